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
use tiderec_records::cpu::TileUnit;

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
/// it and `TIDEREC_MAX_ISA` allows it, or its tiles are emulated
/// ([`tile_unit`]).
pub fn amx_available() -> bool {
    tile_unit().is_some()
}

/// Where the AMX products run ([`tiderec_records::cpu::tile_unit`]): on the
/// CPU's tiles, emulated (`TIDEREC_AMX_EMULATE=1` on a CPU without usable AMX),
/// or nowhere. In this crate's tests a thread may also ask for emulated tiles
/// (`tests::on_tiles`).
pub fn tile_unit() -> Option<TileUnit> {
    #[cfg(test)]
    if tests::emulating_here() {
        return Some(TileUnit::Emulated);
    }
    tiderec_records::cpu::tile_unit()
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

    /// The pairs of the layout's lines, writable.
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
    let unit = tile_unit().expect("gemm_amx: AMX-BF16 does not run here");
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
        x86::gemm(a, b, (start, epilogue), (c, ldc), pack, write_c, unit)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("AMX runs only on x86-64 ({unit:?})")
}

#[cfg(target_arch = "x86_64")]
mod x86;

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
pub(crate) mod tests;
