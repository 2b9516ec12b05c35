//! DLRM's pairwise dot interaction.
//!
//! Per sample the vectors are `v₀` (the bottom MLP's output) and `v₁…v_F`
//! (the pooled embeddings). The output is `v₀` followed by the dot products
//! `⟨vᵢ, vⱼ⟩` for `j < i` (or `j ≤ i` with self-interaction), in row order of
//! the lower triangle: `(1,0), (2,0), (2,1), (3,0), …`. With self-interaction
//! each row also holds its diagonal (`(1,0), (1,1), (2,0), (2,1), (2,2), …`) and
//! `⟨v₀, v₀⟩` comes last.

use super::Scalar;

#[cfg(target_arch = "x86_64")]
mod avx512;

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
    ///
    /// Per sample the vectors are transposed once into `Zᵀ` (`dim` rows of the
    /// `n` vectors, padded to a multiple of eight), and row `i` of the lower
    /// triangle, `⟨zᵢ, z_j⟩` for `j < i`, is `Σ_c zᵢ[c]·Zᵀ[c][j]`: eight pairs per
    /// vector and up to four independent accumulators (`gram_row`) instead of
    /// one horizontal reduction per pair. Row `i`'s pairs are contiguous in the
    /// output, so each row is one copy. Every pair is one chain of fused
    /// multiply-adds over the vector's components in order, from zero
    /// ([`forward_reference`](Self::forward_reference) is that definition); on
    /// a CPU with AVX-512F the `f32` products run on the kernel of
    /// `interaction/avx512.rs`, which computes the same chains.
    pub fn forward<T: Scalar>(&self, dense: &[T], pooled: &[T], batch: usize, out: &mut [T]) {
        #[cfg(target_arch = "x86_64")]
        if avx512::available() {
            if let (Some(dense), Some(pooled), Some(out)) = (T::as_f32(dense), T::as_f32(pooled), T::as_f32_mut(out)) {
                return avx512::forward(self, dense, pooled, batch, out);
            }
        }
        self.forward_portable(dense, pooled, batch, out)
    }

    /// [`forward`](Self::forward) in portable code (the fallback, and the
    /// oracle of the vector kernel).
    pub(crate) fn forward_portable<T: Scalar>(&self, dense: &[T], pooled: &[T], batch: usize, out: &mut [T]) {
        let (d, od, n) = (self.dim, self.output_dim(), self.num_vectors());
        let fd = self.num_sparse * d;
        let npad = n.div_ceil(LANES) * LANES;
        let mut zt = vec![T::ZERO; d * npad];
        let mut gram = vec![T::ZERO; npad];
        for b in 0..batch {
            let z0 = &dense[b * d..(b + 1) * d];
            let zs = &pooled[b * fd..(b + 1) * fd];
            let vector = |i: usize| if i == 0 { z0 } else { &zs[(i - 1) * d..i * d] };
            for i in 0..n {
                for (c, &v) in vector(i).iter().enumerate() {
                    zt[c * npad + i] = v;
                }
            }
            let row = &mut out[b * od..(b + 1) * od];
            row[..d].copy_from_slice(z0);
            let mut k = d;
            for i in 1..n {
                let upto = if self.self_interaction { i + 1 } else { i };
                gram_row(vector(i), &zt, npad, upto.div_ceil(LANES), &mut gram);
                row[k..k + upto].copy_from_slice(&gram[..upto]);
                k += upto;
            }
            if self.self_interaction {
                gram_row(z0, &zt, npad, 1, &mut gram);
                row[k] = gram[0];
            }
        }
    }

    /// The definition, one dot product per pair: the oracle for [`forward`](Self::forward).
    pub fn forward_reference<T: Scalar>(&self, dense: &[T], pooled: &[T], batch: usize, out: &mut [T]) {
        let (d, od, n) = (self.dim, self.output_dim(), self.num_vectors());
        let fd = self.num_sparse * d;
        for b in 0..batch {
            let vector = |i: usize| {
                if i == 0 {
                    &dense[b * d..(b + 1) * d]
                } else {
                    &pooled[b * fd + (i - 1) * d..b * fd + i * d]
                }
            };
            let row = &mut out[b * od..(b + 1) * od];
            row[..d].copy_from_slice(vector(0));
            let mut k = d;
            for i in 1..n {
                let upto = if self.self_interaction { i + 1 } else { i };
                for j in 0..upto {
                    row[k] = vector(i).iter().zip(vector(j)).fold(T::ZERO, |acc, (&x, &y)| x.mul_add(y, acc));
                    k += 1;
                }
            }
            if self.self_interaction {
                row[k] = vector(0).iter().fold(T::ZERO, |acc, &x| x.mul_add(x, acc));
            }
        }
    }

    /// Writes `ddense` and `dpooled` (both overwritten) from `dout`.
    ///
    /// Per sample the pair gradients form a symmetric matrix `S` (`S[i][j] =
    /// S[j][i] = ∂L/∂⟨zᵢ,zⱼ⟩`, `S[i][i] = 2·∂L/∂⟨zᵢ,zᵢ⟩`), and `dZ = S·Z`,
    /// computed row by row with the accumulators in registers: each entry one
    /// chain of fused multiply-adds over `j` in ascending order from zero, the
    /// dense vector's own gradient added last. On a CPU with AVX-512F the `f32`
    /// products run on the kernel of `interaction/avx512.rs`, which computes
    /// the same chains.
    pub fn backward<T: Scalar>(
        &self,
        dense: &[T],
        pooled: &[T],
        dout: &[T],
        batch: usize,
        ddense: &mut [T],
        dpooled: &mut [T],
    ) {
        #[cfg(target_arch = "x86_64")]
        if avx512::available() {
            let inputs = (T::as_f32(dense), T::as_f32(pooled), T::as_f32(dout));
            if let ((Some(dense), Some(pooled), Some(dout)), Some(ddense), Some(dpooled)) =
                (inputs, T::as_f32_mut(ddense), T::as_f32_mut(dpooled))
            {
                return avx512::backward(self, (dense, pooled, dout), batch, ddense, dpooled);
            }
        }
        self.backward_portable(dense, pooled, dout, batch, ddense, dpooled)
    }

    /// [`backward`](Self::backward) in portable code (the fallback, and the
    /// oracle of the vector kernel).
    pub(crate) fn backward_portable<T: Scalar>(
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

/// Values per accumulator vector (one AVX2 register of `f32`).
const LANES: usize = 8;

/// `out[j] = Σ_c zi[c]·zt[c][j]` for the first `blocks · 8` columns `j` of the
/// transposed vectors `zt` (`zi.len()` rows of `npad` values), four column
/// blocks at a time so that four accumulator chains run side by side.
#[inline]
fn gram_row<T: Scalar>(zi: &[T], zt: &[T], npad: usize, blocks: usize, out: &mut [T]) {
    let mut first = 0;
    while first < blocks {
        let take = (blocks - first).min(4);
        match take {
            4 => gram_blocks::<T, 4>(zi, zt, npad, first, out),
            3 => gram_blocks::<T, 3>(zi, zt, npad, first, out),
            2 => gram_blocks::<T, 2>(zi, zt, npad, first, out),
            _ => gram_blocks::<T, 1>(zi, zt, npad, first, out),
        }
        first += take;
    }
}

/// `B` column blocks of [`gram_row`] starting at block `first`.
#[inline(always)]
fn gram_blocks<T: Scalar, const B: usize>(zi: &[T], zt: &[T], npad: usize, first: usize, out: &mut [T]) {
    let mut acc = [[T::ZERO; LANES]; B];
    for (c, &x) in zi.iter().enumerate() {
        let col = &zt[c * npad + first * LANES..c * npad + (first + B) * LANES];
        for (a, v) in acc.iter_mut().zip(col.chunks_exact(LANES)) {
            for l in 0..LANES {
                a[l] = x.mul_add(v[l], a[l]);
            }
        }
    }
    for (bb, a) in acc.iter().enumerate() {
        out[(first + bb) * LANES..(first + bb + 1) * LANES].copy_from_slice(a);
    }
}

/// `out[n×d] = s[n×n] · z[n×d]`: four rows of `out` by two column blocks of
/// eight at a time, so each `z_j` block is loaded once for four rows and eight
/// independent chains keep the adders busy. Every element sums over `j` in
/// ascending order.
#[inline]
fn sym_times<T: Scalar>(s: &[T], z: &[T], n: usize, d: usize, out: &mut [T]) {
    let blocks = d / LANES;
    let mut first = 0;
    while first < n {
        let take = (n - first).min(4);
        let mut cb = 0;
        while cb < blocks {
            let width = (blocks - cb).min(2);
            match (take, width) {
                (4, 2) => sym_block::<T, 4, 2>(s, z, (n, d), (first, cb), out),
                (4, _) => sym_block::<T, 4, 1>(s, z, (n, d), (first, cb), out),
                (3, 2) => sym_block::<T, 3, 2>(s, z, (n, d), (first, cb), out),
                (3, _) => sym_block::<T, 3, 1>(s, z, (n, d), (first, cb), out),
                (2, 2) => sym_block::<T, 2, 2>(s, z, (n, d), (first, cb), out),
                (2, _) => sym_block::<T, 2, 1>(s, z, (n, d), (first, cb), out),
                (_, 2) => sym_block::<T, 1, 2>(s, z, (n, d), (first, cb), out),
                _ => sym_block::<T, 1, 1>(s, z, (n, d), (first, cb), out),
            }
            cb += width;
        }
        for r in first..first + take {
            for c in blocks * LANES..d {
                let mut acc = T::ZERO;
                for j in 0..n {
                    acc = s[r * n + j].mul_add(z[j * d + c], acc);
                }
                out[r * d + c] = acc;
            }
        }
        first += take;
    }
}

/// Rows `first..first + R`, column blocks `cb..cb + B` of [`sym_times`].
#[inline(always)]
fn sym_block<T: Scalar, const R: usize, const B: usize>(
    s: &[T],
    z: &[T],
    (n, d): (usize, usize),
    (first, cb): (usize, usize),
    out: &mut [T],
) {
    let mut acc = [[[T::ZERO; LANES]; B]; R];
    for j in 0..n {
        let zj = &z[j * d + cb * LANES..j * d + (cb + B) * LANES];
        for (r, row) in acc.iter_mut().enumerate() {
            let sij = s[(first + r) * n + j];
            for (a, v) in row.iter_mut().zip(zj.chunks_exact(LANES)) {
                for l in 0..LANES {
                    a[l] = sij.mul_add(v[l], a[l]);
                }
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        let at = (first + r) * d + cb * LANES;
        for (b, a) in row.iter().enumerate() {
            out[at + b * LANES..at + (b + 1) * LANES].copy_from_slice(a);
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
    use crate::gradcheck::check_gradients;
    use tiderec_records::rng::normal_f64;

    /// `backward` against finite differences of `forward` (f64) for one shape.
    fn check_against_finite_differences(it: &DotInteraction, batch: usize, seed: u64) {
        let (d, fd) = (it.dim, it.num_sparse * it.dim);
        let dense: Vec<f64> = (0..batch * d).map(|i| normal_f64(seed, 0, i as u64, 0)).collect();
        let pooled: Vec<f64> = (0..batch * fd).map(|i| normal_f64(seed + 1, 0, i as u64, 0)).collect();
        let r: Vec<f64> = (0..batch * it.output_dim()).map(|i| normal_f64(seed + 2, 0, i as u64, 0)).collect();
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

    #[test]
    fn interaction_gradients_match_finite_differences() {
        for self_interaction in [false, true] {
            check_against_finite_differences(&DotInteraction { num_sparse: 3, dim: 4, self_interaction }, 2, 1);
        }
    }

    /// The blocked forward equals one dot product per pair, on shapes that
    /// exercise one to five column blocks, partial blocks and dims that are not
    /// a multiple of eight.
    #[test]
    fn forward_equals_the_pairwise_definition() {
        for (num_sparse, dim) in [(1, 4), (3, 16), (7, 8), (8, 5), (26, 16), (39, 12)] {
            for self_interaction in [false, true] {
                let it = DotInteraction { num_sparse, dim, self_interaction };
                let batch = 3;
                let dense: Vec<f64> = (0..batch * dim).map(|i| normal_f64(5, 0, i as u64, 0)).collect();
                let pooled: Vec<f64> = (0..batch * num_sparse * dim).map(|i| normal_f64(6, 0, i as u64, 0)).collect();
                let mut fast = vec![f64::NAN; batch * it.output_dim()];
                let mut reference = vec![0.0; batch * it.output_dim()];
                it.forward(&dense, &pooled, batch, &mut fast);
                it.forward_reference(&dense, &pooled, batch, &mut reference);
                for (k, (a, b)) in fast.iter().zip(&reference).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                        "{num_sparse}x{dim} {self_interaction} [{k}]: {a} vs {b}"
                    );
                }
            }
        }
    }

    /// The backward pass against finite differences on a shape with several
    /// row groups, a partial row group and a partial column block.
    #[test]
    fn backward_matches_finite_differences_on_wide_shapes() {
        check_against_finite_differences(&DotInteraction { num_sparse: 9, dim: 11, self_interaction: false }, 2, 7);
    }

    /// The blocked backward equals its definition bit for bit in `f32`: each
    /// vector's gradient `Σ_j S[i][j]·z_j` summed over `j` in ascending order,
    /// the dense vector's own gradient added last, on shapes with one to five
    /// column blocks, partial row groups and dims that are not a multiple of eight.
    #[test]
    fn backward_equals_the_definition_bit_for_bit() {
        for (num_sparse, dim) in [(1, 4), (3, 16), (7, 8), (8, 5), (26, 16), (39, 12), (4, 40)] {
            for self_interaction in [false, true] {
                let it = DotInteraction { num_sparse, dim, self_interaction };
                let (batch, n) = (3, num_sparse + 1);
                let value = |seed, i: usize| normal_f64(seed, 0, i as u64, 0) as f32;
                let dense: Vec<f32> = (0..batch * dim).map(|i| value(5, i)).collect();
                let pooled: Vec<f32> = (0..batch * num_sparse * dim).map(|i| value(6, i)).collect();
                let dout: Vec<f32> = (0..batch * it.output_dim()).map(|i| value(7, i)).collect();
                let (mut dd, mut dp) = (vec![f32::NAN; dense.len()], vec![f32::NAN; pooled.len()]);
                it.backward(&dense, &pooled, &dout, batch, &mut dd, &mut dp);
                for b in 0..batch {
                    let z = |i: usize| {
                        if i == 0 {
                            &dense[b * dim..(b + 1) * dim]
                        } else {
                            &pooled[(b * num_sparse + i - 1) * dim..(b * num_sparse + i) * dim]
                        }
                    };
                    let g = &dout[b * it.output_dim()..(b + 1) * it.output_dim()];
                    // S from the pairs' order: rows 1.., j < i (then i itself), ⟨z₀, z₀⟩ last.
                    let mut sym = vec![0.0f32; n * n];
                    let mut k = dim;
                    for i in 1..n {
                        for j in 0..i {
                            (sym[i * n + j], sym[j * n + i]) = (g[k], g[k]);
                            k += 1;
                        }
                        if self_interaction {
                            sym[i * n + i] = g[k] + g[k];
                            k += 1;
                        }
                    }
                    if self_interaction {
                        sym[0] = g[k] + g[k];
                    }
                    for i in 0..n {
                        for c in 0..dim {
                            let mut want = (0..n).fold(0.0f32, |acc, j| sym[i * n + j].mul_add(z(j)[c], acc));
                            let got = if i == 0 {
                                want += g[c];
                                dd[b * dim + c]
                            } else {
                                dp[(b * num_sparse + i - 1) * dim + c]
                            };
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{num_sparse}x{dim} {self_interaction} [{b}][{i}][{c}]"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The AVX-512 kernels equal the portable ones bit for bit, forward and
    /// backward, on shapes with one to three 16-column blocks, a partial row
    /// group, dims below, at and past one vector, and both self-interaction
    /// settings; the forward also equals the pairwise definition bit for bit.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_kernels_equal_the_portable_ones_bit_for_bit() {
        if !avx512::available() {
            eprintln!("skipped: this CPU has no AVX-512F (or TIDEREC_MAX_ISA caps it), so the kernels cannot run");
            return;
        }
        let shapes =
            [(1, 4), (3, 16), (7, 8), (8, 5), (15, 16), (16, 16), (26, 16), (39, 12), (4, 40), (33, 17), (26, 64)];
        for (num_sparse, dim) in shapes {
            for self_interaction in [false, true] {
                let it = DotInteraction { num_sparse, dim, self_interaction };
                let batch = 5;
                let value = |seed, i: usize| normal_f64(seed, 0, i as u64, 0) as f32;
                let dense: Vec<f32> = (0..batch * dim).map(|i| value(5, i)).collect();
                let pooled: Vec<f32> = (0..batch * num_sparse * dim).map(|i| value(6, i)).collect();
                let od = it.output_dim();
                let what = format!("{num_sparse}x{dim} self {self_interaction}");
                // One value past the outputs, so a store past them shows.
                let (mut fast, mut portable, mut reference) =
                    (vec![f32::NAN; batch * od + 1], vec![f32::NAN; batch * od], vec![f32::NAN; batch * od]);
                avx512::forward(&it, &dense, &pooled, batch, &mut fast);
                it.forward_portable(&dense, &pooled, batch, &mut portable);
                it.forward_reference(&dense, &pooled, batch, &mut reference);
                assert!(fast[batch * od].is_nan(), "{what}: forward wrote past its output");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast[..batch * od]), bits(&portable), "{what}: forward");
                assert_eq!(bits(&portable), bits(&reference), "{what}: forward against the definition");
                let dout: Vec<f32> = (0..batch * od).map(|i| value(7, i)).collect();
                let (mut dd, mut dp) = (vec![f32::NAN; dense.len() + 1], vec![f32::NAN; pooled.len() + 1]);
                let (mut pd, mut pp) = (vec![f32::NAN; dense.len()], vec![f32::NAN; pooled.len()]);
                avx512::backward(&it, (&dense, &pooled, &dout), batch, &mut dd, &mut dp);
                it.backward_portable(&dense, &pooled, &dout, batch, &mut pd, &mut pp);
                assert!(
                    dd[dense.len()].is_nan() && dp[pooled.len()].is_nan(),
                    "{what}: backward wrote past its output"
                );
                assert_eq!(bits(&dd[..dense.len()]), bits(&pd), "{what}: dense gradient");
                assert_eq!(bits(&dp[..pooled.len()]), bits(&pp), "{what}: pooled gradients");
            }
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
