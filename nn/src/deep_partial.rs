//! DES partial results of a deep part's first fully connected layer.
//!
//! DeepFM and Wide & Deep feed `[x, v_1, …, v_F]` (dense features, then each
//! field's factor vector) into a first layer `z = W·in + b`. Split `W` by
//! columns into `W_x` and one block `W_f` (`hidden × k`) per field:
//!
//! ```text
//! z = b + W_x·x + Σ_f W_f·(a_f v_f)
//! ```
//!
//! The sum over fields is additive, so the owner of some fields' rows can
//! return its share `Σ_{its fields} W_f·(a_f v_f)` (`hidden` values per
//! sample) instead of the rows, and the home adds the shares, `b` and
//! `W_x·x`. Going back, every share receives the same `∂L/∂z`; the owner
//! turns it into row gradients `∂L/∂v_f = a_f W_fᵀ·∂L/∂z` and adds its share
//! `a_f v_f ⊗ ∂L/∂z` of `∂L/∂W_f` to its own dense gradient. Dense gradients
//! are summed over all workers before any update, so which worker computed a
//! term of `∂L/∂W_f` changes nothing but the order of a float sum.
//!
//! The factor columns are held transposed (`[field][k][hidden]`, a
//! `fields·k × hidden` matrix `Wᵀ_v`). [`FirstLayer::accumulate`] and
//! [`FirstLayer::backward`] work one sample and field at a time (the
//! reference); [`DeepShares`] does the same for a whole micro-batch as three
//! GEMMs over `X` (`B × fields·k`, the owner's scaled factors, zero where a
//! sample has no row of the owner): `Z = X·Wᵀ_v`, `∂X = ∂Z·W_v`,
//! `∂Wᵀ_v += Xᵀ·∂Z`.

use super::gemm::{gemm, Op};
use super::gemm_packed::{gemm_packed, gemm_tn, PackedRhs};
use super::Scalar;

/// Where the factor columns of a first layer live in a model's flat buffer.
///
/// `W` is `[hidden × input]` row-major at `offset` (as in [`super::linear::Linear`]);
/// component `c` of field `f`'s factor is input column `skip + f·dim + c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirstLayer {
    /// Offset of `W` in the flat parameter buffer.
    pub offset: usize,
    /// Input width of the layer.
    pub input: usize,
    /// Output width of the layer (the width of its partial result).
    pub hidden: usize,
    /// Input columns before the first factor (the dense features).
    pub skip: usize,
    /// Factor width `k` of each field.
    pub dim: usize,
    /// Fields whose factors enter the layer.
    pub fields: usize,
}

impl FirstLayer {
    /// Values of the transposed factor block (and of its gradient).
    pub fn block_len(&self) -> usize {
        self.fields * self.dim * self.hidden
    }

    /// Copies the factor columns of `W` out of `params`, transposed, into `wt`
    /// (`[field][k][hidden]`, resized to [`block_len`](Self::block_len)).
    pub fn load_transposed<T: Scalar>(&self, params: &[T], wt: &mut Vec<T>) {
        let (h, kf) = (self.hidden, self.fields * self.dim);
        wt.clear();
        wt.resize(self.block_len(), T::ZERO);
        for o in 0..h {
            let row = &params[self.offset + o * self.input + self.skip..][..kf];
            for (j, &v) in row.iter().enumerate() {
                wt[j * h + o] = v;
            }
        }
    }

    /// Adds a transposed block gradient `dwt` (`[field][k][hidden]`) into the layer's
    /// weight gradient inside the flat `grads` buffer.
    pub fn add_transposed_grads<T: Scalar>(&self, dwt: &[T], grads: &mut [T]) {
        let (h, kf) = (self.hidden, self.fields * self.dim);
        for o in 0..h {
            let row = &mut grads[self.offset + o * self.input + self.skip..][..kf];
            for (j, g) in row.iter_mut().enumerate() {
                *g += dwt[j * h + o];
            }
        }
    }

    /// Adds field `field`'s share `W_f·(weight·factors)` to one sample's partial result `out` (`hidden` values).
    #[inline]
    pub fn accumulate<T: Scalar>(&self, wt: &[T], field: usize, factors: &[T], weight: T, out: &mut [T]) {
        let h = self.hidden;
        let block = &wt[field * self.dim * h..(field + 1) * self.dim * h];
        for (col, &v) in block.chunks_exact(h).zip(&factors[..self.dim]) {
            let x = weight * v;
            for (o, &w) in out[..h].iter_mut().zip(col) {
                *o += x * w;
            }
        }
    }

    /// From one sample's `dz` (`hidden` values): adds `weight·W_fᵀ·dz` to
    /// `dfactors` and `weight·factors ⊗ dz` to the transposed block gradient `dwt`.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: Scalar>(
        &self,
        wt: &[T],
        field: usize,
        factors: &[T],
        weight: T,
        dz: &[T],
        dfactors: &mut [T],
        dwt: &mut [T],
    ) {
        let (h, k) = (self.hidden, self.dim);
        let span = field * k * h..(field + 1) * k * h;
        let (block, dblock) = (&wt[span.clone()], &mut dwt[span]);
        for c in 0..k {
            let col = &block[c * h..(c + 1) * h];
            let mut dot = T::ZERO;
            for (&w, &g) in col.iter().zip(&dz[..h]) {
                dot += w * g;
            }
            dfactors[c] += weight * dot;
            let x = weight * factors[c];
            for (d, &g) in dblock[c * h..(c + 1) * h].iter_mut().zip(&dz[..h]) {
                *d += x * g;
            }
        }
    }
}

/// Values `gemm_tn` may read past the last row of its right operand (one vector).
const GEMM_TN_SLACK: usize = 8;

/// Widest `hidden` whose weight gradient runs on [`gemm_tn`] (narrow right
/// operands, one panel); wider ones on the general GEMM, which blocks for cache.
const GEMM_TN_MAX_WIDTH: usize = 64;

/// A first layer's factor block as [`DeepShares`] reads it: transposed
/// (`wt`, `[field][k][hidden]`) and packed for both of its products.
#[derive(Clone, Debug, Default)]
pub struct DeepWeights<T> {
    /// The transposed factor block.
    pub wt: Vec<T>,
    /// `wt` packed as the right operand of `X·wt`.
    forward: PackedRhs<T>,
    /// `wtᵀ` packed as the right operand of `∂Z·wtᵀ`.
    backward: PackedRhs<T>,
}

impl<T: Scalar> DeepWeights<T> {
    /// Loads the layer's factor block from the flat `params`.
    pub fn load(&mut self, layer: &FirstLayer, params: &[T]) {
        layer.load_transposed(params, &mut self.wt);
        let (kf, h) = (layer.fields * layer.dim, layer.hidden);
        self.forward.pack(Op::N, kf, h, &self.wt);
        self.backward.pack(Op::T, h, kf, &self.wt);
    }
}

/// A micro-batch's factor input to a first layer and its gradients: the
/// batched form of [`FirstLayer::accumulate`] and [`FirstLayer::backward`].
#[derive(Clone, Debug, Default)]
pub struct DeepShares<T> {
    /// `X`: `[B × fields·k]`, each present (sample, field) its weighted factor, else zero.
    x: Vec<T>,
    /// `Z = X·Wᵀ_v` (forward) or `∂Z` gathered from the partial gradients (backward), `[B × hidden]`.
    z: Vec<T>,
    /// `∂X = ∂Z·W_v`, `[B × fields·k]`.
    dx: Vec<T>,
    batch: usize,
}

impl<T: Scalar> DeepShares<T> {
    /// Starts a micro-batch of `batch` samples with no factors.
    pub fn reset(&mut self, layer: &FirstLayer, batch: usize) {
        self.batch = batch;
        self.x.clear();
        self.x.resize(batch * layer.fields * layer.dim, T::ZERO);
    }

    /// Adds `weight · factors` as sample `sample`'s input of field `field`.
    #[inline]
    pub fn add(&mut self, layer: &FirstLayer, sample: usize, field: usize, factors: &[T], weight: T) {
        let k = layer.dim;
        let at = sample * layer.fields * k + field * k;
        for (x, &v) in self.x[at..at + k].iter_mut().zip(&factors[..k]) {
            *x += weight * v;
        }
    }

    /// Adds every sample's share `X·Wᵀ_v` to its partial result: `out` is
    /// `[B × stride]` and the share goes at `offset` of each row.
    ///
    /// The products read `X` and `∂Z` where they lie against the packed
    /// weights ([`gemm_packed`]); a general GEMM would pack the `B`-row operand
    /// on every call, as much work as the product at these narrow widths.
    pub fn add_shares(
        &mut self,
        layer: &FirstLayer,
        weights: &DeepWeights<T>,
        out: &mut [T],
        stride: usize,
        offset: usize,
    ) {
        let (b, kf) = (self.batch, layer.fields * layer.dim);
        if b > 0 {
            gemm_packed(b, &self.x, kf, &weights.forward, true, &mut out[offset..], stride);
        }
    }

    /// Back-propagates the partial results' gradients `dp` (`[B × stride]`, `∂Z`
    /// at `offset` of each row): keeps `∂X` for [`dfactors`](Self::dfactors)
    /// and adds `Xᵀ·∂Z` to the transposed block gradient `dwt`.
    pub fn backward(
        &mut self,
        layer: &FirstLayer,
        weights: &DeepWeights<T>,
        dp: &[T],
        stride: usize,
        offset: usize,
        dwt: &mut [T],
    ) {
        let (b, h, kf) = (self.batch, layer.hidden, layer.fields * layer.dim);
        self.z.clear();
        for row in dp.chunks_exact(stride).take(b) {
            self.z.extend_from_slice(&row[offset..offset + h]);
        }
        // `gemm_tn` reads rows of `∂Z` to whole vectors: slack after the last.
        self.z.resize(b * h + GEMM_TN_SLACK, T::ZERO);
        self.dx.clear();
        self.dx.resize(b * kf, T::ZERO);
        if b == 0 {
            return;
        }
        gemm_packed(b, &self.z, h, &weights.backward, false, &mut self.dx, kf);
        if h <= GEMM_TN_MAX_WIDTH {
            gemm_tn(kf, h, b, &self.x, kf, &self.z, h, true, dwt, h);
        } else {
            gemm(Op::T, Op::N, kf, h, b, T::ONE, &self.x, &self.z, T::ONE, dwt);
        }
    }

    /// `∂L/∂(input)` of sample `sample`'s field `field` after [`backward`](Self::backward)
    /// (`dim` values; multiply by the pooling weight for the row's gradient).
    #[inline]
    pub fn dfactors(&self, layer: &FirstLayer, sample: usize, field: usize) -> &[T] {
        let k = layer.dim;
        let at = sample * layer.fields * k + field * k;
        &self.dx[at..at + k]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use tiderec_records::rng::normal_f64;

    fn layer() -> FirstLayer {
        // Two leading dense columns, three fields of width 2, five outputs, at offset 3.
        FirstLayer { offset: 3, input: 2 + 3 * 2, hidden: 5, skip: 2, dim: 2, fields: 3 }
    }

    fn values(n: usize, seed: u64) -> Vec<f64> {
        (0..n).map(|i| normal_f64(seed, 0, i as u64, 0)).collect()
    }

    /// Shares of any split of the fields add up to the factor part of `W·in`.
    #[test]
    fn shares_add_up_to_the_layer_product() {
        let l = layer();
        let params = values(l.offset + l.hidden * l.input + 4, 1);
        let input = values(l.input, 2);
        let mut wt = Vec::new();
        l.load_transposed(&params, &mut wt);
        let mut shares = vec![vec![0.0; l.hidden]; 2];
        for f in 0..l.fields {
            let factors = &input[l.skip + f * l.dim..l.skip + (f + 1) * l.dim];
            l.accumulate(&wt, f, factors, 1.0, &mut shares[f % 2]);
        }
        for o in 0..l.hidden {
            let w = &params[l.offset + o * l.input..l.offset + (o + 1) * l.input];
            let direct: f64 = (l.skip..l.input).map(|j| w[j] * input[j]).sum();
            let got = shares[0][o] + shares[1][o];
            assert!((got - direct).abs() < 1e-12, "output {o}: {got} vs {direct}");
        }
    }

    /// Factor and weight gradients through the shares match finite differences, with pooling weights.
    #[test]
    fn gradients_match_finite_differences() {
        let l = layer();
        let weights = [0.5, 1.0, -2.0];
        let r = values(l.hidden, 3);
        let loss = |params: &[f64], factors: &[f64]| {
            let mut wt = Vec::new();
            l.load_transposed(params, &mut wt);
            let mut z = vec![0.0; l.hidden];
            for f in 0..l.fields {
                l.accumulate(&wt, f, &factors[f * l.dim..(f + 1) * l.dim], weights[f], &mut z);
            }
            z.iter().zip(&r).map(|(a, b)| a * b).sum::<f64>()
        };
        let params = values(l.offset + l.hidden * l.input + 4, 4);
        let factors = values(l.fields * l.dim, 5);
        let mut wt = Vec::new();
        l.load_transposed(&params, &mut wt);
        let mut dfactors = vec![0.0; factors.len()];
        let mut dwt = vec![0.0; l.block_len()];
        for (f, &w) in weights.iter().enumerate() {
            let span = f * l.dim..(f + 1) * l.dim;
            l.backward(&wt, f, &factors[span.clone()], w, &r, &mut dfactors[span], &mut dwt);
        }
        let mut grads = vec![0.0; params.len()];
        l.add_transposed_grads(&dwt, &mut grads);
        check_gradients(&params, &grads, |p| loss(p, &factors));
        check_gradients(&factors, &dfactors, |x| loss(&params, x));
    }

    /// The batched shares equal the per-sample reference, with absent fields and weights.
    #[test]
    fn batched_shares_equal_the_reference() {
        let l = layer();
        let batch = 4;
        let params = values(l.offset + l.hidden * l.input + 4, 6);
        let factors = values(batch * l.fields * l.dim, 7);
        let dz_all = values(batch * (2 + l.hidden), 8);
        let (stride, offset) = (2 + l.hidden, 2);
        let present = |s: usize, f: usize| !(s + f).is_multiple_of(3);
        let weight = |s: usize, f: usize| 0.25 + (s * 3 + f) as f64 * 0.125;
        let mut weights = DeepWeights::default();
        weights.load(&l, &params);
        let wt = weights.wt.clone();
        let (mut want, mut want_df, mut want_dwt) =
            (vec![0.0; batch * stride], vec![0.0; factors.len()], vec![0.0; l.block_len()]);
        let mut shares = DeepShares::default();
        shares.reset(&l, batch);
        for s in 0..batch {
            for f in (0..l.fields).filter(|&f| present(s, f)) {
                let at = (s * l.fields + f) * l.dim;
                let (x, w) = (&factors[at..at + l.dim], weight(s, f));
                l.accumulate(&wt, f, x, w, &mut want[s * stride + offset..(s + 1) * stride]);
                let dz = &dz_all[s * stride + offset..(s + 1) * stride];
                l.backward(&wt, f, x, w, dz, &mut want_df[at..at + l.dim], &mut want_dwt);
                shares.add(&l, s, f, x, w);
            }
        }
        let mut got = vec![0.0; batch * stride];
        shares.add_shares(&l, &weights, &mut got, stride, offset);
        let mut got_dwt = vec![0.0; l.block_len()];
        shares.backward(&l, &weights, &dz_all, stride, offset, &mut got_dwt);
        let close = |a: &[f64], b: &[f64], what: &str| {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!((x - y).abs() < 1e-12, "{what} {i}: {x} vs {y}");
            }
        };
        close(&got, &want, "share");
        close(&got_dwt, &want_dwt, "weight gradient");
        for s in 0..batch {
            for f in (0..l.fields).filter(|&f| present(s, f)) {
                let at = (s * l.fields + f) * l.dim;
                let got: Vec<f64> = shares.dfactors(&l, s, f).iter().map(|&g| g * weight(s, f)).collect();
                close(&got, &want_df[at..at + l.dim], "factor gradient");
            }
        }
    }
}
