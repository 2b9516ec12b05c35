use super::super::amx_tile::{block_32x32, emulated, Tiles, BLOCK, TILE_PAIRS};
use super::super::bf16_pack::x86::{interleave_index, mask, pairs16};
use super::{AmxLhs, AmxRhs, Epilogue, Start, CHUNK_PAIRS, PREFETCH_BLOCKS};
use std::arch::x86_64::*;
use tiderec_records::cpu::TileUnit;

/// [`super::AmxRhs::pack`] of `b` stored `k × n` ([`Op::N`](super::Op::N)):
/// each pair of rows is converted 16 columns at a time, each 16 pairs
/// stored where their panel holds them; padding columns and pair rows are zero.
///
/// # Safety
/// AVX-512 F, BW and BF16; `b` holds `k × n` values; `data` holds
/// `⌈n/32⌉` panels of `kp ≥ ⌈k/2⌉` rows of 32 pairs.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn pack_rows(b: &[f32], k: usize, n: usize, data: &mut [u32], kp: usize) {
    debug_assert!(b.len() >= k * n && data.len() >= n.div_ceil(BLOCK) * kp * BLOCK);
    let interleave = interleave_index();
    let (src, out) = (b.as_ptr(), data.as_mut_ptr());
    let pairs = k.div_ceil(2);
    let columns = n.div_ceil(BLOCK) * BLOCK;
    for q in 0..kp {
        for j in (0..columns).step_by(16) {
            let dst = out.add((j / BLOCK * kp + q) * BLOCK + j % BLOCK);
            if q >= pairs || j >= n {
                _mm512_storeu_si512(dst as *mut _, _mm512_setzero_si512());
                continue;
            }
            let lanes = mask(n - j);
            let lo = _mm512_maskz_loadu_ps(lanes, src.add(2 * q * n + j));
            let hi = if 2 * q + 1 < k {
                _mm512_maskz_loadu_ps(lanes, src.add((2 * q + 1) * n + j))
            } else {
                _mm512_setzero_ps()
            };
            _mm512_storeu_si512(dst as *mut _, pairs16(lo, hi, interleave));
        }
    }
}

/// The permutes of [`transpose16`]: per round `b` (8, 4, 2, 1), the lane
/// indices of row `r` (low) and of row `r + b` (high).
type Rounds = [(usize, __m512i, __m512i); 4];

/// The lane indices of [`transpose_rounds`], built at compile time: per
/// round `b` (8, 4, 2, 1), those of row `r` (low) and of row `r + b` (high).
const ROUND_INDICES: [[[i32; 16]; 2]; 4] = {
    let mut t = [[[0i32; 16]; 2]; 4];
    let mut r = 0;
    while r < 4 {
        let b = 8 >> r;
        let mut l = 0;
        while l < 16 {
            let low = l & b == 0;
            t[r][0][l] = if low { l as i32 } else { (16 + l - b) as i32 };
            t[r][1][l] = if low { (l + b) as i32 } else { (16 + l) as i32 };
            l += 1;
        }
        r += 1;
    }
    t
};

#[target_feature(enable = "avx512f")]
fn transpose_rounds() -> Rounds {
    // SAFETY: 64 bytes read from a 64-byte array.
    let load = |idx: &[i32; 16]| unsafe { _mm512_loadu_si512(idx.as_ptr() as *const _) };
    std::array::from_fn(|r| (8 >> r, load(&ROUND_INDICES[r][0]), load(&ROUND_INDICES[r][1])))
}

/// Transposes the 16 × 16 words of `v` in place: four rounds of two-source
/// permutes exchanging blocks of 8, 4, 2 and 1 across the diagonal.
///
/// # Safety
/// The CPU has AVX-512 F (the caller's features are inlined into it).
#[inline(always)]
unsafe fn transpose16(v: &mut [__m512i; 16], rounds: &Rounds) {
    for &(b, low, high) in rounds {
        for r in 0..16 {
            if r & b == 0 {
                let (x, y) = (v[r], v[r + b]);
                v[r] = _mm512_permutex2var_epi32(x, low, y);
                v[r + b] = _mm512_permutex2var_epi32(x, high, y);
            }
        }
    }
}

/// [`super::AmxRhs::pack`] of `b` stored `n × k` ([`Op::T`](super::Op::T),
/// a layer's `Wᵀ`): for 16 columns and 16 pairs at a time, each column's
/// 32 values are rounded in order into its 16 pairs (one register per
/// column, as [`round_row_pairs`](super::round_row_pairs) rounds them), and
/// the 16 × 16 block is transposed into 16 pair rows of 16 columns.
/// Padding columns and pair rows are zero.
///
/// # Safety
/// AVX-512 F, BW and BF16; `b` holds `n × k` values; `data` holds
/// `⌈n/32⌉` panels of `kp` rows of 32 pairs, `kp ≥ ⌈k/2⌉` a multiple of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn pack_columns(b: &[f32], k: usize, n: usize, data: &mut [u32], kp: usize) {
    debug_assert!(b.len() >= k * n && data.len() >= n.div_ceil(BLOCK) * kp * BLOCK);
    let rounds = transpose_rounds();
    let (src, out) = (b.as_ptr(), data.as_mut_ptr());
    for j0 in (0..n.div_ceil(BLOCK) * BLOCK).step_by(16) {
        let panel = out.add(j0 / BLOCK * kp * BLOCK + j0 % BLOCK);
        for q0 in (0..kp).step_by(TILE_PAIRS) {
            // Values `2·q0 ..` of each column, at most 32.
            let count = k.saturating_sub(2 * q0).min(32);
            let mut v = [_mm512_setzero_si512(); 16];
            for (dj, reg) in v.iter_mut().enumerate() {
                let j = j0 + dj;
                if j >= n || count == 0 {
                    break;
                }
                let at = src.add(j * k + 2 * q0);
                let lo = _mm512_maskz_loadu_ps(mask(count), at);
                let hi = _mm512_maskz_loadu_ps(mask(count.saturating_sub(16)), at.add(16));
                // The first operand fills the upper 16 lanes: memory order is kept.
                *reg = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo));
            }
            transpose16(&mut v, &rounds);
            for (dq, reg) in v.iter().enumerate() {
                _mm512_storeu_si512(panel.add((q0 + dq) * BLOCK) as *mut _, *reg);
            }
        }
    }
}

/// [`super::pack_transposed_portable`] in registers: for 16 rows and 16
/// pairs at a time, each pair step is converted from two rows of `a`
/// (16 pairs of the 16 rows in one register), and the 16 × 16 block is
/// transposed by four rounds of two-source permutes (blocks of 8, 4, 2
/// and 1 exchanged across the diagonal).
///
/// With `sums`, each row's values are also summed as they are read (the
/// steps in order, as [`super::row_sums`]).
///
/// # Safety
/// AVX-512 F, BW and BF16; `a` holds `k × m` values; `data` holds `m` rows of
/// `kp ≥ ⌈k/2⌉` pairs, `kp` a multiple of 16; `sums`, if any, `m` values.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
pub(super) unsafe fn pack_transposed(
    a: &[f32],
    m: usize,
    k: usize,
    data: &mut [u32],
    kp: usize,
    mut sums: Option<&mut [f32]>,
) {
    debug_assert!(a.len() >= k * m && data.len() >= m * kp);
    debug_assert!(sums.as_ref().is_none_or(|s| s.len() >= m));
    if let Some(s) = sums.as_deref_mut() {
        s[..m].fill(0.0);
    }
    let interleave = interleave_index();
    let rounds = transpose_rounds();
    let src = a.as_ptr();
    // Pair steps outer: the 32 rows of `a` a step reads are read front to back.
    for q0 in (0..kp).step_by(TILE_PAIRS) {
        for i0 in (0..m).step_by(16) {
            let rows = 16.min(m - i0);
            let lanes = mask(rows);
            let mut v = [_mm512_setzero_si512(); 16];
            let sum_at = sums.as_deref_mut().map(|s| s.as_mut_ptr().add(i0));
            let mut sum = sum_at.map_or(_mm512_setzero_ps(), |p| _mm512_maskz_loadu_ps(lanes, p));
            for (dq, reg) in v.iter_mut().enumerate() {
                let step = 2 * (q0 + dq);
                if step >= k {
                    break;
                }
                let lo = _mm512_maskz_loadu_ps(lanes, src.add(step * m + i0));
                sum = _mm512_add_ps(sum, lo);
                let hi = if step + 1 < k {
                    let hi = _mm512_maskz_loadu_ps(lanes, src.add((step + 1) * m + i0));
                    sum = _mm512_add_ps(sum, hi);
                    hi
                } else {
                    _mm512_setzero_ps()
                };
                *reg = pairs16(lo, hi, interleave);
            }
            if let Some(p) = sum_at {
                _mm512_mask_storeu_ps(p, lanes, sum);
            }
            transpose16(&mut v, &rounds);
            for (r, reg) in v.iter().enumerate().take(rows) {
                _mm512_storeu_si512(data.as_mut_ptr().add((i0 + r) * kp + q0) as *mut _, *reg);
            }
        }
    }
}

/// A block of `c` that the matrix's edge cuts, computed in full here.
#[repr(C, align(64))]
struct Edge([f32; BLOCK * BLOCK]);

/// Where the finished blocks of a product are packed: `lhs` as
/// `(rows of pairs, pairs per row)` of an [`AmxLhs`](super::AmxLhs),
/// `rows` as `(panels of 32 columns, pair rows per panel)` of an
/// [`AmxRhs`](super::AmxRhs) over `c`'s rows, `transposed` as
/// `(rows of pairs, pairs per row, column sums)` of an
/// [`AmxLhs`](super::AmxLhs) of `cᵀ` ([`super::Packings`]).
#[derive(Clone, Copy)]
pub(super) struct PackTo {
    pub(super) lhs: Option<(*mut u32, usize)>,
    pub(super) rows: Option<(*mut u32, usize)>,
    pub(super) transposed: Option<(*mut u32, usize, *mut f32)>,
}

impl PackTo {
    fn any(&self) -> bool {
        self.lhs.is_some() || self.rows.is_some() || self.transposed.is_some()
    }
}

/// [`Epilogue::apply`] to rows `i..i + rows` of `c`, `cols ≤ 32` entries
/// from column `j`, sixteen lanes at a time: the same comparisons and `+ 0`
/// as the scalar ReLU, so equal bit for bit (NaN kept, `-0` made `+0`).
/// The block's entries are read at `block` (its first entry; rows `stride`
/// apart) and, with `store`, written back there; `ldc` is `c`'s stride,
/// which [`Epilogue::ReluBackward`]'s output shares.
///
/// Each finished row of the block is also rounded to bf16 into `pack.lhs`:
/// its 32 values in order (zeros past `cols`) as 16 pairs, as
/// [`round_row_pairs`](super::round_row_pairs) packs them; and into
/// `pack.rows`: rows `2q` and `2q + 1` as the 32 pairs of pair row `q` of
/// panel `j/32` (zeros past `cols` and past the block's `rows`), as
/// [`pack_rows`] packs them.
///
/// # Safety
/// The CPU has AVX-512 F, BW and BF16; `i` is a multiple of 32 and `j` of
/// 32; `block` holds 32 rows of 32 entries at `stride`; the block lies
/// inside the ReLU's output (laid out as `c`) for
/// [`Epilogue::ReluBackward`], inside the packed output for
/// [`Epilogue::ReluBackwardPacked`]; `pack.lhs`'s rows hold pairs
/// `j/2 .. j/2 + 16` of rows `i .. i + rows`; `pack.rows`' panel `j/32`
/// holds pair rows `i/2 .. i/2 + 16`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn finish_block(
    epilogue: Epilogue<'_>,
    (block, stride): (*mut f32, usize),
    ldc: usize,
    (i, j): (usize, usize),
    (rows, cols): (usize, usize),
    pack: PackTo,
    store: bool,
) {
    let zero = _mm512_setzero_ps();
    let at = (block, stride, (i, j), (rows, cols), pack);
    match epilogue {
        Epilogue::None => each_row(at, false, |_, _, _, x| x),
        // `x < 0` gives 0, anything else (NaN too) `x + 0`.
        Epilogue::Relu => {
            each_row(at, store, |_, _, _, x| _mm512_maskz_add_ps(_mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, zero), x, zero))
        }
        // `out <= 0` gives 0, anything else (NaN too) `grad + 0`.
        Epilogue::ReluBackward(out) => each_row(at, store, |r, half, m, x| {
            let o = _mm512_maskz_loadu_ps(m, out.as_ptr().add(r * ldc + j + 16 * half));
            _mm512_maskz_add_ps(_mm512_cmp_ps_mask::<_CMP_NLE_UQ>(o, zero), x, zero)
        }),
        // The same, the output widened from its bf16 half of pair row `r/2`.
        Epilogue::ReluBackwardPacked(out) => {
            let (panels, kp) = (out.layout.data.as_ptr(), out.layout.kp);
            each_row(at, store, |r, half, m, x| {
                let pairs = _mm512_maskz_loadu_epi32(m, panels.add((j / BLOCK * kp + r / 2) * BLOCK + 16 * half) as _);
                let bits = if r % 2 == 0 {
                    _mm512_slli_epi32::<16>(pairs)
                } else {
                    _mm512_and_si512(pairs, _mm512_set1_epi32(0xffff_0000u32 as i32))
                };
                let o = _mm512_castsi512_ps(bits);
                _mm512_maskz_add_ps(_mm512_cmp_ps_mask::<_CMP_NLE_UQ>(o, zero), x, zero)
            })
        }
    }
}

/// `x ← f(row, half, lanes, x)` over the two sixteen-lane halves of each
/// of the block's rows, the lanes past its `cols` masked off (stored when
/// `store`), then each row's 32 values rounded into `pack.lhs`'s row, each
/// pair of rows into `pack.rows`' pair row, and the block transposed into
/// `pack.transposed` (see [`finish_block`]).
#[inline(always)]
#[allow(clippy::type_complexity)]
unsafe fn each_row(
    (block, stride, (i, j), (rows, cols), pack): (*mut f32, usize, (usize, usize), (usize, usize), PackTo),
    store: bool,
    mut f: impl FnMut(usize, usize, u16, __m512) -> __m512,
) {
    if !store && !pack.any() {
        return;
    }
    let (m0, m1) = (mask(cols), mask(cols.saturating_sub(16)));
    let interleave = interleave_index();
    let pairs_wanted = pack.rows.is_some() || pack.transposed.is_some();
    // The block's 16 pair rows of 32 pairs as two halves of 16, for the
    // transposed packing: all written below before it is read (not zeroed first).
    let mut strip = [[std::mem::MaybeUninit::<__m512i>::uninit(); 16]; 2];
    let mut sums = pack
        .transposed
        .map(|(_, _, s)| [_mm512_maskz_loadu_ps(m0, s.add(j)), _mm512_maskz_loadu_ps(m1, s.add(j + 16))]);
    // Two rows at a time: a pair row of `pack.rows` takes both.
    for r in (i..i + BLOCK).step_by(2) {
        let mut pair = [[_mm512_setzero_ps(); 2]; 2];
        for (t, halves) in pair.iter_mut().enumerate().take((i + rows).saturating_sub(r)) {
            let to = block.add((r - i + t) * stride);
            let lo = f(r + t, 0, m0, _mm512_maskz_loadu_ps(m0, to));
            let hi = if m1 != 0 { f(r + t, 1, m1, _mm512_maskz_loadu_ps(m1, to.add(16))) } else { _mm512_setzero_ps() };
            if store {
                _mm512_mask_storeu_ps(to, m0, lo);
                if m1 != 0 {
                    _mm512_mask_storeu_ps(to.add(16), m1, hi);
                }
            }
            if let Some((out, kp)) = pack.lhs {
                // The first operand fills the upper 16 lanes: memory order is kept.
                let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_storeu_si512(out.add((r + t) * kp + j / 2) as *mut _, v);
            }
            // Each column's chain over the rows in order (lanes past `cols` are never stored).
            if let Some([s0, s1]) = sums.as_mut() {
                *s0 = _mm512_add_ps(*s0, lo);
                *s1 = _mm512_add_ps(*s1, hi);
            }
            *halves = [lo, hi];
        }
        if !pairs_wanted {
            if r + 2 >= i + rows {
                return;
            }
            continue;
        }
        // Past the block's rows the pairs are zero, as the padding of the layouts.
        let [[lo0, hi0], [lo1, hi1]] = pair;
        let both = [pairs16(lo0, lo1, interleave), pairs16(hi0, hi1, interleave)];
        if let Some((panels, kp)) = pack.rows {
            let dst = panels.add((j / BLOCK * kp + r / 2) * BLOCK);
            _mm512_storeu_si512(dst as *mut _, both[0]);
            _mm512_storeu_si512(dst.add(16) as *mut _, both[1]);
        }
        strip[0][(r - i) / 2].write(both[0]);
        strip[1][(r - i) / 2].write(both[1]);
    }
    let Some((out, kp, s)) = pack.transposed else {
        return;
    };
    if let Some([s0, s1]) = sums {
        _mm512_mask_storeu_ps(s.add(j), m0, s0);
        _mm512_mask_storeu_ps(s.add(j + 16), m1, s1);
    }
    // Pair row `q` of column `j + 16h + l` is lane `l` of `strip[h][q]`:
    // transposed, register `l` holds that column's 16 pairs from pair `i/2`.
    let rounds = transpose_rounds();
    for (h, half) in strip.iter().enumerate() {
        // With a transposed packing, every pair row of the block was written above.
        let mut v = half.map(|q| q.assume_init());
        transpose16(&mut v, &rounds);
        for (l, reg) in v.iter().enumerate() {
            _mm512_storeu_si512(out.add((j + 16 * h + l) * kp + i / 2) as *mut _, *reg);
        }
    }
}

/// See [`super::gemm_amx`].
///
/// # Safety
/// AMX runs here on `unit` (for [`TileUnit::Emulated`], AVX-512 BF16 runs
/// here); `c` holds `m` rows of `n` at stride `ldc`; `kp ≥ 16`.
///
/// With `pack`, the finished blocks are also packed there ([`finish_block`]);
/// without `store`, where one chunk holds the whole reduction, they are
/// packed only: each block goes from the tiles through an L1 buffer to the
/// packings, and `c` is not written.
pub(super) unsafe fn gemm(
    a: &AmxLhs,
    b: &AmxRhs,
    (start, epilogue): (Start<'_>, Epilogue<'_>),
    (c, ldc): (&mut [f32], usize),
    pack: PackTo,
    store: bool,
    unit: TileUnit,
) {
    let (m, n, kp) = (a.m(), b.n(), b.layout.kp);
    let (a_words, b_words) = (&a.layout.data[..], &b.layout.data[..]);
    let through_edge = !store && pack.any() && kp <= CHUNK_PAIRS;
    // The hardware's tiles are configured for the product and released after it.
    let tiles = match unit {
        TileUnit::Hardware => Some(Tiles::configure()),
        TileUnit::Emulated => None,
    };
    let mut edge = Edge([0.0; BLOCK * BLOCK]);
    for q0 in (0..kp).step_by(CHUNK_PAIRS) {
        let blocks = CHUNK_PAIRS.min(kp - q0) / TILE_PAIRS;
        // The first chunk starts where asked; later ones continue from `c`;
        // the last one finishes each block while it is in L1.
        let start = if q0 == 0 { start } else { Start::Output };
        let finishing = q0 + CHUNK_PAIRS >= kp && (pack.any() || !matches!(epilogue, Epilogue::None));
        for i in (0..m).step_by(BLOCK) {
            let a_ptr = a_words.as_ptr().add(i * kp + q0);
            for j in (0..n).step_by(BLOCK) {
                let b_ptr = b_words.as_ptr().add((j / BLOCK * kp + q0) * BLOCK);
                // Past the chunk's end this reaches the next panel's start, which
                // the next block reads (a prefetch never faults, even past the buffer).
                let prefetch = b_ptr.wrapping_add(PREFETCH_BLOCKS * TILE_PAIRS * BLOCK);
                let (rows, cols) = (BLOCK.min(m - i), BLOCK.min(n - j));
                let run = |c: *mut f32, ldc: usize, from: (*const f32, usize)| match &tiles {
                    Some(tiles) => {
                        block_32x32(tiles, a_ptr, kp * 4, b_ptr, BLOCK * 4, blocks, c, ldc * 4, from, prefetch)
                    }
                    None => emulated::block_32x32(a_ptr, kp * 4, b_ptr, BLOCK * 4, blocks, c, ldc * 4, from),
                };
                if rows == BLOCK && cols == BLOCK && !through_edge {
                    let out = c.as_mut_ptr().add(i * ldc + j);
                    match start {
                        Start::Zero => run(out, ldc, (std::ptr::null(), 0)),
                        Start::Output => run(out, ldc, (out, ldc * 4)),
                        Start::Row(row) => run(out, ldc, (row.as_ptr().add(j), 0)),
                    }
                    if finishing {
                        finish_block(epilogue, (out, ldc), ldc, (i, j), (rows, cols), pack, true);
                    }
                    continue;
                }
                // `None`: the block starts from the edge buffer, filled here.
                let from = match start {
                    Start::Zero => Some((std::ptr::null(), 0)),
                    Start::Row(row) if cols == BLOCK => Some((row.as_ptr().add(j), 0)),
                    Start::Output => {
                        for r in 0..rows {
                            edge.0[r * BLOCK..r * BLOCK + cols].copy_from_slice(&c[(i + r) * ldc + j..][..cols]);
                        }
                        None
                    }
                    Start::Row(row) => {
                        for r in 0..rows {
                            edge.0[r * BLOCK..r * BLOCK + cols].copy_from_slice(&row[j..j + cols]);
                        }
                        None
                    }
                };
                // One pointer both reads the start from the buffer and writes the block there.
                let edge_ptr = edge.0.as_mut_ptr();
                run(edge_ptr, BLOCK, from.unwrap_or((edge_ptr as *const f32, BLOCK * 4)));
                if through_edge {
                    finish_block(epilogue, (edge.0.as_mut_ptr(), BLOCK), ldc, (i, j), (rows, cols), pack, false);
                    continue;
                }
                for r in 0..rows {
                    c[(i + r) * ldc + j..][..cols].copy_from_slice(&edge.0[r * BLOCK..r * BLOCK + cols]);
                }
                if finishing {
                    let out = c.as_mut_ptr().add(i * ldc + j);
                    finish_block(epilogue, (out, ldc), ldc, (i, j), (rows, cols), pack, true);
                }
            }
        }
    }
    drop(tiles);
}
