//! DES partial results of the LR / FM models.
//!
//! The logit of an FM depends on a sample's field rows `[w_f, v_f]` only
//! through two sums over the fields:
//!
//! ```text
//! p = [ c = Σ_f (w_f − ½‖v_f‖²),  S = Σ_f v_f (k values) ]
//! logit = b + a·x + c + ½‖S‖²
//! ```
//!
//! (the FM identity `Σ_{f<g} ⟨v_f, v_g⟩ = ½(‖S‖² − Σ_f ‖v_f‖²)` with the
//! first-order weights folded into the scalar). Both sums are additive over
//! any partition of the fields, so the owner of a group of rows can return
//! its share of `p` (`k + 1` values per sample) instead of the rows
//! themselves, and the home of the sample adds the shares up (Distributed
//! Equivalent Substitution). Going back, every share receives the same
//! `∂L/∂p = [g, g·S]`, and the owner turns it into row gradients:
//! `∂L/∂w_f = ∂L/∂c`, `∂L/∂v_f = ∂L/∂S − v_f ∂L/∂c = g (S − v_f)`, the FM's usual gradient.
//!
//! A field's contribution must be its whole pooled vector, so a field
//! exchanged this way holds at most one id per sample (one-hot; the trainer
//! checks it), scaled by that id's pooling weight `a`: the row enters as
//! `x = a·row` and its gradient is `a·∂L/∂x`.
//!
//! Logistic regression (`k = 0`, or no FM term) has `p = [Σ_f w_f]`.
//!
//! DeepFM and Wide & Deep append their deep part's first-layer share
//! `Σ_f W_f·v_f` (`hidden` values, see [`super::deep_partial`]) after those
//! sums, so one partial result per sample and owner carries both terms.

use super::deep_partial::FirstLayer;
use super::Scalar;

/// Shape of the partial result of an LR or FM model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FmPartial {
    /// Factor width `k` of each row `[w, v₁ … v_k]`.
    pub dim: usize,
    /// Whether the second-order term is part of the model (else only `Σ w`).
    pub fm: bool,
    /// The deep part's first layer, whose factor share follows the FM sums (DeepFM, Wide & Deep).
    pub deep: Option<FirstLayer>,
}

impl FmPartial {
    /// Values per sample: the FM sums (`k + 1` with the FM term, else 1), then
    /// the first layer's share (`hidden` values) when there is a deep part.
    pub fn width(&self) -> usize {
        self.fm_width() + self.deep.map_or(0, |l| l.hidden)
    }

    /// Values of the FM sums at the start of a partial result.
    pub fn fm_width(&self) -> usize {
        if self.second_order() {
            self.dim + 1
        } else {
            1
        }
    }

    /// Adds field `field`'s row to one sample's partial result: the FM sums
    /// and, with a deep part, the first layer's share (`wt`: the layer's
    /// transposed factor block, [`FirstLayer::load_transposed`]; unused without a deep part).
    ///
    /// One sample and field at a time: the reference for the trainer, which
    /// adds the FM sums here but the first layer's shares a micro-batch at a
    /// time ([`super::DeepShares`]).
    #[inline]
    pub fn accumulate_field<T: Scalar>(&self, wt: &[T], field: usize, row: &[T], weight: T, out: &mut [T]) {
        self.accumulate(row, weight, out);
        if let Some(l) = self.deep {
            let fw = self.fm_width();
            l.accumulate(wt, field, &row[1..], weight, &mut out[fw..]);
        }
    }

    /// The gradient of a row from the gradient `dp` of the partial result it
    /// went into, given the first layer's input gradient `dfactors` of its
    /// field and sample when there is a deep part ([`super::DeepShares::dfactors`]);
    /// overwrites `drow`.
    #[inline]
    pub fn row_grad_with<T: Scalar>(&self, row: &[T], weight: T, dp: &[T], dfactors: Option<&[T]>, drow: &mut [T]) {
        self.row_grad(row, weight, dp, drow);
        if let Some(df) = dfactors {
            if !self.second_order() {
                drow[1..].fill(T::ZERO);
            }
            for (d, &g) in drow[1..1 + self.dim].iter_mut().zip(df) {
                *d += weight * g;
            }
        }
    }

    /// The gradient of field `field`'s row from the gradient `dp` of the
    /// partial result it went into (overwrites `drow`); with a deep part also
    /// adds the row's share of the first layer's weight gradient to `dwt`
    /// (transposed like `wt`). The per-sample reference of
    /// [`row_grad_with`](Self::row_grad_with) after [`super::DeepShares::backward`].
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn row_grad_field<T: Scalar>(
        &self,
        wt: &[T],
        field: usize,
        row: &[T],
        weight: T,
        dp: &[T],
        drow: &mut [T],
        dwt: &mut [T],
    ) {
        self.row_grad(row, weight, dp, drow);
        if let Some(l) = self.deep {
            if !self.second_order() {
                drow[1..].fill(T::ZERO);
            }
            let fw = self.fm_width();
            l.backward(wt, field, &row[1..], weight, &dp[fw..], &mut drow[1..], dwt);
        }
    }

    fn second_order(&self) -> bool {
        self.fm && self.dim > 0
    }

    /// Adds the contribution of one field's row (`1 + k` values) with pooling
    /// weight `weight` to one sample's partial result `out` (`width()` values).
    #[inline]
    pub fn accumulate<T: Scalar>(&self, row: &[T], weight: T, out: &mut [T]) {
        let mut c = weight * row[0];
        if self.second_order() {
            let k = self.dim;
            let mut squares = T::ZERO;
            for (sc, &v) in out[1..1 + k].iter_mut().zip(&row[1..1 + k]) {
                let x = weight * v;
                *sc += x;
                squares += x * x;
            }
            c -= T::from_f64(0.5) * squares;
        }
        out[0] += c;
    }

    /// The gradient of one field's row from the gradient `dp` of the partial
    /// result it was accumulated into; overwrites `drow` (`1 + k` values).
    #[inline]
    pub fn row_grad<T: Scalar>(&self, row: &[T], weight: T, dp: &[T], drow: &mut [T]) {
        drow[0] = weight * dp[0];
        if self.second_order() {
            for c in 0..self.dim {
                let x = weight * row[1 + c];
                drow[1 + c] = weight * (dp[1 + c] - dp[0] * x);
            }
        }
    }

    /// The interaction part of the logit from a sample's summed partial result: `c + ½‖S‖²`.
    #[inline]
    pub fn logit<T: Scalar>(&self, p: &[T]) -> T {
        let mut l = p[0];
        if self.second_order() {
            let mut total = T::ZERO;
            for &s in &p[1..1 + self.dim] {
                total += s * s;
            }
            l += T::from_f64(0.5) * total;
        }
        l
    }

    /// `∂logit/∂p` scaled by `g` (the loss gradient of the logit); overwrites `dp`.
    #[inline]
    pub fn logit_grad<T: Scalar>(&self, p: &[T], g: T, dp: &mut [T]) {
        dp[0] = g;
        if self.second_order() {
            for c in 0..self.dim {
                dp[1 + c] = g * p[1 + c];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fm::FmInteraction;
    use crate::gradcheck::check_gradients;
    use tiderec_records::rng::normal_f64;

    fn rows(fields: usize, k: usize, seed: u64) -> Vec<f64> {
        (0..fields * (1 + k)).map(|i| normal_f64(seed, 0, i as u64, 0) * 0.7).collect()
    }

    /// The logit from partial results equals the FM computed on the rows, however the fields are split.
    #[test]
    fn partial_sums_reproduce_the_fm_term() {
        let (fields, k) = (5, 3);
        let r = rows(fields, k, 1);
        let fm = FmInteraction { num_fields: fields, dim: k, stride: 1 + k, offset: 1 };
        let mut direct = [0.0f64];
        fm.forward(&r, 1, &mut direct);
        let linear: f64 = (0..fields).map(|f| r[f * (1 + k)]).sum();
        let part = FmPartial { dim: k, fm: true, deep: None };
        // Two owners: fields {0, 3} and {1, 2, 4}; their shares add up at home.
        let mut shares = vec![vec![0.0f64; part.width()]; 2];
        for f in 0..fields {
            let owner = usize::from(f != 0 && f != 3);
            part.accumulate(&r[f * (1 + k)..(f + 1) * (1 + k)], 1.0, &mut shares[owner]);
        }
        let total: Vec<f64> = (0..part.width()).map(|i| shares[0][i] + shares[1][i]).collect();
        let got = part.logit(&total);
        assert!((got - (linear + direct[0])).abs() < 1e-12, "{got} vs {}", linear + direct[0]);
    }

    /// Row gradients through the partial result match finite differences of the logit, with weights.
    #[test]
    fn row_gradients_match_finite_differences() {
        for (k, fm) in [(3, true), (3, false), (0, true)] {
            let fields = 4;
            let part = FmPartial { dim: k, fm, deep: None };
            let weights = [1.0, 0.5, 2.0, -0.3];
            let logit_of = |r: &[f64]| {
                let mut p = vec![0.0; part.width()];
                for (row, &w) in r.chunks_exact(1 + k).zip(&weights) {
                    part.accumulate(row, w, &mut p);
                }
                part.logit(&p)
            };
            let r = rows(fields, k, 2);
            let mut p = vec![0.0; part.width()];
            for (row, &w) in r.chunks_exact(1 + k).zip(&weights) {
                part.accumulate(row, w, &mut p);
            }
            let mut dp = vec![0.0; part.width()];
            part.logit_grad(&p, 1.0, &mut dp);
            let mut grads = vec![0.0; r.len()];
            for ((row, g), &w) in r.chunks_exact(1 + k).zip(grads.chunks_exact_mut(1 + k)).zip(&weights) {
                part.row_grad(row, w, &dp, g);
            }
            check_gradients(&r, &grads, logit_of);
        }
    }
}
