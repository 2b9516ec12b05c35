use std::arch::x86_64::*;

/// Writes the transpose of the 8 × 8 tile at `src` (rows `lds` apart) to
/// `dst` (rows `ldd` apart): `dst[r·ldd + q] = src[q·lds + r]`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose_tile(src: *const f32, lds: usize, dst: *mut f32, ldd: usize) {
    let r: [__m256; 8] = std::array::from_fn(|q| _mm256_loadu_ps(src.add(q * lds)));
    // Interleave pairs of rows, then pairs of pairs, then swap 128-bit halves.
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0b01_00_01_00>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0b11_10_11_10>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0b01_00_01_00>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0b11_10_11_10>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0b01_00_01_00>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0b11_10_11_10>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0b01_00_01_00>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0b11_10_11_10>(t5, t7);
    let out = [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ];
    for (i, v) in out.iter().enumerate() {
        _mm256_storeu_ps(dst.add(i * ldd), *v);
    }
}

/// A [`PanelProduct`](super::PanelProduct) as pointers, bounds checked by the caller.
pub(super) struct Raw {
    pub rows: usize,
    pub k: usize,
    pub a: *const f32,
    pub lda: usize,
    pub a_step: usize,
    pub panel: *const f32,
    pub panel_rs: usize,
    pub c: *mut f32,
    pub ldc: usize,
    pub width: usize,
    pub accumulate: bool,
}

impl Raw {
    /// The `width` columns of the panel from column `first` on (a multiple
    /// of eight, inside the panel), as a panel of their own: the same
    /// rows of `a`, the panel's rows from that column, `c` from that column.
    /// Each entry's chain of multiply-adds does not depend on which columns
    /// share a block, so a panel run in parts gives the whole panel's values.
    pub(super) fn columns(&self, first: usize, width: usize) -> Raw {
        debug_assert!(first.is_multiple_of(super::LANES) && first + width <= self.width);
        // SAFETY (of the offsets): `first` is inside the panel's row and `c`'s block.
        unsafe { Raw { panel: self.panel.add(first), c: self.c.add(first), width, ..*self } }
    }
}

/// How a block's values of `a` lie, a kernel's `L`: a row's values next
/// to each other (`a_step = 1`, `a` as stored), the rows next to each other
/// (`lda = 1`, `a` transposed), or neither. Each is its own loop, so that
/// in the first two every address a step loads is a constant displacement
/// from registers that stay fixed through the loop (the row starts and the
/// step's offset, or the step's start).
pub(super) const UNIT_STEP: u8 = 0;
pub(super) const UNIT_ROW: u8 = 1;
pub(super) const STRIDED: u8 = 2;

/// One module of register-blocked kernels compiled for `$features`, with
/// `$r1 … $r5` rows per block for panels of one to five vectors; with
/// `$halves`, a panel of three or four vectors runs as two narrower ones
/// (see [`Raw::columns`]).
macro_rules! kernels {
    ($module:ident, $features:literal, $r1:literal, $r2:literal, $r3:literal, $r4:literal, $r5:literal, $halves:literal) => {
        pub(super) mod $module {
            use super::super::LANES;
            use super::{Raw, STRIDED, UNIT_ROW, UNIT_STEP};
            use std::arch::x86_64::*;

            /// `R × 8V` block: `R` rows of `a` from row `i` times the panel of `V`
            /// vectors, into `c` from row `i`, the first `width` columns.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn block<const R: usize, const V: usize, const L: u8>(raw: &Raw, i: usize) {
                let Raw { k, lda, a_step, panel, panel_rs, ldc, width, accumulate, .. } = *raw;
                let (a, c) = (raw.a.add(i * lda), raw.c.add(i * ldc));
                let mut acc = [[_mm256_setzero_ps(); V]; R];
                // Each row's start, opaque to the optimiser, which would otherwise
                // derive every row's address from the one before it, a serial add
                // per value loaded.
                let starts: [*const f32; R] = std::hint::black_box(std::array::from_fn(|r| a.add(r * lda)));
                // One step of the k loop: row p of the panel times column p of the rows.
                let step = |acc: &mut [[__m256; V]; R], p: usize| {
                    let mut bv = [_mm256_setzero_ps(); V];
                    for (v, b) in bv.iter_mut().enumerate() {
                        *b = _mm256_loadu_ps(panel.add(p * panel_rs + LANES * v));
                    }
                    for (r, row) in acc.iter_mut().enumerate() {
                        let at = match L {
                            UNIT_STEP => starts[r].add(p),
                            UNIT_ROW => a.add(p * a_step + r),
                            _ => a.add(r * lda + p * a_step),
                        };
                        let av = _mm256_broadcast_ss(&*at);
                        for (x, &b) in row.iter_mut().zip(&bv) {
                            *x = _mm256_fmadd_ps(av, b, *x);
                        }
                    }
                };
                // Unrolled by four (the short k of a recurrence pays little loop overhead).
                let mut p = 0;
                while p + 4 <= k {
                    step(&mut acc, p);
                    step(&mut acc, p + 1);
                    step(&mut acc, p + 2);
                    step(&mut acc, p + 3);
                    p += 4;
                }
                while p < k {
                    step(&mut acc, p);
                    p += 1;
                }
                if width == LANES * V {
                    for (r, row) in acc.iter().enumerate() {
                        let out = c.add(r * ldc);
                        for (v, &x) in row.iter().enumerate() {
                            let o = out.add(LANES * v);
                            let x = if accumulate { _mm256_add_ps(x, _mm256_loadu_ps(o)) } else { x };
                            _mm256_storeu_ps(o, x);
                        }
                    }
                } else {
                    let mut tmp = [0.0f32; 5 * LANES];
                    for (r, row) in acc.iter().enumerate() {
                        for (v, &x) in row.iter().enumerate() {
                            _mm256_storeu_ps(tmp.as_mut_ptr().add(LANES * v), x);
                        }
                        let out = c.add(r * ldc);
                        for (j, &v) in tmp.iter().enumerate().take(width) {
                            let o = out.add(j);
                            *o = if accumulate { *o + v } else { v };
                        }
                    }
                }
            }

            /// `rows` rows of `a` times one panel of `V` vectors: full blocks of
            /// `R` rows, then blocks of the rows left (at most one per size).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn panel<const R: usize, const V: usize, const L: u8>(p: &Raw) {
                let mut i = 0;
                while i + R <= p.rows {
                    block::<R, V, L>(p, i);
                    i += R;
                }
                // The tail, as a sum of powers of two below R.
                let mut rest = p.rows - i;
                for size in [8, 4, 2, 1] {
                    if size < R && rest >= size {
                        match size {
                            8 => block::<8, V, L>(p, i),
                            4 => block::<4, V, L>(p, i),
                            2 => block::<2, V, L>(p, i),
                            _ => block::<1, V, L>(p, i),
                        }
                        i += size;
                        rest -= size;
                    }
                }
            }

            /// A panel of `vectors` vectors (1 to 5) with this module's block rows.
            #[target_feature(enable = $features)]
            pub(in super::super) unsafe fn panel_of(vectors: usize, p: &Raw) {
                match (p.a_step == 1, p.lda == 1) {
                    (true, _) => panel_laid::<UNIT_STEP>(vectors, p),
                    (false, true) => panel_laid::<UNIT_ROW>(vectors, p),
                    _ => panel_laid::<STRIDED>(vectors, p),
                }
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn panel_laid<const L: u8>(vectors: usize, p: &Raw) {
                match vectors {
                    1 => panel::<$r1, 1, L>(p),
                    2 => panel::<$r2, 2, L>(p),
                    3 | 4 if $halves => {
                        panel::<$r2, 2, L>(&p.columns(0, 2 * LANES));
                        panel_laid::<L>(vectors - 2, &p.columns(2 * LANES, p.width - 2 * LANES));
                    }
                    3 => panel::<$r3, 3, L>(p),
                    4 => panel::<$r4, 4, L>(p),
                    _ => panel::<$r5, 5, L>(p),
                }
            }
        }
    };
}

// Sixteen registers: R·V accumulators + V panel vectors + a broadcast ≤ 16.
// Twelve accumulators of three or four vectors (4 × 24, 3 × 32) leave no
// room for the step's panel vectors: LLVM moves registers through the
// stack inside the loop (3 × 32 in every layout, 4 × 24 in one), at half
// the speed of 6 × 16 on a Zen 3, so those panels run as 6 × 16 beside
// 8 × 8 or 6 × 16.
kernels!(avx2, "avx2,fma", 8, 6, 4, 3, 2, true);
// Thirty-two registers (AVX-512VL encodes ymm16–31): about twice the rows.
kernels!(avx512vl, "avx2,fma,avx512f,avx512vl", 8, 6, 6, 6, 4, false);

/// The same products on 512-bit vectors: a panel of `V` eight-lane vectors is
/// `V / 2` zmm registers plus one ymm register when `V` is odd. Every entry of
/// `c` is still one chain of fused multiply-adds over `p` from zero, then one
/// add to `c`, so the results equal the 256-bit kernels' bit for bit.
pub(super) mod avx512 {
    use super::Raw;
    use std::arch::x86_64::*;

    /// `R` rows times a panel of `Z` zmm and `Y` (0 or 1) ymm vectors.
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
    unsafe fn block<const R: usize, const Z: usize, const Y: usize>(raw: &Raw, i: usize) {
        let Raw { k, lda, a_step, panel, panel_rs, ldc, width, accumulate, .. } = *raw;
        let (a, c) = (raw.a.add(i * lda), raw.c.add(i * ldc));
        let mut wide = [[_mm512_setzero_ps(); Z]; R];
        let mut half = [[_mm256_setzero_ps(); Y]; R];
        let step = |wide: &mut [[__m512; Z]; R], half: &mut [[__m256; Y]; R], p: usize| {
            let row = panel.add(p * panel_rs);
            let mut bz = [_mm512_setzero_ps(); Z];
            for (v, b) in bz.iter_mut().enumerate() {
                *b = _mm512_loadu_ps(row.add(16 * v));
            }
            let mut by = [_mm256_setzero_ps(); Y];
            for b in by.iter_mut() {
                *b = _mm256_loadu_ps(row.add(16 * Z));
            }
            for r in 0..R {
                let s = *a.add(r * lda + p * a_step);
                let az = _mm512_set1_ps(s);
                for (x, &b) in wide[r].iter_mut().zip(&bz) {
                    *x = _mm512_fmadd_ps(az, b, *x);
                }
                for (x, &b) in half[r].iter_mut().zip(&by) {
                    *x = _mm256_fmadd_ps(_mm256_set1_ps(s), b, *x);
                }
            }
        };
        let mut p = 0;
        while p + 4 <= k {
            step(&mut wide, &mut half, p);
            step(&mut wide, &mut half, p + 1);
            step(&mut wide, &mut half, p + 2);
            step(&mut wide, &mut half, p + 3);
            p += 4;
        }
        while p < k {
            step(&mut wide, &mut half, p);
            p += 1;
        }
        if width == 16 * Z + 8 * Y {
            for r in 0..R {
                let out = c.add(r * ldc);
                for (v, &x) in wide[r].iter().enumerate() {
                    let o = out.add(16 * v);
                    let x = if accumulate { _mm512_add_ps(x, _mm512_loadu_ps(o)) } else { x };
                    _mm512_storeu_ps(o, x);
                }
                for &x in &half[r] {
                    let o = out.add(16 * Z);
                    let x = if accumulate { _mm256_add_ps(x, _mm256_loadu_ps(o)) } else { x };
                    _mm256_storeu_ps(o, x);
                }
            }
        } else {
            let mut tmp = [0.0f32; 48];
            for r in 0..R {
                for (v, &x) in wide[r].iter().enumerate() {
                    _mm512_storeu_ps(tmp.as_mut_ptr().add(16 * v), x);
                }
                for &x in &half[r] {
                    _mm256_storeu_ps(tmp.as_mut_ptr().add(16 * Z), x);
                }
                let out = c.add(r * ldc);
                for (j, &v) in tmp.iter().enumerate().take(width) {
                    let o = out.add(j);
                    *o = if accumulate { *o + v } else { v };
                }
            }
        }
    }

    /// `rows` rows of `a` times one panel: full blocks of `R` rows, then the
    /// rest as blocks of 8, 4, 2 and 1 (`R` is at most 16).
    #[inline]
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
    unsafe fn panel<const R: usize, const Z: usize, const Y: usize>(p: &Raw) {
        let mut i = 0;
        while i + R <= p.rows {
            block::<R, Z, Y>(p, i);
            i += R;
        }
        let mut rest = p.rows - i;
        for size in [8, 4, 2, 1] {
            if size < R && rest >= size {
                match size {
                    8 => block::<8, Z, Y>(p, i),
                    4 => block::<4, Z, Y>(p, i),
                    2 => block::<2, Z, Y>(p, i),
                    _ => block::<1, Z, Y>(p, i),
                }
                i += size;
                rest -= size;
            }
        }
    }

    /// A panel of `vectors` eight-lane vectors (1 to 5): twelve rows per block
    /// (at most 24 accumulators of 32 registers), eight for five vectors.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
    pub(in super::super) unsafe fn panel_of(vectors: usize, p: &Raw) {
        match vectors {
            1 => panel::<12, 0, 1>(p),
            2 => panel::<12, 1, 0>(p),
            3 => panel::<12, 1, 1>(p),
            4 => panel::<12, 2, 0>(p),
            _ => panel::<8, 2, 1>(p),
        }
    }
}
