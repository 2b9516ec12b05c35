//! Backward products on the packed kernels in matrixmultiply's summation
//! order: runs of [`MM_KC`] reduction steps, each a chain of fused
//! multiply-adds from zero, added to `c` in order, so a start-up measurement
//! may choose between them and matrixmultiply without changing a value.
//!
//! Invariants: [`gemm_mm_order_in_place`] and [`gemm_mm_order_f32`] (in
//! place or with `b` copied a run at a time) equal matrixmultiply's `sgemm`
//! bit for bit where it runs an FMA kernel and `m, n > 1`
//! (`tests::mm_order_equals_matrixmultiply_bit_for_bit`); only the `m × n`
//! entries of `c` are written.

use super::{gemm_packed_chunks, packed_span_f32_with, panels, Finish, PackedRhs, PanelKernel, Panels};
use std::cell::Cell;

/// Reduction steps per pass of matrixmultiply's `f32` kernels (its `kc`, 256
/// unless the crate was built with `MATMUL_SGEMM_KC` set):
/// [`gemm_mm_order_in_place`] splits the sums where matrixmultiply does.
pub(crate) const MM_KC: usize = 256;

/// `c[m×n] = op(a) · b` (overwriting `c`) in the summation order of
/// matrixmultiply's fused multiply-add kernels: every entry is a chain of
/// fused multiply-adds from zero over each run of [`MM_KC`] reduction steps,
/// the runs' sums added to `c` in order; then, with a `mask` (laid out as
/// `c`), each entry zeroed where the mask is not positive, as
/// [`relu_backward_in_place`](crate::relu::relu_backward_in_place) does (a
/// `dx` passed back through the ReLU below the layer); then, with `sums`,
/// each finished row added to it, rows in order ([`Finish::sums`]: from
/// zero, the column sums of `c`). `b` (`k × n`, rows `ldb` apart) is
/// read where it lies, with no copy (a layer's weight in the backward
/// `dx = dy·W`, its input in `dW = dyᵀ·x`): every full panel is read in
/// place; a last panel narrower than its width (`n` not a multiple of eight)
/// is packed into `tail` (`k` rows of at most 40 values), since reading it in
/// place would read past the end of `b`. `op(a)` is `m × k`, read where it
/// lies: row `i`, step `p` at `a[i·lda + p·a_step]` (`lda = k, a_step = 1`
/// for `a` stored `m × k`; `lda = 1, a_step = m` for `a` stored `k × m`, a
/// weight gradient's `dyᵀ`).
///
/// The results equal `gemm(op, Op::N, …, beta = 0)` bit for bit wherever
/// matrixmultiply runs an FMA kernel (x86-64 with FMA or AVX-512) and
/// `m, n > 1` (`tests::mm_order_equals_matrixmultiply_bit_for_bit`).
///
/// # Panics
/// When an operand is shorter than its shape requires, `ldb < n`, or the CPU does not run `kernel`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_mm_order_in_place(
    kernel: PanelKernel,
    m: usize,
    a: &[f32],
    lda: usize,
    a_step: usize,
    (k, n, b, ldb): (usize, usize, &[f32], usize),
    tail: &mut PackedRhs<f32>,
    (c, mask, sums): MmOrderCells<'_>,
    ldc: usize,
) {
    assert!(ldb >= n, "gemm_mm_order_in_place: stride {ldb} shorter than a row of {n}");
    assert!(k == 0 || n == 0 || b.len() >= (k - 1) * ldb + n, "gemm_mm_order_in_place: b too short");
    let (last_first, last_pw) = panels(n).last().unwrap_or((0, 0));
    let tail_first = if n - last_first < last_pw {
        tail.pack_columns(k, last_first, n - last_first, b, ldb);
        last_first
    } else {
        n
    };
    let operands = (Panels::InPlace { k, n, b, ldb, tail, tail_first }, false, Finish { mask, sums, ..Finish::NONE });
    gemm_packed_chunks(m, a, lda, a_step, operands, c, ldc, MM_KC, &mut |s| packed_span_f32_with(kernel, s))
}

/// What a backward product in matrixmultiply's order writes: `c`, the ReLU
/// mask laid out as `c` that zeroes it (if any), and where the column sums
/// of `c` as written are added, rows in order (if anywhere).
pub type MmOrderOut<'a, T> = (&'a mut [T], Option<&'a [T]>, Option<&'a mut [T]>);

/// [`MmOrderOut`] with the sums as cells, as a [`Finish`] holds them.
type MmOrderCells<'a> = (&'a mut [f32], Option<&'a [f32]>, Option<&'a [Cell<f32>]>);

/// How a backward product in matrixmultiply's order runs on the packed
/// kernels: the panel kernel, and whether `b` is read in place or copied a
/// run at a time (`gemm_mm_order_f32`). Every choice gives the same sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmOrderKernel {
    /// The panel kernel.
    pub kernel: PanelKernel,
    /// Whether `b` is copied into panels a run at a time.
    pub copy_b: bool,
}

/// [`gemm_mm_order_in_place`]'s product on `choice.kernel`; with
/// `choice.copy_b`, `b` is copied into `scratch` one run of [`MM_KC`] rows
/// at a time (every column of the run, as zero-padded panels) and each run's
/// panels are read from there: the same chains of fused multiply-adds and the
/// same adds to `c` as reading `b` in place, so equal bit for bit, and to
/// matrixmultiply (`tests::mm_order_equals_matrixmultiply_bit_for_bit`).
///
/// Reading in place, a 64-column block of `b`'s rows lies on lines one row
/// stride apart; with a stride of a power of two (a layer 512 wide is 2 KiB) a
/// run's lines fall into a few sets of the L1 cache and evict each other, so
/// every step reads `b` from L2. The copied panels are contiguous and stay
/// in L1; the copy is one pass over `b` per product, worth it where many rows
/// of `a` reuse each run (DLRM's top MLP at 2,048 rows on a Sapphire Rapids
/// core, `docs/benchmarks.md`) and not where few do (a `dW` into 64 outputs,
/// a `dx` at 128 rows): the start-up measurement chooses.
///
/// # Panics
/// As [`gemm_mm_order_in_place`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_mm_order_f32(
    choice: MmOrderKernel,
    m: usize,
    a: &[f32],
    lda: usize,
    a_step: usize,
    (k, n, b, ldb): (usize, usize, &[f32], usize),
    scratch: &mut PackedRhs<f32>,
    (c, mask, sums): MmOrderOut<'_, f32>,
    ldc: usize,
) {
    let kernel = choice.kernel;
    let sums = sums.map(|sums| Cell::from_mut(sums).as_slice_of_cells());
    if !choice.copy_b || k == 0 {
        // In place (with no run to copy, the in-place product writes the zeros, the mask and the sums).
        return gemm_mm_order_in_place(kernel, m, a, lda, a_step, (k, n, b, ldb), scratch, (c, mask, sums), ldc);
    }
    assert!(ldb >= n, "gemm_mm_order: stride {ldb} shorter than a row of {n}");
    assert!(n == 0 || b.len() >= (k - 1) * ldb + n, "gemm_mm_order: b too short");
    for k0 in (0..k).step_by(MM_KC) {
        let kc = MM_KC.min(k - k0);
        scratch.pack_columns(kc, 0, n, &b[k0 * ldb..], ldb);
        // Each run's chains from zero, added to `c` after the first run; the
        // mask and the sums on the last, as the in-place product's chunks do.
        let last = k0 + kc == k;
        let finish = Finish { mask: mask.filter(|_| last), sums: sums.filter(|_| last), ..Finish::NONE };
        let a = &a[k0 * a_step..];
        let operands = (Panels::Packed(scratch), k0 > 0, finish);
        gemm_packed_chunks(m, a, lda, a_step, operands, &mut *c, ldc, kc, &mut |s| packed_span_f32_with(kernel, s));
    }
}
