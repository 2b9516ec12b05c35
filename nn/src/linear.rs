//! Fully connected layer `y = x·Wᵀ + b`.
//!
//! `W` is `[output × input]` row-major at `offset` in the model's flat
//! parameter buffer, followed by `b` (`output` values).

use super::gemm::{gemm, gemm_nt_acc, gemm_nt_rows, Op};
use super::gemm_amx::{AmxRhs, Epilogue};
use super::gemm_bf16::{Bf16Scratch, Chained, Left, Right};
use super::gemm_packed::{gemm_packed_finish_with, Finish, PackedRhs};
pub use super::kernel_choice::ForwardClass;
use super::kernel_choice::{
    backward_kernel_for, batch_invariant_class, forward_class, general_packed_kernel, packed_computes_general,
    panel_kernel_for, Backward,
};
use super::relu::{relu_backward_in_place, relu_in_place};
use super::Scalar;
use tiderec_records::rng::normal_f64;

/// A fully connected layer addressing its weights inside a flat buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Linear {
    /// Input width.
    pub input: usize,
    /// Output width.
    pub output: usize,
    /// Where `W` starts in the flat parameter buffer.
    pub offset: usize,
}

impl Linear {
    /// Number of parameters (`W` and `b`).
    pub fn num_params(&self) -> usize {
        self.output * self.input + self.output
    }

    fn bias_offset(&self) -> usize {
        self.offset + self.output * self.input
    }

    /// DLRM's initialisation: `W ~ N(0, 2/(in+out))`, `b ~ N(0, 1/out)`,
    /// drawn from counter-based randomness keyed by `(seed, tag)`.
    pub fn init<T: Scalar>(&self, params: &mut [T], seed: u64, tag: u64) {
        let w_std = (2.0 / (self.input + self.output) as f64).sqrt();
        let b_std = (1.0 / self.output as f64).sqrt();
        let nw = self.output * self.input;
        for (i, p) in params[self.offset..self.offset + nw].iter_mut().enumerate() {
            *p = T::from_f64(normal_f64(seed, tag, 0, i as u64) * w_std);
        }
        let bo = self.bias_offset();
        for (i, p) in params[bo..bo + self.output].iter_mut().enumerate() {
            *p = T::from_f64(normal_f64(seed, tag, 1, i as u64) * b_std);
        }
    }

    /// `y[batch × output] = x[batch × input] · Wᵀ + b`, then the ReLU when
    /// `relu` (as [`relu_in_place`] over `y`); `packed` is scratch space for
    /// `Wᵀ` (reused across calls, no allocation once large enough).
    ///
    /// The product runs in one of three summation classes, chosen by shape from measurements
    /// (`benches/linear_forward.rs`, `benches/dlrm_gemm_shapes.rs`,
    /// `tiderec bench kernels`): the packed kernel transposes `W` once in 8 × 8
    /// register tiles and reads `x` where it lies (1.2–1.5× matrixmultiply at a
    /// worker's micro-batch of 64 rows, and the fastest at any batch on outputs
    /// of at most 64, or on any layer where its wide AVX-512 kernel runs); many
    /// rows into a wide output go to the `gemm` crate ([`gemm_nt_acc`], 1.1–1.25×
    /// matrixmultiply at 1,024 rows on DLRM's 367→512 and 512→256) on CPUs
    /// without AVX-512; the rest (narrow inputs, `f64` without a vector packed
    /// kernel) to matrixmultiply. A narrow input's product runs on a vector
    /// packed kernel instead where the start-up measurement found one faster:
    /// its sums are matrixmultiply's ([`packed_computes_general`]). The packed
    /// kernels add the bias and apply the ReLU as they write each block of `y`
    /// (the same values as writing the bias first and the ReLU after, bit for
    /// bit).
    #[inline(never)]
    pub fn forward<T: Scalar>(
        &self,
        params: &[T],
        x: &[T],
        batch: usize,
        out: (&mut [T], bool),
        packed: &mut PackedRhs<T>,
    ) {
        let class = self.forward_class::<T>(batch);
        self.forward_in(class, false, params, (x, batch), out, packed)
    }

    /// [`forward`](Self::forward) with each row's output independent of how many
    /// rows are computed with it and of its place among them (scoring): the
    /// product runs in the class of the layer's shape alone
    /// ([`batch_invariant_class`]), and a single row of the matrixmultiply class
    /// through matrixmultiply too ([`gemm_nt_rows`]). Equal to
    /// [`forward`](Self::forward) bit for bit wherever that runs the same class
    /// on two rows or more (any batch of 2 to 256 rows, and any batch of two or
    /// more where a vector packed kernel runs); within rounding of it elsewhere.
    #[inline(never)]
    pub fn forward_batch_invariant<T: Scalar>(
        &self,
        params: &[T],
        x: &[T],
        batch: usize,
        out: (&mut [T], bool),
        packed: &mut PackedRhs<T>,
    ) {
        let class = batch_invariant_class::<T>(self.input, self.output);
        self.forward_in(class, true, params, (x, batch), out, packed)
    }

    /// The body of both forwards: the product in `class`, one row through
    /// matrixmultiply when `one_row_general` (else through [`gemm()`]'s dot products).
    #[inline(always)]
    fn forward_in<T: Scalar>(
        &self,
        class: ForwardClass,
        one_row_general: bool,
        params: &[T],
        (x, batch): (&[T], usize),
        (y, relu): (&mut [T], bool),
        packed: &mut PackedRhs<T>,
    ) {
        let w = &params[self.offset..self.offset + self.output * self.input];
        let b = &params[self.bias_offset()..self.bias_offset() + self.output];
        let y = &mut y[..batch * self.output];
        let kernel = match class {
            ForwardClass::Packed => Some(panel_kernel_for(batch, self.input, self.output)),
            ForwardClass::General if packed_computes_general::<T>(batch, self.input, self.output) => {
                general_packed_kernel(batch, self.input, self.output)
            }
            _ => None,
        };
        if let Some(kernel) = kernel {
            packed.pack(Op::T, self.input, self.output, w);
            let finish = Finish { row: Some(b), relu, mask: None, sums: None };
            gemm_packed_finish_with(batch, x, self.input, packed, (false, finish), y, self.output, |span| {
                T::packed_span_with(kernel, span)
            });
            return;
        }
        for row in y.chunks_exact_mut(self.output) {
            row.copy_from_slice(b);
        }
        if class == ForwardClass::Wide {
            gemm_nt_acc(batch, self.output, self.input, x, w, y);
        } else if one_row_general {
            gemm_nt_rows(batch, self.output, self.input, T::ONE, x, w, T::ONE, y);
        } else {
            gemm(Op::N, Op::T, batch, self.output, self.input, T::ONE, x, w, T::ONE, y);
        }
        if relu {
            relu_in_place(y);
        }
    }

    /// Which class [`forward`](Self::forward) uses for `batch` rows: the packed
    /// kernel where it runs vectorized (not in `f64` or without AVX2), for an
    /// input of at least 16 and an output of 8 or more; elsewhere the `gemm`
    /// crate for more than 256 rows into an output wider than 64 (input ≥ 16),
    /// matrixmultiply otherwise.
    pub fn forward_class<T: Scalar>(&self, batch: usize) -> ForwardClass {
        forward_class::<T>(batch, self.input, self.output)
    }

    /// Writes `dW = dyᵀ·x` and `db = Σ dy` into `grads`, and `dx = dy·W` when
    /// asked, passed back through the ReLU whose output `x` is when its flag
    /// says so (as [`relu_backward_in_place`] against `x`; the packed kernel
    /// does it as it writes each block of `dx`); `packed` is scratch space (the
    /// packed kernel reads `x` and `W` where they lie; it packs only their last
    /// `input mod 8` columns).
    ///
    /// Both products are matrixmultiply's sums: where a vector packed kernel runs
    /// and both dimensions of the result exceed one, on whichever the start-up
    /// measurement chose ([`backward_kernel_for`]) of matrixmultiply and the packed
    /// kernel in matrixmultiply's summation order ([`T::gemm_mm_order`](Scalar::gemm_mm_order),
    /// equal to it bit for bit); on matrixmultiply otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: Scalar>(
        &self,
        params: &[T],
        x: &[T],
        dy: &[T],
        batch: usize,
        grads: &mut [T],
        dx: Option<(&mut [T], bool)>,
        packed: &mut PackedRhs<T>,
    ) {
        let dx = dx.map(|(dx, relu_below)| (dx, relu_below, None));
        self.backward_summed(params, x, dy, batch, grads, (dx, None), packed)
    }

    /// [`backward`](Self::backward) with the bias gradients summed by the
    /// `dx` products: `db`, when given, is this layer's (the column sums of
    /// `dy`, which the layer above's `dx` product added up as it wrote `dy`),
    /// copied instead of summing `dy` again; the third part of `dx`, when
    /// given, is overwritten with the column sums of `dx` as written (after
    /// the ReLU), the layer below's. The values equal summing the rows
    /// afterwards, bit for bit, without one more pass over each `dy`.
    #[inline(never)]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    pub(crate) fn backward_summed<T: Scalar>(
        &self,
        params: &[T],
        x: &[T],
        dy: &[T],
        batch: usize,
        grads: &mut [T],
        (dx, db): (Option<(&mut [T], bool, Option<&mut [T]>)>, Option<&[T]>),
        packed: &mut PackedRhs<T>,
    ) {
        let nw = self.output * self.input;
        let (gw, gb) = grads[self.offset..self.offset + nw + self.output].split_at_mut(nw);
        let packable = T::packed_panel_is_vectorized() && self.input > 1;
        let dw_kernel = if packable && self.output > 1 && batch > 0 {
            backward_kernel_for(Backward::Dw, batch, self.input, self.output)
        } else {
            None
        };
        if let Some(kernel) = dw_kernel {
            // dW (output × input) = dyᵀ·x: row i of dyᵀ is column i of dy.
            T::gemm_mm_order(
                kernel,
                self.output,
                dy,
                1,
                self.output,
                (batch, self.input, x, self.input),
                packed,
                (gw, None, None),
                self.input,
            );
        } else {
            gemm(Op::T, Op::N, self.output, self.input, batch, T::ONE, dy, x, T::ZERO, gw);
        }
        match db {
            Some(db) => gb.copy_from_slice(&db[..self.output]),
            None => column_sums(&dy[..batch * self.output], gb),
        }
        if let Some((dx, relu_below, sums)) = dx {
            let w = &params[self.offset..self.offset + nw];
            let dx = &mut dx[..batch * self.input];
            let mask = relu_below.then_some(&x[..batch * self.input]);
            let dx_kernel = if packable && batch > 1 && self.output > 0 {
                backward_kernel_for(Backward::Dx, batch, self.input, self.output)
            } else {
                None
            };
            let mut sums = sums.map(|sums| &mut sums[..self.input]);
            if let Some(kernel) = dx_kernel {
                // The product adds its rows onto the sums.
                if let Some(sums) = sums.as_deref_mut() {
                    sums.fill(T::ZERO);
                }
                T::gemm_mm_order(
                    kernel,
                    batch,
                    dy,
                    self.output,
                    1,
                    (self.output, self.input, w, self.input),
                    packed,
                    (dx, mask, sums),
                    self.input,
                );
            } else {
                gemm(Op::N, Op::N, batch, self.input, self.output, T::ONE, dy, w, T::ZERO, dx);
                if let Some(x) = mask {
                    relu_backward_in_place(dx, x);
                }
                if let Some(sums) = sums {
                    column_sums(dx, sums);
                }
            }
        }
    }
}

/// `sums ← Σ rows`: the rows of `values` (each `sums.len()` wide) added
/// one after another from zero (a bias gradient from its `dy`).
fn column_sums<T: Scalar>(values: &[T], sums: &mut [T]) {
    sums.fill(T::ZERO);
    for row in values.chunks_exact(sums.len().max(1)) {
        for (s, &v) in sums.iter_mut().zip(row) {
            *s += v;
        }
    }
}

impl Linear {
    /// [`forward`](Self::forward) under `--precision bf16`: `x` and `W` rounded to
    /// bf16, products accumulated in `f32` onto the `f32` bias on the best bf16
    /// kernel ([`Bf16Scratch::product_onto_row`]), then the ReLU when `relu` (as
    /// [`relu_in_place`] over `y`); `W` is rounded
    /// from its current `f32` values on every call.
    pub fn forward_bf16(
        &self,
        params: &[f32],
        x: &[f32],
        batch: usize,
        (y, relu): (&mut [f32], bool),
        scratch: &mut Bf16Scratch,
    ) {
        let x = Chained::Rows(&x[..batch * self.input]);
        self.forward_bf16_chained(params, x, batch, (y, relu), scratch, None);
    }

    /// [`forward_bf16`](Self::forward_bf16) with the input as
    /// [`Bf16Scratch::product_onto_row_chained`] takes it (the previous layer's
    /// output packed by its product, or values), and with `next` the output
    /// packed for the next layer where the kernel can: the result says whether
    /// it was. When it was, the output is packed both as the next layer's
    /// input to its forward (the scratch's [`Chained::Packed`]) and into `next`
    /// as its input to `dW` ([`Right::Packed`]), and `y` is then left
    /// unwritten where one chunk of the kernel holds the reduction (the layer
    /// above reads only the packings). The same values as `forward_bf16`, bit
    /// for bit.
    pub fn forward_bf16_chained(
        &self,
        params: &[f32],
        x: Chained<'_>,
        batch: usize,
        (y, relu): (&mut [f32], bool),
        scratch: &mut Bf16Scratch,
        next: Option<&mut AmxRhs>,
    ) -> bool {
        let w = &params[self.offset..self.offset + self.output * self.input];
        let b = &params[self.bias_offset()..self.bias_offset() + self.output];
        let y = &mut y[..batch * self.output];
        let shape = (batch, self.output, self.input);
        let epilogue = if relu { Epilogue::Relu } else { Epilogue::None };
        let write_y = next.is_none();
        scratch.product_onto_row_chained(
            x,
            (Op::T, w),
            shape,
            (b, epilogue),
            (y, self.output, write_y),
            (!write_y, next),
        )
    }

    /// [`backward`](Self::backward) under `--precision bf16`: `dW = dyᵀ·x` and
    /// `dx = dy·W` on bf16-rounded operands with `f32` accumulation; `db = Σ dy`
    /// in `f32`. With `dx`'s second part `true`, `x` is the output of a ReLU
    /// before this layer, and `dx` is then passed back through that ReLU
    /// ([`relu_backward_in_place`]).
    #[allow(clippy::too_many_arguments)]
    pub fn backward_bf16(
        &self,
        params: &[f32],
        x: &[f32],
        dy: &[f32],
        batch: usize,
        grads: &mut [f32],
        dx: Option<(&mut [f32], bool)>,
        scratch: &mut Bf16Scratch,
    ) {
        self.backward_bf16_chained(params, (x, None, dy), batch, grads, dx, scratch, (false, false));
    }

    /// [`backward_bf16`](Self::backward_bf16) where `dy_packed` says the
    /// product that wrote `dy` packed it ([`Bf16Scratch::product_then_chained`]),
    /// so `dW` (with the bias gradient) and the `dx` product read it packed
    /// (`dy` itself need not hold the values then), and with `pack_dx` `dx` is
    /// packed for the layer below, and then left unwritten where one chunk of
    /// the kernel holds the reduction: the result says whether it was. `x_packed`, if given,
    /// is `x` as the previous layer's forward packed it (`rows` of
    /// [`forward_bf16_chained`](Self::forward_bf16_chained)), which `dW` reads
    /// instead of packing `x`, and from which the ReLU's pass reads its output
    /// ([`Epilogue::ReluBackwardPacked`]). The same values as `backward_bf16`,
    /// bit for bit, wherever no output of that ReLU is a positive denormal.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_bf16_chained(
        &self,
        params: &[f32],
        (x, x_packed, dy): (&[f32], Option<&AmxRhs>, &[f32]),
        batch: usize,
        grads: &mut [f32],
        dx: Option<(&mut [f32], bool)>,
        scratch: &mut Bf16Scratch,
        (dy_packed, pack_dx): (bool, bool),
    ) -> bool {
        let nw = self.output * self.input;
        let (gw, gb) = grads[self.offset..self.offset + nw + self.output].split_at_mut(nw);
        let dy = &dy[..batch * self.output];
        let shape = (self.output, self.input, batch);
        let x = &x[..batch * self.input];
        let right = x_packed.map_or(Right::Values(Op::N, x), Right::Packed);
        let left = if dy_packed { Left::Transposed } else { Left::Values(Op::T, dy) };
        scratch.product_summing_lhs(left, right, shape, (gw, self.input), gb);
        let Some((dx, relu_below)) = dx else {
            return false;
        };
        let (w, shape) = (&params[self.offset..self.offset + nw], (batch, self.input, self.output));
        let epilogue = match (relu_below, x_packed) {
            (false, _) => Epilogue::None,
            (true, Some(packed)) => Epilogue::ReluBackwardPacked(packed),
            (true, None) => Epilogue::ReluBackward(x),
        };
        let dy = if dy_packed { Chained::Packed } else { Chained::Rows(dy) };
        let dx = (&mut dx[..batch * self.input], self.input);
        scratch.product_then_chained(dy, (Op::N, w), shape, epilogue, dx, pack_dx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;

    #[test]
    fn linear_gradients_match_finite_differences() {
        let lin = Linear { input: 5, output: 3, offset: 2 };
        let batch = 4;
        let mut params = vec![0.0f64; 2 + lin.num_params()];
        lin.init(&mut params, 1, 0);
        let x: Vec<f64> = (0..batch * 5).map(|i| tiderec_records::rng::normal_f64(3, 0, i as u64, 0)).collect();
        let r: Vec<f64> = (0..batch * 3).map(|i| tiderec_records::rng::normal_f64(4, 0, i as u64, 0)).collect();
        // loss = Σ r ⊙ y, so dy = r.
        let loss = |p: &[f64], x: &[f64]| {
            let mut y = vec![0.0; batch * 3];
            lin.forward(p, x, batch, (&mut y, false), &mut PackedRhs::default());
            y.iter().zip(&r).map(|(a, b)| a * b).sum::<f64>()
        };
        let mut grads = vec![0.0; params.len()];
        let mut dx = vec![0.0; x.len()];
        lin.backward(&params, &x, &r, batch, &mut grads, Some((&mut dx, false)), &mut PackedRhs::default());
        check_gradients(&params[2..], &grads[2..], |p| {
            let mut full = params.clone();
            full[2..].copy_from_slice(p);
            loss(&full, &x)
        });
        check_gradients(&x, &dx, |xx| loss(&params, xx));
    }

    /// `layer`'s forward of `batch` rows of `x` in chunks of `chunk` rows,
    /// batch-invariant or training's.
    fn forward_in_chunks<T: Scalar>(lin: &Linear, params: &[T], x: &[T], chunk: usize, invariant: bool) -> Vec<T> {
        let mut y = Vec::new();
        let mut packed = PackedRhs::default();
        for rows in x.chunks(chunk * lin.input) {
            let n = rows.len() / lin.input;
            let mut part = vec![T::ZERO; n * lin.output];
            if invariant {
                lin.forward_batch_invariant(params, rows, n, (&mut part, true), &mut packed);
            } else {
                lin.forward(params, rows, n, (&mut part, true), &mut packed);
            }
            y.extend(part);
        }
        y
    }

    /// The batch-invariant forward gives each row the same bits whether it is
    /// computed alone, among 7 rows or among 300 (past the 256 rows where
    /// training's class can change), and wherever it lies; it equals training's
    /// forward bit for bit on 7 rows (the same class on two rows or more), and
    /// within rounding on one row and on 300. In `f32` (the packed kernel where
    /// a vector one runs) and `f64` (no packed kernel: matrixmultiply, where
    /// training runs the `gemm` crate past 256 rows on wide layers).
    #[test]
    fn batch_invariant_forward_gives_each_row_its_bits_at_any_batch() {
        batch_invariant_rows::<f32>(1e-5);
        batch_invariant_rows::<f64>(1e-12);
    }

    fn batch_invariant_rows<T: Scalar>(tolerance: f64) {
        let bits = |v: &[T]| v.iter().map(|x| x.to_f64().to_bits()).collect::<Vec<_>>();
        let batch = 300;
        // Narrow inputs and outputs (matrixmultiply), a layer of width 1, wide layers.
        for (input, output) in [(13, 100), (40, 3), (100, 4), (20, 1), (40, 100), (367, 130)] {
            let lin = Linear { input, output, offset: 0 };
            let mut params = vec![T::ZERO; lin.num_params()];
            lin.init(&mut params, 7, input as u64);
            let x: Vec<T> =
                (0..batch * input).map(|i| T::from_f64(tiderec_records::rng::normal_f64(9, 1, i as u64, 0))).collect();
            let what = format!("{}: {input}->{output}", std::any::type_name::<T>());
            let all = forward_in_chunks(&lin, &params, &x, batch, true);
            for chunk in [1, 7, 257] {
                let got = forward_in_chunks(&lin, &params, &x, chunk, true);
                assert_eq!(bits(&got), bits(&all), "{what}: in chunks of {chunk} rows");
            }
            // The rows in reverse order: each keeps its bits.
            let reversed: Vec<T> = x.chunks(input).rev().flatten().copied().collect();
            let back = forward_in_chunks(&lin, &params, &reversed, batch, true);
            let back: Vec<T> = back.chunks(output).rev().flatten().copied().collect();
            assert_eq!(bits(&back), bits(&all), "{what}: rows reversed");
            let training_small = forward_in_chunks(&lin, &params, &x, 7, false);
            assert_eq!(bits(&training_small), bits(&all), "{what}: training's forward on 7 rows");
            for chunk in [1, batch] {
                let training = forward_in_chunks(&lin, &params, &x, chunk, false);
                for (k, (t, a)) in training.iter().zip(&all).enumerate() {
                    let (t, a) = (t.to_f64(), a.to_f64());
                    assert!((t - a).abs() <= tolerance * (1.0 + a.abs()), "{what} [{k}] chunks of {chunk}: {t} vs {a}");
                }
            }
        }
    }

    /// All three forward kernels (packed: any batch where a vector packed
    /// kernel runs; the `gemm` crate: many rows into a wide output where none
    /// does; matrixmultiply: narrow inputs or outputs) agree with the plain
    /// definition.
    #[test]
    fn forward_kernels_agree_with_the_definition() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        use ForwardClass::*;
        let wide = if f32::packed_panel_is_vectorized() { Packed } else { Wide };
        let cases = [
            (40, 24, 5, Packed),
            (40, 24, 300, Packed),
            (40, 100, 300, wide),
            (367, 130, 257, wide),
            (10, 100, 300, General),
            (7, 9, 3, General),
            (20, 3, 4, General),
        ];
        for (input, output, batch, kernel) in cases {
            let lin = Linear { input, output, offset: 0 };
            if f32::packed_panel_is_vectorized() {
                assert_eq!(lin.forward_class::<f32>(batch), kernel, "{input}->{output} b{batch}");
            }
            let mut params = vec![0.0f32; lin.num_params()];
            lin.init(&mut params, 2, 0);
            let x: Vec<f32> =
                (0..batch * input).map(|i| tiderec_records::rng::normal_f64(8, 0, i as u64, 0) as f32).collect();
            let mut y = vec![0.0f32; batch * output];
            lin.forward(&params, &x, batch, (&mut y, false), &mut PackedRhs::default());
            for b in 0..batch {
                for j in 0..output {
                    let want = params[input * output + j] as f64
                        + (0..input).map(|i| x[b * input + i] as f64 * params[j * input + i] as f64).sum::<f64>();
                    let got = y[b * output + j] as f64;
                    assert!(
                        (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "{input}->{output} b{batch}: {got} vs {want}"
                    );
                }
            }
            // With the ReLU: the same as applying it after, bit for bit (the
            // packed kernels apply it as they write).
            let mut y_relu = vec![f32::NAN; batch * output];
            lin.forward(&params, &x, batch, (&mut y_relu, true), &mut PackedRhs::default());
            crate::relu::relu_in_place(&mut y);
            assert_eq!(bits(&y_relu), bits(&y), "{input}->{output} b{batch} with the ReLU");
            // dx through the ReLU whose output `x` is: the same as masking after.
            let dy: Vec<f32> =
                (0..batch * output).map(|i| tiderec_records::rng::normal_f64(9, 0, i as u64, 0) as f32).collect();
            let mut grads = vec![0.0f32; lin.num_params()];
            let (mut dx, mut dx_relu) = (vec![f32::NAN; batch * input], vec![f32::NAN; batch * input]);
            lin.backward(&params, &x, &dy, batch, &mut grads, Some((&mut dx, false)), &mut PackedRhs::default());
            lin.backward(&params, &x, &dy, batch, &mut grads, Some((&mut dx_relu, true)), &mut PackedRhs::default());
            crate::relu::relu_backward_in_place(&mut dx, &x);
            assert_eq!(bits(&dx_relu), bits(&dx), "{input}->{output} b{batch} dx through the ReLU");
        }
    }

    /// A narrow input's forward (under 16 values, the matrixmultiply class) on
    /// every vector packed kernel equals matrixmultiply's bit for bit: bias
    /// copied in, `x·Wᵀ` added with `beta = 1`, then the ReLU; and
    /// [`Linear::forward`] runs a measured packed choice there with the same
    /// values. One row stays matrixmultiply's (its matrix–vector loop).
    #[test]
    fn narrow_inputs_run_matrixmultiplys_sums_on_the_packed_kernels() {
        use crate::gemm_packed::{packed_span_f32_with, PanelKernel};
        use crate::kernel_choice::{choose_forward_kernels, ForwardShape, Measure};
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let kernels: Vec<PanelKernel> =
            PanelKernel::available().iter().copied().filter(|&k| k != PanelKernel::Portable).collect();
        if kernels.is_empty() || !f32::packed_panel_is_vectorized() {
            eprintln!("skipped: this CPU (or TIDEREC_MAX_ISA) runs no vector packed kernel");
            return;
        }
        let val = |i: usize, s: u64| tiderec_records::rng::normal_f64(s, 0, i as u64, 0) as f32;
        for input in 1..16 {
            for (output, batch) in [(8, 2), (13, 5), (16, 64), (33, 130), (100, 7), (512, 300)] {
                assert!(crate::kernel_choice::packed_computes_general::<f32>(batch, input, output));
                assert!(!crate::kernel_choice::packed_computes_general::<f32>(1, input, output));
                let lin = Linear { input, output, offset: 0 };
                let mut params = vec![0.0f32; lin.num_params()];
                lin.init(&mut params, 3, input as u64);
                let (w, b) = params.split_at(input * output);
                let x: Vec<f32> = (0..batch * input).map(|i| val(i, 5)).collect();
                let mut want = vec![0.0f32; batch * output];
                want.chunks_exact_mut(output).for_each(|row| row.copy_from_slice(b));
                gemm(Op::N, Op::T, batch, output, input, 1.0, &x, w, 1.0, &mut want);
                relu_in_place(&mut want);
                let mut packed = PackedRhs::default();
                packed.pack(Op::T, input, output, w);
                for &kernel in &kernels {
                    let mut got = vec![f32::NAN; batch * output];
                    let finish = Finish { row: Some(b), relu: true, mask: None, sums: None };
                    gemm_packed_finish_with(batch, &x, input, &packed, (false, finish), &mut got, output, |s| {
                        packed_span_f32_with(kernel, s)
                    });
                    assert_eq!(bits(&got), bits(&want), "{kernel:?} {input}->{output} b{batch}");
                }
            }
        }
        // Through the layer once a measurement has chosen a kernel for the shape.
        let (input, output, batch) = (13, 64, 40);
        choose_forward_kernels(&[ForwardShape { rows: batch, input, output }], Measure::STARTUP);
        let lin = Linear { input, output, offset: 0 };
        let mut params = vec![0.0f32; lin.num_params()];
        lin.init(&mut params, 4, 0);
        let x: Vec<f32> = (0..batch * input).map(|i| val(i, 6)).collect();
        let mut want = vec![0.0f32; batch * output];
        want.chunks_exact_mut(output).for_each(|row| row.copy_from_slice(&params[input * output..]));
        gemm(Op::N, Op::T, batch, output, input, 1.0, &x, &params[..input * output], 1.0, &mut want);
        relu_in_place(&mut want);
        let mut got = vec![f32::NAN; batch * output];
        lin.forward(&params, &x, batch, (&mut got, true), &mut PackedRhs::default());
        assert_eq!(bits(&got), bits(&want), "Linear::forward {input}->{output} b{batch}");
    }

    /// The bf16 forward and backward equal their definitions on the bf16 oracle
    /// bit for bit (`y = b + x·Wᵀ`, `dW = dyᵀ·x`, `dx = dy·W`), `db = Σ dy` in
    /// `f32`, and nothing outside the layer's ranges is written.
    #[test]
    fn bf16_products_equal_the_oracle() {
        bf16_products_equal_the_best_kernels_oracle();
    }

    /// [`bf16_products_equal_the_oracle`] on AMX tiles, emulated where the
    /// CPU has none: the bias start row, the ReLU epilogues, the `dW` product
    /// summing `db` as it packs `dy`, against the AMX oracle.
    #[test]
    fn bf16_products_on_amx_tiles_equal_the_oracle() {
        crate::gemm_amx::tests::on_amx_tiles(bf16_products_equal_the_best_kernels_oracle);
    }

    fn bf16_products_equal_the_best_kernels_oracle() {
        let kernel = crate::gemm_bf16::Bf16Kernel::best();
        let gemm_bf16_reference = |op_a, op_b, m, n, k, a: &[f32], b: &[f32], acc, c: &mut [f32]| {
            kernel.reference(op_a, op_b, m, n, k, a, b, acc, c)
        };
        for (input, output, batch) in [(13, 512, 7), (367, 512, 30), (256, 1, 25), (5, 3, 1), (64, 16, 40)] {
            let lin = Linear { input, output, offset: 3 };
            let mut params = vec![0.0f32; 3 + lin.num_params() + 2];
            lin.init(&mut params, 4, 0);
            let val = |seed: u64, i: usize| tiderec_records::rng::normal_f64(seed, 0, i as u64, 0) as f32;
            let x: Vec<f32> = (0..batch * input).map(|i| val(5, i)).collect();
            let dy: Vec<f32> = (0..batch * output).map(|i| val(6, i)).collect();
            let (w, b) = params[3..3 + lin.num_params()].split_at(output * input);
            let mut scratch = Bf16Scratch::default();
            let mut y = vec![f32::NAN; batch * output];
            lin.forward_bf16(&params, &x, batch, (&mut y, false), &mut scratch);
            let mut want: Vec<f32> = (0..batch).flat_map(|_| b.iter().copied()).collect();
            gemm_bf16_reference(Op::N, Op::T, batch, output, input, &x, w, true, &mut want);
            assert_eq!(
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "forward {input}->{output} b{batch}"
            );
            lin.forward_bf16(&params, &x, batch, (&mut y, true), &mut scratch);
            crate::relu::relu_in_place(&mut want);
            assert_eq!(
                y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "forward with ReLU {input}->{output} b{batch}"
            );
            let mut grads = vec![f32::NAN; params.len()];
            let mut dx = vec![f32::NAN; batch * input];
            lin.backward_bf16(&params, &x, &dy, batch, &mut grads, Some((&mut dx, false)), &mut scratch);
            let mut want_dw = vec![0.0f32; output * input];
            gemm_bf16_reference(Op::T, Op::N, output, input, batch, &dy, &x, false, &mut want_dw);
            let want_db: Vec<f32> =
                (0..output).map(|j| (0..batch).fold(0.0f32, |s, r| s + dy[r * output + j])).collect();
            let mut want_dx = vec![0.0f32; batch * input];
            gemm_bf16_reference(Op::N, Op::N, batch, input, output, &dy, w, false, &mut want_dx);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&grads[3..3 + output * input]), bits(&want_dw), "dW {input}->{output} b{batch}");
            assert_eq!(bits(&grads[3 + output * input..3 + lin.num_params()]), bits(&want_db), "db");
            assert_eq!(bits(&dx), bits(&want_dx), "dx {input}->{output} b{batch}");
            assert!(grads[..3].iter().chain(&grads[3 + lin.num_params()..]).all(|g| g.is_nan()), "outside the layer");
            // dx passed back through the ReLU before the layer (its output: x itself here).
            lin.backward_bf16(&params, &x, &dy, batch, &mut grads, Some((&mut dx, true)), &mut scratch);
            crate::relu::relu_backward_in_place(&mut want_dx, &x);
            assert_eq!(bits(&dx), bits(&want_dx), "dx through the ReLU {input}->{output} b{batch}");
        }
    }
}
