//! A stack of [`Linear`] layers with ReLU between them.

use super::aligned::AlignedVec;
use super::gemm_amx::AmxRhs;
use super::gemm_bf16::{Bf16Scratch, Chained};
use super::gemm_packed::PackedRhs;
use super::linear::Linear;
use super::precision::Precision;
use super::relu::relu_backward_in_place;
use super::Scalar;

/// Layers `widths[0] → widths[1] → … → widths[n]`, ReLU after each layer
/// except (optionally) the last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mlp {
    /// The layers in order.
    pub layers: Vec<Linear>,
    /// Whether the last layer is followed by a ReLU.
    pub relu_last: bool,
}

/// Activations kept from `forward` for `backward`, and scratch space.
#[derive(Clone, Debug, Default)]
pub struct MlpCache<T> {
    /// Per layer, its output; under bf16 on AMX a layer whose product packed
    /// its output for the layer above (`inputs`) may leave it unwritten, since
    /// the forward, `dW` and the ReLU's backward of the layer above read it
    /// packed.
    outs: Vec<AlignedVec<T>>,
    /// Per layer, the gradient with respect to its output (then its
    /// pre-activation): each keeps its size from step to step, so no step
    /// clears memory that the next product overwrites anyway. Under bf16 on
    /// AMX a layer's `dx` product that packed its output for the layer below
    /// may leave that layer's unwritten: the layer below reads it packed.
    douts: Vec<AlignedVec<T>>,
    /// A layer's packed weight during its forward (scratch shared by the layers).
    packed: PackedRhs<T>,
    /// The precision of the layers' products (see [`MlpCache::set_precision`]).
    precision: Precision,
    /// Whether the `f32`/`f64` forward runs [`Linear::forward_batch_invariant`]
    /// (see [`MlpCache::set_batch_invariant`]).
    batch_invariant: bool,
    /// The bf16 operands under [`Precision::Bf16`] (scratch shared by the layers).
    bf16: Bf16Scratch,
    /// Under bf16 on AMX, per layer, its input as the layer below's forward
    /// packed it for this layer's `dW`, and whether the last forward did.
    inputs: Vec<(AmxRhs, bool)>,
    /// In `f32` and `f64`: a layer's bias gradient as the layer above's `dx`
    /// product summed it, and the one this layer's `dx` product sums for the
    /// layer below.
    sums: (Vec<T>, Vec<T>),
}

impl<T: Scalar> MlpCache<T> {
    /// Runs the layers' products in `precision` from the next `forward` on.
    /// bf16 is refused for `f64` layers and on a CPU without AVX-512 BF16
    /// ([`Precision::check_cpu`]).
    pub fn set_precision(&mut self, precision: Precision) -> Result<(), tiderec_records::OperatorError> {
        if precision == Precision::Bf16 && T::as_f32(&[]).is_none() {
            return Err(tiderec_records::OperatorError::config("precision", "bf16 products run on f32 models only"));
        }
        precision.check_cpu()?;
        self.precision = precision;
        Ok(())
    }

    /// The precision of the layers' products.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// From the next `forward` on, runs each layer's product as
    /// [`Linear::forward_batch_invariant`] (`true`: each row's output does not
    /// depend on the batch it is computed in, as scoring needs) or as
    /// [`Linear::forward`] (`false`, the default: training's). Applies to the
    /// `f32` and `f64` products, not to bf16's.
    pub fn set_batch_invariant(&mut self, on: bool) {
        self.batch_invariant = on;
    }
}

/// The `f32` view of a bf16 product's operand (the precision is bf16 only for `f32` layers).
fn f32_view<T: Scalar>(v: &[T]) -> &[f32] {
    T::as_f32(v).expect("MlpCache::set_precision admits bf16 for f32 layers only")
}

/// [`f32_view`] of an output.
fn f32_view_mut<T: Scalar>(v: &mut [T]) -> &mut [f32] {
    T::as_f32_mut(v).expect("MlpCache::set_precision admits bf16 for f32 layers only")
}

impl Mlp {
    /// Builds layers for `widths` whose weights start at `offset`.
    pub fn new(widths: &[usize], offset: usize, relu_last: bool) -> Self {
        let mut layers = Vec::new();
        let mut off = offset;
        for w in widths.windows(2) {
            let l = Linear { input: w[0], output: w[1], offset: off };
            off += l.num_params();
            layers.push(l);
        }
        Mlp { layers, relu_last }
    }

    /// Total parameters of all layers.
    pub fn num_params(&self) -> usize {
        self.layers.iter().map(Linear::num_params).sum()
    }

    /// Input width.
    pub fn input(&self) -> usize {
        self.layers[0].input
    }

    /// Output width.
    pub fn output(&self) -> usize {
        self.layers.last().unwrap().output
    }

    /// Initialises every layer; layer `i` uses tag `tag * 1000 + i`.
    pub fn init<T: Scalar>(&self, params: &mut [T], seed: u64, tag: u64) {
        for (i, l) in self.layers.iter().enumerate() {
            l.init(params, seed, tag * 1000 + i as u64);
        }
    }

    fn relu_after(&self, i: usize) -> bool {
        i + 1 < self.layers.len() || self.relu_last
    }

    /// Runs the stack on `x[batch × input]`; the result is `[batch × output]`.
    pub fn forward<'c, T: Scalar>(&self, params: &[T], x: &[T], batch: usize, cache: &'c mut MlpCache<T>) -> &'c [T] {
        cache.outs.resize_with(self.layers.len(), AlignedVec::new);
        cache.inputs.resize_with(self.layers.len(), Default::default);
        cache.inputs.iter_mut().for_each(|(_, packed)| *packed = false);
        // Under bf16, whether the previous layer's product packed its output for this one.
        let mut packed = false;
        for (i, l) in self.layers.iter().enumerate() {
            let (done, rest) = cache.outs.split_at_mut(i);
            let input: &[T] = if i == 0 { x } else { &done[i - 1] };
            let out = &mut rest[0];
            out.resize(batch * l.output, T::ZERO);
            let relu = self.relu_after(i);
            match cache.precision {
                // `set_precision` admits fp32 and bf16 only (tf32 is a GPU worker's).
                Precision::Fp32 | Precision::Tf32 if cache.batch_invariant => {
                    l.forward_batch_invariant(params, input, batch, (out, relu), &mut cache.packed)
                }
                Precision::Fp32 | Precision::Tf32 => l.forward(params, input, batch, (out, relu), &mut cache.packed),
                Precision::Bf16 => {
                    let p = f32_view(params);
                    let x = if packed { Chained::Packed } else { Chained::Rows(&f32_view(input)[..batch * l.input]) };
                    let next = cache.inputs.get_mut(i + 1).map(|(rows, _)| rows);
                    packed = l.forward_bf16_chained(p, x, batch, (f32_view_mut(out), relu), &mut cache.bf16, next);
                    if let Some((_, input_packed)) = cache.inputs.get_mut(i + 1) {
                        *input_packed = packed;
                    }
                }
            }
        }
        &cache.outs[self.layers.len() - 1][..batch * self.output()]
    }

    #[allow(clippy::too_many_arguments)]
    /// Back-propagates `dout` (gradient w.r.t. the output of the last forward);
    /// writes layer gradients into `grads` and the input gradient into `dx` when asked.
    pub fn backward<T: Scalar>(
        &self,
        params: &[T],
        x: &[T],
        batch: usize,
        cache: &mut MlpCache<T>,
        dout: &[T],
        grads: &mut [T],
        dx: Option<&mut [T]>,
    ) {
        let n = self.layers.len();
        let MlpCache { outs, douts, packed, precision, bf16, inputs, sums, .. } = cache;
        douts.resize_with(n, AlignedVec::new);
        for (d, l) in douts.iter_mut().zip(&self.layers) {
            d.resize(batch * l.output, T::ZERO);
        }
        douts[n - 1].copy_from_slice(&dout[..batch * self.output()]);
        let mut dx = dx;
        // A layer's dx product applies the ReLU below it as it writes (under
        // bf16 it also packs its output for the layer below's dx where it can).
        let (mut through_relu, mut dy_packed) = (false, false);
        for i in (0..n).rev() {
            let l = &self.layers[i];
            let (below, rest) = douts.split_at_mut(i);
            let dy = &mut rest[0];
            if self.relu_after(i) && !through_relu {
                relu_backward_in_place(dy, &outs[i]);
                dy_packed = false;
            }
            let input: &[T] = if i == 0 { x } else { &outs[i - 1] };
            let layer_dx = if i == 0 { dx.as_deref_mut() } else { Some(&mut below[i - 1][..]) };
            let relu_below = i > 0 && self.relu_after(i - 1);
            through_relu = layer_dx.is_some() && relu_below;
            match precision {
                Precision::Fp32 | Precision::Tf32 => {
                    // Below the top, the layer above's `dx` product summed this
                    // layer's bias gradient into `sums.0`; above the first
                    // layer, this one's sums the layer below's into `sums.1`.
                    let (db, below) = (&mut sums.0, &mut sums.1);
                    let db = (i + 1 < n).then_some(&db[..]);
                    let below = (i > 0).then(|| {
                        below.resize(self.layers[i - 1].output, T::ZERO);
                        &mut below[..]
                    });
                    let dx = layer_dx.map(|d| (d, relu_below, below));
                    l.backward_summed(params, input, dy, batch, grads, (dx, db), packed);
                    std::mem::swap(&mut sums.0, &mut sums.1);
                }
                Precision::Bf16 => {
                    let (p, input, dy) = (f32_view(params), f32_view(input), f32_view(dy));
                    let layer_dx = layer_dx.map(|d| (f32_view_mut(d), relu_below));
                    let chain = (dy_packed, i > 0);
                    let x_packed = inputs.get(i).and_then(|(rows, packed)| packed.then_some(rows));
                    let x = (input, x_packed, dy);
                    dy_packed = l.backward_bf16_chained(p, x, batch, f32_view_mut(grads), layer_dx, bf16, chain);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use tiderec_records::rng::normal_f64;

    /// Under bf16 each layer's product packs its output for the next where the
    /// AMX kernel runs (forward: the layer above's input; backward: the layer
    /// below's `dy`): the stack's outputs and gradients equal those of the
    /// layers' own [`Linear::forward_bf16`] and [`Linear::backward_bf16`] calls,
    /// each packing its operands from values, bit for bit (odd widths, a batch
    /// not a multiple of 32, twice through one cache).
    #[test]
    fn a_bf16_stack_equals_its_layers_one_by_one() {
        a_bf16_stack_equals_its_layers();
    }

    /// [`a_bf16_stack_equals_its_layers_one_by_one`] on AMX tiles, emulated
    /// where the CPU has none: the chained packings of every layer.
    #[test]
    fn a_bf16_stack_on_amx_tiles_equals_its_layers_one_by_one() {
        crate::gemm_amx::tests::on_amx_tiles(a_bf16_stack_equals_its_layers);
    }

    fn a_bf16_stack_equals_its_layers() {
        let mut cache = MlpCache::<f32>::default();
        if let Err(e) = cache.set_precision(Precision::Bf16) {
            eprintln!("skipped: {e}");
            return;
        }
        for (widths, batch) in [(vec![13, 37, 64, 17, 1], 45), (vec![40, 32, 33], 64)] {
            let mlp = Mlp::new(&widths, 0, false);
            let mut params = vec![0.0f32; mlp.num_params()];
            mlp.init(&mut params, 3, 1);
            let x: Vec<f32> = (0..batch * widths[0]).map(|i| normal_f64(8, 0, i as u64, 0) as f32).collect();
            let mut scratch = Bf16Scratch::default();
            let mut outs: Vec<Vec<f32>> = Vec::new();
            for (i, l) in mlp.layers.iter().enumerate() {
                let mut y = vec![0.0f32; batch * l.output];
                let input = outs.last().unwrap_or(&x);
                l.forward_bf16(&params, input, batch, (&mut y, mlp.relu_after(i)), &mut scratch);
                outs.push(y);
            }
            // The backward: each layer's dx product applies the ReLU below it.
            let r: Vec<f32> = (0..batch * mlp.output()).map(|i| normal_f64(9, 0, i as u64, 0) as f32).collect();
            let (mut want_grads, mut dy) = (vec![0.0f32; params.len()], r.clone());
            for (i, l) in mlp.layers.iter().enumerate().rev() {
                let input = if i == 0 { &x } else { &outs[i - 1] };
                let relu_below = i > 0 && mlp.relu_after(i - 1);
                let mut dx = vec![0.0f32; batch * l.input];
                l.backward_bf16(&params, input, &dy, batch, &mut want_grads, Some((&mut dx, relu_below)), &mut scratch);
                dy = dx;
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for _ in 0..2 {
                let got = mlp.forward(&params, &x, batch, &mut cache);
                assert_eq!(bits(got), bits(outs.last().unwrap()), "{widths:?} batch {batch}");
                let (mut grads, mut dx) = (vec![0.0f32; params.len()], vec![0.0f32; x.len()]);
                mlp.backward(&params, &x, batch, &mut cache, &r, &mut grads, Some(&mut dx));
                assert_eq!(bits(&grads), bits(&want_grads), "gradients: {widths:?} batch {batch}");
                assert_eq!(bits(&dx), bits(&dy), "input gradient: {widths:?} batch {batch}");
            }
        }
    }

    /// Each layer's bias gradient, summed by the `dx` product of the layer
    /// above as it writes `dy` (on every kernel the start-up measurement can
    /// choose, and on matrixmultiply), equals the sums of `dy`'s rows taken
    /// afterwards, bit for bit; the other gradients are those of the
    /// layers' own backward calls.
    #[test]
    fn bias_gradients_summed_by_the_products_equal_the_rows_summed() {
        use crate::gemm_packed::{MmOrderKernel, PanelKernel};
        use crate::kernel_choice::{install_backward, Backward, BackwardShape};
        // Shapes no other test measures: the installed choices are global.
        let (widths, batch) = ([13, 41, 37, 25, 1], 61);
        let mlp = Mlp::new(&widths, 0, false);
        let mut params = vec![0.0f32; mlp.num_params()];
        mlp.init(&mut params, 4, 1);
        let x: Vec<f32> = (0..batch * widths[0]).map(|i| normal_f64(10, 0, i as u64, 0) as f32).collect();
        let r: Vec<f32> = (0..batch).map(|i| normal_f64(11, 0, i as u64, 0) as f32).collect();
        let mut choices = vec![None];
        for &kernel in PanelKernel::available().iter().filter(|&&k| k != PanelKernel::Portable) {
            choices.extend([false, true].map(|copy_b| Some(MmOrderKernel { kernel, copy_b })));
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for choice in choices {
            for l in &mlp.layers {
                let shape = BackwardShape { product: Backward::Dx, rows: batch, input: l.input, output: l.output };
                install_backward(shape, choice);
            }
            let mut cache = MlpCache::default();
            let outs = mlp.forward(&params, &x, batch, &mut cache).to_vec();
            assert_eq!(outs.len(), batch);
            let (mut grads, mut dx) = (vec![0.0f32; params.len()], vec![0.0f32; x.len()]);
            mlp.backward(&params, &x, batch, &mut cache, &r, &mut grads, Some(&mut dx));
            // The layers one by one, each summing its own `dy` (the final one,
            // after the ReLU, kept in the cache).
            let mut want = vec![0.0f32; params.len()];
            for (i, l) in mlp.layers.iter().enumerate() {
                let input = if i == 0 { &x[..] } else { &cache.outs[i - 1][..] };
                l.backward(&params, input, &cache.douts[i], batch, &mut want, None, &mut PackedRhs::default());
                let bias = l.offset + l.input * l.output..l.offset + l.num_params();
                assert_eq!(bits(&grads[bias.clone()]), bits(&want[bias]), "{choice:?}: layer {i}'s bias gradient");
            }
            assert_eq!(bits(&grads), bits(&want), "{choice:?}: the gradients");
        }
    }

    #[test]
    fn mlp_gradients_match_finite_differences() {
        for relu_last in [false, true] {
            let mlp = Mlp::new(&[4, 6, 5, 2], 0, relu_last);
            let batch = 3;
            let mut params = vec![0.0f64; mlp.num_params()];
            mlp.init(&mut params, 9, 1);
            let x: Vec<f64> = (0..batch * 4).map(|i| normal_f64(5, 0, i as u64, 0)).collect();
            let r: Vec<f64> = (0..batch * 2).map(|i| normal_f64(6, 0, i as u64, 0)).collect();
            let loss = |p: &[f64], x: &[f64]| {
                let mut c = MlpCache::default();
                let y = mlp.forward(p, x, batch, &mut c);
                y.iter().zip(&r).map(|(a, b)| a * b).sum::<f64>()
            };
            let mut cache = MlpCache::default();
            mlp.forward(&params, &x, batch, &mut cache);
            let mut grads = vec![0.0; params.len()];
            let mut dx = vec![0.0; x.len()];
            mlp.backward(&params, &x, batch, &mut cache, &r, &mut grads, Some(&mut dx));
            check_gradients(&params, &grads, |p| loss(p, &x));
            check_gradients(&x, &dx, |xx| loss(&params, xx));
        }
    }
}
