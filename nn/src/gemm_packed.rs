//! GEMM against a right-hand operand packed once and reused many times: the
//! weight-stationary products of a recurrence (`h · W_hhᵀ` every time step,
//! `dG · W_hh` every step of back-propagation) and the skinny input-side
//! products beside them.
//!
//! [`PackedRhs`] stores `op(b)` (`k × n`) as column panels, each `k` rows of
//! its width's contiguous values, zero-padded to a multiple of `LANES`:
//! panels of 16 columns while more than 40 remain, then one panel of the
//! rest (`n = 36` is one 40-wide panel, `n = 108` five of 16 and one of 32).
//! [`gemm_packed`] streams the rows of `a` as stored (no copy, any row
//! stride) and accumulates each `rows × width` block of `c` in registers
//! (AVX2 + FMA: at most twelve accumulators, e.g. 6 × 16 or 2 × 40 `f32`;
//! with AVX-512VL's thirty-two registers up to 24, e.g. 12 × 16 or 6 × 32;
//! the wide AVX-512 kernel of `wide.rs`, the fastest where it runs, 6 × 64 across
//! four panels),
//! so a product of a few dozen columns pays neither the packing of both
//! operands nor the edge handling that a general GEMM pays on every call.
//!
//! Beside this file: `finish` (a block's bias, ReLU, mask and column sums as
//! it is written), `mm_order` (the backward products in matrixmultiply's
//! summation order), `wide` and `x86` (the AVX-512 and AVX2 kernels).
//!
//! Invariants: a `PackedRhs` built from `b` holds exactly `op(b)`'s values
//! (padding is zero and never reaches `c`); [`gemm_packed`] writes only the
//! `m × n` entries of `c`. The oracle is [`gemm_reference`](super::gemm::gemm_reference).

use super::aligned::AlignedVec;
use super::gemm::Op;
use super::Scalar;

/// Values per vector (one AVX2 register of `f32`); panel widths are multiples of it.
pub(crate) const LANES: usize = 8;
/// Width of the full panels.
const WIDE: usize = 2 * LANES;
/// The widest last panel (five vectors).
const LAST_MAX: usize = 5 * LANES;
/// Rows of `a` per group, kept in L1 while all panels pass: a multiple of
/// every block's rows (AVX2: 8, 6, 4, 3 or 2 for panels of 1 to 5 vectors;
/// AVX-512VL: 12, 12, 8, 6 or 4).
const GROUP_ROWS: usize = 24;
/// The largest `c` (bytes) whose product runs the reduction's chunks
/// outside its row groups (see `gemm_packed_chunks`): twice a Zen 3 core's
/// 512 KiB L2, half a Sapphire Rapids core's.
/// Past it each group runs through every chunk (on a Zen 3 the AVX2 kernel
/// runs DLRM's wide forward products at 2,048 rows 1.1–1.2× faster so).
const C_CHUNKS_OUTSIDE_MAX: usize = 1 << 20;
/// Most reduction steps per pass: a 40-wide panel's chunk is at most 30 KiB of
/// `f32`, so it stays in L1 or close (every GRU product is one chunk; an MLP's
/// `k = 512` is three).
const K_CHUNK_MAX: usize = 192;
/// Reduction steps per part of [`PanelKernel::Avx512WideSplit`]'s chunks:
/// four 16-wide panels' part is 16 KiB.
const SPLIT_STEPS: usize = 64;

/// Copies `W` values of successive rows of `b` (rows `ldb` apart, the
/// first from `start`) into the `W`-value rows of `panel`.
fn copy_rows<T: Copy, const W: usize>(panel: &mut [T], b: &[T], start: usize, ldb: usize) {
    for (p, row) in panel.chunks_exact_mut(W).enumerate() {
        let at = p * ldb + start;
        let row: &mut [T; W] = row.try_into().expect("chunks of W values");
        *row = b[at..at + W].try_into().expect("a row of W values");
    }
}

/// `(first column, panel width)` of each panel for `n` columns.
pub(super) fn panels(n: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut first = 0;
    std::iter::from_fn(move || {
        if first >= n {
            return None;
        }
        let rest = n - first;
        let width = if rest > LAST_MAX { WIDE } else { rest.div_ceil(LANES) * LANES };
        first += width;
        Some((first - width, width))
    })
}

/// `op(b)` (`k × n`) packed into zero-padded column panels for [`gemm_packed`].
#[derive(Clone, Debug, Default)]
pub struct PackedRhs<T> {
    k: usize,
    n: usize,
    /// Panel after panel, starting on a cache line: each 64-byte row of a
    /// 16-wide `f32` panel is one line, never two.
    panels: AlignedVec<T>,
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
    ///
    /// Every value of the packed layout is written (the operand's values, then
    /// zeros in each panel's padding columns), so the buffer is not cleared
    /// first: a per-step weight re-pack costs one pass over the weight.
    pub fn pack(&mut self, op: Op, k: usize, n: usize, b: &[T]) {
        assert!(b.len() >= k * n, "PackedRhs: b has {} values, needs {}", b.len(), k * n);
        if op == Op::N {
            return self.pack_columns(k, 0, n, b, n);
        }
        for (first, width, pw, panel) in self.reshape(k, n) {
            T::pack_transposed(b, k, first, width, pw, panel);
            if width < pw {
                for row in panel.chunks_exact_mut(pw) {
                    row[width..].fill(T::ZERO);
                }
            }
        }
    }

    /// Sizes the panels for a `k × n` operand (the buffer is reused, its
    /// contents are left for the packing to overwrite) and hands out each
    /// panel to fill: `(first column, columns of the operand, panel width, its k rows)`.
    fn reshape(&mut self, k: usize, n: usize) -> impl Iterator<Item = (usize, usize, usize, &mut [T])> {
        self.k = k;
        self.n = n;
        let total: usize = panels(n).map(|(_, pw)| k * pw).sum();
        // Every value is written by the packing: a scratch shared by products
        // of several shapes is not cleared each time it grows again.
        self.panels.resize_to_overwrite(total, T::ZERO);
        let mut rest = &mut self.panels[..];
        panels(n).map(move |(first, pw)| {
            let (panel, tail) = std::mem::take(&mut rest).split_at_mut(k * pw);
            rest = tail;
            (first, pw.min(n - first), pw, panel)
        })
    }

    /// Packs columns `first .. first + n` of the `k` rows of `b`, rows `ldb`
    /// apart ([`Op::N`]'s packing of a block of a stored matrix: the last
    /// columns that [`gemm_mm_order_in_place`](mm_order::gemm_mm_order_in_place) cannot read in place).
    ///
    /// # Panics
    /// When `b` is shorter than its shape requires or `first + n > ldb`.
    pub(crate) fn pack_columns(&mut self, k: usize, first: usize, n: usize, b: &[T], ldb: usize) {
        assert!(first + n <= ldb, "PackedRhs: columns {first}..{} past a row of {ldb}", first + n);
        assert!(k == 0 || b.len() >= (k - 1) * ldb + first + n, "PackedRhs: b too short");
        for (f, width, pw, panel) in self.reshape(k, n) {
            let start = first + f;
            if width == WIDE && pw == WIDE {
                // A full panel's rows are copied as fixed-size arrays: a
                // copy of a length known only at run time is a call to
                // `memcpy` per 64-byte row, which cost more than the copying.
                copy_rows::<T, WIDE>(panel, b, start, ldb);
                continue;
            }
            for (p, row) in panel.chunks_exact_mut(pw).enumerate() {
                let at = p * ldb + start;
                row[..width].copy_from_slice(&b[at..at + width]);
                row[width..].fill(T::ZERO);
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
pub fn gemm_packed<T: Scalar>(
    m: usize,
    a: &[T],
    lda: usize,
    b: &PackedRhs<T>,
    accumulate: bool,
    c: &mut [T],
    ldc: usize,
) {
    gemm_packed_with(m, a, lda, b, accumulate, c, ldc, |span| T::packed_span_with(PanelKernel::best(), span))
}

/// [`gemm_packed`] with the product of a row group and the panels given:
/// training passes the measured kernel (`|s| packed_span_f32_with(kernel, s)`),
/// benchmarks and tests each kernel in turn.
///
/// # Panics
/// As [`gemm_packed`], and as `span_product` does.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_packed_with<T: Scalar>(
    m: usize,
    a: &[T],
    lda: usize,
    b: &PackedRhs<T>,
    accumulate: bool,
    c: &mut [T],
    ldc: usize,
    span_product: impl FnMut(PanelSpan<'_, T>),
) {
    gemm_packed_finish_with(m, a, lda, b, (accumulate, Finish::NONE), c, ldc, span_product)
}

/// [`gemm_packed_with`] with `finish` done as each block of `c` is written
/// (a forward's bias and ReLU): the same values as writing the bias row into
/// every row of `c`, accumulating the product onto it and then applying the
/// ReLU, bit for bit, without the passes over `c`.
///
/// # Panics
/// As [`gemm_packed_with`], when `finish` names both a row and `accumulate`,
/// or when its row or mask is shorter than `c`'s columns or rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_packed_finish_with<T: Scalar>(
    m: usize,
    a: &[T],
    lda: usize,
    b: &PackedRhs<T>,
    (accumulate, finish): (bool, Finish<'_, T>),
    c: &mut [T],
    ldc: usize,
    mut span_product: impl FnMut(PanelSpan<'_, T>),
) {
    let k = b.k;
    assert!(m == 0 || b.n == 0 || lda >= k, "gemm_packed: stride {lda} shorter than a row of {k}");
    let chunk = k.div_ceil(k.max(1).div_ceil(K_CHUNK_MAX)).max(1);
    let operands = (Panels::Packed(b), accumulate, finish);
    gemm_packed_chunks(m, a, lda, 1, operands, c, ldc, chunk, &mut span_product)
}

/// The right-hand operand of [`gemm_packed_chunks`]: where each panel's rows are.
#[derive(Clone, Copy)]
pub(super) enum Panels<'a, T> {
    /// Packed: a panel's `k` rows of `pw` values lie contiguously.
    Packed(&'a PackedRhs<T>),
    /// `b` (`k × n`) as stored, rows `ldb` apart; the panel from column
    /// `tail_first` on (if any) is `tail`, packed.
    InPlace { k: usize, n: usize, b: &'a [T], ldb: usize, tail: &'a PackedRhs<T>, tail_first: usize },
}

impl<'a, T> Panels<'a, T> {
    /// `(k, n)`.
    pub(super) fn shape(&self) -> (usize, usize) {
        match *self {
            Panels::Packed(b) => (b.k, b.n),
            Panels::InPlace { k, n, .. } => (k, n),
        }
    }

    /// Reduction steps `k0 .. k0 + kc` of the panel starting at column `first`
    /// (`pw` wide), and the stride between its rows.
    #[inline]
    pub(super) fn rows(&self, first: usize, pw: usize, k0: usize, kc: usize) -> (&'a [T], usize) {
        match *self {
            // The panels before `first` hold `first` columns of `k` rows.
            Panels::Packed(b) => {
                let at = b.k * first;
                (&b.panels[at + k0 * pw..at + (k0 + kc) * pw], pw)
            }
            Panels::InPlace { tail, tail_first, .. } if first == tail_first => Panels::Packed(tail).rows(0, pw, k0, kc),
            Panels::InPlace { b, ldb, .. } => (&b[k0 * ldb + first..(k0 + kc - 1) * ldb + first + pw], ldb),
        }
    }
}

/// The body of the packed products: `chunk` reduction steps per pass.
#[allow(clippy::too_many_arguments)]
fn gemm_packed_chunks<T: Scalar>(
    m: usize,
    a: &[T],
    lda: usize,
    a_step: usize,
    (b, accumulate, finish): (Panels<'_, T>, bool, Finish<'_, T>),
    c: &mut [T],
    ldc: usize,
    chunk: usize,
    span_product: &mut impl FnMut(PanelSpan<'_, T>),
) {
    let (k, n) = b.shape();
    if m == 0 || n == 0 {
        return;
    }
    assert!(ldc >= n, "gemm_packed: stride {ldc} shorter than a row of {n}");
    if k > 0 {
        let need = (m - 1) * lda + (k - 1) * a_step + 1;
        assert!(a.len() >= need, "gemm_packed: a has {} values, needs {}", a.len(), need);
    }
    assert!(c.len() >= (m - 1) * ldc + n, "gemm_packed: c has {} values, needs {}", c.len(), (m - 1) * ldc + n);
    assert!(!(accumulate && finish.row.is_some()), "gemm_packed: a row to add and accumulate both");
    assert!(finish.row.is_none_or(|row| row.len() >= n), "gemm_packed: row shorter than {n}");
    assert!(finish.mask.is_none_or(|mask| mask.len() >= (m - 1) * ldc + n), "gemm_packed: mask shorter than c");
    assert!(finish.sums.is_none_or(|sums| sums.len() >= n), "gemm_packed: sums shorter than {n}");
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                c[i * ldc..i * ldc + n].fill(T::ZERO);
            }
        }
        finish_block(true, c, (m, n, ldc), 0, finish);
        finish_block(false, c, (m, n, ldc), 0, finish);
        return;
    }
    // A long `k` runs in chunks (a chunk of a panel is a contiguous part of
    // it, and stays in L1), a group's rows of `a` stay in L1 while every panel
    // of a chunk passes (the panels of a recurrence's weight fit in L1 too).
    // While `c` is small each chunk runs through every group, so the chunk's
    // panels are read from L2 by each group; a large `c` would be read and
    // written once per chunk, pushing the panels out of L2, so each group
    // runs through every chunk instead while its block of `c` stays near.
    // Either way each entry of `c` gets its chunks in order, so the order
    // changes no value.
    let mut run = |k0: usize, g: usize| {
        let kc = chunk.min(k - k0);
        let group = GROUP_ROWS.min(m - g);
        span_product(PanelSpan {
            rows: group,
            k: kc,
            a: &a[g * lda + k0 * a_step..(g + group - 1) * lda + (k0 + kc - 1) * a_step + 1],
            lda,
            a_step,
            panels: b,
            k0,
            c: &mut c[g * ldc..],
            ldc,
            accumulate: accumulate || k0 > 0,
            finish: finish.of_chunk((k0, k0 + kc, k), g, ldc),
        });
    };
    if m * n * std::mem::size_of::<T>() > C_CHUNKS_OUTSIDE_MAX {
        for g in (0..m).step_by(GROUP_ROWS) {
            for k0 in (0..k).step_by(chunk) {
                run(k0, g);
            }
        }
    } else {
        for k0 in (0..k).step_by(chunk) {
            for g in (0..m).step_by(GROUP_ROWS) {
                run(k0, g);
            }
        }
    }
}

/// A group of rows of `a` times every panel of one chunk of the reduction,
/// the unit the drivers hand to a kernel: `c[r·ldc + j] (+)= Σ_p a[r·lda +
/// p·a_step] · op(b)[k0 + p][j]` for `r < rows`, `p < k`, every column `j`.
/// [`each`](Self::each) splits it into the panels' products; the wide
/// AVX-512 kernel reads four panels at once.
#[doc(hidden)]
pub struct PanelSpan<'a, T> {
    rows: usize,
    k: usize,
    a: &'a [T],
    lda: usize,
    a_step: usize,
    panels: Panels<'a, T>,
    k0: usize,
    c: &'a mut [T],
    ldc: usize,
    accumulate: bool,
    /// This chunk's part of the product's [`Finish`] (its mask from the group's first row).
    finish: Finish<'a, T>,
}

impl<T: Scalar> PanelSpan<'_, T> {
    /// Each panel's product, in column order, the span's [`Finish`] done
    /// around each ([`finish_around`]).
    pub(crate) fn each(self, mut panel_product: impl FnMut(PanelProduct<'_, T>)) {
        let PanelSpan { rows, k, a, lda, a_step, panels: b, k0, c, ldc, accumulate, finish } = self;
        let (_, n) = b.shape();
        for (first, pw) in panels(n) {
            let (panel, panel_rs) = b.rows(first, pw, k0, k);
            let p = PanelProduct {
                rows,
                k,
                a,
                lda,
                a_step,
                panel,
                panel_rs,
                pw,
                c: &mut c[first..],
                ldc,
                width: pw.min(n - first),
                accumulate,
            };
            finish_around(p, first, finish, &mut panel_product);
        }
    }
}

/// `c[m×n] (+)= aᵀ · b` with `a` stored `k × m` (rows `lda` apart) and `b`
/// stored `k × n` (rows `ldb` apart), both read where they lie: the weight
/// gradients of a recurrence, `dW = dGᵀ·x` over a chunk of time steps
/// (`m = 3H`, `n = I` or `H` of a few dozen, `k` = hundreds of rows). Each
/// register block of `c` broadcasts consecutive values of a row of `a` and
/// loads vectors of the same row of `b`, so neither operand is packed: `b`
/// with `n ≤ 40` is itself one panel. The reduction runs in chunks that keep a
/// panel's rows in L1, accumulating into `c`.
///
/// Every row of `b` is read to `n` rounded up to whole vectors (the values
/// past `n`, the next row's or slack, only reach columns of `c` that are
/// never written), so `b` must hold that many values after its last row.
///
/// # Panics
/// When a slice is shorter than its shape (`b` than `(k − 1)·ldb + ⌈n/8⌉·8`).
#[allow(clippy::too_many_arguments)]
pub fn gemm_tn<T: Scalar>(
    m: usize,
    n: usize,
    k: usize,
    a: &[T],
    lda: usize,
    b: &[T],
    ldb: usize,
    accumulate: bool,
    c: &mut [T],
    ldc: usize,
) {
    assert!(lda >= m && ldb >= n && ldc >= n, "gemm_tn: strides {lda}, {ldb}, {ldc} shorter than rows {m}, {n}, {n}");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                c[i * ldc..i * ldc + n].fill(T::ZERO);
            }
        }
        return;
    }
    let padded = n.div_ceil(LANES) * LANES;
    assert!(b.len() >= (k - 1) * ldb + padded, "gemm_tn: b has {} values, needs {}", b.len(), (k - 1) * ldb + padded);
    let chunk = k.div_ceil(k.div_ceil(K_CHUNK_MAX));
    for k0 in (0..k).step_by(chunk) {
        let kc = chunk.min(k - k0);
        for g in (0..m).step_by(GROUP_ROWS) {
            let group = GROUP_ROWS.min(m - g);
            for (first, pw) in panels(n) {
                T::packed_panel(PanelProduct {
                    rows: group,
                    k: kc,
                    a: &a[k0 * lda + g..],
                    lda: 1,
                    a_step: lda,
                    panel: &b[k0 * ldb + first..],
                    panel_rs: ldb,
                    pw,
                    c: &mut c[g * ldc + first..],
                    ldc,
                    width: pw.min(n - first),
                    accumulate: accumulate || k0 > 0,
                });
            }
        }
    }
}

/// One panel's product, the unit of [`Scalar::packed_panel`]:
/// `c[r·ldc + j] (+)= Σ_p a[r·lda + p·a_step] · panel[p·panel_rs + j]` for
/// `r < rows`, `j < width ≤ pw`. A packed panel has `a_step = 1` and
/// `panel_rs = pw`; [`gemm_tn`] reads both operands where they lie instead.
#[doc(hidden)]
pub struct PanelProduct<'a, T> {
    /// Rows of `a` and `c`.
    pub rows: usize,
    /// The reduction length.
    pub k: usize,
    /// `rows` rows of `k` values, `lda` apart, their values `a_step` apart.
    pub a: &'a [T],
    /// Row stride of `a`.
    pub lda: usize,
    /// Stride between the `k` values of a row of `a` (1 unless `a` is read transposed).
    pub a_step: usize,
    /// `k` rows of `pw` values, `panel_rs` apart.
    pub panel: &'a [T],
    /// Row stride of the panel (`pw` when packed).
    pub panel_rs: usize,
    /// Panel width: a multiple of [`LANES`], at most five vectors.
    pub pw: usize,
    /// `rows` rows of at least `width` values, `ldc` apart.
    pub c: &'a mut [T],
    /// Row stride of `c`.
    pub ldc: usize,
    /// Columns of `c` written (the rest of the panel is padding).
    pub width: usize,
    /// Add to `c` instead of overwriting it.
    pub accumulate: bool,
}

impl<T> PanelProduct<'_, T> {
    /// Checks that every access lies inside the slices (the kernels rely on it).
    fn check(&self) {
        let vectors = self.pw / LANES;
        assert!(
            self.pw.is_multiple_of(LANES) && (1..=5).contains(&vectors),
            "packed_panel: bad panel width {}",
            self.pw
        );
        assert!(self.width <= self.pw, "packed_panel: bad panel");
        if self.rows == 0 || self.k == 0 {
            return;
        }
        assert!(self.a.len() > (self.rows - 1) * self.lda + (self.k - 1) * self.a_step, "packed_panel: a too short");
        assert!(self.panel.len() >= (self.k - 1) * self.panel_rs + self.pw, "packed_panel: panel too short");
        assert!(self.c.len() >= (self.rows - 1) * self.ldc + self.width, "packed_panel: c too short");
    }
}

/// The portable [`Scalar::packed_panel`].
pub(crate) fn packed_panel_portable<T: Scalar>(p: PanelProduct<'_, T>) {
    p.check();
    let PanelProduct { rows, k, a, lda, a_step, panel, panel_rs, pw, c, ldc, width, accumulate } = p;
    let mut block = vec![T::ZERO; rows * pw];
    for p in 0..k {
        let brow = &panel[p * panel_rs..p * panel_rs + pw];
        for (r, out) in block.chunks_exact_mut(pw).enumerate() {
            let av = a[r * lda + p * a_step];
            for (x, &bv) in out.iter_mut().zip(brow) {
                *x += av * bv;
            }
        }
    }
    for (r, out) in block.chunks_exact(pw).enumerate() {
        for (o, &x) in c[r * ldc..r * ldc + width].iter_mut().zip(out) {
            *o = if accumulate { *o + x } else { x };
        }
    }
}

/// The portable [`Scalar::pack_transposed`]: column `j` of the panel is row
/// `first + j` of `b`, each read contiguously, eight columns at a time so the
/// writes of a panel row stay within one cache line.
pub(crate) fn pack_transposed_portable<T: Scalar>(
    b: &[T],
    k: usize,
    first: usize,
    width: usize,
    pw: usize,
    panel: &mut [T],
) {
    for j0 in (0..width).step_by(LANES) {
        let cols = LANES.min(width - j0);
        let rows: [&[T]; LANES] = std::array::from_fn(|q| {
            let j = first + j0 + q.min(cols - 1);
            &b[j * k..(j + 1) * k]
        });
        for (p, out) in panel.chunks_exact_mut(pw).take(k).enumerate() {
            for (v, row) in out[j0..j0 + cols].iter_mut().zip(&rows) {
                *v = row[p];
            }
        }
    }
}

/// [`Scalar::pack_transposed`] for `f32`: 8 × 8 tiles transposed in AVX
/// registers when the CPU has AVX2 (four times the portable loop's speed on
/// DLRM's `512 × 256` weight).
pub(super) fn pack_transposed_f32(b: &[f32], k: usize, first: usize, width: usize, pw: usize, panel: &mut [f32]) {
    assert!(b.len() >= (first + width) * k && panel.len() >= k * pw && width <= pw, "pack_transposed: bad operand");
    #[cfg(target_arch = "x86_64")]
    if PanelKernel::best() != PanelKernel::Portable {
        let (full_cols, full_k) = (width / LANES * LANES, k / LANES * LANES);
        for j0 in (0..full_cols).step_by(LANES) {
            for p0 in (0..full_k).step_by(LANES) {
                // SAFETY: AVX2 is present; rows first + j0 .. + 8 of b have k values
                // (asserted) and p0 + 8 <= k; panel rows p0 .. p0 + 8 have pw >= j0 + 8 values.
                unsafe {
                    x86::transpose_tile(
                        b.as_ptr().add((first + j0) * k + p0),
                        k,
                        panel.as_mut_ptr().add(p0 * pw + j0),
                        pw,
                    )
                };
            }
            // The last k mod 8 reduction steps of these eight columns.
            for p in full_k..k {
                for q in 0..LANES {
                    panel[p * pw + j0 + q] = b[(first + j0 + q) * k + p];
                }
            }
        }
        if full_cols < width {
            // The last width mod 8 columns.
            let tail = &mut panel[..k * pw];
            for j in full_cols..width {
                for (p, out) in tail.chunks_exact_mut(pw).enumerate() {
                    out[j] = b[(first + j) * k + p];
                }
            }
        }
        return;
    }
    pack_transposed_portable(b, k, first, width, pw, panel)
}

/// The `f32` panel kernels, chosen between by CPU features ([`PanelKernel::best`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PanelKernel {
    /// `packed_panel_portable`.
    Portable,
    /// AVX2 + FMA, sixteen vector registers: blocks of at most twelve accumulators.
    Avx2,
    /// The same instructions on 256-bit vectors with AVX-512VL's thirty-two
    /// registers: blocks of up to twenty-five accumulators (twice the rows per
    /// panel pass, so every panel row loaded serves twice the multiply-adds).
    Avx512Vl,
    /// 512-bit vectors (AVX-512F), thirty-two registers: a 16-wide panel is one
    /// register, so a block of twelve rows holds twelve accumulators of sixteen
    /// columns. The same chains of multiply-adds as the 256-bit kernels.
    Avx512,
    /// 512-bit vectors across four 16-wide panels at once: six rows × 64
    /// columns in 24 accumulators, each step loading four panel vectors and six
    /// values of `a` for 24 fused multiply-adds, enough to keep both 512-bit
    /// FMA ports of an Ice Lake or Sapphire Rapids core busy (the one-panel
    /// kernel's twelve rows × 16 columns load as much as they multiply).
    /// Runs whole [`PanelSpan`]s; the same chains as the other kernels.
    Avx512Wide,
    /// [`Avx512Wide`](Self::Avx512Wide) with each chunk of the reduction run
    /// in parts of 64 steps, every row block of the span through one part
    /// before the next, the accumulators kept in between: a part of four
    /// panels stays in L1 while the span's rows read it, where a whole chunk
    /// may not beside the rows of `a` (a Sapphire Rapids core's 48 KiB). The
    /// same chains, continued where they stopped, so the same results.
    Avx512WideSplit,
}

impl PanelKernel {
    /// The fastest kernel this CPU runs.
    #[inline]
    pub fn best() -> Self {
        static BEST: std::sync::OnceLock<PanelKernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| *Self::available().last().unwrap_or(&PanelKernel::Portable))
    }

    /// The vector kernels worth timing for a product of `k` reduction steps:
    /// every one this CPU runs but the portable one, and the split wide
    /// kernel only where its chunks are longer than a part (elsewhere it runs
    /// the wide kernel's very loops).
    pub fn candidates(k: usize) -> impl Iterator<Item = PanelKernel> {
        Self::available().iter().copied().filter(move |&kernel| {
            kernel != PanelKernel::Portable && (kernel != PanelKernel::Avx512WideSplit || k > SPLIT_STEPS)
        })
    }

    /// Whether this CPU runs [`PanelKernel::Avx512Wide`] (under `TIDEREC_MAX_ISA`).
    pub fn wide_available() -> bool {
        Self::available().contains(&PanelKernel::Avx512Wide)
    }

    /// Every kernel this CPU runs under `TIDEREC_MAX_ISA` ([`tiderec_records::cpu`]),
    /// slowest first (decided once per process).
    pub fn available() -> &'static [Self] {
        use tiderec_records::cpu::{has, Feature};
        static AVAILABLE: std::sync::OnceLock<Vec<PanelKernel>> = std::sync::OnceLock::new();
        AVAILABLE.get_or_init(|| {
            let mut kernels = vec![PanelKernel::Portable];
            #[cfg(target_arch = "x86_64")]
            if has(Feature::Avx2) && has(Feature::Fma) {
                kernels.push(PanelKernel::Avx2);
                if has(Feature::Avx512F) && has(Feature::Avx512Vl) {
                    kernels.push(PanelKernel::Avx512Vl);
                    kernels.push(PanelKernel::Avx512);
                    // Before the wide kernel, which stays the default of a product never measured.
                    kernels.push(PanelKernel::Avx512WideSplit);
                    kernels.push(PanelKernel::Avx512Wide);
                }
            }
            kernels
        })
    }
}

/// [`Scalar::packed_panel`] for `f32`: the best kernel the CPU runs (features
/// are checked once per panel, not per block).
#[inline]
pub(super) fn packed_panel_f32(p: PanelProduct<'_, f32>) {
    run_panel_f32(PanelKernel::best(), p)
}

/// One panel's product with a chosen kernel.
///
/// # Panics
/// When the CPU does not run `kernel`, or the operands do not fit the shape.
#[cfg(test)]
pub(crate) fn packed_panel_f32_with(kernel: PanelKernel, p: PanelProduct<'_, f32>) {
    assert!(PanelKernel::available().contains(&kernel), "packed_panel: this CPU does not run {kernel:?}");
    run_panel_f32(kernel, p)
}

/// A row group's product with every panel on a chosen kernel: the wide
/// kernel reads the panels four at a time, the others one by one.
///
/// # Panics
/// When the CPU does not run `kernel`.
pub(crate) fn packed_span_f32_with(kernel: PanelKernel, span: PanelSpan<'_, f32>) {
    assert!(PanelKernel::available().contains(&kernel), "packed_panel: this CPU does not run {kernel:?}");
    #[cfg(target_arch = "x86_64")]
    match kernel {
        PanelKernel::Avx512Wide => return wide::span_product(span, usize::MAX),
        PanelKernel::Avx512WideSplit => return wide::span_product(span, SPLIT_STEPS),
        _ => {}
    }
    span.each(|p| run_panel_f32(kernel, p))
}

/// One panel's product on `kernel`, which the caller checked this CPU runs.
#[inline]
fn run_panel_f32(kernel: PanelKernel, p: PanelProduct<'_, f32>) {
    if kernel == PanelKernel::Portable {
        return packed_panel_portable(p);
    }
    p.check();
    let PanelProduct { rows, k, a, lda, a_step, panel, panel_rs, pw, ldc, width, .. } = p;
    let vectors = pw / LANES;
    #[cfg(target_arch = "x86_64")]
    {
        let raw = x86::Raw {
            rows,
            k,
            a: a.as_ptr(),
            lda,
            a_step,
            panel: panel.as_ptr(),
            panel_rs,
            c: p.c.as_mut_ptr(),
            ldc,
            width,
            accumulate: p.accumulate,
        };
        // SAFETY: the CPU has the kernel's features (checked above); the asserts bound every access.
        unsafe {
            match kernel {
                PanelKernel::Avx2 => x86::avx2::panel_of(vectors, &raw),
                PanelKernel::Avx512Vl => x86::avx512vl::panel_of(vectors, &raw),
                // One panel alone: the wide kernel's chains on one panel are the one-panel kernel's.
                _ => x86::avx512::panel_of(vectors, &raw),
            }
        }
    }
}

mod finish;
mod mm_order;

pub(crate) use finish::Finish;
use finish::{finish_around, finish_block};
pub(crate) use mm_order::gemm_mm_order_f32;
pub use mm_order::{MmOrderKernel, MmOrderOut};

#[cfg(target_arch = "x86_64")]
mod wide;

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests;
