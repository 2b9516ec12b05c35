//! DLRM's pairwise dot interaction.
//!
//! Per sample the vectors are `v₀` (the bottom MLP's output) and `v₁…v_F`
//! (the pooled embeddings). The output is `v₀` followed by the dot products
//! `⟨vᵢ, vⱼ⟩` for `j < i` (or `j ≤ i` with self-interaction), in row order of
//! the lower triangle: `(1,0), (2,0), (2,1), (3,0), …`. With self-interaction
//! each row also holds its diagonal (`(1,0), (1,1), (2,0), (2,1), (2,2), …`) and
//! `⟨v₀, v₀⟩` comes last.

use super::Scalar;

/// Dot interaction of one dense vector and `num_sparse` pooled embeddings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DotInteraction {
    /// Number of pooled embeddings per sample.
    pub num_sparse: usize,
    /// Vector width.
    pub dim: usize,
    /// Whether `⟨vᵢ, vᵢ⟩` terms are included.
    pub self_interaction: bool,
}

impl DotInteraction {
    /// Number of dot products per sample.
    pub fn num_pairs(&self) -> usize {
        let n = self.num_sparse + 1;
        if self.self_interaction { n * (n + 1) / 2 } else { n * (n - 1) / 2 }
    }

    /// Output width per sample: `dim + num_pairs`.
    pub fn output_dim(&self) -> usize {
        self.dim + self.num_pairs()
    }

    #[inline]
    fn vector<'a, T>(&self, dense: &'a [T], pooled: &'a [T], b: usize, i: usize) -> &'a [T] {
        let d = self.dim;
        if i == 0 {
            &dense[b * d..(b + 1) * d]
        } else {
            let base = (b * self.num_sparse + i - 1) * d;
            &pooled[base..base + d]
        }
    }

    /// `dense: [B × dim]`, `pooled: [B × num_sparse × dim]`, `out: [B × output_dim]`.
    pub fn forward<T: Scalar>(&self, dense: &[T], pooled: &[T], batch: usize, out: &mut [T]) {
        let (d, od, n) = (self.dim, self.output_dim(), self.num_sparse + 1);
        for b in 0..batch {
            let row = &mut out[b * od..(b + 1) * od];
            row[..d].copy_from_slice(&dense[b * d..(b + 1) * d]);
            let mut k = d;
            for i in 1..n {
                let vi = self.vector(dense, pooled, b, i);
                let upto = if self.self_interaction { i + 1 } else { i };
                for j in 0..upto {
                    let vj = self.vector(dense, pooled, b, j);
                    let mut s = T::ZERO;
                    for (x, y) in vi.iter().zip(vj) {
                        s += *x * *y;
                    }
                    row[k] = s;
                    k += 1;
                }
            }
            if self.self_interaction {
                let v0 = self.vector(dense, pooled, b, 0);
                let mut s = T::ZERO;
                for x in v0 {
                    s += *x * *x;
                }
                row[k] = s;
            }
        }
    }

    /// Writes `ddense` and `dpooled` (both overwritten) from `dout`.
    pub fn backward<T: Scalar>(
        &self, dense: &[T], pooled: &[T], dout: &[T], batch: usize, ddense: &mut [T], dpooled: &mut [T],
    ) {
        let (d, od, n, f) = (self.dim, self.output_dim(), self.num_sparse + 1, self.num_sparse);
        for b in 0..batch {
            let g = &dout[b * od..(b + 1) * od];
            let dd = &mut ddense[b * d..(b + 1) * d];
            dd.copy_from_slice(&g[..d]);
            let dp = &mut dpooled[b * f * d..(b + 1) * f * d];
            dp.fill(T::ZERO);
            let mut k = d;
            for i in 1..n {
                let vi = self.vector(dense, pooled, b, i);
                let upto = if self.self_interaction { i + 1 } else { i };
                for j in 0..upto {
                    let gk = g[k];
                    k += 1;
                    let vj = self.vector(dense, pooled, b, j);
                    // d⟨vi,vj⟩/dvi = vj, /dvj = vi (twice vi when i == j).
                    for c in 0..d {
                        dp[(i - 1) * d + c] += gk * vj[c];
                    }
                    if j == 0 {
                        for c in 0..d {
                            dd[c] += gk * vi[c];
                        }
                    } else {
                        for c in 0..d {
                            dp[(j - 1) * d + c] += gk * vi[c];
                        }
                    }
                }
            }
            if self.self_interaction {
                let gk = g[k];
                let v0 = self.vector(dense, pooled, b, 0);
                for c in 0..d {
                    dd[c] += (gk + gk) * v0[c];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::gradcheck::check_gradients;
    use crate::rng::normal_f64;

    #[test]
    fn interaction_gradients_match_finite_differences() {
        for self_interaction in [false, true] {
            let it = DotInteraction { num_sparse: 3, dim: 4, self_interaction };
            let batch = 2;
            let dense: Vec<f64> = (0..batch * 4).map(|i| normal_f64(1, 0, i as u64, 0)).collect();
            let pooled: Vec<f64> = (0..batch * 12).map(|i| normal_f64(2, 0, i as u64, 0)).collect();
            let r: Vec<f64> = (0..batch * it.output_dim()).map(|i| normal_f64(3, 0, i as u64, 0)).collect();
            let loss = |de: &[f64], po: &[f64]| {
                let mut out = vec![0.0; batch * it.output_dim()];
                it.forward(de, po, batch, &mut out);
                out.iter().zip(&r).map(|(a, b)| a * b).sum::<f64>()
            };
            let mut dd = vec![0.0; dense.len()];
            let mut dp = vec![0.0; pooled.len()];
            it.backward(&dense, &pooled, &r, batch, &mut dd, &mut dp);
            check_gradients(&dense, &dd, |x| loss(x, &pooled));
            check_gradients(&pooled, &dp, |x| loss(&dense, x));
        }
    }

    #[test]
    fn pair_counts() {
        let it = DotInteraction { num_sparse: 26, dim: 16, self_interaction: false };
        assert_eq!(it.num_pairs(), 351);
        assert_eq!(it.output_dim(), 367);
        let it = DotInteraction { self_interaction: true, ..it };
        assert_eq!(it.num_pairs(), 378);
    }
}
