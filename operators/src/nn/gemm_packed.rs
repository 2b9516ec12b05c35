//! GEMM against a right-hand operand packed once and reused many times: the
//! weight-stationary products of a recurrence (`h · W_hhᵀ` every time step,
//! `dG · W_hh` every step of back-propagation) and the skinny input-side
//! products beside them.
//!
//! [`PackedRhs`] stores `op(b)` (`k × n`) as column panels of
//! [`PANEL`] columns, each panel `k` rows of `PANEL` contiguous values, the
//! last one zero-padded. [`gemm_packed`] streams the rows of `a` as stored
//! (no copy) and accumulates each `rows × PANEL` block of `c` in registers
//! (AVX2 + FMA: 6 × 16 `f32`, twelve accumulators), so a product of a few
//! dozen columns pays neither the packing of both operands nor the edge
//! handling that a general GEMM pays on every call.
//!
//! Invariants: a `PackedRhs` built from `b` holds exactly `op(b)`'s values
//! (padding is zero and never reaches `c`); [`gemm_packed`] writes only the
//! `m × n` entries of `c`. The oracle is [`gemm_reference`](super::gemm::gemm_reference).

use super::gemm::Op;
use super::Scalar;

/// Columns per panel of a [`PackedRhs`] (two AVX2 vectors of `f32`).
pub const PANEL: usize = 16;
/// Rows of `c` per register block of [`gemm_packed`].
pub const BLOCK_ROWS: usize = 6;

/// `op(b)` (`k × n`) packed into zero-padded column panels for [`gemm_packed`].
#[derive(Clone, Debug, Default)]
pub struct PackedRhs<T> {
    k: usize,
    n: usize,
    panels: Vec<T>,
}

impl<T: Scalar> PackedRhs<T> {
    /// Packs `op(b)`: `b` is stored `k × n` for [`Op::N`], `n × k` for [`Op::T`].
    ///
    /// # Panics
    /// When `b` is shorter than its shape requires.
    pub fn new(op: Op, k: usize, n: usize, b: &[T]) -> Self {
        let mut packed = PackedRhs::default();
        packed.pack(op, k, n, b);
        packed
    }

    /// Re-packs into this buffer (no allocation once it is large enough).
    pub fn pack(&mut self, op: Op, k: usize, n: usize, b: &[T]) {
        assert!(b.len() >= k * n, "PackedRhs: b has {} values, needs {}", b.len(), k * n);
        let panels = n.div_ceil(PANEL);
        self.k = k;
        self.n = n;
        self.panels.clear();
        self.panels.resize(panels * k * PANEL, T::ZERO);
        if k == 0 {
            return;
        }
        for (q, panel) in self.panels.chunks_exact_mut(k * PANEL).enumerate() {
            let first = q * PANEL;
            let width = PANEL.min(n - first);
            for p in 0..k {
                let row = &mut panel[p * PANEL..p * PANEL + width];
                match op {
                    Op::N => row.copy_from_slice(&b[p * n + first..p * n + first + width]),
                    Op::T => {
                        for (j, v) in row.iter_mut().enumerate() {
                            *v = b[(first + j) * k + p];
                        }
                    }
                }
            }
        }
    }

    /// Rows of `op(b)`.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Columns of `op(b)`.
    pub fn n(&self) -> usize {
        self.n
    }
}

/// `c[m×n] = a[m×k] · op(b) (+ c when accumulate)`: row `i` of `a` starts at
/// `a[i·lda]` (`k` values), row `i` of `c` at `c[i·ldc]` (`n` values), so rows
/// may be strided (a time step of batch-major sequences).
///
/// # Panics
/// When `a` or `c` is shorter than its shape requires, or a stride is shorter than a row.
pub fn gemm_packed<T: Scalar>(m: usize, a: &[T], lda: usize, b: &PackedRhs<T>, accumulate: bool, c: &mut [T], ldc: usize) {
    let (k, n) = (b.k, b.n);
    if m == 0 || n == 0 {
        return;
    }
    assert!(lda >= k && ldc >= n, "gemm_packed: strides {lda}, {ldc} shorter than rows {k}, {n}");
    assert!(a.len() >= (m - 1) * lda + k, "gemm_packed: a has {} values, needs {}", a.len(), (m - 1) * lda + k);
    assert!(c.len() >= (m - 1) * ldc + n, "gemm_packed: c has {} values, needs {}", c.len(), (m - 1) * ldc + n);
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                c[i * ldc..i * ldc + n].fill(T::ZERO);
            }
        }
        return;
    }
    // Row blocks outside, panels inside: a block's rows of `a` stay in L1 while
    // every panel passes (the panels of a recurrence's weight fit in L1 too).
    let mut i = 0;
    while i < m {
        let rows = BLOCK_ROWS.min(m - i);
        let a_rows = &a[i * lda..(i + rows - 1) * lda + k];
        for (q, panel) in b.panels.chunks_exact(k * PANEL).enumerate() {
            let first = q * PANEL;
            let width = PANEL.min(n - first);
            T::packed_block(rows, k, a_rows, lda, panel, &mut c[i * ldc + first..], ldc, width, accumulate);
        }
        i += rows;
    }
}

/// The portable [`Scalar::packed_block`]: `c[r·ldc + j] (+)= Σ_p a[r·lda + p] · panel[p·PANEL + j]`
/// for `r < rows`, `j < width`.
#[allow(clippy::too_many_arguments)]
pub fn packed_block_portable<T: Scalar>(
    rows: usize,
    k: usize,
    a: &[T],
    lda: usize,
    panel: &[T],
    c: &mut [T],
    ldc: usize,
    width: usize,
    accumulate: bool,
) {
    let mut block = [[T::ZERO; PANEL]; BLOCK_ROWS];
    for p in 0..k {
        let brow = &panel[p * PANEL..(p + 1) * PANEL];
        for (r, out) in block.iter_mut().enumerate().take(rows) {
            let av = a[r * lda + p];
            for (x, &bv) in out.iter_mut().zip(brow) {
                *x += av * bv;
            }
        }
    }
    for (r, out) in block.iter().enumerate().take(rows) {
        for (o, &x) in c[r * ldc..r * ldc + width].iter_mut().zip(out) {
            *o = if accumulate { *o + x } else { x };
        }
    }
}

/// [`Scalar::packed_block`] for `f32`: AVX2 + FMA when the CPU has them.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(super) fn packed_block_f32(
    rows: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    panel: &[f32],
    c: &mut [f32],
    ldc: usize,
    width: usize,
    accumulate: bool,
) {
    assert!(rows <= BLOCK_ROWS && width <= PANEL && lda >= k && panel.len() >= k * PANEL);
    assert!(rows == 0 || a.len() >= (rows - 1) * lda + k, "packed_block: a too short");
    assert!(rows == 0 || c.len() >= (rows - 1) * ldc + width, "packed_block: c too short");
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA; the asserts bound every access.
        unsafe {
            let (a, b, cp) = (a.as_ptr(), panel.as_ptr(), c.as_mut_ptr());
            match rows {
                6 => avx2::block::<6>(k, a, lda, b, cp, ldc, width, accumulate),
                5 => avx2::block::<5>(k, a, lda, b, cp, ldc, width, accumulate),
                4 => avx2::block::<4>(k, a, lda, b, cp, ldc, width, accumulate),
                3 => avx2::block::<3>(k, a, lda, b, cp, ldc, width, accumulate),
                2 => avx2::block::<2>(k, a, lda, b, cp, ldc, width, accumulate),
                1 => avx2::block::<1>(k, a, lda, b, cp, ldc, width, accumulate),
                _ => {}
            }
        }
        return;
    }
    packed_block_portable(rows, k, a, lda, panel, c, ldc, width, accumulate)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::PANEL;
    use std::arch::x86_64::*;

    /// `R × 16` block: `R` rows of `a` (stride `lda`) times one panel, into `c` (stride `ldc`).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn block<const R: usize>(
        k: usize,
        a: *const f32,
        lda: usize,
        panel: *const f32,
        c: *mut f32,
        ldc: usize,
        width: usize,
        accumulate: bool,
    ) {
        let mut lo = [_mm256_setzero_ps(); R];
        let mut hi = [_mm256_setzero_ps(); R];
        for p in 0..k {
            let b0 = _mm256_loadu_ps(panel.add(p * PANEL));
            let b1 = _mm256_loadu_ps(panel.add(p * PANEL + 8));
            for r in 0..R {
                let av = _mm256_broadcast_ss(&*a.add(r * lda + p));
                lo[r] = _mm256_fmadd_ps(av, b0, lo[r]);
                hi[r] = _mm256_fmadd_ps(av, b1, hi[r]);
            }
        }
        if width == PANEL {
            for r in 0..R {
                let row = c.add(r * ldc);
                let (mut x, mut y) = (lo[r], hi[r]);
                if accumulate {
                    x = _mm256_add_ps(x, _mm256_loadu_ps(row));
                    y = _mm256_add_ps(y, _mm256_loadu_ps(row.add(8)));
                }
                _mm256_storeu_ps(row, x);
                _mm256_storeu_ps(row.add(8), y);
            }
        } else {
            let mut tmp = [0.0f32; PANEL];
            for r in 0..R {
                _mm256_storeu_ps(tmp.as_mut_ptr(), lo[r]);
                _mm256_storeu_ps(tmp.as_mut_ptr().add(8), hi[r]);
                let row = c.add(r * ldc);
                for (j, &v) in tmp.iter().enumerate().take(width) {
                    let o = row.add(j);
                    *o = if accumulate { *o + v } else { v };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::gemm::gemm_reference;
    use proptest::prelude::*;

    fn check<T: Scalar>(m: usize, n: usize, k: usize, transposed: bool, accumulate: bool, seed: u64, tol: f64) {
        let val = |i: usize| T::from_f64(crate::rng::unit_f64(seed, i as u64, 0, 0) - 0.5);
        let a: Vec<T> = (0..m * k).map(val).collect();
        let b: Vec<T> = (0..k * n).map(|i| val(i + 100_000)).collect();
        let c0: Vec<T> = (0..m * n).map(|i| val(i + 200_000)).collect();
        let op = if transposed { Op::T } else { Op::N };
        let packed = PackedRhs::new(op, k, n, &b);
        let (mut c1, mut c2) = (c0.clone(), c0.clone());
        gemm_packed(m, &a, k, &packed, accumulate, &mut c1, n);
        let beta = if accumulate { T::ONE } else { T::ZERO };
        gemm_reference(Op::N, op, m, n, k, T::ONE, &a, &b, beta, &mut c2);
        for (x, y) in c1.iter().zip(&c2) {
            assert!((x.to_f64() - y.to_f64()).abs() <= tol, "{x:?} vs {y:?} at {m}x{n}x{k}");
        }
    }

    proptest! {
        #[test]
        fn packed_gemm_matches_reference_f64(m in 0usize..15, n in 0usize..40, k in 0usize..9, t in any::<bool>(), acc in any::<bool>(), seed in any::<u64>()) {
            check::<f64>(m, n, k, t, acc, seed, 1e-12);
        }

        #[test]
        fn packed_gemm_matches_reference_f32(m in 0usize..15, n in 0usize..40, k in 0usize..40, t in any::<bool>(), acc in any::<bool>(), seed in any::<u64>()) {
            check::<f32>(m, n, k, t, acc, seed, 1e-4);
        }
    }

    #[test]
    fn strided_rows_are_read_and_written_in_place() {
        // Rows of a and c spaced wider than a row (a time step of batch-major sequences).
        let (m, n, k, lda, ldc) = (9, 20, 7, 13, 25);
        let val = |i: usize| crate::rng::unit_f64(3, i as u64, 0, 0) - 0.5;
        let a: Vec<f64> = (0..(m - 1) * lda + k).map(val).collect();
        let b: Vec<f64> = (0..k * n).map(|i| val(i + 1000)).collect();
        let mut c: Vec<f64> = (0..(m - 1) * ldc + n).map(|i| val(i + 2000)).collect();
        let before = c.clone();
        gemm_packed(m, &a, lda, &PackedRhs::new(Op::N, k, n, &b), true, &mut c, ldc);
        for (idx, (&got, &was)) in c.iter().zip(&before).enumerate() {
            let (i, j) = (idx / ldc, idx % ldc);
            let want = if j < n { was + (0..k).map(|p| a[i * lda + p] * b[p * n + j]).sum::<f64>() } else { was };
            assert!((got - want).abs() < 1e-12, "c[{i}][{j}]: {got} vs {want}");
        }
    }

    #[test]
    fn recurrence_shapes_match_reference() {
        for (m, n, k) in [(256, 108, 36), (64, 96, 32), (256, 36, 108), (7, 144, 72)] {
            check::<f32>(m, n, k, true, true, 7, 1e-4);
            check::<f32>(m, n, k, false, false, 8, 1e-4);
        }
    }
}
