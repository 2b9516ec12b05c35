//! The wide AVX-512 kernel ([`PanelKernel::Avx512Wide`](super::PanelKernel::Avx512Wide)):
//! a row group times every panel of a chunk, read as 16-column vectors four
//! at a time.
//!
//! A register block is `R` rows × `Z` vectors of 16 columns (six rows × four
//! vectors where four are left, eight × three, twelve × two or one), the
//! vectors taken from consecutive panels, so a block spans panels the
//! one-panel kernels visit apart. Each step loads `Z` panel vectors and
//! broadcasts `R` values of `a` for `R·Z` fused multiply-adds: at six × four,
//! ten loads per 24 FMAs, where the one-panel kernel's twelve × one loads
//! thirteen per twelve and so cannot keep two FMA ports busy.
//!
//! The split form ([`PanelKernel::Avx512WideSplit`](super::PanelKernel::Avx512WideSplit))
//! runs a chunk in parts of [`SPLIT_STEPS`](super::SPLIT_STEPS) steps, every block of the span
//! through one part before the next: a part of four panels (16 KiB) stays in
//! L1 while the span's row blocks read it, where a whole chunk's (up to 48
//! KiB) is read again from L2 by each block on a core whose L1 it overflows
//! beside the rows of `a`. Between parts a block's accumulators wait in a
//! scratch block of the span, stored and loaded whole, so each chain goes on
//! where it stopped.
//!
//! Invariants: every entry of `c` is one chain of fused multiply-adds over the
//! chunk's steps from zero, then one add to `c` when accumulating, exactly as
//! in the other vector kernels, so the results equal theirs bit for bit
//! (`tests::wide_kernel_equals_the_one_panel_kernels_bit_for_bit`). Only the
//! span's `width` columns of each panel are written (the last vector of the
//! last panel under a mask); a last panel a whole number of vectors does not
//! fill (8, 24 or 40 wide) runs on the one-panel AVX-512 kernel. The span's
//! [`Finish`] is done in registers as each block is written, with the
//! values of the scalar definitions (`tests::finish_in_registers_equals_finish_around`);
//! its column sums are added as each row of a block is written, and the
//! blocks of a column come in row order.

use super::{finish_around, panels, run_panel_f32, Finish, PanelKernel, PanelProduct, PanelSpan};
use std::arch::x86_64::*;

/// Columns per 512-bit vector.
const VECTOR: usize = 16;
/// Vectors per register block at most.
const MAX_Z: usize = 4;
/// Rows of a span at most (the drivers' row groups).
const SPAN_ROWS: usize = super::GROUP_ROWS;

/// A span's accumulators between the parts of the split form: row `r`'s
/// vector `z` of the group at `r · MAX_Z · VECTOR + z · VECTOR`.
#[repr(align(64))]
struct Carried(std::mem::MaybeUninit<[f32; SPAN_ROWS * MAX_Z * VECTOR]>);

/// Where a block's chains start and end within a chunk: from zero or from
/// the carried accumulators, into `c` or into them for the next part.
#[derive(Clone, Copy)]
struct Part {
    from: *const f32,
    to: *mut f32,
}

impl Part {
    /// A whole chunk: from zero into `c`.
    const WHOLE: Part = Part { from: std::ptr::null(), to: std::ptr::null_mut() };
}

/// Up to four 16-column vectors of consecutive columns, each read from its
/// panel: `(first value of the chunk's first step, stride between steps)`.
#[derive(Clone, Copy)]
struct Group {
    vectors: [(*const f32, usize); MAX_Z],
    count: usize,
    /// Column of `c` of the first vector.
    first: usize,
    /// Columns written of the last vector (1 to 16).
    last_lanes: usize,
}

/// The span's operands as pointers, bounds checked by the span's driver.
#[derive(Clone, Copy)]
struct Rows {
    k: usize,
    a: *const f32,
    lda: usize,
    a_step: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    /// The span's [`Finish`]: the row added in place of `c` (null: none), the
    /// ReLU, the mask laid out as `c` (null: none), the column sums (null: none;
    /// `Cell`s, so written through a pointer from a shared slice).
    row: *const f32,
    relu: bool,
    mask: *const f32,
    sums: *mut f32,
    /// Steps per part of a chunk (the chunk's length: not split).
    split: usize,
}

/// [`PanelSpan`]'s product on the wide kernel (the CPU runs AVX-512F: the
/// caller checked [`PanelKernel::available`](super::PanelKernel::available)),
/// its chunk in parts of `split` steps (`usize::MAX`: whole).
pub(super) fn span_product(span: PanelSpan<'_, f32>, split: usize) {
    let PanelSpan { rows, k, a, lda, a_step, panels: b, k0, c, ldc, accumulate, finish } = span;
    let (_, n) = b.shape();
    if rows == 0 || k == 0 || n == 0 {
        // The driver never hands out an empty span; nothing to write if it did.
        return;
    }
    assert!(a.len() > (rows - 1) * lda + (k - 1) * a_step, "wide kernel: a too short");
    assert!(c.len() >= (rows - 1) * ldc + n, "wide kernel: c too short");
    assert!(finish.row.is_none_or(|row| row.len() >= n), "wide kernel: row too short");
    assert!(finish.mask.is_none_or(|mask| mask.len() >= (rows - 1) * ldc + n), "wide kernel: mask too short");
    assert!(finish.sums.is_none_or(|sums| sums.len() >= n), "wide kernel: sums too short");
    assert!(rows <= SPAN_ROWS && split > 0, "wide kernel: a span of {rows} rows, parts of {split} steps");
    let Finish { row, relu, mask, sums } = finish;
    let (row, mask) = (row.map_or(std::ptr::null(), <[f32]>::as_ptr), mask.map_or(std::ptr::null(), <[f32]>::as_ptr));
    let sums = sums.map_or(std::ptr::null_mut(), |sums| sums.as_ptr().cast::<f32>().cast_mut());
    let ops = Rows { k, a: a.as_ptr(), lda, a_step, c: c.as_mut_ptr(), ldc, accumulate, row, relu, mask, sums, split };
    let mut group = Group { vectors: [(std::ptr::null(), 0); MAX_Z], count: 0, first: 0, last_lanes: VECTOR };
    // A panel 8, 24 or 40 wide is not whole vectors: only the last panel can be.
    let mut ragged = None;
    for (first, pw) in panels(n) {
        if !pw.is_multiple_of(VECTOR) {
            ragged = Some((first, pw));
            break;
        }
        let width = pw.min(n - first);
        let (panel, rs) = b.rows(first, pw, k0, k);
        assert!(panel.len() >= (k - 1) * rs + pw, "wide kernel: panel too short");
        for v in 0..pw / VECTOR {
            if group.count == MAX_Z {
                // SAFETY: AVX-512F present (caller); the asserts bound every access.
                unsafe { flush(&ops, rows, &mut group) };
            }
            if group.count == 0 {
                group.first = first + VECTOR * v;
            }
            // SAFETY: v·16 < pw: inside the panel's first step.
            group.vectors[group.count] = (unsafe { panel.as_ptr().add(VECTOR * v) }, rs);
            group.count += 1;
            group.last_lanes = (width - VECTOR * v).min(VECTOR);
        }
    }
    // SAFETY: as above.
    unsafe { flush(&ops, rows, &mut group) };
    if let Some((first, pw)) = ragged {
        let (panel, panel_rs) = b.rows(first, pw, k0, k);
        let c = &mut c[first..];
        let width = pw.min(n - first);
        let p = PanelProduct { rows, k, a, lda, a_step, panel, panel_rs, pw, c, ldc, width, accumulate };
        finish_around(p, first, finish, |p| run_panel_f32(PanelKernel::Avx512, p));
    }
}

/// Runs the collected vectors over every row of the span and empties the
/// group: the whole chunk, or its parts in order (every row block through
/// one part before the next).
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
unsafe fn flush(ops: &Rows, rows: usize, group: &mut Group) {
    if group.count == 0 {
        return;
    }
    if ops.k <= ops.split {
        blocks(ops, rows, group, Part::WHOLE);
    } else {
        // Not cleared: every part splits the rows into the same blocks, and a
        // block reads back only what it stored in the part before.
        let mut carried = Carried(std::mem::MaybeUninit::uninit());
        let at = carried.0.as_mut_ptr().cast::<f32>();
        let mut first = 0;
        while first < ops.k {
            let steps = ops.split.min(ops.k - first);
            let part = Rows { k: steps, a: ops.a.add(first * ops.a_step), ..*ops };
            let mut vectors = *group;
            for (base, rs) in vectors.vectors.iter_mut().take(vectors.count) {
                *base = base.add(first * *rs);
            }
            let from = if first == 0 { std::ptr::null() } else { at.cast_const() };
            let to = if first + steps < ops.k { at } else { std::ptr::null_mut() };
            blocks(&part, rows, &vectors, Part { from, to });
            first += steps;
        }
    }
    group.count = 0;
}

/// Every row block of the span, for the group's vectors and one part.
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
unsafe fn blocks(ops: &Rows, rows: usize, group: &Group, part: Part) {
    match group.count {
        0 => {}
        1 => by_rows::<12, 1>(ops, rows, group, part),
        2 => by_rows::<12, 2>(ops, rows, group, part),
        3 => by_rows::<8, 3>(ops, rows, group, part),
        _ => by_rows::<6, 4>(ops, rows, group, part),
    }
}

/// Blocks of `R` rows, then the rest as blocks of 8, 4, 2 and 1.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
unsafe fn by_rows<const R: usize, const Z: usize>(ops: &Rows, rows: usize, group: &Group, part: Part) {
    let mut i = 0;
    while i + R <= rows {
        block::<R, Z>(ops, group, i, part);
        i += R;
    }
    let mut rest = rows - i;
    for size in [8, 4, 2, 1] {
        if size < R && rest >= size {
            match size {
                8 => block::<8, Z>(ops, group, i, part),
                4 => block::<4, Z>(ops, group, i, part),
                2 => block::<2, Z>(ops, group, i, part),
                _ => block::<1, Z>(ops, group, i, part),
            }
            i += size;
            rest -= size;
        }
    }
}

/// One step of a block: row `p` of the `Z` vectors times column `p` of the `R` rows.
#[inline(always)]
unsafe fn step<const R: usize, const Z: usize>(
    acc: &mut [[__m512; Z]; R],
    a: *const f32,
    (lda, a_step): (usize, usize),
    vectors: &[(*const f32, usize); MAX_Z],
    p: usize,
) {
    let mut b = [_mm512_setzero_ps(); Z];
    for (z, v) in b.iter_mut().enumerate() {
        let (base, rs) = vectors[z];
        *v = _mm512_loadu_ps(base.add(p * rs));
    }
    for (r, row) in acc.iter_mut().enumerate() {
        let s = _mm512_set1_ps(*a.add(r * lda + p * a_step));
        for (x, &v) in row.iter_mut().zip(&b) {
            *x = _mm512_fmadd_ps(s, v, *x);
        }
    }
}

/// `R` rows from row `i` times the group's `Z` vectors, into `c` (or, for a
/// part before the last, into the carried accumulators).
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
unsafe fn block<const R: usize, const Z: usize>(ops: &Rows, group: &Group, i: usize, part: Part) {
    let Rows { k, lda, a_step, ldc, accumulate, .. } = *ops;
    let a = ops.a.add(i * lda);
    let mut acc = [[_mm512_setzero_ps(); Z]; R];
    if !part.from.is_null() {
        for (r, row) in acc.iter_mut().enumerate() {
            for (z, x) in row.iter_mut().enumerate() {
                *x = _mm512_load_ps(part.from.add(((i + r) * MAX_Z + z) * VECTOR));
            }
        }
    }
    let strides = (lda, a_step);
    let mut p = 0;
    while p + 4 <= k {
        step::<R, Z>(&mut acc, a, strides, &group.vectors, p);
        step::<R, Z>(&mut acc, a, strides, &group.vectors, p + 1);
        step::<R, Z>(&mut acc, a, strides, &group.vectors, p + 2);
        step::<R, Z>(&mut acc, a, strides, &group.vectors, p + 3);
        p += 4;
    }
    while p < k {
        step::<R, Z>(&mut acc, a, strides, &group.vectors, p);
        p += 1;
    }
    if !part.to.is_null() {
        for (r, row) in acc.iter().enumerate() {
            for (z, &x) in row.iter().enumerate() {
                _mm512_store_ps(part.to.add(((i + r) * MAX_Z + z) * VECTOR), x);
            }
        }
        return;
    }
    if !ops.row.is_null() || ops.relu || !ops.mask.is_null() || !ops.sums.is_null() {
        return write(ops, group, i, acc);
    }
    // A plain sum (no finish on this chunk) is written inline: handing the
    // accumulators to `write` copies them through memory, one more pass per
    // block that a short reduction (a recurrence's products) would feel.
    let mask: __mmask16 = if group.last_lanes == VECTOR { !0 } else { (1u16 << group.last_lanes) - 1 };
    let c = ops.c.add(i * ldc + group.first);
    for (r, row) in acc.iter().enumerate() {
        let out = c.add(r * ldc);
        for (z, &x) in row.iter().enumerate() {
            let o = out.add(VECTOR * z);
            if z + 1 < Z || mask == !0 {
                let x = if accumulate { _mm512_add_ps(x, _mm512_loadu_ps(o)) } else { x };
                _mm512_storeu_ps(o, x);
            } else {
                let x = if accumulate { _mm512_add_ps(x, _mm512_maskz_loadu_ps(mask, o)) } else { x };
                _mm512_mask_storeu_ps(o, mask, x);
            }
        }
    }
}

/// Writes a block's sums into `c` (rows from `i`) with the span's
/// accumulation and [`Finish`]. Apart from [`block`], and never inlined into
/// it: the finish's values would otherwise take registers the reduction loop
/// needs (spilling accumulators there cost two thirds of its speed).
#[inline(never)]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
unsafe fn write<const R: usize, const Z: usize>(ops: &Rows, group: &Group, i: usize, acc: [[__m512; Z]; R]) {
    let Rows { ldc, accumulate, .. } = *ops;
    let lanes: __mmask16 = if group.last_lanes == VECTOR { !0 } else { (1u16 << group.last_lanes) - 1 };
    let at = i * ldc + group.first;
    let zero = _mm512_setzero_ps();
    // Every vector but a last one under `lanes` loads and stores whole.
    let lanes_of = |z: usize| if z + 1 < Z { !0 } else { lanes };
    // The column sums stay in registers over the block's rows, added row after
    // row as `sums += row` over the finished rows adds them.
    let mut sums = [zero; Z];
    if !ops.sums.is_null() {
        for (z, s) in sums.iter_mut().enumerate() {
            *s = load(ops.sums.add(group.first + VECTOR * z), lanes_of(z));
        }
    }
    for (r, acc_row) in acc.iter().enumerate() {
        for (z, &x) in acc_row.iter().enumerate() {
            let o = ops.c.add(at + r * ldc + VECTOR * z);
            let lanes = lanes_of(z);
            let mut x = if accumulate {
                _mm512_add_ps(x, load(o, lanes))
            } else if !ops.row.is_null() {
                _mm512_add_ps(x, load(ops.row.add(group.first + VECTOR * z), lanes))
            } else {
                x
            };
            if ops.relu {
                // `(0 > x) ? 0 : x` keeps NaN, then `+ 0` turns -0 into +0: `relu_in_place`.
                x = _mm512_add_ps(_mm512_max_ps(zero, x), zero);
            }
            if !ops.mask.is_null() {
                // Kept where the mask is not `<= 0` (NaN included), as `x + 0`: `relu_backward_in_place`.
                let keep =
                    _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(load(ops.mask.add(at + r * ldc + VECTOR * z), lanes), zero);
                x = _mm512_maskz_add_ps(keep, x, zero);
            }
            store(o, x, lanes);
            if !ops.sums.is_null() {
                sums[z] = _mm512_add_ps(sums[z], x);
            }
        }
    }
    if !ops.sums.is_null() {
        for (z, &s) in sums.iter().enumerate() {
            store(ops.sums.add(group.first + VECTOR * z), s, lanes_of(z));
        }
    }
}

/// Stores the 16 values at `p`, or those of `lanes`.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
unsafe fn store(p: *mut f32, x: __m512, lanes: __mmask16) {
    if lanes == !0 {
        _mm512_storeu_ps(p, x);
    } else {
        _mm512_mask_storeu_ps(p, lanes, x);
    }
}

/// The 16 values at `p`, or those of `lanes` (the rest zero, never read).
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
unsafe fn load(p: *const f32, lanes: __mmask16) -> __m512 {
    if lanes == !0 {
        _mm512_loadu_ps(p)
    } else {
        _mm512_maskz_loadu_ps(lanes, p)
    }
}
