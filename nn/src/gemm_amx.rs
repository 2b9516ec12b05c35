//! `c[m×n] (+)= op(a) · op(b)` on AMX tiles: the bf16 products of
//! `--precision bf16` on CPUs with AMX-BF16.
//!
//! The operands are bf16-rounded pairs (as for [`gemm_bf16`](super::gemm_bf16))
//! in the tiles' layouts: [`AmxLhs`] holds `op(a)` row by row, each row's pairs
//! padded to a multiple of 16 (one tile row), the rows padded to a multiple of
//! 32; [`AmxRhs`] holds `op(b)` as panels of 32 columns, each `⌈k/2⌉` rows of
//! pairs padded to a multiple of 16. Padding is zero, so it adds `+0` products.
//!
//! # Summation
//! Every entry of `c` is one chain over the reduction in *blocks* of 16 pairs,
//! from `c` (accumulating) or `+0`: `out ← out + (Σₑ + Σₒ)`, where `Σₑ` sums the
//! block's even-step products in order and `Σₒ` its odd-step products, every
//! addition rounded to `f32` — what one `TDPBF16PS` computes (measured on the
//! hardware; the crate's tile assembly documents it). [`gemm_amx_reference`] is that definition
//! in scalar code from the `f32` operands; the kernel equals it bit for bit
//! wherever no product or partial sum is a denormal (`tests`). The blocking of
//! the loops (chunks of the reduction, rows, panels) never changes a chain:
//! a chain left in `c` between chunks is reloaded exactly.
//!
//! Invariant: only the `m × n` entries of `c` are written.

use super::aligned::AlignedVec;
use super::amx_tile::{BLOCK, TILE_PAIRS};
use super::bf16_pack::{bf16_to_f32, interleave_rows, round_bf16, round_row_pairs};
use super::gemm::Op;
use super::relu::{relu_backward_in_place, relu_in_place};

/// Pairs per chunk of the reduction: a 32-row slice of `a` is reused by every
/// panel of `b`, whose rows are prefetched [`PREFETCH_BLOCKS`] blocks ahead.
/// Both were measured on Sapphire Rapids on DLRM's layers at 2,048 rows
/// (chunks of 128 to 1,024 pairs, prefetch 0 to 8 blocks ahead or the whole
/// next panel): these were the fastest.
const CHUNK_PAIRS: usize = 512;
/// Blocks of 16 pair rows of `b` between a block's tile loads and its prefetch.
const PREFETCH_BLOCKS: usize = 4;

/// Pairs per 64-byte line: the packed buffers start on a line
/// ([`AlignedVec`]), so every tile row of 16 pairs is one line.
const LINE_PAIRS: usize = 16;

/// `x` rounded up to a multiple of `to`.
fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// Whether the AMX products run here: the CPU has AMX-BF16, the process may use
/// it and `TIDEREC_MAX_ISA` allows it ([`tiderec_records::cpu`]).
pub fn amx_available() -> bool {
    tiderec_records::cpu::has(tiderec_records::cpu::Feature::AmxBf16)
}

/// The buffer of a packed operand: `count` rows of `op(a)` ([`AmxLhs`]) or
/// columns of `op(b)` ([`AmxRhs`]), each of `kp` pairs (`⌈k/2⌉` padded to 16),
/// the count padded to 32.
#[derive(Clone, Debug, Default)]
struct Layout {
    count: usize,
    pairs: usize,
    kp: usize,
    /// Lines of pairs; a buffer reused for products of several shapes keeps
    /// its largest length, and the packing that follows writes every line it
    /// uses, so a shorter shape clears nothing.
    data: AlignedVec<u32>,
}

impl Layout {
    /// Sizes the buffer for `count` rows or columns over a reduction of `k`,
    /// without clearing it: the packing or a product's epilogue
    /// ([`gemm_amx_packing`]) writes every line used.
    fn prepare(&mut self, count: usize, k: usize) {
        self.count = count;
        self.pairs = k.div_ceil(2);
        self.kp = round_up(self.pairs, TILE_PAIRS);
        let words = self.lines() * LINE_PAIRS;
        if self.data.len() < words {
            self.data.resize(words, 0);
        }
    }

    /// Lines of the layout (the buffer may hold more, from a larger shape).
    fn lines(&self) -> usize {
        round_up(self.count, BLOCK) * self.kp / LINE_PAIRS
    }

    /// The pairs of the layout's lines.
    #[cfg(test)]
    fn used(&self) -> &[u32] {
        &self.data[..self.lines() * LINE_PAIRS]
    }

    /// [`used`](Self::used), writable.
    fn used_mut(&mut self) -> &mut [u32] {
        let words = self.lines() * LINE_PAIRS;
        &mut self.data[..words]
    }
}

/// `op(a)` (`m × k`) in rows of pairs: pair `q` of row `i` at `i·kp + q`, with
/// `kp` the pairs padded to 16 and the rows to 32.
#[derive(Clone, Debug, Default)]
pub struct AmxLhs {
    /// `m` rows.
    layout: Layout,
    /// Sixteen pair rows of the transposed packing.
    strip: Vec<u32>,
}

impl AmxLhs {
    /// Packs `op(a)`: `a` is stored `m × k` for [`Op::N`], `k × m` for [`Op::T`].
    /// Every value of the layout is written, so a reused buffer is not cleared first.
    ///
    /// # Panics
    /// When `a` is shorter than its shape requires.
    pub fn pack(&mut self, op: Op, m: usize, k: usize, a: &[f32]) {
        self.pack_summing(op, m, k, a, None)
    }

    /// [`pack`](Self::pack), and with `sums` (`m` values) also
    /// `sums[i] = Σ_p op(a)[i][p]`, one `f32` chain per row over `p` in order
    /// from `+0` ([`row_sums`]'s result bit for bit): for `dW = dyᵀ·x`, the
    /// bias gradient `Σ_b dy[b]` without another pass over `dy`.
    ///
    /// # Panics
    /// When `a` is shorter than its shape requires or `sums` holds fewer than `m` values.
    pub fn pack_summing(&mut self, op: Op, m: usize, k: usize, a: &[f32], sums: Option<&mut [f32]>) {
        assert!(a.len() >= m * k, "AmxLhs: a has {} values, needs {}", a.len(), m * k);
        if let Some(s) = &sums {
            assert!(s.len() >= m, "AmxLhs: {} sums for {m} rows", s.len());
        }
        self.layout.prepare(m, k);
        let (pairs, kp) = (self.layout.pairs, self.layout.kp);
        let data = self.layout.used_mut();
        match op {
            Op::N => {
                for (i, out) in data.chunks_exact_mut(kp.max(1)).enumerate().take(m) {
                    round_row_pairs(&a[i * k..(i + 1) * k], &mut out[..pairs]);
                    out[pairs..].fill(0);
                }
            }
            Op::T => {
                #[cfg(target_arch = "x86_64")]
                if super::bf16_pack::bf16_vector_available() {
                    // SAFETY: the CPU has AVX-512 F, BW and BF16 (checked); `a` holds
                    // `k × m` values and `sums`, if any, `m` (asserted); `data` `m`
                    // rows of `kp` pairs.
                    unsafe { x86::pack_transposed(a, m, k, data, kp, sums) };
                    data[m * kp..].fill(0);
                    return;
                }
                pack_transposed_portable(a, m, k, data, kp, &mut self.strip);
            }
        }
        data[m * kp..].fill(0);
        if let Some(s) = sums {
            row_sums(op, m, k, a, s);
        }
    }

    /// Rows of `op(a)`.
    pub fn m(&self) -> usize {
        self.layout.count
    }

    /// Pairs per row (`⌈k/2⌉`).
    pub fn pairs(&self) -> usize {
        self.layout.pairs
    }
}

/// `sums[i] = Σ_p op(a)[i][p]` for the `m` rows of `op(a)` (`m × k`; `a`
/// stored `m × k` for [`Op::N`], `k × m` for [`Op::T`]): one `f32` chain per
/// row over `p` in order, from `+0`.
///
/// # Panics
/// When `a` or `sums` is shorter than the shape requires.
pub fn row_sums(op: Op, m: usize, k: usize, a: &[f32], sums: &mut [f32]) {
    let sums = &mut sums[..m];
    sums.fill(0.0);
    match op {
        Op::N => {
            for (s, row) in sums.iter_mut().zip(a.chunks_exact(k.max(1))) {
                *s = row.iter().fold(0.0, |acc, &v| acc + v);
            }
        }
        Op::T => {
            for step in a[..m * k].chunks_exact(m.max(1)) {
                for (s, &v) in sums.iter_mut().zip(step) {
                    *s += v;
                }
            }
        }
    }
}

/// Rows of pairs of `op(a)` from `a` stored `k × m` (the [`Op::T`] packing):
/// sixteen pairs of every row at a time through `strip`, then each row's
/// sixteen moved into place.
fn pack_transposed_portable(a: &[f32], m: usize, k: usize, data: &mut [u32], kp: usize, strip: &mut Vec<u32>) {
    let pairs = k.div_ceil(2);
    strip.resize(TILE_PAIRS * m, 0);
    for q0 in (0..kp).step_by(TILE_PAIRS) {
        for (dq, out) in strip.chunks_exact_mut(m.max(1)).enumerate() {
            let q = q0 + dq;
            if q >= pairs {
                out.fill(0);
                continue;
            }
            let lo = &a[2 * q * m..(2 * q + 1) * m];
            let hi = (2 * q + 1 < k).then(|| &a[(2 * q + 1) * m..(2 * q + 2) * m]);
            interleave_rows(lo, hi, out);
        }
        for i in 0..m {
            let row = &mut data[i * kp + q0..i * kp + q0 + TILE_PAIRS];
            for (dq, o) in row.iter_mut().enumerate() {
                *o = strip[dq * m + i];
            }
        }
    }
}

/// The portable [`AmxRhs::pack`] into `data` (`⌈n/32⌉` panels of `kp` pair rows).
fn pack_rhs_portable(op: Op, b: &[f32], k: usize, n: usize, data: &mut [u32], kp: usize, column: &mut Vec<u32>) {
    let pairs = k.div_ceil(2);
    for (p, panel) in data.chunks_exact_mut((kp * BLOCK).max(1)).enumerate().take(n.div_ceil(BLOCK)) {
        let first = p * BLOCK;
        let width = BLOCK.min(n - first);
        match op {
            Op::N => {
                for (q, out) in panel.chunks_exact_mut(BLOCK).enumerate().take(pairs) {
                    let row = |s: usize| &b[s * n + first..s * n + first + width];
                    interleave_rows(row(2 * q), (2 * q + 1 < k).then(|| row(2 * q + 1)), &mut out[..width]);
                    out[width..].fill(0);
                }
            }
            Op::T => {
                column.resize(pairs, 0);
                for j in 0..width {
                    round_row_pairs(&b[(first + j) * k..(first + j + 1) * k], column);
                    for (out, &v) in panel.chunks_exact_mut(BLOCK).zip(column.iter()) {
                        out[j] = v;
                    }
                }
                if width < BLOCK {
                    for out in panel.chunks_exact_mut(BLOCK).take(pairs) {
                        out[width..].fill(0);
                    }
                }
            }
        }
        panel[pairs * BLOCK..].fill(0);
    }
}

/// `op(b)` (`k × n`) as panels of 32 columns: pair row `q` of panel `p` at
/// `(p·kp + q)·32`, one pair per column, with `kp` the pairs padded to 16.
#[derive(Clone, Debug, Default)]
pub struct AmxRhs {
    /// `n` columns.
    layout: Layout,
    /// One column's pairs (the transposed packing's scratch).
    column: Vec<u32>,
}

impl AmxRhs {
    /// Packs `op(b)`: `b` is stored `k × n` for [`Op::N`], `n × k` for [`Op::T`]
    /// (a layer's `Wᵀ`). Every value of the layout is written.
    ///
    /// # Panics
    /// When `b` is shorter than its shape requires.
    pub fn pack(&mut self, op: Op, k: usize, n: usize, b: &[f32]) {
        assert!(b.len() >= k * n, "AmxRhs: b has {} values, needs {}", b.len(), k * n);
        self.layout.prepare(n, k);
        let kp = self.layout.kp;
        let data = self.layout.used_mut();
        #[cfg(target_arch = "x86_64")]
        if super::bf16_pack::bf16_vector_available() {
            // SAFETY: the CPU has AVX-512 F, BW and BF16 (checked); `b` holds `k × n`
            // values (asserted) and `data` the panels of `kp` pair rows.
            unsafe {
                match op {
                    Op::N => x86::pack_rows(b, k, n, data, kp),
                    Op::T => x86::pack_columns(b, k, n, data, kp),
                }
            };
            return;
        }
        pack_rhs_portable(op, b, k, n, data, kp, &mut self.column);
    }

    /// Columns of `op(b)`.
    pub fn n(&self) -> usize {
        self.layout.count
    }

    /// Pairs per column (`⌈k/2⌉`).
    pub fn pairs(&self) -> usize {
        self.layout.pairs
    }

    /// Entry `(row, col)` of `op(b)` as packed: its bf16 rounding, widened.
    ///
    /// # Panics
    /// Outside the `k × n` packed.
    pub fn value(&self, row: usize, col: usize) -> f32 {
        assert!(row < 2 * self.layout.pairs && col < self.n(), "AmxRhs: no entry ({row}, {col})");
        let pair = self.layout.data[(col / BLOCK * self.layout.kp + row / 2) * BLOCK + col % BLOCK];
        bf16_to_f32((pair >> (16 * (row % 2))) as u16)
    }
}

/// Where the chain of every entry of `c` starts.
#[derive(Clone, Copy, Debug)]
pub enum Start<'a> {
    /// At `+0`.
    Zero,
    /// At `c`'s value (accumulating).
    Output,
    /// At `row[j]` for column `j` of every row (a bias; `row` holds `n` values).
    Row(&'a [f32]),
}

/// What becomes of each entry of `c` once its chain is complete, while its
/// block is still in L1: an activation's pass without a pass of its own.
#[derive(Clone, Copy, Debug)]
pub enum Epilogue<'a> {
    /// It is stored as summed.
    None,
    /// [`relu_in_place`].
    Relu,
    /// [`relu_backward_in_place`] against
    /// the ReLU's output, laid out as `c` (`m` rows at stride `ldc`).
    ReluBackward(&'a [f32]),
    /// [`relu_backward_in_place`] against the ReLU's output rounded to bf16,
    /// as `rows` of [`gemm_amx_packing`] holds it (the `m × n` output as the
    /// right operand of a product over its rows): the values the layer above
    /// multiplied. The same as [`Epilogue::ReluBackward`] against the `f32`
    /// output wherever no output is a positive denormal (which rounds to `+0`).
    ReluBackwardPacked(&'a AmxRhs),
}

impl Epilogue<'_> {
    /// Applies the epilogue to `cols` entries of row `r` of `c` from column `j`.
    pub(crate) fn apply(&self, c: &mut [f32], ldc: usize, (r, j, cols): (usize, usize, usize)) {
        let at = r * ldc + j;
        match *self {
            Epilogue::None => {}
            Epilogue::Relu => relu_in_place(&mut c[at..at + cols]),
            Epilogue::ReluBackward(out) => relu_backward_in_place(&mut c[at..at + cols], &out[at..at + cols]),
            Epilogue::ReluBackwardPacked(out) => {
                let out: Vec<f32> = (j..j + cols).map(|col| out.value(r, col)).collect();
                relu_backward_in_place(&mut c[at..at + cols], &out);
            }
        }
    }
}

/// `c[m×n] = op(a)·op(b)` (`+ c` when `accumulate`) on AMX tiles; row `i` of
/// `c` starts at `c[i·ldc]`.
///
/// # Panics
/// When the operands' shapes disagree, `c` is shorter than its shape requires,
/// or AMX does not run here ([`amx_available`]).
pub fn gemm_amx(a: &AmxLhs, b: &AmxRhs, accumulate: bool, c: &mut [f32], ldc: usize) {
    gemm_amx_from(a, b, if accumulate { Start::Output } else { Start::Zero }, Epilogue::None, c, ldc)
}

/// [`gemm_amx`] with every chain starting at `start` and finished by
/// `epilogue`: with [`Start::Row`] the result is that of copying the row into
/// every row of `c` and accumulating, without the copy; with
/// [`Epilogue::Relu`], that of a ReLU pass over `c` afterwards, without the pass.
///
/// # Panics
/// As [`gemm_amx`], and when a start row holds fewer than `n` values.
pub fn gemm_amx_from(a: &AmxLhs, b: &AmxRhs, start: Start<'_>, epilogue: Epilogue<'_>, c: &mut [f32], ldc: usize) {
    let packings = Packings { lhs: None, rows: None, transposed: None, write_c: true };
    product(a, b, start, epilogue, (c, ldc), packings)
}

/// [`gemm_amx_from`], and `next` packed from the finished `c` as the left
/// operand of a product over `c`'s columns: what `next.pack(Op::N, m, n, c)`
/// afterwards packs, bit for bit, written while each block of `c` is in L1
/// (a layer's output, rounded once for the next layer's product). With
/// `rows`, `c` is also packed there as the right operand of a product over
/// `c`'s rows, what `rows.pack(Op::N, m, n, c)` packs (the next layer's input
/// for its `dW = dyᵀ·x`).
///
/// # Panics
/// As [`gemm_amx_from`].
pub fn gemm_amx_packing(
    a: &AmxLhs,
    b: &AmxRhs,
    (start, epilogue): (Start<'_>, Epilogue<'_>),
    (c, ldc): (&mut [f32], usize),
    next: &mut AmxLhs,
    rows: Option<&mut AmxRhs>,
) {
    let packings = Packings { lhs: Some(next), rows, transposed: None, write_c: true };
    gemm_amx_into(a, b, (start, epilogue), (c, ldc), packings)
}

/// Where [`gemm_amx_into`] packs the finished `c` (`m × n`), each block while
/// it is in L1; each packing is what packing `c` afterwards writes, bit for bit.
#[derive(Debug)]
pub struct Packings<'a> {
    /// `c` as the left operand of a product over its columns:
    /// `lhs.pack(Op::N, m, n, c)` (a layer's output for the next layer's forward,
    /// a `dy` for the `dx` product of the layer below).
    pub lhs: Option<&'a mut AmxLhs>,
    /// `c` as the right operand of a product over its rows:
    /// `rows.pack(Op::N, m, n, c)` (a layer's output for the next layer's `dW`).
    pub rows: Option<&'a mut AmxRhs>,
    /// `cᵀ` as the left operand of a product over `c`'s rows, and `c`'s column
    /// sums (`n` values): `t.pack_summing(Op::T, n, m, c, Some(sums))` (a `dy`
    /// for the `dW = dyᵀ·x` of the layer below, with its bias gradient).
    pub transposed: Option<(&'a mut AmxLhs, &'a mut [f32])>,
    /// Whether `c` is written. Without, where one chunk holds the reduction
    /// (`k ≤ 1,024`) and something is packed, each finished block goes from the
    /// tiles through an L1 buffer to the packings only and `c` is left as it
    /// was (elsewhere `c` is written as usual).
    pub write_c: bool,
}

/// [`gemm_amx_from`] with its finished blocks also packed as `packings` asks.
///
/// # Panics
/// As [`gemm_amx_from`], and when the column sums hold fewer than `n` values.
pub fn gemm_amx_into(
    a: &AmxLhs,
    b: &AmxRhs,
    (start, epilogue): (Start<'_>, Epilogue<'_>),
    (c, ldc): (&mut [f32], usize),
    packings: Packings<'_>,
) {
    product(a, b, start, epilogue, (c, ldc), packings)
}

fn product(
    a: &AmxLhs,
    b: &AmxRhs,
    start: Start<'_>,
    epilogue: Epilogue<'_>,
    (c, ldc): (&mut [f32], usize),
    Packings { lhs: mut next, mut rows, mut transposed, write_c }: Packings<'_>,
) {
    assert!(amx_available(), "gemm_amx: AMX-BF16 does not run here");
    if let Some(next) = next.as_deref_mut() {
        next.layout.prepare(a.m(), b.n());
    }
    if let Some(rows) = rows.as_deref_mut() {
        rows.layout.prepare(b.n(), a.m());
    }
    if let Some((t, sums)) = transposed.as_mut() {
        assert!(sums.len() >= b.n(), "gemm_amx: {} column sums for {} columns", sums.len(), b.n());
        t.layout.prepare(b.n(), a.m());
        sums[..b.n()].fill(0.0);
    }
    let (m, n, kp) = (a.m(), b.n(), b.layout.kp);
    if let Start::Row(row) = start {
        assert!(row.len() >= n, "gemm_amx: a start row of {} values for {n} columns", row.len());
    }
    match (epilogue, m > 0 && n > 0) {
        (Epilogue::ReluBackward(out), true) => {
            assert!(out.len() >= (m - 1) * ldc + n, "gemm_amx: a ReLU output of {} values", out.len())
        }
        (Epilogue::ReluBackwardPacked(out), _) => assert!(
            out.n() >= n && 2 * out.pairs() >= m,
            "gemm_amx: a packed ReLU output of {} x {} for {m} x {n}",
            2 * out.pairs(),
            out.n()
        ),
        _ => {}
    }
    assert_eq!(a.pairs(), b.pairs(), "gemm_amx: {} pairs on the left, {} on the right", a.pairs(), b.pairs());
    if m == 0 || n == 0 {
        if let Some(next) = next {
            next.layout.used_mut().fill(0);
        }
        if let Some(rows) = rows {
            rows.layout.used_mut().fill(0);
        }
        if let Some((t, _)) = transposed {
            t.layout.used_mut().fill(0);
        }
        return;
    }
    assert!(ldc >= n && c.len() >= (m - 1) * ldc + n, "gemm_amx: c has {} values for {m} rows of {n}", c.len());
    if kp == 0 {
        for r in 0..m {
            match start {
                Start::Zero => c[r * ldc..r * ldc + n].fill(0.0),
                Start::Output => {}
                Start::Row(row) => c[r * ldc..r * ldc + n].copy_from_slice(&row[..n]),
            }
            epilogue.apply(c, ldc, (r, 0, n));
        }
        if next.is_some() || rows.is_some() || transposed.is_some() {
            let values: Vec<f32> = (0..m).flat_map(|r| c[r * ldc..r * ldc + n].iter().copied()).collect();
            if let Some(next) = next {
                next.pack(Op::N, m, n, &values);
            }
            if let Some(rows) = rows {
                rows.pack(Op::N, m, n, &values);
            }
            if let Some((t, sums)) = transposed {
                t.pack_summing(Op::T, n, m, &values, Some(sums));
            }
        }
        return;
    }
    let lhs_to = next.map(|next| {
        // The padding rows; every pair of the rows below `m` is written by the blocks.
        let kp_next = next.layout.kp;
        let data = next.layout.used_mut();
        data[m * kp_next..].fill(0);
        (data.as_mut_ptr(), kp_next)
    });
    // Every line of these layouts is written by the blocks (their padding rows and columns as zeros).
    let rows_to = rows.map(|rows| (rows.layout.used_mut().as_mut_ptr(), rows.layout.kp));
    let transposed_to = transposed.map(|(t, sums)| {
        let kp_t = t.layout.kp;
        (t.layout.used_mut().as_mut_ptr(), kp_t, sums.as_mut_ptr())
    });
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AMX runs here (asserted); the shapes were checked above and the
    // packed operands hold `m` rows padded to 32 and `n` columns padded to 32,
    // both over `kp` pairs; `lhs_to`, if any, `m` rows of `⌈n/32⌉·16` pairs;
    // `rows_to`, if any, `⌈n/32⌉` panels of `⌈m/32⌉·16` pair rows;
    // `transposed_to`, if any, `n` rows padded to 32 of `⌈m/32⌉·16` pairs and `n` sums.
    unsafe {
        let pack = x86::PackTo { lhs: lhs_to, rows: rows_to, transposed: transposed_to };
        x86::gemm(a, b, (start, epilogue), (c, ldc), pack, write_c)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("AMX runs only on x86-64")
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::amx_tile::{block_32x32, Tiles, BLOCK, TILE_PAIRS};
    use super::super::bf16_pack::x86::{interleave_index, mask, pairs16};
    use super::{AmxLhs, AmxRhs, Epilogue, Start, CHUNK_PAIRS, PREFETCH_BLOCKS};
    use std::arch::x86_64::*;

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
            Epilogue::Relu => each_row(at, store, |_, _, _, x| {
                _mm512_maskz_add_ps(_mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, zero), x, zero)
            }),
            // `out <= 0` gives 0, anything else (NaN too) `grad + 0`.
            Epilogue::ReluBackward(out) => each_row(at, store, |r, half, m, x| {
                let o = _mm512_maskz_loadu_ps(m, out.as_ptr().add(r * ldc + j + 16 * half));
                _mm512_maskz_add_ps(_mm512_cmp_ps_mask::<_CMP_NLE_UQ>(o, zero), x, zero)
            }),
            // The same, the output widened from its bf16 half of pair row `r/2`.
            Epilogue::ReluBackwardPacked(out) => {
                let (panels, kp) = (out.layout.data.as_ptr(), out.layout.kp);
                each_row(at, store, |r, half, m, x| {
                    let pairs =
                        _mm512_maskz_loadu_epi32(m, panels.add((j / BLOCK * kp + r / 2) * BLOCK + 16 * half) as _);
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
                let hi =
                    if m1 != 0 { f(r + t, 1, m1, _mm512_maskz_loadu_ps(m1, to.add(16))) } else { _mm512_setzero_ps() };
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
    /// AMX runs here; `c` holds `m` rows of `n` at stride `ldc`; `kp ≥ 16`.
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
    ) {
        let (m, n, kp) = (a.m(), b.n(), b.layout.kp);
        let (a_words, b_words) = (&a.layout.data[..], &b.layout.data[..]);
        let through_edge = !store && pack.any() && kp <= CHUNK_PAIRS;
        let tiles = Tiles::configure();
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
                    let run = |c: *mut f32, ldc: usize, from: (*const f32, usize)| {
                        block_32x32(&tiles, a_ptr, kp * 4, b_ptr, BLOCK * 4, blocks, c, ldc * 4, from, prefetch)
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
                    let from = match start {
                        Start::Zero => (std::ptr::null(), 0),
                        Start::Row(row) if cols == BLOCK => (row.as_ptr().add(j), 0),
                        Start::Output => {
                            for r in 0..rows {
                                edge.0[r * BLOCK..r * BLOCK + cols].copy_from_slice(&c[(i + r) * ldc + j..][..cols]);
                            }
                            (edge.0.as_ptr(), BLOCK * 4)
                        }
                        Start::Row(row) => {
                            for r in 0..rows {
                                edge.0[r * BLOCK..r * BLOCK + cols].copy_from_slice(&row[j..j + cols]);
                            }
                            (edge.0.as_ptr(), BLOCK * 4)
                        }
                    };
                    run(edge.0.as_mut_ptr(), BLOCK, from);
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
}

/// The definition of [`gemm_amx`] from the `f32` operands (see the module's
/// summation): `op(a)` is `m × k` (`a` stored `m × k` for [`Op::N`], `k × m`
/// for [`Op::T`]), `op(b)` is `k × n` (`b` stored `k × n` or `n × k`), `c` is
/// `m × n` row-major.
#[allow(clippy::too_many_arguments)]
pub fn gemm_amx_reference(
    op_a: Op,
    op_b: Op,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    b: &[f32],
    accumulate: bool,
    c: &mut [f32],
) {
    let r = |x: f32| bf16_to_f32(round_bf16(x));
    let av = |i: usize, p: usize| if p >= k { 0.0 } else { r(if op_a == Op::N { a[i * k + p] } else { a[p * m + i] }) };
    let bv = |p: usize, j: usize| if p >= k { 0.0 } else { r(if op_b == Op::N { b[p * n + j] } else { b[j * k + p] }) };
    let kp = round_up(k.div_ceil(2), TILE_PAIRS);
    for i in 0..m {
        for j in 0..n {
            let mut out = if accumulate { c[i * n + j] } else { 0.0 };
            for q0 in (0..kp).step_by(TILE_PAIRS) {
                let (mut even, mut odd) = (av(i, 2 * q0) * bv(2 * q0, j), av(i, 2 * q0 + 1) * bv(2 * q0 + 1, j));
                for q in q0 + 1..q0 + TILE_PAIRS {
                    even += av(i, 2 * q) * bv(2 * q, j);
                    odd += av(i, 2 * q + 1) * bv(2 * q + 1, j);
                }
                out += even + odd;
            }
            c[i * n + j] = out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operands(m: usize, n: usize, k: usize, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        // Normal values scaled over a wide range of exponents, so the order of
        // the sums shows in the last bits.
        let val = |i: usize| {
            let x = tiderec_records::rng::normal_f64(seed, i as u64, 0, 0);
            let e = (tiderec_records::rng::unit_f64(seed, i as u64, 1, 0) * 16.0) as i32 - 8;
            (x * 2f64.powi(e)) as f32
        };
        let a = (0..m * k).map(val).collect();
        let b = (0..k * n).map(|i| val(i + 10_000_000)).collect();
        let c = (0..m * n).map(|i| val(i + 20_000_000)).collect();
        (a, b, c)
    }

    /// Shapes with every edge: one row, rows past 32, widths not multiples of
    /// 16 or 32, odd `k`, `k` past one and two chunks of the reduction, one column.
    const SHAPES: [(usize, usize, usize); 13] = [
        (1, 1, 1),
        (3, 5, 2),
        (13, 17, 13),
        (33, 33, 31),
        (32, 32, 32),
        (64, 64, 64),
        (37, 70, 257),
        (64, 512, 13),
        (128, 1, 256),
        (50, 16, 600),
        (2, 40, 1000),
        (70, 96, 513),
        (33, 40, 2100),
    ];

    /// The kernel, on both layouts of both operands, accumulating or not,
    /// equals [`gemm_amx_reference`] bit for bit.
    #[test]
    fn kernel_equals_the_oracle_bit_for_bit() {
        if !amx_available() {
            eprintln!("skipped: this CPU has no usable AMX-BF16 ({})", tiderec_records::cpu::describe());
            return;
        }
        let (mut lhs, mut rhs) = (AmxLhs::default(), AmxRhs::default());
        for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
            let (a, b, c0) = operands(m, n, k, s as u64);
            for (op_a, op_b, accumulate) in
                [(Op::N, Op::T, true), (Op::T, Op::N, false), (Op::N, Op::N, false), (Op::T, Op::T, true)]
            {
                let mut want = c0.clone();
                gemm_amx_reference(op_a, op_b, m, n, k, &a, &b, accumulate, &mut want);
                lhs.pack(op_a, m, k, &a);
                rhs.pack(op_b, k, n, &b);
                let mut got = c0.clone();
                gemm_amx(&lhs, &rhs, accumulate, &mut got, n);
                for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        x.to_bits() == y.to_bits(),
                        "{op_a:?}{op_b:?} {m}x{n}x{k} acc {accumulate} [{i}]: {x:e} vs {y:e}"
                    );
                }
            }
        }
    }

    /// Every shape of [`SHAPES`] with every start and epilogue (the ReLU's
    /// backward against its output as values and as packed), each handed to
    /// `f` with the packed operands, `c`'s starting values and the case's name.
    fn each_case(seed: u64, mut f: impl FnMut(&str, (&AmxLhs, &AmxRhs), (Start<'_>, Epilogue<'_>), &[f32], usize)) {
        let (mut lhs, mut rhs, mut relu_packed) = (AmxLhs::default(), AmxRhs::default(), AmxRhs::default());
        for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
            let (a, b, c0) = operands(m, n, k, seed + s as u64);
            let bias: Vec<f32> = c0[..n].to_vec();
            let relu_out: Vec<f32> = c0.iter().rev().copied().collect();
            lhs.pack(Op::N, m, k, &a);
            rhs.pack(Op::T, k, n, &b);
            relu_packed.pack(Op::N, m, n, &relu_out);
            let starts = [Start::Zero, Start::Output, Start::Row(&bias)];
            let epilogues = [
                Epilogue::None,
                Epilogue::Relu,
                Epilogue::ReluBackward(&relu_out),
                Epilogue::ReluBackwardPacked(&relu_packed),
            ];
            for (start, epilogue) in starts.iter().flat_map(|&s| epilogues.iter().map(move |&e| (s, e))) {
                let case = format!("{m}x{n}x{k} {start:?} {epilogue:?}");
                f(&case, (&lhs, &rhs), (start, epilogue), &c0, k);
            }
        }
    }

    /// A product that packs its output for the next one writes the same `c`
    /// as one that does not, and the packed output equals `c` packed
    /// afterwards, padding included, bit for bit, as a left operand and as a
    /// right one: on every shape, start and epilogue, into buffers left from a
    /// larger shape.
    #[test]
    fn packing_the_output_equals_packing_it_afterwards() {
        if !amx_available() {
            eprintln!("skipped: this CPU has no usable AMX-BF16 ({})", tiderec_records::cpu::describe());
            return;
        }
        let want_next = &mut AmxLhs::default();
        let (mut next, mut rows, mut want_rows) = (AmxLhs::default(), AmxRhs::default(), AmxRhs::default());
        let (big, _, _) = operands(70, 1, 600, 1);
        next.pack(Op::N, 70, 600, &big);
        rows.pack(Op::N, 70, 600, &big);
        each_case(200, |case, (lhs, rhs), (start, epilogue), c0, _| {
            let (m, n) = (lhs.m(), rhs.n());
            let mut want = c0.to_vec();
            gemm_amx_from(lhs, rhs, start, epilogue, &mut want, n);
            want_next.pack(Op::N, m, n, &want);
            want_rows.pack(Op::N, m, n, &want);
            let mut got = c0.to_vec();
            gemm_amx_packing(lhs, rhs, (start, epilogue), (&mut got, n), &mut next, Some(&mut rows));
            assert!(got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "c differs: {case}");
            let shape = |l: &Layout| (l.count, l.pairs, l.kp);
            assert_eq!(shape(&next.layout), shape(&want_next.layout), "{case}");
            assert_eq!(next.layout.used(), want_next.layout.used(), "packed output differs: {case}");
            assert_eq!(shape(&rows.layout), shape(&want_rows.layout), "{case}");
            assert_eq!(rows.layout.used(), want_rows.layout.used(), "output packed as rows differs: {case}");
        });
    }

    /// Packing while summing leaves the packing as it was, and its sums equal
    /// [`row_sums`] bit for bit (and that, each row's chain in order), on both
    /// layouts: the transposed one sums in the packing kernel where the CPU has
    /// AVX-512 BF16, elsewhere in `row_sums`.
    #[test]
    fn packing_while_summing_equals_the_row_sums() {
        let (mut plain, mut summing) = (AmxLhs::default(), AmxLhs::default());
        for (s, &(m, _, k)) in SHAPES.iter().enumerate() {
            let (a, _, _) = operands(m, 1, k, 100 + s as u64);
            for op in [Op::T, Op::N] {
                let at = |i: usize, p: usize| if op == Op::N { a[i * k + p] } else { a[p * m + i] };
                let want: Vec<u32> = (0..m).map(|i| (0..k).fold(0.0f32, |acc, p| acc + at(i, p)).to_bits()).collect();
                let mut sums = vec![f32::NAN; m + 3];
                row_sums(op, m, k, &a, &mut sums);
                assert_eq!(sums[..m].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "row_sums {op:?} {m}x{k}");
                assert!(sums[m..].iter().all(|v| v.is_nan()), "row_sums wrote past m");
                plain.pack(op, m, k, &a);
                let mut fused = vec![f32::NAN; m + 3];
                summing.pack_summing(op, m, k, &a, Some(&mut fused));
                assert_eq!(fused[..m].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "fused {op:?} {m}x{k}");
                assert!(fused[m..].iter().all(|v| v.is_nan()), "the fused sums wrote past m");
                assert_eq!(plain.layout.used(), summing.layout.used(), "packing {op:?} {m}x{k}");
            }
        }
    }

    /// The oracle's order is the hardware's and no other: the same products
    /// summed as one chain in order differ from it on these operands, so the
    /// bit-for-bit test above could fail.
    #[test]
    fn the_oracle_is_not_a_plain_chain() {
        let (m, n, k) = (16, 16, 64);
        let (a, b, _) = operands(m, n, k, 7);
        let mut amx = vec![0.0; m * n];
        gemm_amx_reference(Op::N, Op::N, m, n, k, &a, &b, false, &mut amx);
        let mut chain = vec![0.0; m * n];
        crate::gemm_bf16::gemm_bf16_reference(Op::N, Op::N, m, n, k, &a, &b, false, &mut chain);
        let differ = amx.iter().zip(&chain).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        assert!(differ > m * n / 10, "{differ} of {} entries differ", m * n);
    }

    /// Rows of `c` wider than `n`: the columns past `n` are never written, and
    /// buffers reused for smaller shapes are fully rewritten.
    #[test]
    fn only_the_product_entries_are_written() {
        if !amx_available() {
            eprintln!("skipped: this CPU has no usable AMX-BF16");
            return;
        }
        let (mut lhs, mut rhs) = (AmxLhs::default(), AmxRhs::default());
        let (big_a, big_b, _) = operands(70, 70, 90, 9);
        lhs.pack(Op::N, 70, 90, &big_a);
        rhs.pack(Op::N, 90, 70, &big_b);
        let (m, n, k, ldc) = (30, 21, 9, 40);
        let (a, b, _) = operands(m, n, k, 3);
        lhs.pack(Op::N, m, k, &a);
        rhs.pack(Op::N, k, n, &b);
        let mut want = vec![0.0; m * n];
        gemm_amx_reference(Op::N, Op::N, m, n, k, &a, &b, false, &mut want);
        let mut c = vec![f32::NAN; (m - 1) * ldc + n];
        gemm_amx(&lhs, &rhs, false, &mut c, ldc);
        for (idx, &v) in c.iter().enumerate() {
            let (i, j) = (idx / ldc, idx % ldc);
            if j < n {
                assert_eq!(v.to_bits(), want[i * n + j].to_bits(), "[{i}][{j}]");
            } else {
                assert!(v.is_nan(), "[{i}][{j}] written");
            }
        }
    }

    /// Starting every chain at a bias row equals copying the row into `c` and
    /// accumulating, and the ReLU epilogue a ReLU pass afterwards, bit for bit,
    /// on shapes with edges and past one chunk.
    #[test]
    fn a_start_row_equals_a_copied_bias() {
        if !amx_available() {
            eprintln!("skipped: this CPU has no usable AMX-BF16");
            return;
        }
        let (mut lhs, mut rhs) = (AmxLhs::default(), AmxRhs::default());
        let mut cut = 0;
        for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
            let (a, b, _) = operands(m, n, k, 50 + s as u64);
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.37 - 3.0).collect();
            lhs.pack(Op::N, m, k, &a);
            rhs.pack(Op::T, k, n, &b);
            let mut want: Vec<f32> = (0..m).flat_map(|_| bias.iter().copied()).collect();
            gemm_amx_reference(Op::N, Op::T, m, n, k, &a, &b, true, &mut want);
            let mut got = vec![f32::NAN; m * n];
            gemm_amx_from(&lhs, &rhs, Start::Row(&bias), Epilogue::None, &mut got, n);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{m}x{n}x{k}");
            cut += want.iter().filter(|&&v| v < 0.0).count();
            relu_in_place(&mut want);
            gemm_amx_from(&lhs, &rhs, Start::Row(&bias), Epilogue::Relu, &mut got, n);
            assert_eq!(bits(&got), bits(&want), "{m}x{n}x{k} with the ReLU epilogue");
        }
        assert!(cut > 1000, "only {cut} entries were negative: the ReLU was hardly tested");
    }

    /// The ReLU-backward epilogue equals the product followed by
    /// `relu_backward_in_place` against the output, bit for bit, at a stride.
    #[test]
    fn the_relu_backward_epilogue_equals_a_pass_afterwards() {
        if !amx_available() {
            eprintln!("skipped: this CPU has no usable AMX-BF16");
            return;
        }
        let (mut lhs, mut rhs) = (AmxLhs::default(), AmxRhs::default());
        for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
            let ldc = n + 3;
            let (a, b, _) = operands(m, n, k, 70 + s as u64);
            let out: Vec<f32> = (0..m * ldc).map(|i| if i % 3 == 0 { 0.0 } else { (i % 7) as f32 - 3.0 }).collect();
            lhs.pack(Op::N, m, k, &a);
            rhs.pack(Op::N, k, n, &b);
            let mut want = vec![0.0f32; m * n];
            gemm_amx_reference(Op::N, Op::N, m, n, k, &a, &b, false, &mut want);
            let mut got = vec![f32::NAN; m * ldc];
            gemm_amx_from(&lhs, &rhs, Start::Zero, Epilogue::ReluBackward(&out), &mut got, ldc);
            for i in 0..m {
                relu_backward_in_place(&mut want[i * n..(i + 1) * n], &out[i * ldc..i * ldc + n]);
                for j in 0..ldc {
                    let g = got[i * ldc + j];
                    if j < n {
                        assert_eq!(g.to_bits(), want[i * n + j].to_bits(), "{m}x{n}x{k} [{i}][{j}]");
                    } else {
                        assert!(g.is_nan(), "{m}x{n}x{k} [{i}][{j}] written");
                    }
                }
            }
        }
    }

    /// The vector packing of rows of `b` writes the portable packing's bits.
    #[test]
    fn row_packing_equals_portable() {
        if !crate::bf16_pack::bf16_vector_available() {
            eprintln!("skipped: this CPU has no AVX-512 BF16 (only the portable packing runs)");
            return;
        }
        for (k, n) in [(1, 1), (2, 3), (32, 16), (33, 17), (7, 40), (64, 33), (100, 5), (31, 70)] {
            let (b, _, _) = operands(k, 1, n, 12);
            let kp = round_up(k.div_ceil(2), TILE_PAIRS);
            let len = n.div_ceil(BLOCK) * kp * BLOCK;
            let (mut got, mut want) = (vec![7u32; len], vec![9u32; len]);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the features were checked; the buffers have the documented sizes.
            unsafe {
                x86::pack_rows(&b, k, n, &mut got, kp)
            };
            pack_rhs_portable(Op::N, &b, k, n, &mut want, kp, &mut Vec::new());
            assert_eq!(got, want, "{k}x{n}");
        }
    }

    /// The vector packing of columns of `b` (stored `n × k`, a layer's `Wᵀ`)
    /// writes the portable packing's bits, padding included.
    #[test]
    fn column_packing_equals_portable() {
        if !crate::bf16_pack::bf16_vector_available() {
            eprintln!("skipped: this CPU has no AVX-512 BF16 (only the portable packing runs)");
            return;
        }
        for (k, n) in [(1, 1), (2, 3), (32, 16), (33, 17), (7, 40), (64, 33), (100, 5), (31, 70), (367, 512)] {
            let (b, _, _) = operands(n, 1, k, 13);
            let kp = round_up(k.div_ceil(2), TILE_PAIRS);
            let len = n.div_ceil(BLOCK) * kp * BLOCK;
            let (mut got, mut want) = (vec![7u32; len], vec![9u32; len]);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the features were checked; the buffers have the documented sizes.
            unsafe {
                x86::pack_columns(&b, k, n, &mut got, kp)
            };
            pack_rhs_portable(Op::T, &b, k, n, &mut want, kp, &mut Vec::new());
            assert_eq!(got, want, "{k}x{n}");
        }
    }

    /// The vector transposed packing writes the portable packing's bits.
    #[test]
    fn transposed_packing_equals_portable() {
        if !crate::bf16_pack::bf16_vector_available() {
            eprintln!("skipped: this CPU has no AVX-512 BF16 (only the portable packing runs)");
            return;
        }
        for (m, k) in [(1, 1), (3, 2), (16, 32), (17, 33), (40, 7), (33, 64), (5, 100)] {
            let (a, _, _) = operands(m, 1, k, 11);
            let kp = round_up(k.div_ceil(2), TILE_PAIRS);
            let (mut got, mut want) = (vec![7u32; m * kp], vec![9u32; m * kp]);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the features were checked; the buffers have the documented sizes.
            unsafe {
                x86::pack_transposed(&a, m, k, &mut got, kp, None)
            };
            pack_transposed_portable(&a, m, k, &mut want, kp, &mut Vec::new());
            assert_eq!(got, want, "{m}x{k}");
        }
    }

    /// The vector epilogue equals the scalar ReLU passes on the values where a
    /// vector select could differ: NaN, `±0`, `±∞`, and at every width 1..=32.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_vector_epilogue_equals_the_scalar_passes_on_special_values() {
        if !amx_available() {
            eprintln!("skipped: this CPU has no usable AMX-BF16");
            return;
        }
        let special = [f32::NAN, -0.0, 0.0, f32::INFINITY, f32::NEG_INFINITY, -1.5, 2.5, -f32::MIN_POSITIVE];
        let (rows, ldc) = (3, 37);
        let value = |i: usize, shift: usize| special[(i * 7 + shift) % special.len()];
        let out: Vec<f32> = (0..rows * ldc).map(|i| value(i, 3)).collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let kp = 32;
        for cols in 1..=32 {
            for epilogue in [Epilogue::None, Epilogue::Relu, Epilogue::ReluBackward(&out)] {
                let c: Vec<f32> = (0..rows * ldc).map(|i| value(i, cols)).collect();
                let mut want = c.clone();
                let mut want_pairs = vec![0u32; rows * kp];
                for r in 0..rows {
                    epilogue.apply(&mut want, ldc, (r, 2, cols));
                    let row = &want[r * ldc + 2..r * ldc + 2 + cols];
                    round_row_pairs(row, &mut want_pairs[r * kp + 1..r * kp + 17]);
                }
                for pack in [false, true] {
                    let mut got = c.clone();
                    let mut pairs = vec![u32::MAX; rows * kp];
                    let to = super::x86::PackTo {
                        lhs: pack.then_some((pairs.as_mut_ptr(), kp)),
                        rows: None,
                        transposed: None,
                    };
                    // SAFETY: AMX implies AVX-512 F, BW and BF16; the block (rows × cols
                    // from column 2) lies inside `got` and `out`, its pairs (1 to 16) in `pairs`.
                    unsafe {
                        let block = (got.as_mut_ptr().add(2), ldc);
                        super::x86::finish_block(epilogue, block, ldc, (0, 2), (rows, cols), to, true)
                    };
                    assert_eq!(bits(&got), bits(&want), "{cols} columns, {epilogue:?}, packing {pack}");
                    if pack {
                        for r in 0..rows {
                            let (got, want) = (&pairs[r * kp..(r + 1) * kp], &want_pairs[r * kp..(r + 1) * kp]);
                            assert_eq!(got[1..17], want[1..17], "{cols} columns, {epilogue:?}: row {r}'s pairs");
                            assert!(
                                got[..1].iter().chain(&got[17..]).all(|&p| p == u32::MAX),
                                "written past the block"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The ReLU-backward epilogue reading the packed output equals the scalar
    /// pass against that output rounded to bf16, bit for bit, on special values
    /// (NaN, `±0`, `±∞`, denormals), at every width 1..=32 of the first and of
    /// the second panel; against the `f32` output it differs only where that is
    /// a positive denormal, which rounds to `+0`.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_packed_relu_backward_reads_the_rounded_output() {
        if !amx_available() {
            eprintln!("skipped: this CPU has no usable AMX-BF16");
            return;
        }
        let tiny = f32::from_bits(1);
        let special = [f32::NAN, -0.0, 0.0, f32::INFINITY, f32::NEG_INFINITY, -1.5, 2.5, tiny, -tiny, 1e-39, 3.0];
        let (rows, ldc) = (5, 64);
        let value = |i: usize, shift: usize| special[(i * 7 + shift) % special.len()];
        let out: Vec<f32> = (0..rows * ldc).map(|i| value(i, 3)).collect();
        let rounded: Vec<f32> = out.iter().map(|&x| bf16_to_f32(round_bf16(x))).collect();
        let mut packed = AmxRhs::default();
        packed.pack(Op::N, rows, ldc, &out);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let none = super::x86::PackTo { lhs: None, rows: None, transposed: None };
        for (j, cols) in [0, 32].into_iter().flat_map(|j| (1..=32).map(move |cols| (j, cols))) {
            let c: Vec<f32> = (0..rows * ldc).map(|i| value(i, cols) * 0.5 + 1.0).collect();
            let (mut want, mut exact) = (c.clone(), c.clone());
            for r in 0..rows {
                Epilogue::ReluBackward(&rounded).apply(&mut want, ldc, (r, j, cols));
                Epilogue::ReluBackward(&out).apply(&mut exact, ldc, (r, j, cols));
            }
            let mut scalar = c.clone();
            let mut got = c.clone();
            for r in 0..rows {
                Epilogue::ReluBackwardPacked(&packed).apply(&mut scalar, ldc, (r, j, cols));
            }
            // SAFETY: AMX implies AVX-512 F, BW and BF16; the block (rows × cols from
            // column j, a multiple of 32) lies inside `got` and the packed output.
            unsafe {
                let block = (got.as_mut_ptr().add(j), ldc);
                super::x86::finish_block(
                    Epilogue::ReluBackwardPacked(&packed),
                    block,
                    ldc,
                    (0, j),
                    (rows, cols),
                    none,
                    true,
                )
            };
            assert_eq!(bits(&scalar), bits(&want), "scalar: {cols} columns from {j}");
            assert_eq!(bits(&got), bits(&want), "vector: {cols} columns from {j}");
            for (at, (&g, &e)) in got.iter().zip(&exact).enumerate() {
                let inside = (j..j + cols).contains(&(at % ldc));
                let positive_denormal = out[at] > 0.0 && out[at].is_subnormal();
                let differs = inside && positive_denormal && e != 0.0;
                assert_eq!(g.to_bits() != e.to_bits(), differs, "at {at}: {g} against {e}");
            }
        }
    }

    /// [`gemm_amx_into`] packs the finished `c` as packing it afterwards does,
    /// bit for bit, padding included: as a left operand, as a right one, and
    /// transposed with its column sums ([`AmxLhs::pack_summing`]); without
    /// `write_c` it leaves `c` as it was where one chunk holds the reduction
    /// (elsewhere it writes `c`): on every shape, start and epilogue, into
    /// buffers left from a larger shape.
    #[test]
    fn every_packing_equals_packing_afterwards_with_or_without_c() {
        if !amx_available() {
            eprintln!("skipped: this CPU has no usable AMX-BF16 ({})", tiderec_records::cpu::describe());
            return;
        }
        let (mut next, mut rows, mut t) = (AmxLhs::default(), AmxRhs::default(), AmxLhs::default());
        let (mut want_next, mut want_rows, mut want_t) = (AmxLhs::default(), AmxRhs::default(), AmxLhs::default());
        let (big, _, _) = operands(70, 1, 600, 1);
        next.pack(Op::N, 70, 600, &big);
        rows.pack(Op::N, 70, 600, &big);
        t.pack(Op::T, 600, 70, &big);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        each_case(300, |case, (lhs, rhs), (start, epilogue), c0, k| {
            let (m, n) = (lhs.m(), rhs.n());
            let mut want = c0.to_vec();
            gemm_amx_from(lhs, rhs, start, epilogue, &mut want, n);
            let mut want_sums = vec![f32::NAN; n];
            want_next.pack(Op::N, m, n, &want);
            want_rows.pack(Op::N, m, n, &want);
            want_t.pack_summing(Op::T, n, m, &want, Some(&mut want_sums));
            for write_c in [false, true] {
                let case = format!("{case} write_c {write_c}");
                let (mut got, mut sums) = (c0.to_vec(), vec![f32::NAN; n + 1]);
                let packings = Packings {
                    lhs: Some(&mut next),
                    rows: Some(&mut rows),
                    transposed: Some((&mut t, &mut sums[..n])),
                    write_c,
                };
                gemm_amx_into(lhs, rhs, (start, epilogue), (&mut got, n), packings);
                let one_chunk = k.div_ceil(2).div_ceil(TILE_PAIRS) * TILE_PAIRS <= CHUNK_PAIRS;
                assert_eq!(bits(&got), bits(if one_chunk && !write_c { c0 } else { &want }), "c: {case}");
                let shape = |l: &Layout| (l.count, l.pairs, l.kp);
                assert_eq!(shape(&next.layout), shape(&want_next.layout), "{case}");
                assert_eq!(next.layout.used(), want_next.layout.used(), "as a left operand: {case}");
                assert_eq!(shape(&rows.layout), shape(&want_rows.layout), "{case}");
                assert_eq!(rows.layout.used(), want_rows.layout.used(), "as rows: {case}");
                assert_eq!(shape(&t.layout), shape(&want_t.layout), "{case}");
                assert_eq!(t.layout.used(), want_t.layout.used(), "transposed: {case}");
                assert_eq!(bits(&sums[..n]), bits(&want_sums), "column sums: {case}");
                assert!(sums[n].is_nan(), "a sum past n written: {case}");
            }
        });
    }

    /// An empty reduction writes zeros (or leaves `c` when accumulating).
    #[test]
    fn an_empty_reduction_is_zero() {
        if !amx_available() {
            eprintln!("skipped: this CPU has no usable AMX-BF16");
            return;
        }
        let (mut lhs, mut rhs) = (AmxLhs::default(), AmxRhs::default());
        lhs.pack(Op::N, 3, 0, &[]);
        rhs.pack(Op::N, 0, 4, &[]);
        let mut c = vec![5.0; 12];
        gemm_amx(&lhs, &rhs, true, &mut c, 4);
        assert!(c.iter().all(|&v| v == 5.0));
        gemm_amx(&lhs, &rhs, false, &mut c, 4);
        assert!(c.iter().all(|&v| v == 0.0));
    }
}
