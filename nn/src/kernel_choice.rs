//! Kernels chosen for this machine: the CPU's vector features, then a short
//! measurement of each candidate on every forward product a run will compute.
//!
//! A layer's forward `x·Wᵀ` belongs to one of three *summation classes*, fixed by
//! its shape and by whether the CPU runs the wide AVX-512 kernel ([`forward_class`],
//! as [`Linear::forward_class`](crate::linear::Linear::forward_class)): the packed kernel, the `gemm` crate or
//! matrixmultiply. The classes order their sums differently, so the class is
//! never measured, and a run's numbers do not depend on how fast anything
//! was. Inside the packed class the candidates are the vector kernels this CPU
//! runs ([`PanelKernel::available`]: AVX2, AVX-512VL on 256-bit vectors,
//! AVX-512F on 512-bit vectors one panel or four panels at a time, the latter
//! also with each chunk of the reduction run in parts that stay in L1 where a
//! product's reduction is longer than a part: [`PanelKernel::candidates`]), which compute every entry
//! as the same chain of fused multiply-adds and so give results equal bit for
//! bit (`gemm_packed::tests::vector_kernels_agree_bit_for_bit`). The measurement
//! picks among those only: two runs on one machine, or W workers against one,
//! train the same numbers whichever kernel won. A product of the matrixmultiply
//! class whose input is under 16 has the vector packed kernels as candidates
//! too ([`packed_computes_general`]): its reduction is one chunk of theirs, so
//! they add its sums in matrixmultiply's order.
//!
//! The backward products (`dW = dyᵀ·x`, `dx = dy·W`) are matrixmultiply's
//! sums. Their candidates are matrixmultiply itself and the packed kernels run
//! in matrixmultiply's summation order (`gemm_mm_order_in_place`: the same
//! chains of fused multiply-adds over the same runs of 256 steps; and the
//! wide kernel, whole and split, once more with its vector operand copied a
//! run at a time, `gemm_mm_order_f32`), equal to it
//! bit for bit (`gemm_packed::tests::mm_order_equals_matrixmultiply_bit_for_bit`);
//! [`choose_backward_kernels`] picks the fastest, keeping matrixmultiply unless
//! a packed kernel beats it by [`BACKWARD_MARGIN`] ([`backward_winner`]).
//!
//! Scoring runs each forward product in the class of its shape alone
//! ([`batch_invariant_class`]), so a sample's logit does not depend on the batch
//! it is scored in; training keeps [`forward_class`], which its measurements and
//! results were made with.
//!
//! Invariants: [`choose_forward_kernels`] installs a choice only for a shape in
//! the packed class, or in the general class where [`packed_computes_general`]
//! holds, and only a kernel the CPU runs; a forward shape never measured runs
//! [`PanelKernel::best`] in the packed class and matrixmultiply in the general
//! one, a backward one matrixmultiply.

use super::aligned::AlignedVec;
use super::gemm::{gemm, gemm_nt_acc, Op};
use super::gemm_bf16::Bf16Scratch;
use super::gemm_packed::{
    gemm_mm_order_f32, gemm_packed_with, packed_span_f32_with, MmOrderKernel, PackedRhs, PanelKernel,
};
use super::Scalar;
use std::sync::RwLock;
use std::time::Instant;

/// The summation class of a forward product (see [`Linear::forward`](crate::linear::Linear::forward)): each
/// class orders its sums its own way, so the class is a function of the shape
/// only; within the packed class the vector kernel is chosen by measurement
/// (this module), all giving equal results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardClass {
    /// `gemm_packed` with `Wᵀ` packed for the call.
    Packed,
    /// The `gemm` crate.
    Wide,
    /// matrixmultiply.
    General,
}

/// The summation class of a `batch × input → output` forward product: the
/// packed kernel wherever its vector panels run (AVX2 or AVX-512) and the
/// layer is not narrow, at any batch (it beats the `gemm` crate on DLRM's wide
/// layers at 2,048 rows: about 2× with the wide AVX-512 kernel, 1.16–1.20×
/// with AVX2 on a Zen 3); elsewhere the `gemm` crate for wide layers on large
/// batches and matrixmultiply for the rest.
///
/// The class depends on the shape and on whether this CPU (under
/// `TIDEREC_MAX_ISA`) runs a vector packed kernel, never on a measurement: two
/// runs on one machine train the same numbers, and so do an AVX2 and an
/// AVX-512 CPU, whose packed kernels give equal sums.
pub fn forward_class<T: Scalar>(batch: usize, input: usize, output: usize) -> ForwardClass {
    let packable = input >= 16 && output >= 8;
    if packable && T::packed_panel_is_vectorized() {
        ForwardClass::Packed
    } else if input >= 16 && batch > 256 && output > 64 {
        ForwardClass::Wide
    } else {
        ForwardClass::General
    }
}

/// The summation class of an `input → output` forward product whose rows must
/// not depend on how many are computed together (scoring): fixed by the shape
/// alone, as [`forward_class`] is for batches of at most 256 rows: the packed
/// kernel where a vector one runs and the layer is not narrow, matrixmultiply
/// elsewhere, never the `gemm` crate (it runs past 256 rows only, so a row's sums
/// would change with the batch). Both
/// sum each entry of a row the same way at any row count (one row through
/// matrixmultiply as well: [`gemm_nt_rows`](super::gemm::gemm_nt_rows)).
pub fn batch_invariant_class<T: Scalar>(input: usize, output: usize) -> ForwardClass {
    match forward_class::<T>(1, input, output) {
        ForwardClass::Wide => ForwardClass::General,
        class => class,
    }
}

/// Whether the vector packed kernels compute matrixmultiply's sums for the
/// `batch × input → output` forward, and so are candidates of its class
/// ([`ForwardClass::General`]) beside matrixmultiply: an input under 16 is one
/// chunk of the packed reduction, so each entry is one chain of fused
/// multiply-adds from zero added to the bias, as matrixmultiply computes it
/// after the bias is copied into the output (`linear::tests::narrow_inputs_run_matrixmultiplys_sums_on_the_packed_kernels`).
/// Needs an output of at least 8 and two rows or more (one row is
/// `gemm`'s matrix–vector loop, another order).
pub fn packed_computes_general<T: Scalar>(batch: usize, input: usize, output: usize) -> bool {
    T::packed_panel_is_vectorized()
        && forward_class::<T>(batch, input, output) == ForwardClass::General
        && (1..16).contains(&input)
        && output >= 8
        && batch >= 2
}

/// A forward product `rows × input → output` (`x·Wᵀ` with `W` `output × input`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ForwardShape {
    /// Rows of `x` (a worker's micro-batch).
    pub rows: usize,
    /// Input width.
    pub input: usize,
    /// Output width.
    pub output: usize,
}

impl ForwardShape {
    /// Floating-point operations of one product.
    pub fn flops(&self) -> f64 {
        2.0 * (self.rows * self.input * self.output) as f64
    }
}

impl std::fmt::Display for ForwardShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}->{}", self.rows, self.input, self.output)
    }
}

/// One way to compute a forward product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Candidate {
    /// The packed kernel with this panel kernel (`Wᵀ` packed on every call, as in training).
    Packed(PanelKernel),
    /// The `gemm` crate ([`gemm_nt_acc`]).
    GemmCrate,
    /// matrixmultiply ([`gemm()`]).
    MatrixMultiply,
    /// A backward product on the packed kernel in matrixmultiply's order (`gemm_mm_order_in_place`).
    PackedMmOrder(PanelKernel),
    /// The same with `b` copied into panels a run at a time (`gemm_mm_order_f32`).
    CopiedMmOrder(PanelKernel),
}

impl Candidate {
    /// The summation class the candidate belongs to.
    pub fn class(&self) -> ForwardClass {
        match self {
            Candidate::Packed(_) => ForwardClass::Packed,
            Candidate::GemmCrate => ForwardClass::Wide,
            Candidate::MatrixMultiply | Candidate::PackedMmOrder(_) | Candidate::CopiedMmOrder(_) => {
                ForwardClass::General
            }
        }
    }

    /// A short name (`packed-avx512`, `gemm-crate`, `matrixmultiply`).
    pub fn name(&self) -> &'static str {
        match self {
            Candidate::Packed(PanelKernel::Portable) => "packed-portable",
            Candidate::Packed(PanelKernel::Avx2) => "packed-avx2",
            Candidate::Packed(PanelKernel::Avx512Vl) => "packed-avx512vl",
            Candidate::Packed(PanelKernel::Avx512) => "packed-avx512",
            Candidate::Packed(PanelKernel::Avx512Wide) => "packed-avx512w",
            Candidate::Packed(PanelKernel::Avx512WideSplit) => "packed-avx512ws",
            Candidate::GemmCrate => "gemm-crate",
            Candidate::MatrixMultiply => "matrixmultiply",
            Candidate::PackedMmOrder(PanelKernel::Portable) => "packed-mm-portable",
            Candidate::PackedMmOrder(PanelKernel::Avx2) => "packed-mm-avx2",
            Candidate::PackedMmOrder(PanelKernel::Avx512Vl) => "packed-mm-avx512vl",
            Candidate::PackedMmOrder(PanelKernel::Avx512) => "packed-mm-avx512",
            Candidate::PackedMmOrder(PanelKernel::Avx512Wide) => "packed-mm-avx512w",
            Candidate::PackedMmOrder(PanelKernel::Avx512WideSplit) => "packed-mm-avx512ws",
            Candidate::CopiedMmOrder(PanelKernel::Portable) => "copied-mm-portable",
            Candidate::CopiedMmOrder(PanelKernel::Avx2) => "copied-mm-avx2",
            Candidate::CopiedMmOrder(PanelKernel::Avx512Vl) => "copied-mm-avx512vl",
            Candidate::CopiedMmOrder(PanelKernel::Avx512) => "copied-mm-avx512",
            Candidate::CopiedMmOrder(PanelKernel::Avx512Wide) => "copied-mm-avx512w",
            Candidate::CopiedMmOrder(PanelKernel::Avx512WideSplit) => "copied-mm-avx512ws",
        }
    }

    /// The packed kernel of a backward candidate in matrixmultiply's order
    /// (`None`: matrixmultiply itself, or a forward candidate).
    pub fn mm_order_kernel(&self) -> Option<MmOrderKernel> {
        match *self {
            Candidate::PackedMmOrder(kernel) => Some(MmOrderKernel { kernel, copy_b: false }),
            Candidate::CopiedMmOrder(kernel) => Some(MmOrderKernel { kernel, copy_b: true }),
            _ => None,
        }
    }
}

/// A candidate's measured speed on one shape.
#[derive(Clone, Debug)]
pub struct Timing {
    /// The candidate.
    pub candidate: Candidate,
    /// Median GFLOP/s over the rounds.
    pub gflops: f64,
    /// Whether it may be chosen: it is in the shape's summation class.
    pub eligible: bool,
}

/// The measurement of one shape and the kernel it runs on.
#[derive(Clone, Debug)]
pub struct ShapeChoice {
    /// The product.
    pub shape: ForwardShape,
    /// Every candidate measured (the eligible ones, or all with [`Measure::all`]).
    pub timings: Vec<Timing>,
    /// What the product runs on from now on.
    pub chosen: Candidate,
}

/// How long and how widely to measure.
#[derive(Clone, Copy, Debug)]
pub struct Measure {
    /// Time per candidate per round, in seconds of this thread's CPU time.
    pub seconds: f64,
    /// Rounds, alternating the candidates; the median is kept.
    pub rounds: usize,
    /// Also time the candidates of the other summation classes (for reports; never chosen).
    pub all: bool,
    /// Rounds more for a backward product whose two fastest candidates the
    /// first rounds found close ([`CLOSE_CALL`]) and whose call takes half a
    /// round or more (so a round held one or two calls): those two alternate
    /// again and the medians of all their rounds decide.
    pub settle: usize,
}

impl Measure {
    /// The start-up measurement: two rounds of 2 ms (or one call, if longer) per
    /// eligible candidate, and six rounds more for the two fastest of a backward
    /// product of a millisecond or more per call where they are close; about
    /// 0.4 s of CPU for DLRM's products at batch 128, 0.9 s at 2,048 (the split
    /// wide kernel's candidates add about 0.1 s at 2,048 on a Zen 4 core).
    pub const STARTUP: Measure = Measure { seconds: 0.002, rounds: 2, all: false, settle: 6 };
}

/// Two backward candidates are a close call when the faster's median rate is
/// within this factor of the other's (after [`BACKWARD_MARGIN`] where one is
/// matrixmultiply). A product of a few milliseconds is one call per round at
/// start-up, so two rounds are two calls: on a shared machine their spread
/// alone reaches several percent.
pub const CLOSE_CALL: f64 = 1.10;

/// The installed choices (a handful of shapes: a linear scan).
static CHOSEN: RwLock<Vec<(ForwardShape, PanelKernel)>> = RwLock::new(Vec::new());

/// The packed kernel a [`ForwardClass::General`] product `rows × input →
/// output` runs on instead of matrixmultiply: the measured choice where it was
/// a packed kernel ([`packed_computes_general`]); `None` (matrixmultiply) where
/// matrixmultiply was faster or the shape was never measured.
pub fn general_packed_kernel(rows: usize, input: usize, output: usize) -> Option<PanelKernel> {
    let shape = ForwardShape { rows, input, output };
    let chosen = CHOSEN.read().ok()?;
    chosen.iter().find(|(s, _)| *s == shape).map(|&(_, kernel)| kernel)
}

/// The panel kernel of the packed product `rows × input → output`: the measured
/// choice, or [`PanelKernel::best`] for a shape never measured.
#[inline]
pub fn panel_kernel_for(rows: usize, input: usize, output: usize) -> PanelKernel {
    let shape = ForwardShape { rows, input, output };
    if let Ok(chosen) = CHOSEN.read() {
        if let Some(&(_, kernel)) = chosen.iter().find(|(s, _)| *s == shape) {
            return kernel;
        }
    }
    PanelKernel::best()
}

/// Measures every distinct shape in `shapes` and installs, for each shape of
/// the packed class, its fastest vector kernel, and for each narrow shape of
/// the general class ([`packed_computes_general`]) the fastest vector kernel
/// where one beat matrixmultiply. Returns one entry per distinct shape
/// (sorted), the chosen candidate of the other classes being their only one.
pub fn choose_forward_kernels(shapes: &[ForwardShape], measure: Measure) -> Vec<ShapeChoice> {
    let mut distinct = shapes.to_vec();
    distinct.sort();
    distinct.dedup();
    let choices: Vec<ShapeChoice> = distinct.iter().map(|&shape| measure_shape(shape, measure)).collect();
    install_forward(&choices);
    choices
}

/// Installs each measured forward choice as [`choose_forward_kernels`] does
/// (a report that measured with [`measure_shape`] and then runs the model).
pub fn install_forward(choices: &[ShapeChoice]) {
    if let Ok(mut chosen) = CHOSEN.write() {
        for c in choices {
            chosen.retain(|(s, _)| *s != c.shape);
            if let Candidate::Packed(kernel) = c.chosen {
                chosen.push((c.shape, kernel));
            }
        }
    }
}

/// Times the candidates of one shape (see [`Measure`]) without installing anything.
pub fn measure_shape(shape: ForwardShape, measure: Measure) -> ShapeChoice {
    let class = forward_class::<f32>(shape.rows, shape.input, shape.output);
    let mut candidates: Vec<Candidate> = PanelKernel::candidates(shape.input).map(Candidate::Packed).collect();
    candidates.extend([Candidate::GemmCrate, Candidate::MatrixMultiply]);
    // The vector packed kernels also compute the general class's sums for a narrow input.
    let general_packed = packed_computes_general::<f32>(shape.rows, shape.input, shape.output);
    let eligible = |c: &Candidate| {
        c.class() == class || (general_packed && matches!(c, Candidate::Packed(k) if *k != PanelKernel::Portable))
    };
    candidates.retain(|c| measure.all || eligible(c));
    let (m, n, k) = (shape.rows, shape.output, shape.input);
    let val = |i: usize| ((i.wrapping_mul(7919) % 1000) as f32) * 1e-3 - 0.5;
    // Aligned as training's activations are (`MlpCache`), so the rates are training's.
    let x = AlignedVec::from_slice(&(0..m * k).map(val).collect::<Vec<f32>>());
    let w = AlignedVec::from_slice(&(0..n * k).map(|i| val(i + 17)).collect::<Vec<f32>>());
    let mut y = AlignedVec::new();
    y.resize(m * n, 0.0f32);
    let mut packed = PackedRhs::default();
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); candidates.len()];
    for _ in 0..measure.rounds.max(1) {
        for (c, rate) in candidates.iter().zip(&mut rates) {
            let mut run = || match *c {
                Candidate::Packed(kernel) => {
                    packed.pack(Op::T, k, n, &w);
                    gemm_packed_with(m, &x, k, &packed, true, &mut y, n, |s| packed_span_f32_with(kernel, s));
                }
                Candidate::GemmCrate => gemm_nt_acc(m, n, k, &x, &w, &mut y),
                Candidate::MatrixMultiply | Candidate::PackedMmOrder(_) | Candidate::CopiedMmOrder(_) => {
                    gemm(Op::N, Op::T, m, n, k, 1.0, &x, &w, 1.0, &mut y)
                }
            };
            rate.push(shape.flops() * calls_per_second(measure.seconds, &mut run) / 1e9);
        }
    }
    let timings: Vec<Timing> = candidates
        .iter()
        .zip(rates)
        .map(|(&candidate, r)| Timing { candidate, gflops: median(r), eligible: eligible(&candidate) })
        .collect();
    let chosen = timings
        .iter()
        .filter(|t| t.eligible)
        .max_by(|a, b| a.gflops.total_cmp(&b.gflops))
        .map(|t| t.candidate)
        .unwrap_or(match class {
            ForwardClass::Packed => Candidate::Packed(PanelKernel::best()),
            ForwardClass::Wide => Candidate::GemmCrate,
            ForwardClass::General => Candidate::MatrixMultiply,
        });
    ShapeChoice { shape, timings, chosen }
}

/// A layer's backward product.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backward {
    /// `dW[output × input] = dyᵀ·x`, over the rows.
    Dw,
    /// `dx[rows × input] = dy·W`, over the outputs.
    Dx,
}

/// A backward product of the layer `input → output` at `rows` rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackwardShape {
    /// Which product.
    pub product: Backward,
    /// Rows of the micro-batch.
    pub rows: usize,
    /// Input width of the layer.
    pub input: usize,
    /// Output width of the layer.
    pub output: usize,
}

impl BackwardShape {
    /// `(m, n, k)` of the product.
    pub fn mnk(&self) -> (usize, usize, usize) {
        match self.product {
            Backward::Dw => (self.output, self.input, self.rows),
            Backward::Dx => (self.rows, self.input, self.output),
        }
    }

    /// Whether the packed kernel may run it (a vector packed kernel runs here,
    /// and the product is not a matrix–vector one, which `gemm` computes apart).
    pub fn packable(&self) -> bool {
        let (m, n, k) = self.mnk();
        f32::packed_panel_is_vectorized() && m > 1 && n > 1 && k > 0
    }
}

impl std::fmt::Display for BackwardShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = if self.product == Backward::Dw { "dW" } else { "dx" };
        write!(f, "{name} {}x{}->{}", self.rows, self.input, self.output)
    }
}

/// The measurement of one backward product and the kernel it runs on.
#[derive(Clone, Debug)]
pub struct BackwardChoice {
    /// The product.
    pub shape: BackwardShape,
    /// Every candidate measured (all eligible: they give equal results).
    pub timings: Vec<Timing>,
    /// What the product runs on from now on.
    pub chosen: Candidate,
}

/// The installed backward choices: `None` is matrixmultiply.
static CHOSEN_BACKWARD: RwLock<Vec<(BackwardShape, Option<MmOrderKernel>)>> = RwLock::new(Vec::new());

/// The kernel of a backward product: the measured choice, `None` (matrixmultiply)
/// for a product never measured.
#[inline]
pub fn backward_kernel_for(product: Backward, rows: usize, input: usize, output: usize) -> Option<MmOrderKernel> {
    let shape = BackwardShape { product, rows, input, output };
    CHOSEN_BACKWARD.read().ok().and_then(|chosen| chosen.iter().find(|(s, _)| *s == shape).and_then(|&(_, k)| k))
}

/// The backward products of the forward shapes: `dW` of each, `dx` of each.
pub fn backward_shapes(forward: &[ForwardShape]) -> Vec<BackwardShape> {
    forward
        .iter()
        .flat_map(|f| {
            [Backward::Dw, Backward::Dx].map(|product| BackwardShape {
                product,
                rows: f.rows,
                input: f.input,
                output: f.output,
            })
        })
        .collect()
}

/// Measures every distinct product in `shapes` and installs the fastest of
/// matrixmultiply and the packed kernels in its order (equal results).
pub fn choose_backward_kernels(shapes: &[BackwardShape], measure: Measure) -> Vec<BackwardChoice> {
    let mut distinct = shapes.to_vec();
    distinct.sort();
    distinct.dedup();
    let choices: Vec<BackwardChoice> = distinct.iter().map(|&shape| measure_backward(shape, measure)).collect();
    install_backward_choices(&choices);
    choices
}

/// Installs each measured backward choice as [`choose_backward_kernels`] does.
pub fn install_backward_choices(choices: &[BackwardChoice]) {
    if let Ok(mut chosen) = CHOSEN_BACKWARD.write() {
        for c in choices {
            chosen.retain(|(s, _)| *s != c.shape);
            if let Some(kernel) = c.chosen.mm_order_kernel() {
                chosen.push((c.shape, Some(kernel)));
            }
        }
    }
}

/// Installs `kernel` for `shape` (tests: a chosen kernel without a measurement).
#[cfg(test)]
pub(crate) fn install_backward(shape: BackwardShape, kernel: Option<MmOrderKernel>) {
    let mut chosen = CHOSEN_BACKWARD.write().expect("the backward choices");
    chosen.retain(|(s, _)| *s != shape);
    chosen.push((shape, kernel));
}

/// Times the candidates of one backward product without installing anything.
pub fn measure_backward(shape: BackwardShape, measure: Measure) -> BackwardChoice {
    let (m, n, k) = shape.mnk();
    let mut candidates = vec![Candidate::MatrixMultiply];
    if shape.packable() {
        candidates.extend(PanelKernel::candidates(k).map(Candidate::PackedMmOrder));
        // `b` copied a run at a time, on the widest kernel only (start-up
        // time), whole and split where the wide kernel runs.
        candidates.push(Candidate::CopiedMmOrder(PanelKernel::best()));
        if PanelKernel::candidates(k).any(|kernel| kernel == PanelKernel::Avx512WideSplit) {
            candidates.push(Candidate::CopiedMmOrder(PanelKernel::Avx512WideSplit));
        }
    }
    let val = |i: usize| ((i.wrapping_mul(104_729) % 1000) as f32) * 1e-3 - 0.5;
    // `a` as the layer stores it (dy: rows × output), `b` stored k × n (x or W),
    // starting on a cache line as training's activations do (`MlpCache`).
    let a = AlignedVec::from_slice(&(0..m * k).map(val).collect::<Vec<f32>>());
    let b = AlignedVec::from_slice(&(0..k * n).map(|i| val(i + 3)).collect::<Vec<f32>>());
    let mut c = AlignedVec::new();
    c.resize(m * n, 0.0f32);
    let mut packed = PackedRhs::default();
    let (op_a, lda, a_step) = match shape.product {
        Backward::Dw => (Op::T, 1, m),
        Backward::Dx => (Op::N, k, 1),
    };
    let flops = 2.0 * (m * n * k) as f64;
    let mut time = |cand: Candidate| {
        let mut run = || match cand {
            Candidate::PackedMmOrder(_) | Candidate::CopiedMmOrder(_) => {
                let kernel = cand.mm_order_kernel().expect("a backward packed candidate");
                gemm_mm_order_f32(kernel, m, &a, lda, a_step, (k, n, &b, n), &mut packed, (&mut c, None, None), n)
            }
            _ => gemm(op_a, Op::N, m, n, k, 1.0, &a, &b, 0.0, &mut c),
        };
        flops * calls_per_second(measure.seconds, &mut run) / 1e9
    };
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); candidates.len()];
    for _ in 0..measure.rounds.max(1) {
        for (&cand, rate) in candidates.iter().zip(&mut rates) {
            rate.push(time(cand));
        }
    }
    // Only where a round held a call or two: many calls per round already average the noise out.
    let few_calls = |rates: &[f64]| flops / (median(rates.to_vec()) * 1e9) * 2.0 >= measure.seconds;
    if let Some((i, j)) = close_call(&candidates, &rates).filter(|&(i, _)| few_calls(&rates[i])) {
        for _ in 0..measure.settle {
            for at in [i, j] {
                rates[at].push(time(candidates[at]));
            }
        }
    }
    let timings: Vec<Timing> = candidates
        .iter()
        .zip(rates)
        .map(|(&candidate, r)| Timing { candidate, gflops: median(r), eligible: true })
        .collect();
    BackwardChoice { shape, chosen: backward_winner(&timings), timings }
}

/// The indices of the two fastest candidates (by their median rates) when
/// they are a close call ([`CLOSE_CALL`]), matrixmultiply held to
/// [`BACKWARD_MARGIN`] as [`backward_winner`] holds it.
fn close_call(candidates: &[Candidate], rates: &[Vec<f64>]) -> Option<(usize, usize)> {
    let effective: Vec<f64> = (candidates.iter().zip(rates))
        .map(|(&c, r)| median(r.clone()) * if c == Candidate::MatrixMultiply { BACKWARD_MARGIN } else { 1.0 })
        .collect();
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by(|&x, &y| effective[y].total_cmp(&effective[x]));
    let (&first, &second) = (order.first()?, order.get(1)?);
    (effective[first] <= effective[second] * CLOSE_CALL).then_some((first, second))
}

/// How much faster than matrixmultiply a packed kernel must be measured to
/// replace it on a backward product: 5%.
pub const BACKWARD_MARGIN: f64 = 1.05;

/// The backward kernel `timings` elect: the fastest packed kernel when it beats
/// matrixmultiply by [`BACKWARD_MARGIN`], matrixmultiply otherwise. A close
/// call keeps matrixmultiply, the kernel every backward product ran before
/// the choice existed, so a noisy start-up measurement (a loaded machine, a
/// few milliseconds per candidate) does not trade it for a slower kernel.
pub fn backward_winner(timings: &[Timing]) -> Candidate {
    let mm = timings.iter().find(|t| t.candidate == Candidate::MatrixMultiply).map_or(0.0, |t| t.gflops);
    timings
        .iter()
        .filter(|t| t.candidate != Candidate::MatrixMultiply)
        .max_by(|a, b| a.gflops.total_cmp(&b.gflops))
        .filter(|t| t.gflops > mm * BACKWARD_MARGIN)
        .map_or(Candidate::MatrixMultiply, |t| t.candidate)
}

/// GFLOP/s of one product of the layer `input → output` at `rows` rows under
/// `--precision bf16` (`None`: the forward `x·Wᵀ`; `Some`: a backward product),
/// on the best bf16 kernel, both operands rounded and packed from values on
/// every call (as training packs the first layer of each MLP; the layers after
/// it read operands their neighbours' products packed where AMX runs). For
/// reports: bf16 is a precision, not a candidate of an `f32` class.
pub fn measure_bf16(product: Option<Backward>, rows: usize, input: usize, output: usize, measure: Measure) -> f64 {
    let val = |i: usize| ((i.wrapping_mul(7919) % 1000) as f32) * 1e-3 - 0.5;
    let x: Vec<f32> = (0..rows * input).map(val).collect();
    let w: Vec<f32> = (0..output * input).map(|i| val(i + 17)).collect();
    let dy: Vec<f32> = (0..rows * output).map(|i| val(i + 3)).collect();
    let mut out = vec![0.0f32; rows.max(output) * input.max(output)];
    let mut s = Bf16Scratch::default();
    let flops = 2.0 * (rows * input * output) as f64;
    let mut run = || match product {
        None => s.product((Op::N, &x), (Op::T, &w), (rows, output, input), true, &mut out, output),
        Some(Backward::Dw) => s.product((Op::T, &dy), (Op::N, &x), (output, input, rows), false, &mut out, input),
        Some(Backward::Dx) => s.product((Op::N, &dy), (Op::N, &w), (rows, input, output), false, &mut out, input),
    };
    flops * median_calls_per_second(measure, &mut run) / 1e9
}

/// Calls of `f` per second of this thread's CPU time (wall time where the
/// system does not report it): the median over `measure`'s rounds of
/// `measure.seconds` (and at least one call) each.
pub fn median_calls_per_second(measure: Measure, f: &mut impl FnMut()) -> f64 {
    median((0..measure.rounds.max(1)).map(|_| calls_per_second(measure.seconds, f)).collect())
}

/// Calls of `f` per second of this thread's CPU time (wall time where the
/// system does not report it), over at least `seconds` and one call.
fn calls_per_second(seconds: f64, f: &mut impl FnMut()) -> f64 {
    let start = thread_seconds();
    let mut calls = 0u64;
    loop {
        f();
        calls += 1;
        let spent = thread_seconds() - start;
        if spent >= seconds && spent > 0.0 {
            return calls as f64 / spent;
        }
    }
}

/// This thread's CPU time in seconds (`CLOCK_THREAD_CPUTIME_ID`), or wall
/// time where the system has no thread clock. Not `/proc/thread-self/schedstat`:
/// on a running thread it advances in scheduler ticks (4 ms at 250 Hz), so
/// a start-up measurement of 2 ms could read zero or twice its time.
fn thread_seconds() -> f64 {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid `timespec` for the call to write.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9;
        }
    }
    static WALL: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    WALL.get_or_init(Instant::now).elapsed().as_secs_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The CPU's model name (`/proc/cpuinfo`), or `unknown`.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// The vector extensions the kernels may use here (`avx2 fma avx512f …`): the
/// CPU's, under `TIDEREC_MAX_ISA` ([`tiderec_records::cpu`]).
pub fn cpu_features() -> Vec<&'static str> {
    tiderec_records::cpu::usable().into_iter().map(|f| f.name()).collect()
}

/// [`cpu_features`] for a report line, naming the cap and what it turns off
/// when one is set: `avx2 fma (TIDEREC_MAX_ISA=avx2; off: avx512f …)`.
pub fn cpu_features_line() -> String {
    tiderec_records::cpu::describe()
}

/// One line naming each product's kernel:
/// `forward 64x512->256 packed-avx512, …; dW 64x512->256 packed-mm-avx512, …`.
pub fn summary(forward: &[ShapeChoice], backward: &[BackwardChoice]) -> String {
    let mut parts = vec![format!(
        "forward {}",
        forward.iter().map(|c| format!("{} {}", c.shape, c.chosen.name())).collect::<Vec<_>>().join(", ")
    )];
    if !backward.is_empty() {
        parts.push(backward.iter().map(|c| format!("{} {}", c.shape, c.chosen.name())).collect::<Vec<_>>().join(", "));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A measured packed shape gets one of the CPU's vector kernels, installed
    /// for [`panel_kernel_for`]; a shape of another class gets its only
    /// candidate and installs nothing; only eligible candidates are timed.
    /// Without a vector packed kernel (a CPU without AVX2, or
    /// `TIDEREC_MAX_ISA=portable`) there is no packed class: matrixmultiply.
    #[test]
    fn choices_stay_inside_the_summation_class() {
        let packed = ForwardShape { rows: 24, input: 40, output: 24 };
        let general = ForwardShape { rows: 24, input: 40, output: 3 };
        let narrow = ForwardShape { rows: 24, input: 5, output: 24 };
        let shapes = [packed, general, narrow, packed];
        let choices = choose_forward_kernels(&shapes, Measure { seconds: 0.0005, rounds: 1, all: false, settle: 0 });
        assert_eq!(choices.len(), 3, "one entry per distinct shape");
        let by = |s: ForwardShape| choices.iter().find(|c| c.shape == s).expect("measured");
        let p = by(packed);
        if !f32::packed_panel_is_vectorized() {
            eprintln!("no vector packed kernel here: the packed shape is matrixmultiply's");
            assert_eq!(p.chosen, Candidate::MatrixMultiply);
            assert_eq!(p.timings.len(), 1);
            return;
        }
        assert!(p.timings.iter().all(|t| t.eligible && t.candidate.class() == ForwardClass::Packed));
        assert!(p.timings.iter().all(|t| t.gflops > 0.0));
        match p.chosen {
            Candidate::Packed(kernel) => {
                assert!(PanelKernel::available().contains(&kernel));
                assert_eq!(panel_kernel_for(24, 40, 24), kernel);
            }
            other => panic!("packed shape chose {other:?}"),
        }
        let g = by(general);
        assert_eq!(g.chosen, Candidate::MatrixMultiply);
        assert_eq!(g.timings.len(), 1);
        assert_eq!(general_packed_kernel(24, 40, 3), None);
        // A narrow input: matrixmultiply and the vector packed kernels, whose sums are its.
        let n = by(narrow);
        assert!(n.timings.iter().all(|t| t.eligible));
        assert!(n.timings.iter().any(|t| t.candidate == Candidate::MatrixMultiply));
        assert!(n.timings.iter().any(|t| matches!(t.candidate, Candidate::Packed(_))));
        let installed = match n.chosen {
            Candidate::Packed(kernel) => Some(kernel),
            Candidate::MatrixMultiply => None,
            other => panic!("narrow shape chose {other:?}"),
        };
        assert_eq!(general_packed_kernel(24, 5, 24), installed);
    }

    /// The measurements' clock resolves far below a scheduler tick (4 ms at
    /// 250 Hz): a start-up measurement lasts 2 ms per candidate and round.
    #[cfg(unix)]
    #[test]
    fn the_thread_clock_resolves_well_below_a_scheduler_tick() {
        let mut steps = Vec::new();
        let mut last = thread_seconds();
        while steps.len() < 20 {
            let now = thread_seconds();
            if now != last {
                steps.push(now - last);
                last = now;
            }
        }
        let mut sorted = steps.clone();
        sorted.sort_by(f64::total_cmp);
        assert!(sorted[sorted.len() / 2] < 1e-4, "the thread clock advances in steps of {steps:?} s");
    }

    /// A measured backward product installs its choice for [`backward_kernel_for`]
    /// (`None` for matrixmultiply); a matrix–vector one has matrixmultiply only.
    #[test]
    fn backward_choices_are_installed() {
        let dx = BackwardShape { product: Backward::Dx, rows: 24, input: 40, output: 32 };
        let vector = BackwardShape { product: Backward::Dw, rows: 24, input: 40, output: 1 };
        let choices =
            choose_backward_kernels(&[dx, vector], Measure { seconds: 0.0005, rounds: 1, all: false, settle: 0 });
        let by = |s: BackwardShape| choices.iter().find(|c| c.shape == s).expect("measured");
        let installed = backward_kernel_for(Backward::Dx, 24, 40, 32);
        match by(dx).chosen {
            Candidate::MatrixMultiply => assert_eq!(installed, None),
            chosen => {
                let kernel = chosen.mm_order_kernel().unwrap_or_else(|| panic!("backward chose {chosen:?}"));
                assert_eq!(installed, Some(kernel));
            }
        }
        if f32::packed_panel_is_vectorized() {
            let names: Vec<&str> = by(dx).timings.iter().map(|t| t.candidate.name()).collect();
            assert!(names.len() >= 3, "matrixmultiply, a packed kernel and the copied one: {names:?}");
            assert!(names.iter().any(|n| n.starts_with("copied-mm-")), "{names:?}");
        }
        assert_eq!(by(vector).timings.len(), 1);
        assert_eq!(by(vector).chosen, Candidate::MatrixMultiply);
        assert_eq!(backward_kernel_for(Backward::Dw, 24, 40, 1), None);
    }

    /// A packed kernel replaces matrixmultiply on a backward product only when
    /// it is measured faster by the margin; a close call keeps matrixmultiply.
    #[test]
    fn backward_choice_keeps_matrixmultiply_on_a_close_call() {
        let t = |candidate, gflops| Timing { candidate, gflops, eligible: true };
        let mm = t(Candidate::MatrixMultiply, 100.0);
        let close = [mm.clone(), t(Candidate::PackedMmOrder(PanelKernel::Avx2), 104.0)];
        assert_eq!(backward_winner(&close), Candidate::MatrixMultiply);
        let clear = [
            mm.clone(),
            t(Candidate::PackedMmOrder(PanelKernel::Avx2), 106.0),
            t(Candidate::PackedMmOrder(PanelKernel::Avx512), 120.0),
        ];
        assert_eq!(backward_winner(&clear), Candidate::PackedMmOrder(PanelKernel::Avx512));
        let slower = [mm.clone(), t(Candidate::PackedMmOrder(PanelKernel::Avx2), 60.0)];
        assert_eq!(backward_winner(&slower), Candidate::MatrixMultiply);
        assert_eq!(backward_winner(&[mm]), Candidate::MatrixMultiply);
    }

    /// Only the two fastest candidates of a close call are measured again;
    /// matrixmultiply counts with its margin, so a packed kernel 4% faster is
    /// close, one 30% faster is not, and neither is a lone candidate.
    #[test]
    fn close_calls_name_the_two_fastest_candidates() {
        let (mm, avx2, avx512) = (
            Candidate::MatrixMultiply,
            Candidate::PackedMmOrder(PanelKernel::Avx2),
            Candidate::PackedMmOrder(PanelKernel::Avx512),
        );
        let rates = |r: &[f64]| r.iter().map(|&x| vec![x, x * 0.9]).collect::<Vec<_>>();
        assert_eq!(close_call(&[mm, avx2], &rates(&[100.0, 104.0])), Some((0, 1)));
        assert_eq!(close_call(&[mm, avx2], &rates(&[100.0, 130.0])), None);
        assert_eq!(close_call(&[mm, avx2, avx512], &rates(&[100.0, 60.0, 112.0])), Some((2, 0)));
        assert_eq!(close_call(&[mm, avx2, avx512], &rates(&[50.0, 118.0, 120.0])), Some((2, 1)));
        assert_eq!(close_call(&[mm], &rates(&[100.0])), None);
    }

    /// With `all`, the other classes are timed too but marked ineligible, and
    /// the choice is still the fastest eligible one: 300 rows into 100 outputs
    /// are the packed kernels' where a vector one runs, the gemm crate's elsewhere.
    #[test]
    fn reports_time_every_class_but_choose_within_one() {
        let shape = ForwardShape { rows: 300, input: 40, output: 100 };
        let class = forward_class::<f32>(shape.rows, shape.input, shape.output);
        let expected = if f32::packed_panel_is_vectorized() { ForwardClass::Packed } else { ForwardClass::Wide };
        assert_eq!(class, expected);
        let c = measure_shape(shape, Measure { seconds: 0.0005, rounds: 1, all: true, settle: 0 });
        assert_eq!(c.chosen.class(), class, "chosen {:?}", c.chosen);
        for t in &c.timings {
            assert_eq!(t.eligible, t.candidate.class() == class, "{:?}", t.candidate);
        }
        let packed_timed = c.timings.iter().any(|t| matches!(t.candidate, Candidate::Packed(_)));
        assert_eq!(
            packed_timed,
            f32::packed_panel_is_vectorized(),
            "the vector packed kernels are timed where they run"
        );
        assert!(c.timings.iter().any(|t| t.candidate == Candidate::GemmCrate));
        assert!(c.timings.iter().any(|t| t.candidate == Candidate::MatrixMultiply && !t.eligible));
    }
}
