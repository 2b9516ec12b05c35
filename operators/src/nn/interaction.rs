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
        if self.self_interaction {
            n * (n + 1) / 2
        } else {
            n * (n - 1) / 2
        }
    }

    /// Output width per sample: `dim + num_pairs`.
    pub fn output_dim(&self) -> usize {
        self.dim + self.num_pairs()
    }

    /// Number of vectors per sample (`num_sparse + 1`).
    fn num_vectors(&self) -> usize {
        self.num_sparse + 1
    }

    /// `dense: [B × dim]`, `pooled: [B × num_sparse × dim]`, `out: [B × output_dim]`.
    pub fn forward<T: Scalar>(&self, dense: &[T], pooled: &[T], batch: usize, out: &mut [T]) {
        let (d, od, n) = (self.dim, self.output_dim(), self.num_vectors());
        let fd = self.num_sparse * d;
        let mut z = vec![T::ZERO; n * d];
        for b in 0..batch {
            z[..d].copy_from_slice(&dense[b * d..(b + 1) * d]);
            z[d..].copy_from_slice(&pooled[b * fd..(b + 1) * fd]);
            let row = &mut out[b * od..(b + 1) * od];
            row[..d].copy_from_slice(&z[..d]);
            let mut k = d;
            for i in 1..n {
                let zi = &z[i * d..(i + 1) * d];
                let upto = if self.self_interaction { i + 1 } else { i };
                for j in 0..upto {
                    row[k] = dot(zi, &z[j * d..(j + 1) * d]);
                    k += 1;
                }
            }
            if self.self_interaction {
                row[k] = dot(&z[..d], &z[..d]);
            }
        }
    }

    /// Writes `ddense` and `dpooled` (both overwritten) from `dout`.
    ///
    /// Per sample the pair gradients form a symmetric matrix `S` (`S[i][j] =
    /// S[j][i] = ∂L/∂⟨zᵢ,zⱼ⟩`, `S[i][i] = 2·∂L/∂⟨zᵢ,zᵢ⟩`), and `dZ = S·Z`,
    /// computed row by row with the accumulators in registers.
    pub fn backward<T: Scalar>(
        &self,
        dense: &[T],
        pooled: &[T],
        dout: &[T],
        batch: usize,
        ddense: &mut [T],
        dpooled: &mut [T],
    ) {
        let (d, od, n) = (self.dim, self.output_dim(), self.num_vectors());
        let fd = self.num_sparse * d;
        let mut z = vec![T::ZERO; n * d];
        let mut dz = vec![T::ZERO; n * d];
        let mut sym = vec![T::ZERO; n * n];
        for b in 0..batch {
            z[..d].copy_from_slice(&dense[b * d..(b + 1) * d]);
            z[d..].copy_from_slice(&pooled[b * fd..(b + 1) * fd]);
            let g = &dout[b * od..(b + 1) * od];
            sym.fill(T::ZERO);
            let mut k = d;
            for i in 1..n {
                for j in 0..i {
                    sym[i * n + j] = g[k];
                    sym[j * n + i] = g[k];
                    k += 1;
                }
                if self.self_interaction {
                    sym[i * n + i] = g[k] + g[k];
                    k += 1;
                }
            }
            if self.self_interaction {
                sym[0] = g[k] + g[k];
            }
            sym_times(&sym, &z, n, d, &mut dz);
            for (a, &v) in dz[..d].iter_mut().zip(&g[..d]) {
                *a += v;
            }
            ddense[b * d..(b + 1) * d].copy_from_slice(&dz[..d]);
            dpooled[b * fd..(b + 1) * fd].copy_from_slice(&dz[d..]);
        }
    }
}

/// `out[n×d] = s[n×n] · z[n×d]`, eight columns at a time in registers.
#[inline]
fn sym_times<T: Scalar>(s: &[T], z: &[T], n: usize, d: usize, out: &mut [T]) {
    let blocks = d / 8;
    for i in 0..n {
        let srow = &s[i * n..(i + 1) * n];
        for cb in 0..blocks {
            let mut acc = [T::ZERO; 8];
            for (j, &sij) in srow.iter().enumerate() {
                let zj: &[T; 8] = z[j * d + cb * 8..j * d + cb * 8 + 8].try_into().unwrap();
                for l in 0..8 {
                    acc[l] += sij * zj[l];
                }
            }
            out[i * d + cb * 8..i * d + cb * 8 + 8].copy_from_slice(&acc);
        }
        for c in blocks * 8..d {
            let mut acc = T::ZERO;
            for (j, &sij) in srow.iter().enumerate() {
                acc += sij * z[j * d + c];
            }
            out[i * d + c] = acc;
        }
    }
}

/// `Σ xᵢ·yᵢ` with eight independent accumulators (vectorises to FMA lanes).
#[inline]
pub fn dot<T: Scalar>(x: &[T], y: &[T]) -> T {
    let mut acc = [T::ZERO; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (a, b) in xc.zip(yc) {
        for l in 0..8 {
            acc[l] += a[l] * b[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (a, b) in xr.iter().zip(yr) {
        s += *a * *b;
    }
    s
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
