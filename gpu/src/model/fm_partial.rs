//! The DES partial-result form of [`super::DeviceFm`], mirroring the
//! `PartialModel` form of `tiderec_operators::nn::deepfm::Fm`: the home's
//! forward and backward from each sample's summed partial result (see
//! [`crate::nn::fm_partial`]).
//!
//! Forward: the linear part over the dense values (`b + a·x`; the rows'
//! first-order weights are inside the FM sums), the FM term from the sums,
//! and with a deep part the first layer's activations
//! `relu(shares + b₁ + W_x·x)` fed to the layers after it; the logit is their
//! sum, added in that order. Backward: the linear part's gradients, the FM
//! sums' gradient `[g, g·S]`, the deep layers' gradients, and for the first
//! layer its bias and dense columns only: its factor columns are zero, since
//! the owners add their shares of them (the CPU form's contract), and its
//! pre-activation gradient goes to the shares' columns of `dpartial`.

use super::DevicePartialNet;
use crate::blas::{gemm, Op};
use crate::nn::fm_partial::{add_partial_logits, partial_logit_grads, relu, shares_grad, shares_plus_bias};
use crate::nn::linear::{column_sum, relu_backward, Mlp, MlpCache};
use crate::nn::wide::{add_assign, WideShape};
use crate::{Device, GpuError};
use cudarc::driver::CudaSlice;
use tiderec_operators::nn::{FirstLayer, FmConfig, FmPartial};

/// The deep part under the partial form: its first layer, fed by the shares,
/// and the layers after it.
struct DeepRest {
    first: FirstLayer,
    rest: Mlp,
    cache: MlpCache,
    /// The first layer's activations (`[B × hidden]`), the input of `rest`.
    z: Option<CudaSlice<f32>>,
    dz: Option<CudaSlice<f32>>,
}

/// The partial form of an LR / FM / DeepFM / Wide & Deep model without
/// wide-only crosses (the CPU model has none with them).
pub(super) struct FmPartialForm {
    part: FmPartial,
    /// The linear part over the dense values alone (no pooled rows).
    linear: WideShape,
    deep: Option<DeepRest>,
    logits: Option<CudaSlice<f32>>,
    batch: usize,
}

impl FmPartialForm {
    /// The partial form of `config`, `None` where the CPU model has none.
    pub(super) fn new(config: &FmConfig) -> Option<Self> {
        let part = config.partial()?;
        let linear = WideShape { num_dense: config.num_dense, num_fields: 0, dim: config.dim, deep_fields: 0 };
        let deep = part.deep.map(|first| {
            let mut widths = config.deep.clone();
            widths.push(1);
            let after_first = first.offset + first.hidden * first.input + first.hidden;
            DeepRest {
                first,
                rest: Mlp::new(&widths, after_first, false),
                cache: MlpCache::default(),
                z: None,
                dz: None,
            }
        });
        Some(FmPartialForm { part, linear, deep, logits: None, batch: 0 })
    }
}

impl DeepRest {
    /// Where the first layer's bias starts in the flat buffer.
    fn bias(&self) -> usize {
        self.first.offset + self.first.hidden * self.first.input
    }

    /// The first layer's weights `[hidden × input]`.
    fn weights(&self) -> std::ops::Range<usize> {
        self.first.offset..self.bias()
    }

    /// `z = relu(shares + b₁ + x·W_xᵀ)`, then the layers after the first; returns their output.
    fn forward(
        &mut self,
        dev: &Device,
        part: &FmPartial,
        params: &CudaSlice<f32>,
        dense: &CudaSlice<f32>,
        partial: &CudaSlice<f32>,
        batch: usize,
    ) -> Result<&CudaSlice<f32>, GpuError> {
        let (h, nd, input) = (self.first.hidden, self.first.skip, self.first.input);
        let (bias, weights) = (self.bias(), self.weights());
        let z = dev.grown(&mut self.z, (batch * h).max(1))?;
        shares_plus_bias(dev, part, partial, params, bias, batch, z)?;
        if nd > 0 && batch > 0 {
            let w = params.slice(weights);
            gemm(dev, "partial first layer", (Op::N, Op::T), (batch, h, nd), dense, nd, &w, input, 1.0, z, h)?;
        }
        relu(dev, z, batch * h)?;
        let z = self.z.as_ref().expect("grown above");
        self.rest.forward(dev, params, z, batch, &mut self.cache)?;
        self.cache.output().ok_or_else(|| GpuError::shape("device fm partial", "the deep part has no output"))
    }

    /// The layers' gradients (the first layer's factor columns zero) and the
    /// shares' columns of `dpartial`.
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &mut self,
        dev: &Device,
        part: &FmPartial,
        params: &CudaSlice<f32>,
        dense: &CudaSlice<f32>,
        dlogits: &CudaSlice<f32>,
        batch: usize,
        grads: &mut CudaSlice<f32>,
        dpartial: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let (h, nd, input) = (self.first.hidden, self.first.skip, self.first.input);
        let (bias, weights) = (self.bias(), self.weights());
        let z = self.z.as_ref().ok_or_else(|| GpuError::shape("device fm partial", "backward without a forward"))?;
        let dz = dev.grown(&mut self.dz, (batch * h).max(1))?;
        self.rest.backward(dev, params, z, &mut self.cache, dlogits, grads, Some(&mut *dz))?;
        relu_backward(dev, dz, z, batch * h)?;
        shares_grad(dev, part, dz, batch, dpartial)?;
        column_sum(dev, dz, batch, h, grads, bias)?;
        let mut gw = grads.slice_mut(weights);
        dev.stream.memset_zeros(&mut gw).map_err(GpuError::driver("zeroing the first layer's gradient"))?;
        if nd > 0 && batch > 0 {
            gemm(
                dev,
                "partial first layer backward",
                (Op::T, Op::N),
                (h, nd, batch),
                dz,
                h,
                dense,
                nd,
                0.0,
                &mut gw,
                input,
            )?;
        }
        Ok(())
    }
}

impl DevicePartialNet for FmPartialForm {
    fn shape(&self) -> FmPartial {
        self.part
    }

    fn forward_partial(
        &mut self,
        dev: &Device,
        params: &CudaSlice<f32>,
        dense: &CudaSlice<f32>,
        partial: &CudaSlice<f32>,
        batch: usize,
    ) -> Result<&CudaSlice<f32>, GpuError> {
        self.batch = batch;
        let logits = dev.grown(&mut self.logits, batch.max(1))?;
        // No pooled rows: the first-order weights arrive inside the FM sums.
        self.linear.forward(dev, dense, partial, params, batch, logits)?;
        add_partial_logits(dev, &self.part, partial, batch, logits)?;
        if let Some(deep) = &mut self.deep {
            let out = deep.forward(dev, &self.part, params, dense, partial, batch)?;
            add_assign(dev, logits, out, batch)?;
        }
        Ok(self.logits.as_ref().expect("grown above"))
    }

    fn backward_partial(
        &mut self,
        dev: &Device,
        params: &CudaSlice<f32>,
        dense: &CudaSlice<f32>,
        partial: &CudaSlice<f32>,
        dlogits: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
        dpartial: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let batch = self.batch;
        // The bias and the dense weights; the linear part has no pooled rows to write.
        self.linear.backward(dev, dense, dlogits, batch, grads, dpartial)?;
        partial_logit_grads(dev, &self.part, partial, dlogits, batch, dpartial)?;
        if let Some(deep) = &mut self.deep {
            deep.backward(dev, &self.part, params, dense, dlogits, batch, grads, dpartial)?;
        }
        Ok(())
    }
}
