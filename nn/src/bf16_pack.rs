//! bf16 operands of [`gemm_bf16`](super::gemm_bf16::gemm_bf16): `f32` values
//! rounded to bf16 and stored as 32-bit *pairs*.
//!
//! A bf16 value is the upper half of an `f32`: sign, the 8-bit exponent and 7
//! bits of mantissa. [`round_bf16`] rounds to nearest, ties to even, as
//! `VCVTNE2PS2BF16` does: a denormal input becomes a zero of its sign, a NaN
//! stays a (quiet) NaN, a value past the largest bf16 becomes an infinity.
//!
//! A pair holds the values of two consecutive reduction steps `2q` (low half)
//! and `2q + 1` (high half), which is what `VDPBF16PS` multiplies lane by lane.
//! [`Bf16Lhs`] holds `op(a)` (`m × k`) as `m × ⌈k/2⌉` pairs; [`Bf16Rhs`] holds
//! `op(b)` (`k × n`) as column panels of `⌈k/2⌉` rows of pairs, 32 columns
//! wide, the last panel 16 or 32 (`n` rounded up to 16).
//!
//! Invariants: a packed operand holds exactly [`round_bf16`] of every value
//! of `op(x)`; the high half of an odd `k`'s last pair and the columns of a
//! panel past `n` are zero. The vector packers (AVX-512 BF16) write the same
//! bits as the portable ones (`tests::vector_packing_equals_portable`).

use super::gemm::Op;

/// Columns of a full panel of [`Bf16Rhs`] (two 512-bit vectors of `f32` accumulators).
pub(crate) const PANEL: usize = 32;
/// Columns of one vector; every panel width is a multiple of it.
pub(crate) const VECTOR: usize = 16;

/// `x` rounded to the nearest bf16, ties to even (the bits of its upper half).
///
/// Denormals round to a zero of their sign and a NaN to a quiet NaN, as the
/// conversion instruction does.
#[inline]
pub fn round_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    if bits & 0x7f80_0000 == 0 {
        return ((bits >> 16) & 0x8000) as u16;
    }
    let rounded = bits + 0x7fff + ((bits >> 16) & 1);
    (rounded >> 16) as u16
}

/// The `f32` a bf16 value stands for (exact).
#[inline]
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// The pair of bf16 values `(lo, hi)` as one 32-bit word.
#[inline]
pub fn pair(lo: f32, hi: f32) -> u32 {
    round_bf16(lo) as u32 | (round_bf16(hi) as u32) << 16
}

/// Whether the AVX-512 BF16 conversions and products run on this CPU: it has
/// them and `TIDEREC_MAX_ISA` allows them ([`tiderec_records::cpu`]).
#[inline]
pub fn bf16_vector_available() -> bool {
    use tiderec_records::cpu::{has, Feature};
    has(Feature::Avx512F) && has(Feature::Avx512Bw) && has(Feature::Avx512Bf16)
}

/// `op(a)` (`m × k`) as pairs: the pair `q` of row `i` is at `data[i·lda + q·step]`.
#[derive(Clone, Debug, Default)]
pub struct Bf16Lhs {
    pub(crate) m: usize,
    pub(crate) pairs: usize,
    pub(crate) lda: usize,
    pub(crate) step: usize,
    pub(crate) data: Vec<u32>,
}

impl Bf16Lhs {
    /// Packs `op(a)`: `a` is stored `m × k` for [`Op::N`] (each row's pairs
    /// contiguous), `k × m` for [`Op::T`] (the pairs of step `q` of every row contiguous).
    ///
    /// # Panics
    /// When `a` is shorter than its shape requires.
    pub fn pack(&mut self, op: Op, m: usize, k: usize, a: &[f32]) {
        assert!(a.len() >= m * k, "Bf16Lhs: a has {} values, needs {}", a.len(), m * k);
        let pairs = k.div_ceil(2);
        self.m = m;
        self.pairs = pairs;
        self.data.resize(m * pairs, 0);
        match op {
            Op::N => {
                self.lda = pairs;
                self.step = 1;
                for (row, out) in a[..m * k].chunks_exact(k.max(1)).zip(self.data.chunks_exact_mut(pairs.max(1))) {
                    round_row_pairs(row, out);
                }
            }
            Op::T => {
                self.lda = 1;
                self.step = m;
                for (q, out) in self.data.chunks_exact_mut(m.max(1)).enumerate().take(pairs) {
                    let lo = &a[2 * q * m..(2 * q + 1) * m];
                    let hi = (2 * q + 1 < k).then(|| &a[(2 * q + 1) * m..(2 * q + 2) * m]);
                    interleave_rows(lo, hi, out);
                }
            }
        }
    }

    /// Rows of `op(a)`.
    pub fn m(&self) -> usize {
        self.m
    }

    /// Pairs per row (`⌈k/2⌉`).
    pub fn pairs(&self) -> usize {
        self.pairs
    }
}

/// `(first column, width)` of each panel of [`Bf16Rhs`] for `n` columns.
pub(crate) fn panels(n: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut first = 0;
    std::iter::from_fn(move || {
        if first >= n {
            return None;
        }
        let width = if n - first > VECTOR { PANEL } else { VECTOR };
        first += width;
        Some((first - width, width))
    })
}

/// `op(b)` (`k × n`) as column panels of pairs: a panel of width `pw` is
/// `⌈k/2⌉` rows of `pw` pairs, the pair of column `j` in row `q` holding
/// steps `2q` and `2q + 1` of that column.
#[derive(Clone, Debug, Default)]
pub struct Bf16Rhs {
    pub(crate) pairs: usize,
    pub(crate) n: usize,
    pub(crate) panels: Vec<u32>,
    /// One row of `b` rounded (the transposed packing's scratch).
    row: Vec<u32>,
}

impl Bf16Rhs {
    /// Packs `op(b)`: `b` is stored `k × n` for [`Op::N`], `n × k` for [`Op::T`]
    /// (a layer's `Wᵀ`). Every value of the layout is written, so a reused buffer is not cleared first.
    ///
    /// # Panics
    /// When `b` is shorter than its shape requires.
    pub fn pack(&mut self, op: Op, k: usize, n: usize, b: &[f32]) {
        assert!(b.len() >= k * n, "Bf16Rhs: b has {} values, needs {}", b.len(), k * n);
        let pairs = k.div_ceil(2);
        self.pairs = pairs;
        self.n = n;
        let total: usize = panels(n).map(|(_, pw)| pairs * pw).sum();
        self.panels.resize(total, 0);
        let mut start = 0;
        for (first, pw) in panels(n) {
            let width = pw.min(n - first);
            let panel = &mut self.panels[start..start + pairs * pw];
            start += pairs * pw;
            match op {
                Op::N => {
                    for (q, out) in panel.chunks_exact_mut(pw).enumerate() {
                        let row = |p: usize| &b[p * n + first..p * n + first + width];
                        interleave_rows(row(2 * q), (2 * q + 1 < k).then(|| row(2 * q + 1)), &mut out[..width]);
                    }
                }
                Op::T => {
                    self.row.resize(pairs, 0);
                    for j in 0..width {
                        round_row_pairs(&b[(first + j) * k..(first + j + 1) * k], &mut self.row);
                        for (out, &v) in panel.chunks_exact_mut(pw).zip(&self.row) {
                            out[j] = v;
                        }
                    }
                }
            }
            if width < pw {
                for out in panel.chunks_exact_mut(pw) {
                    out[width..].fill(0);
                }
            }
        }
    }

    /// Pairs per column (`⌈k/2⌉`).
    pub fn pairs(&self) -> usize {
        self.pairs
    }

    /// Columns of `op(b)`.
    pub fn n(&self) -> usize {
        self.n
    }
}

/// `out[q] = pair(row[2q], row[2q + 1])` for the `⌈len/2⌉` pairs of `row`
/// (an odd length's last high half is zero).
///
/// # Panics
/// When `out` is shorter than `⌈row.len()/2⌉`.
pub fn round_row_pairs(row: &[f32], out: &mut [u32]) {
    let pairs = row.len().div_ceil(2);
    assert!(out.len() >= pairs, "round_row_pairs: {} pairs into {}", pairs, out.len());
    #[cfg(target_arch = "x86_64")]
    if bf16_vector_available() {
        // SAFETY: the CPU has the features (checked); `out` holds `pairs` values (asserted).
        unsafe { x86::round_row_pairs(row.as_ptr(), row.len(), out.as_mut_ptr()) };
        return;
    }
    round_row_pairs_portable(row, out)
}

/// The portable [`round_row_pairs`].
pub(crate) fn round_row_pairs_portable(row: &[f32], out: &mut [u32]) {
    for (o, two) in out.iter_mut().zip(row.chunks(2)) {
        *o = pair(two[0], two.get(1).copied().unwrap_or(0.0));
    }
}

/// `out[j] = pair(lo[j], hi[j])` for `j < out.len()` (`hi` absent: zeros).
///
/// # Panics
/// When `lo` or `hi` is shorter than `out`.
pub fn interleave_rows(lo: &[f32], hi: Option<&[f32]>, out: &mut [u32]) {
    let n = out.len();
    assert!(lo.len() >= n && hi.is_none_or(|h| h.len() >= n), "interleave_rows: rows shorter than {n}");
    #[cfg(target_arch = "x86_64")]
    if bf16_vector_available() {
        // SAFETY: the CPU has the features (checked); both rows and `out` hold `n` values (asserted).
        unsafe { x86::interleave_rows(lo.as_ptr(), hi.map(<[f32]>::as_ptr), n, out.as_mut_ptr()) };
        return;
    }
    interleave_rows_portable(lo, hi, out)
}

/// The portable [`interleave_rows`].
pub(crate) fn interleave_rows_portable(lo: &[f32], hi: Option<&[f32]>, out: &mut [u32]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = pair(lo[j], hi.map_or(0.0, |h| h[j]));
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// The 16-bit lane permutation taking `[lo₀ … lo₁₅ | hi₀ … hi₁₅]` to `[lo₀ hi₀ lo₁ hi₁ …]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(crate) fn interleave_index() -> __m512i {
        let idx: [u16; 32] = std::array::from_fn(|i| if i % 2 == 0 { (i / 2) as u16 } else { 16 + (i / 2) as u16 });
        // SAFETY: 64 bytes read from a 64-byte array.
        unsafe { _mm512_loadu_si512(idx.as_ptr() as *const _) }
    }

    /// Mask of the first `n ≤ 16` lanes.
    #[inline]
    pub(crate) fn mask(n: usize) -> u16 {
        if n >= 16 {
            u16::MAX
        } else {
            (1u16 << n) - 1
        }
    }

    /// See [`super::round_row_pairs`]: 32 values (16 pairs) per step, the tail masked.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn round_row_pairs(row: *const f32, len: usize, out: *mut u32) {
        let mut j = 0;
        while j < len {
            let count = (len - j).min(32);
            let lo = _mm512_maskz_loadu_ps(mask(count), row.add(j));
            let hi = _mm512_maskz_loadu_ps(mask(count.saturating_sub(16)), row.add(j + 16));
            // The first operand fills the upper 16 lanes: memory order is kept.
            let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
            _mm512_mask_storeu_epi32(out.add(j / 2) as *mut i32, mask(count.div_ceil(2)), v);
            j += 32;
        }
    }

    /// The 16 pairs `(lo[j], hi[j])` of two vectors, rounded: `idx` is [`interleave_index`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(crate) fn pairs16(lo: __m512, hi: __m512, idx: __m512i) -> __m512i {
        // SAFETY: a 512-bit vector of bf16 reinterpreted as one of integers.
        let both: __m512i = unsafe { std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo)) };
        _mm512_permutexvar_epi16(idx, both)
    }

    /// See [`super::interleave_rows`]: 16 pairs per step, the tail masked.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn interleave_rows(lo: *const f32, hi: Option<*const f32>, n: usize, out: *mut u32) {
        let idx = interleave_index();
        let mut j = 0;
        while j < n {
            let m = mask(n - j);
            let l = _mm512_maskz_loadu_ps(m, lo.add(j));
            let h = match hi {
                Some(h) => _mm512_maskz_loadu_ps(m, h.add(j)),
                None => _mm512_setzero_ps(),
            };
            _mm512_mask_storeu_epi32(out.add(j) as *mut i32, m, pairs16(l, h, idx));
            j += 16;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values that exercise every rounding case: ties either way, carries into
    /// the exponent, overflow to infinity, denormals, zeros, infinities, NaN.
    fn awkward() -> Vec<f32> {
        let mut v: Vec<f32> = [
            0x3f80_8000u32, // 1 + 2⁻⁸: a tie, even below
            0x3f81_8000,    // a tie, odd below: rounds up
            0x3f80_8001,    // just above a tie
            0x3f80_7fff,    // just below a tie
            0x3fff_ffff,    // carries into the exponent
            0x7f7f_ffff,    // the largest f32: past the largest bf16
            0x0000_0001,    // the smallest denormal
            0x807f_ffff,    // the largest negative denormal
            0x0080_0000,    // the smallest normal
            0x8000_0000,    // −0
            0x7f80_0000,    // +∞
            0xff80_0000,    // −∞
            0x7fc0_0000,    // a quiet NaN
            0x7f80_0001,    // a signalling NaN
        ]
        .iter()
        .map(|&b| f32::from_bits(b))
        .collect();
        v.extend(
            (0..200).map(|i| (tiderec_records::rng::unit_f64(5, i, 0, 0) as f32 - 0.5) * 1e3f32.powi(i as i32 % 5 - 2)),
        );
        v
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        let r = |b: u32| round_bf16(f32::from_bits(b));
        assert_eq!(r(0x3f80_8000), 0x3f80, "tie, even below: stays");
        assert_eq!(r(0x3f81_8000), 0x3f82, "tie, odd below: up to even");
        assert_eq!(r(0x3f80_8001), 0x3f81);
        assert_eq!(r(0x3f80_7fff), 0x3f80);
        assert_eq!(r(0x3fff_ffff), 0x4000, "carry into the exponent");
        assert_eq!(r(0x7f7f_ffff), 0x7f80, "past the largest bf16: +∞");
        assert_eq!(r(0x0000_0001), 0x0000, "denormal: +0");
        assert_eq!(r(0x807f_ffff), 0x8000, "denormal: −0");
        assert!(bf16_to_f32(r(0x7f80_0001)).is_nan(), "a signalling NaN stays a NaN");
        // Against the definition: the nearest of the two neighbours, ties to the even one.
        for x in awkward().into_iter().filter(|x| x.is_finite() && x.abs() >= f32::MIN_POSITIVE && x.abs() < 3e38) {
            let down = f32::from_bits(x.to_bits() & 0xffff_0000);
            let up = f32::from_bits((x.to_bits() & 0xffff_0000) + 0x1_0000);
            let got = bf16_to_f32(round_bf16(x));
            let (dd, du) = ((x as f64 - down as f64).abs(), (up as f64 - x as f64).abs());
            let want = if dd < du || (dd == du && (down.to_bits() >> 16) & 1 == 0) { down } else { up };
            assert_eq!(got.to_bits(), want.to_bits(), "{x:e}");
        }
    }

    /// The AVX-512 BF16 conversions write the bits of the portable code for
    /// every length (tails of both vector widths) and every awkward value.
    #[test]
    fn vector_packing_equals_portable() {
        if !bf16_vector_available() {
            eprintln!("this CPU has no AVX-512 BF16: only the portable packing runs here");
            return;
        }
        let values = awkward();
        for len in [0, 1, 2, 15, 16, 17, 31, 32, 33, 63, 100, values.len()] {
            let row = &values[values.len() - len..];
            let pairs = len.div_ceil(2);
            let (mut got, mut want) = (vec![7u32; pairs + 3], vec![7u32; pairs + 3]);
            round_row_pairs(row, &mut got[..pairs]);
            round_row_pairs_portable(row, &mut want[..pairs]);
            assert_eq!(got, want, "round_row_pairs, {len} values");
            let hi: Vec<f32> = row.iter().rev().copied().collect();
            for hi in [Some(&hi[..]), None] {
                let (mut got, mut want) = (vec![7u32; len + 3], vec![7u32; len + 3]);
                interleave_rows(row, hi, &mut got[..len]);
                interleave_rows_portable(row, hi, &mut want[..len]);
                assert_eq!(got, want, "interleave_rows, {len} values, high row {}", hi.is_some());
            }
        }
    }

    /// Both operands hold the rounding of `op(x)` at the documented places,
    /// with zero padding, whatever a reused buffer held before.
    #[test]
    fn packed_operands_hold_the_rounded_values() {
        let (mut lhs, mut rhs) = (Bf16Lhs::default(), Bf16Rhs::default());
        lhs.pack(Op::N, 9, 41, &vec![3.0; 9 * 41]);
        rhs.pack(Op::N, 41, 70, &vec![3.0; 41 * 70]);
        let val = |i: usize| (tiderec_records::rng::unit_f64(9, i as u64, 0, 0) - 0.5) as f32;
        for (op, rows, cols, k) in [(Op::N, 5, 7, 9), (Op::T, 6, 40, 5), (Op::N, 3, 17, 1), (Op::T, 2, 33, 12)] {
            let x: Vec<f32> = (0..rows.max(cols) * k).map(val).collect();
            // op(a) is rows × k.
            let a_at = |i: usize, p: usize| if op == Op::N { x[i * k + p] } else { x[p * rows + i] };
            lhs.pack(op, rows, k, &x);
            for i in 0..rows {
                for q in 0..k.div_ceil(2) {
                    let hi = if 2 * q + 1 < k { a_at(i, 2 * q + 1) } else { 0.0 };
                    assert_eq!(lhs.data[i * lhs.lda + q * lhs.step], pair(a_at(i, 2 * q), hi), "lhs {op:?} {i} {q}");
                }
            }
            // op(b) is k × cols.
            let b_at = |p: usize, j: usize| if op == Op::N { x[p * cols + j] } else { x[j * k + p] };
            rhs.pack(op, k, cols, &x);
            let mut start = 0;
            for (first, pw) in panels(cols) {
                for q in 0..k.div_ceil(2) {
                    for j in 0..pw {
                        let want = if first + j >= cols {
                            0
                        } else {
                            let hi = if 2 * q + 1 < k { b_at(2 * q + 1, first + j) } else { 0.0 };
                            pair(b_at(2 * q, first + j), hi)
                        };
                        assert_eq!(rhs.panels[start + q * pw + j], want, "rhs {op:?} panel {first} row {q} col {j}");
                    }
                }
                start += k.div_ceil(2) * pw;
            }
            assert_eq!(start, rhs.panels.len());
        }
    }
}
