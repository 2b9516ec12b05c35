//! The factorization-machine second-order term, in O(k·n).
//!
//! For `n` field vectors `vᵢ ∈ ℝᵏ` of one sample,
//! `Σ_{i<j} ⟨vᵢ, vⱼ⟩ = ½ Σ_c [(Σᵢ vᵢc)² − Σᵢ vᵢc²]`. The two sums per column
//! (`Σᵢ vᵢc` and `Σᵢ vᵢc²`) are exactly the partial results DES exchanges
//! instead of rows. The vectors sit inside wider rows: `v` of field `f` is
//! `row[offset..offset + k]` with rows `stride` apart.

use super::Scalar;

/// FM second-order interaction over `num_fields` vectors of width `dim`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FmInteraction {
    /// Fields per sample.
    pub num_fields: usize,
    /// Factor width `k`.
    pub dim: usize,
    /// Distance between consecutive field rows.
    pub stride: usize,
    /// Position of the factor inside a row.
    pub offset: usize,
}

impl FmInteraction {
    /// `out[b] = ½ Σ_c [(Σ_f v_fc)² − Σ_f v_fc²]` for each sample of `rows: [B × num_fields × stride]`.
    pub fn forward<T: Scalar>(&self, rows: &[T], batch: usize, out: &mut [T]) {
        let mut sum = vec![T::ZERO; self.dim];
        let half = T::from_f64(0.5);
        for (b, o) in out[..batch].iter_mut().enumerate() {
            sum.fill(T::ZERO);
            let mut squares = T::ZERO;
            for f in 0..self.num_fields {
                let base = (b * self.num_fields + f) * self.stride + self.offset;
                for (s, &v) in sum.iter_mut().zip(&rows[base..base + self.dim]) {
                    *s += v;
                    squares += v * v;
                }
            }
            let mut total = T::ZERO;
            for &s in &sum {
                total += s * s;
            }
            *o = half * (total - squares);
        }
    }

    /// Adds `dout[b] · (Σ_f v_fc − v_fc)` to the factor part of `drows` (other columns untouched).
    pub fn backward<T: Scalar>(&self, rows: &[T], dout: &[T], batch: usize, drows: &mut [T]) {
        let mut sum = vec![T::ZERO; self.dim];
        for (b, &g) in dout[..batch].iter().enumerate() {
            sum.fill(T::ZERO);
            for f in 0..self.num_fields {
                let base = (b * self.num_fields + f) * self.stride + self.offset;
                for (s, &v) in sum.iter_mut().zip(&rows[base..base + self.dim]) {
                    *s += v;
                }
            }
            for f in 0..self.num_fields {
                let base = (b * self.num_fields + f) * self.stride + self.offset;
                let (d, v) = (&mut drows[base..base + self.dim], &rows[base..base + self.dim]);
                for ((d, &v), &s) in d.iter_mut().zip(v).zip(&sum) {
                    *d += g * (s - v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use tiderec_records::rng::normal_f64;

    #[test]
    fn fm_equals_pairwise_sum_and_its_gradient_checks() {
        let fm = FmInteraction { num_fields: 4, dim: 3, stride: 5, offset: 1 };
        let batch = 2;
        let rows: Vec<f64> = (0..batch * 4 * 5).map(|i| normal_f64(1, 0, i as u64, 0)).collect();
        let mut out = vec![0.0; batch];
        fm.forward(&rows, batch, &mut out);
        for b in 0..batch {
            let v = |f: usize, c: usize| rows[(b * 4 + f) * 5 + 1 + c];
            let mut pairs = 0.0;
            for i in 0..4 {
                for j in i + 1..4 {
                    pairs += (0..3).map(|c| v(i, c) * v(j, c)).sum::<f64>();
                }
            }
            assert!((pairs - out[b]).abs() < 1e-12, "{pairs} vs {}", out[b]);
        }
        let r = [0.7, -1.3];
        let loss = |x: &[f64]| {
            let mut o = vec![0.0; batch];
            fm.forward(x, batch, &mut o);
            o.iter().zip(&r).map(|(a, b)| a * b).sum::<f64>()
        };
        let mut d = vec![0.0; rows.len()];
        fm.backward(&rows, &r, batch, &mut d);
        check_gradients(&rows, &d, loss);
    }
}
