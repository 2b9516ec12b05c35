//! `c[m×n] (+)= op(a) · op(b)` on bf16-rounded operands with `f32` accumulation:
//! the products of a fully connected layer under `--precision bf16`.
//!
//! Both operands are packed as bf16 pairs (`bf16_pack`).
//! `VDPBF16PS` multiplies a pair of `a` by a pair of `b` and adds both
//! products to an `f32` accumulator, the high (odd step's) product first; a
//! product of two bf16 values is exact in `f32`, so each step is two rounded
//! `f32` additions. Each entry of `c` sums the reduction in runs of
//! [`K_CHUNK_PAIRS`] pairs, every run a chain from zero, and adds each run's
//! sum to `c` in order (to zero first when not accumulating).
//!
//! [`gemm_bf16_reference`] is that definition in scalar code, from the `f32`
//! operands. The AVX-512 BF16 kernel and the portable one equal it bit for bit
//! wherever no partial sum is a denormal (the instruction flushes denormals to
//! zero; `tests::kernels_equal_the_oracle_bit_for_bit`). Against the `f32`
//! product the error is that of rounding both operands to 8 significant bits:
//! `|c − c₃₂| ≤ 2⁻⁷ · Σₚ |aₚ·bₚ|` plus the `f32` sums' own rounding
//! (`tests::error_against_f32_is_bounded`).
//!
//! Invariant: only the `m × n` entries of `c` are written.

use super::bf16_pack::{bf16_to_f32, round_bf16};
use super::bf16_pack::{bf16_vector_available, panels, Bf16Lhs, Bf16Rhs, VECTOR};
use super::gemm::Op;
use super::gemm_amx::{amx_available, gemm_amx_from, gemm_amx_into, gemm_amx_reference, tile_unit};
use super::gemm_amx::{AmxLhs, AmxRhs, Epilogue, Packings, Start};
use tiderec_records::cpu::TileUnit;

/// Pairs (two reduction steps each) per run of the sums: a 32-column panel's
/// run is 16 KiB, so it stays in L1 while a group of rows passes.
pub const K_CHUNK_PAIRS: usize = 128;
/// Rows of `a` per group, kept in L1 while every panel passes (a multiple of the block rows).
const GROUP_ROWS: usize = 24;
/// Rows per register block: 12 rows × 2 vectors = 24 accumulators of 32 registers.
const BLOCK_ROWS: usize = 12;

/// The bf16 kernels, chosen by CPU features. Two summation classes: the
/// portable and AVX-512 BF16 kernels sum as this module describes, the AMX
/// kernel as [`gemm_amx`](super::gemm_amx) describes; [`Bf16Kernel::best`] is
/// fixed for a machine (and a `TIDEREC_MAX_ISA` cap), so runs on one machine agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Kernel {
    /// Scalar code on the packed operands (any CPU; the oracle's sums).
    Portable,
    /// `VDPBF16PS` on 512-bit vectors (AVX-512 BF16).
    Avx512Bf16,
    /// `TDPBF16PS` on AMX tiles ([`gemm_amx`](super::gemm_amx)).
    Amx,
}

impl Bf16Kernel {
    /// The fastest kernel this CPU runs: AMX, then AVX-512 BF16.
    pub fn best() -> Self {
        if amx_available() {
            Bf16Kernel::Amx
        } else if bf16_vector_available() {
            Bf16Kernel::Avx512Bf16
        } else {
            Bf16Kernel::Portable
        }
    }

    /// Every kernel this CPU runs, slowest first.
    pub fn available() -> &'static [Self] {
        if amx_available() {
            &[Bf16Kernel::Portable, Bf16Kernel::Avx512Bf16, Bf16Kernel::Amx]
        } else if bf16_vector_available() {
            &[Bf16Kernel::Portable, Bf16Kernel::Avx512Bf16]
        } else {
            &[Bf16Kernel::Portable]
        }
    }

    /// A short name (`bf16-portable`, `bf16-avx512`, `bf16-amx`;
    /// `bf16-amx-emulated` on emulated tiles).
    pub fn name(&self) -> &'static str {
        match self {
            Bf16Kernel::Portable => "bf16-portable",
            Bf16Kernel::Avx512Bf16 => "bf16-avx512",
            Bf16Kernel::Amx if tile_unit() == Some(TileUnit::Emulated) => "bf16-amx-emulated",
            Bf16Kernel::Amx => "bf16-amx",
        }
    }

    /// The kernel's definition from the `f32` operands ([`gemm_bf16_reference`]
    /// or [`gemm_amx_reference`]): the oracle it equals bit for bit.
    #[allow(clippy::too_many_arguments)]
    pub fn reference(
        self,
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
        match self {
            Bf16Kernel::Amx => gemm_amx_reference(op_a, op_b, m, n, k, a, b, accumulate, c),
            _ => gemm_bf16_reference(op_a, op_b, m, n, k, a, b, accumulate, c),
        }
    }
}

/// The packed operands of a layer's bf16 products, reused across calls.
#[derive(Clone, Debug, Default)]
pub struct Bf16Scratch {
    /// The left operand (vector kernels).
    pub lhs: Bf16Lhs,
    /// The right operand (vector kernels).
    pub rhs: Bf16Rhs,
    /// The left operand (AMX).
    pub amx_lhs: AmxLhs,
    /// The right operand (AMX).
    pub amx_rhs: AmxRhs,
    /// The output the last chained product packed for the next one (AMX).
    amx_next: AmxLhs,
    /// The shape `(m, k)` of `amx_next` as the next product's left operand,
    /// while it holds the last chained product's output.
    next_shape: Option<(usize, usize)>,
    /// The transpose of the output the last chained `dx` product packed for
    /// the layer below's `dW` (AMX), and the output's column sums.
    amx_next_t: AmxLhs,
    next_sums: Vec<f32>,
    /// The shape `(m, n)` of the output in `amx_next_t`, while it holds the
    /// last chained product's.
    transposed_shape: Option<(usize, usize)>,
}

/// The right operand of [`Bf16Scratch::product_summing_lhs`].
#[derive(Clone, Copy, Debug)]
pub enum Right<'a> {
    /// `op(b)` from its values (`b` stored `k × n` for [`Op::N`], `n × k` for [`Op::T`]).
    Values(Op, &'a [f32]),
    /// `op(b)` already packed for AMX, as a chained product packs its output
    /// ([`Bf16Scratch::product_onto_row_chained`]): only where the AMX kernel runs.
    Packed(&'a AmxRhs),
}

/// The left operand of [`Bf16Scratch::product_summing_lhs`].
#[derive(Clone, Copy, Debug)]
pub enum Left<'a> {
    /// `op(a)` from its values (`a` stored `m × k` for [`Op::N`], `k × m` for [`Op::T`]).
    Values(Op, &'a [f32]),
    /// The transpose of the output of the last chained product, as it packed
    /// it with its column sums ([`Bf16Scratch::product_then_chained`]
    /// returned `true`), unchanged since: `dyᵀ` for `dW = dyᵀ·x`, with the
    /// bias gradient. Only where the AMX kernel runs.
    Transposed,
}

/// The left operand of [`Bf16Scratch::product_onto_row_chained`].
#[derive(Clone, Copy, Debug)]
pub enum Chained<'a> {
    /// `a`, stored `m × k`, packed by the call.
    Rows(&'a [f32]),
    /// The output of the previous chained call, which it packed (it returned
    /// `true`), unchanged since: an `m × k` operand.
    Packed,
}

impl Bf16Scratch {
    /// `c[m×n] = op(a)·op(b)` (`+ c` when `accumulate`) on the best kernel:
    /// packs both operands into this scratch and runs the product. `a` is
    /// stored `m × k` ([`Op::N`]) or `k × m`, `b` `k × n` or `n × k`; row `i`
    /// of `c` starts at `c[i·ldc]`.
    ///
    /// # Panics
    /// When an operand or `c` is shorter than its shape requires.
    #[allow(clippy::too_many_arguments)]
    pub fn product(
        &mut self,
        a: (Op, &[f32]),
        b: (Op, &[f32]),
        (m, n, k): (usize, usize, usize),
        accumulate: bool,
        c: &mut [f32],
        ldc: usize,
    ) {
        self.product_with(Bf16Kernel::best(), a, b, (m, n, k), accumulate, c, ldc)
    }

    /// [`product`](Self::product) on a chosen kernel.
    ///
    /// # Panics
    /// As [`product`](Self::product), and when the CPU does not run `kernel`.
    #[allow(clippy::too_many_arguments)]
    pub fn product_with(
        &mut self,
        kernel: Bf16Kernel,
        (op_a, a): (Op, &[f32]),
        (op_b, b): (Op, &[f32]),
        (m, n, k): (usize, usize, usize),
        accumulate: bool,
        c: &mut [f32],
        ldc: usize,
    ) {
        let start = if accumulate { Start::Output } else { Start::Zero };
        self.run(kernel, (op_a, a), (op_b, b), (m, n, k), start, Epilogue::None, c, ldc)
    }

    /// [`product`](Self::product) (not accumulating) on the best kernel, and
    /// `sums[i] = Σ_p op(a)[i][p]` as [`row_sums`](super::gemm_amx::row_sums)
    /// computes it, bit for bit (the AMX packing of a transposed `a` sums its
    /// values as it reads them): `dW = dyᵀ·x` with the bias gradient `Σ_b dy[b]`.
    ///
    /// # Panics
    /// As [`product`](Self::product), when `sums` holds fewer than `m` values,
    /// and for [`Right::Packed`] when the AMX kernel does not run here or the
    /// packed operand is not `k × n`.
    pub fn product_summing_lhs(
        &mut self,
        a: Left<'_>,
        b: Right<'_>,
        (m, n, k): (usize, usize, usize),
        (c, ldc): (&mut [f32], usize),
        sums: &mut [f32],
    ) {
        if Bf16Kernel::best() == Bf16Kernel::Amx {
            let lhs = match a {
                Left::Values(op_a, a) => {
                    self.amx_lhs.pack_summing(op_a, m, k, a, Some(sums));
                    &self.amx_lhs
                }
                Left::Transposed => {
                    let shape = self.transposed_shape.take();
                    assert_eq!(shape, Some((k, m)), "product_summing_lhs: no packed transpose of a {k}x{m} output");
                    sums[..m].copy_from_slice(&self.next_sums[..m]);
                    &self.amx_next_t
                }
            };
            let rhs = match b {
                Right::Values(op_b, b) => {
                    self.amx_rhs.pack(op_b, k, n, b);
                    &self.amx_rhs
                }
                Right::Packed(rhs) => {
                    let shape = (rhs.pairs(), rhs.n());
                    assert_eq!(shape, (k.div_ceil(2), n), "product_summing_lhs: a packed operand of another shape");
                    rhs
                }
            };
            gemm_amx_from(lhs, rhs, Start::Zero, Epilogue::None, c, ldc);
            return;
        }
        let (Left::Values(op_a, a), Right::Values(op_b, b)) = (a, b) else {
            panic!("product_summing_lhs: a packed AMX operand where AMX does not run");
        };
        self.product((op_a, a), (op_b, b), (m, n, k), false, c, ldc);
        super::gemm_amx::row_sums(op_a, m, k, a, sums);
    }

    /// [`product`](Self::product) (not accumulating) finished by `epilogue`
    /// on the best kernel: the product, then the epilogue's pass over `c`.
    ///
    /// # Panics
    /// As [`product`](Self::product), and when the epilogue's ReLU output is shorter than `c`.
    pub fn product_then(
        &mut self,
        a: (Op, &[f32]),
        b: (Op, &[f32]),
        (m, n, k): (usize, usize, usize),
        epilogue: Epilogue<'_>,
        c: &mut [f32],
        ldc: usize,
    ) {
        self.run(Bf16Kernel::best(), a, b, (m, n, k), Start::Zero, epilogue, c, ldc)
    }

    /// `c[m×n] = row + op(a)·op(b)` with `row` (`n` values) added to every row
    /// of `c`, on the best kernel, then `epilogue`: the result of copying `row`
    /// into each row of `c`, calling [`product`](Self::product) accumulating and
    /// applying the epilogue to `c` (the AMX kernel starts its sums at the row
    /// instead of copying it, and applies the epilogue to each block in L1).
    ///
    /// # Panics
    /// As [`product`](Self::product), and when `row` holds fewer than `n` values.
    #[allow(clippy::too_many_arguments)]
    pub fn product_onto_row(
        &mut self,
        a: (Op, &[f32]),
        b: (Op, &[f32]),
        (m, n, k): (usize, usize, usize),
        (row, epilogue): (&[f32], Epilogue<'_>),
        c: &mut [f32],
        ldc: usize,
    ) {
        self.run(Bf16Kernel::best(), a, b, (m, n, k), Start::Row(row), epilogue, c, ldc)
    }

    /// [`product_onto_row`](Self::product_onto_row) with `a` ([`Op::N`]) from
    /// `a`, and with `pack_output`, `c` also packed as the next call's
    /// [`Chained::Packed`] while each of its blocks is in L1, where the AMX
    /// kernel runs: the result says whether it was (elsewhere the next call
    /// packs `c` from its values). When it was, `c` is also packed into `rows`,
    /// if given, as the [`Right::Packed`] operand of a product over `c`'s rows
    /// (the next layer's `dW = dyᵀ·x`), and then, without `write_c`, `c` is
    /// not written where the reduction fits one chunk of the kernel
    /// ([`Packings::write_c`]): its packings are all that is read. The
    /// results are those of `product_onto_row` bit for bit.
    ///
    /// # Panics
    /// As [`product_onto_row`](Self::product_onto_row), and for
    /// [`Chained::Packed`] when the previous chained call packed no `m × k` output.
    #[allow(clippy::too_many_arguments)]
    pub fn product_onto_row_chained(
        &mut self,
        a: Chained<'_>,
        b: (Op, &[f32]),
        (m, n, k): (usize, usize, usize),
        (row, epilogue): (&[f32], Epilogue<'_>),
        (c, ldc, write_c): (&mut [f32], usize, bool),
        (pack_output, rows): (bool, Option<&mut AmxRhs>),
    ) -> bool {
        self.chained(a, b, (m, n, k), (Start::Row(row), epilogue), (c, ldc, write_c), (pack_output, rows, false))
    }

    /// [`product_then`](Self::product_then) with `a` and `pack_output` as
    /// [`product_onto_row_chained`](Self::product_onto_row_chained) takes them:
    /// a layer's `dx = dy·W`, packed as the `dy` of the layer below: the left
    /// operand of its `dx` product ([`Chained::Packed`]) and, transposed with
    /// its column sums, of its `dW` ([`Left::Transposed`]). When it was packed,
    /// `c` is not written where the reduction fits one chunk of the kernel.
    ///
    /// # Panics
    /// As [`product_onto_row_chained`](Self::product_onto_row_chained).
    pub fn product_then_chained(
        &mut self,
        a: Chained<'_>,
        b: (Op, &[f32]),
        (m, n, k): (usize, usize, usize),
        epilogue: Epilogue<'_>,
        (c, ldc): (&mut [f32], usize),
        pack_output: bool,
    ) -> bool {
        let (start, write_c) = (Start::Zero, !pack_output);
        self.chained(a, b, (m, n, k), (start, epilogue), (c, ldc, write_c), (pack_output, None, pack_output))
    }

    fn chained(
        &mut self,
        a: Chained<'_>,
        (op_b, b): (Op, &[f32]),
        (m, n, k): (usize, usize, usize),
        (start, epilogue): (Start<'_>, Epilogue<'_>),
        (c, ldc, write_c): (&mut [f32], usize, bool),
        (pack_output, rows, transposed): (bool, Option<&mut AmxRhs>, bool),
    ) -> bool {
        let packed = self.next_shape.take();
        self.transposed_shape = None;
        match a {
            Chained::Packed => {
                assert_eq!(packed, Some((m, k)), "a chained bf16 product: no packed {m}x{k} output to read");
                std::mem::swap(&mut self.amx_lhs, &mut self.amx_next);
            }
            Chained::Rows(a) if Bf16Kernel::best() == Bf16Kernel::Amx => self.amx_lhs.pack(Op::N, m, k, a),
            Chained::Rows(a) => {
                self.run(Bf16Kernel::best(), (Op::N, a), (op_b, b), (m, n, k), start, epilogue, c, ldc);
                return false;
            }
        }
        self.amx_rhs.pack(op_b, k, n, b);
        if !pack_output {
            gemm_amx_from(&self.amx_lhs, &self.amx_rhs, start, epilogue, c, ldc);
            return false;
        }
        if transposed {
            self.next_sums.resize(n, 0.0);
        }
        let transposed_to = transposed.then_some((&mut self.amx_next_t, &mut self.next_sums[..]));
        let packings = Packings { lhs: Some(&mut self.amx_next), rows, transposed: transposed_to, write_c };
        gemm_amx_into(&self.amx_lhs, &self.amx_rhs, (start, epilogue), (c, ldc), packings);
        self.next_shape = Some((m, n));
        if transposed {
            self.transposed_shape = Some((m, n));
        }
        true
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        kernel: Bf16Kernel,
        (op_a, a): (Op, &[f32]),
        (op_b, b): (Op, &[f32]),
        (m, n, k): (usize, usize, usize),
        start: Start<'_>,
        epilogue: Epilogue<'_>,
        c: &mut [f32],
        ldc: usize,
    ) {
        if kernel == Bf16Kernel::Amx {
            self.amx_lhs.pack(op_a, m, k, a);
            self.amx_rhs.pack(op_b, k, n, b);
            gemm_amx_from(&self.amx_lhs, &self.amx_rhs, start, epilogue, c, ldc);
            return;
        }
        let accumulate = match start {
            Start::Zero => false,
            Start::Output => true,
            Start::Row(row) => {
                assert!(row.len() >= n, "product_onto_row: a row of {} values for {n} columns", row.len());
                for r in 0..m {
                    c[r * ldc..r * ldc + n].copy_from_slice(&row[..n]);
                }
                true
            }
        };
        self.lhs.pack(op_a, m, k, a);
        self.rhs.pack(op_b, k, n, b);
        gemm_bf16_with(kernel, &self.lhs, &self.rhs, accumulate, c, ldc);
        for r in 0..m {
            epilogue.apply(c, ldc, (r, 0, n));
        }
    }
}

/// `c[m×n] = op(a)·op(b)` (`+ c` when `accumulate`) on the best vector kernel;
/// row `i` of `c` starts at `c[i·ldc]`. `a` is packed with `m` rows and `b`
/// with `n` columns, both over the same `k`. [`Bf16Scratch::product`] also
/// reaches the AMX kernel, whose operands are packed otherwise.
///
/// # Panics
/// When the operands' shapes disagree or `c` is shorter than its shape requires.
pub fn gemm_bf16(a: &Bf16Lhs, b: &Bf16Rhs, accumulate: bool, c: &mut [f32], ldc: usize) {
    let kernel = if bf16_vector_available() { Bf16Kernel::Avx512Bf16 } else { Bf16Kernel::Portable };
    gemm_bf16_with(kernel, a, b, accumulate, c, ldc)
}

/// [`gemm_bf16`] on a chosen kernel.
///
/// # Panics
/// As [`gemm_bf16`], when the CPU does not run `kernel`, and for
/// [`Bf16Kernel::Amx`] (its operands are [`AmxLhs`] and [`AmxRhs`]).
pub fn gemm_bf16_with(kernel: Bf16Kernel, a: &Bf16Lhs, b: &Bf16Rhs, accumulate: bool, c: &mut [f32], ldc: usize) {
    assert!(Bf16Kernel::available().contains(&kernel), "gemm_bf16: this CPU does not run {kernel:?}");
    assert!(kernel != Bf16Kernel::Amx, "gemm_bf16: the AMX kernel takes AmxLhs and AmxRhs (Bf16Scratch::product)");
    let (m, n, pairs) = (a.m, b.n, b.pairs);
    assert_eq!(a.pairs, pairs, "gemm_bf16: {} pairs on the left, {} on the right", a.pairs, pairs);
    if m == 0 || n == 0 {
        return;
    }
    assert!(ldc >= n && c.len() >= (m - 1) * ldc + n, "gemm_bf16: c has {} values for {m} rows of {n}", c.len());
    if pairs == 0 {
        if !accumulate {
            for row in 0..m {
                c[row * ldc..row * ldc + n].fill(0.0);
            }
        }
        return;
    }
    for q0 in (0..pairs).step_by(K_CHUNK_PAIRS) {
        let qc = K_CHUNK_PAIRS.min(pairs - q0);
        for g in (0..m).step_by(GROUP_ROWS) {
            let rows = GROUP_ROWS.min(m - g);
            let mut at = 0;
            for (first, pw) in panels(n) {
                let block = Block {
                    rows,
                    pairs: qc,
                    a: &a.data[g * a.lda + q0 * a.step..],
                    lda: a.lda,
                    step: a.step,
                    panel: &b.panels[at + q0 * pw..at + (q0 + qc) * pw],
                    pw,
                    width: pw.min(n - first),
                    accumulate: accumulate || q0 > 0,
                };
                at += pairs * pw;
                block.check(&c[g * ldc + first..], ldc);
                match kernel {
                    Bf16Kernel::Portable => block.portable(&mut c[g * ldc + first..], ldc),
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: the CPU runs the kernel (asserted above) and `check` bounds every access.
                    Bf16Kernel::Avx512Bf16 => unsafe { x86::panel(&block, c[g * ldc + first..].as_mut_ptr(), ldc) },
                    #[cfg(not(target_arch = "x86_64"))]
                    Bf16Kernel::Avx512Bf16 => unreachable!("not available off x86-64"),
                    Bf16Kernel::Amx => unreachable!("refused above"),
                }
            }
        }
    }
}

/// One run of pairs of a group of rows times one panel.
struct Block<'a> {
    rows: usize,
    pairs: usize,
    /// Pair `q` of row `r` at `a[r·lda + q·step]`.
    a: &'a [u32],
    lda: usize,
    step: usize,
    /// `pairs` rows of `pw` pairs.
    panel: &'a [u32],
    pw: usize,
    /// Columns of `c` written.
    width: usize,
    accumulate: bool,
}

impl Block<'_> {
    /// Checks that every access lies inside the slices (the vector kernel relies on it).
    fn check(&self, c: &[f32], ldc: usize) {
        assert!(self.pw == VECTOR || self.pw == 2 * VECTOR, "gemm_bf16: bad panel width {}", self.pw);
        assert!(self.width <= self.pw && self.panel.len() >= self.pairs * self.pw, "gemm_bf16: bad panel");
        assert!(self.a.len() > (self.rows - 1) * self.lda + (self.pairs - 1) * self.step, "gemm_bf16: a too short");
        assert!(c.len() >= (self.rows - 1) * ldc + self.width, "gemm_bf16: c too short");
    }

    /// The scalar kernel: per entry, per pair, `+ hi·hi` then `+ lo·lo`.
    fn portable(&self, c: &mut [f32], ldc: usize) {
        let half = |v: u32, hi: bool| bf16_to_f32(if hi { (v >> 16) as u16 } else { v as u16 });
        for r in 0..self.rows {
            for j in 0..self.width {
                let mut acc = 0.0f32;
                for q in 0..self.pairs {
                    let (x, y) = (self.a[r * self.lda + q * self.step], self.panel[q * self.pw + j]);
                    acc += half(x, true) * half(y, true);
                    acc += half(x, false) * half(y, false);
                }
                let o = &mut c[r * ldc + j];
                *o = if self.accumulate { *o + acc } else { acc };
            }
        }
    }
}

/// The definition of [`gemm_bf16`] from the `f32` operands: `op(a)` is `m × k`
/// (`a` stored `m × k` for [`Op::N`], `k × m` for [`Op::T`]), `op(b)` is
/// `k × n` (`b` stored `k × n` or `n × k`), `c` is `m × n` row-major.
#[allow(clippy::too_many_arguments)]
pub fn gemm_bf16_reference(
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
    let pairs = k.div_ceil(2);
    for i in 0..m {
        for j in 0..n {
            let mut out = if accumulate { c[i * n + j] } else { 0.0 };
            for q0 in (0..pairs).step_by(K_CHUNK_PAIRS) {
                let mut acc = 0.0f32;
                for q in q0..(q0 + K_CHUNK_PAIRS).min(pairs) {
                    acc += av(i, 2 * q + 1) * bv(2 * q + 1, j);
                    acc += av(i, 2 * q) * bv(2 * q, j);
                }
                out = if q0 == 0 && !accumulate { acc } else { out + acc };
            }
            c[i * n + j] = out;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Block, BLOCK_ROWS, VECTOR};
    use std::arch::x86_64::*;

    /// Mask of the first `n ≤ 16` lanes.
    #[inline]
    fn mask(n: usize) -> u16 {
        if n >= 16 {
            u16::MAX
        } else {
            (1u16 << n) - 1
        }
    }

    /// `R` rows from row `i` times a panel of `V` vectors, into `c` from row `i`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn block<const R: usize, const V: usize>(b: &Block<'_>, i: usize, c: *mut f32, ldc: usize) {
        let a = b.a.as_ptr().add(i * b.lda);
        let panel = b.panel.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); V]; R];
        for q in 0..b.pairs {
            let mut bv: [__m512bh; V] = [std::mem::transmute::<__m512i, __m512bh>(_mm512_setzero_si512()); V];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                    panel.add(q * b.pw + VECTOR * v) as *const _
                ));
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(r * b.lda + q * b.step) as i32));
                for (x, &y) in row.iter_mut().zip(&bv) {
                    *x = _mm512_dpbf16_ps(*x, av, y);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (v, &x) in row.iter().enumerate() {
                let cols = b.width.saturating_sub(VECTOR * v);
                if cols == 0 {
                    continue;
                }
                let (o, m) = (c.add((i + r) * ldc + VECTOR * v), mask(cols));
                let x = if b.accumulate { _mm512_add_ps(_mm512_maskz_loadu_ps(m, o), x) } else { x };
                _mm512_mask_storeu_ps(o, m, x);
            }
        }
    }

    /// Every row of the group: blocks of twelve, then of 8, 4, 2 and 1.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn rows<const V: usize>(b: &Block<'_>, c: *mut f32, ldc: usize) {
        let mut i = 0;
        while i + BLOCK_ROWS <= b.rows {
            block::<BLOCK_ROWS, V>(b, i, c, ldc);
            i += BLOCK_ROWS;
        }
        for size in [8, 4, 2, 1] {
            if b.rows - i >= size {
                match size {
                    8 => block::<8, V>(b, i, c, ldc),
                    4 => block::<4, V>(b, i, c, ldc),
                    2 => block::<2, V>(b, i, c, ldc),
                    _ => block::<1, V>(b, i, c, ldc),
                }
                i += size;
            }
        }
    }

    /// One block of a panel of one or two vectors.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, BW and BF16; `b.check` passed for `c` and `ldc`.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn panel(b: &Block<'_>, c: *mut f32, ldc: usize) {
        if b.pw == VECTOR {
            rows::<1>(b, c, ldc)
        } else {
            rows::<2>(b, c, ldc)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::gemm_reference;

    fn operands(m: usize, n: usize, k: usize, seed: u64) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let val = |i: usize| (tiderec_records::rng::normal_f64(seed, i as u64, 0, 0)) as f32;
        let a = (0..m * k).map(val).collect();
        let b = (0..k * n).map(|i| val(i + 10_000_000)).collect();
        let c = (0..m * n).map(|i| val(i + 20_000_000)).collect();
        (a, b, c)
    }

    /// The kernels this CPU runs on [`Bf16Lhs`] and [`Bf16Rhs`] (AMX is `gemm_amx`'s to test).
    fn vector_kernels() -> Vec<Bf16Kernel> {
        Bf16Kernel::available().iter().copied().filter(|&k| k != Bf16Kernel::Amx).collect()
    }

    /// Shapes with every tail: rows past the blocks of 12 and the groups of 24,
    /// odd `k`, several runs of pairs, one column, panels of 16 and 32.
    const SHAPES: [(usize, usize, usize); 10] = [
        (1, 1, 1),
        (3, 5, 2),
        (13, 17, 13),
        (25, 33, 7),
        (24, 48, 64),
        (37, 70, 257),
        (64, 512, 13),
        (128, 1, 256),
        (50, 16, 600),
        (2, 40, 1000),
    ];

    /// Every kernel this CPU runs, on both layouts of both operands, accumulating
    /// or not, equals the scalar definition bit for bit (normally distributed
    /// operands: no partial sum is a denormal).
    #[test]
    fn kernels_equal_the_oracle_bit_for_bit() {
        if !bf16_vector_available() {
            eprintln!("this CPU has no AVX-512 BF16: only the portable kernel is compared");
        }
        let (mut lhs, mut rhs) = (Bf16Lhs::default(), Bf16Rhs::default());
        for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
            let (a, b, c0) = operands(m, n, k, s as u64);
            for (op_a, op_b, accumulate) in
                [(Op::N, Op::T, true), (Op::T, Op::N, false), (Op::N, Op::N, false), (Op::T, Op::T, true)]
            {
                let mut want = c0.clone();
                gemm_bf16_reference(op_a, op_b, m, n, k, &a, &b, accumulate, &mut want);
                lhs.pack(op_a, m, k, &a);
                rhs.pack(op_b, k, n, &b);
                for kernel in vector_kernels() {
                    let mut got = c0.clone();
                    gemm_bf16_with(kernel, &lhs, &rhs, accumulate, &mut got, n);
                    for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                        assert!(
                            x.to_bits() == y.to_bits(),
                            "{kernel:?} {op_a:?}{op_b:?} {m}x{n}x{k} acc {accumulate} [{i}]: {x} vs {y}"
                        );
                    }
                }
            }
        }
    }

    /// Rows of `c` wider than `n` (a strided output): the columns past `n` are never written.
    #[test]
    fn only_the_product_entries_are_written() {
        let (m, n, k, ldc) = (30, 21, 9, 40);
        let (a, b, _) = operands(m, n, k, 3);
        let (mut lhs, mut rhs) = (Bf16Lhs::default(), Bf16Rhs::default());
        lhs.pack(Op::N, m, k, &a);
        rhs.pack(Op::N, k, n, &b);
        let mut want = vec![0.0; m * n];
        gemm_bf16_reference(Op::N, Op::N, m, n, k, &a, &b, false, &mut want);
        for kernel in vector_kernels() {
            let mut c = vec![f32::NAN; (m - 1) * ldc + n];
            gemm_bf16_with(kernel, &lhs, &rhs, false, &mut c, ldc);
            for (idx, &v) in c.iter().enumerate() {
                let (i, j) = (idx / ldc, idx % ldc);
                if j < n {
                    assert_eq!(v.to_bits(), want[i * n + j].to_bits(), "{kernel:?} c[{i}][{j}]");
                } else {
                    assert!(v.is_nan(), "{kernel:?} wrote c[{i}][{j}] past the product");
                }
            }
        }
    }

    /// Against the exact (`f64`) product of the unrounded operands: each of the `k`
    /// products has both factors rounded to 8 significant bits (relative error at
    /// most 2⁻⁸ each, so 2⁻⁷ + 2⁻¹⁶ together) and the `f32` sums add at most
    /// `k·2⁻²⁴` relative to `Σ|aₚbₚ|`: `|c − exact| ≤ (2⁻⁷ + 2⁻¹⁶ + k·2⁻²⁴)·Σₚ|aₚ·bₚ|`.
    /// The typical error (normal operands) is far below that bound: its root
    /// mean square relative to `√Σ(aₚbₚ)²` is below 2⁻⁸. Every kernel this CPU
    /// runs, AMX included (its sums are chains of at most `k` additions too).
    #[test]
    fn error_against_f32_is_bounded() {
        let mut scratch = Bf16Scratch::default();
        let cases =
            Bf16Kernel::available().iter().flat_map(|&kernel| SHAPES.iter().enumerate().map(move |s| (kernel, s)));
        for (kernel, (s, &(m, n, k))) in cases {
            let (a, b, _) = operands(m, n, k, 100 + s as u64);
            let mut got = vec![0.0f32; m * n];
            scratch.product_with(kernel, (Op::N, &a), (Op::T, &b), (m, n, k), false, &mut got, n);
            let a64: Vec<f64> = a.iter().map(|&v| v as f64).collect();
            let b64: Vec<f64> = b.iter().map(|&v| v as f64).collect();
            let mut exact = vec![0.0f64; m * n];
            gemm_reference(Op::N, Op::T, m, n, k, 1.0, &a64, &b64, 0.0, &mut exact);
            let (mut sq_err, mut sq_scale) = (0.0f64, 0.0f64);
            for i in 0..m {
                for j in 0..n {
                    let terms = (0..k).map(|p| a64[i * k + p] * b64[j * k + p]);
                    let abs_sum: f64 = terms.clone().map(f64::abs).sum();
                    let bound = (2f64.powi(-7) + 2f64.powi(-16) + k as f64 * 2f64.powi(-24)) * abs_sum;
                    let err = (got[i * n + j] as f64 - exact[i * n + j]).abs();
                    assert!(err <= bound, "{kernel:?} {m}x{n}x{k} [{i}][{j}]: error {err:e} over the bound {bound:e}");
                    sq_err += err * err;
                    sq_scale += terms.map(|t| t * t).sum::<f64>();
                }
            }
            let rms = (sq_err / sq_scale).sqrt();
            assert!(rms < 2f64.powi(-8), "{kernel:?} {m}x{n}x{k}: relative RMS error {rms:e}");
        }
    }
}
