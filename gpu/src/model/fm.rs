//! LR, FM, DeepFM and Wide & Deep on the device, mirroring
//! `tiderec_operators::nn::deepfm::Fm`: the linear part (bias, dense weights,
//! the rows' first-order weights), the FM term over the factors, and the
//! deep MLP (from offset `1 + num_dense`) over the dense values and the
//! factors of the fields that are not wide-only crosses; the logit is their
//! sum, added in that order. Its DES partial-result form is in `fm_partial`.

use super::fm_partial::FmPartialForm;
use super::{DeviceNet, DevicePartialNet, Sequences};
use crate::nn::fm::FmInteraction;
use crate::nn::linear::{Mlp, MlpCache};
use crate::nn::wide::{add_assign, WideShape};
use crate::{Device, GpuError};
use cudarc::driver::CudaSlice;
use tiderec_operators::nn::FmConfig;

/// The device computation of an LR / FM / DeepFM / Wide & Deep model.
pub struct DeviceFm {
    wide: WideShape,
    fm: Option<FmInteraction>,
    deep: Option<Mlp>,
    cache: MlpCache,
    logits: Option<CudaSlice<f32>>,
    fm_out: Option<CudaSlice<f32>>,
    fm_scratch: Option<CudaSlice<f32>>,
    deep_in: Option<CudaSlice<f32>>,
    d_deep_in: Option<CudaSlice<f32>>,
    batch: usize,
    /// The DES partial-result form, where the CPU model has one.
    partial: Option<FmPartialForm>,
}

impl DeviceFm {
    /// The parts of `config`, in the CPU model's parameter layout.
    pub fn new(config: &FmConfig) -> Self {
        let deep_fields = config.num_sparse - config.wide_only;
        let wide =
            WideShape { num_dense: config.num_dense, num_fields: config.num_sparse, dim: config.dim, deep_fields };
        let deep = (!config.deep.is_empty()).then(|| {
            let mut widths = vec![wide.deep_width()];
            widths.extend(&config.deep);
            widths.push(1);
            Mlp::new(&widths, 1 + config.num_dense, false)
        });
        let fm = (config.dim > 0 && config.fm).then(|| FmInteraction {
            num_fields: config.num_sparse,
            dim: config.dim,
            stride: config.embedding_dim(),
            offset: 1,
        });
        DeviceFm {
            wide,
            fm,
            deep,
            cache: MlpCache::default(),
            logits: None,
            fm_out: None,
            fm_scratch: None,
            deep_in: None,
            d_deep_in: None,
            batch: 0,
            partial: FmPartialForm::new(config),
        }
    }
}

impl DeviceNet for DeviceFm {
    fn forward(
        &mut self,
        dev: &Device,
        params: &CudaSlice<f32>,
        dense: &CudaSlice<f32>,
        pooled: &CudaSlice<f32>,
        _seq: Sequences<'_>,
        batch: usize,
    ) -> Result<&CudaSlice<f32>, GpuError> {
        self.batch = batch;
        let logits = dev.grown(&mut self.logits, batch)?;
        self.wide.forward(dev, dense, pooled, params, batch, logits)?;
        if let Some(fm) = &self.fm {
            let scratch = dev.grown(&mut self.fm_scratch, batch * fm.dim)?;
            let out = dev.grown(&mut self.fm_out, batch)?;
            fm.forward(dev, pooled, batch, scratch, out)?;
            add_assign(dev, logits, out, batch)?;
        }
        if let Some(mlp) = &self.deep {
            let deep_in = dev.grown(&mut self.deep_in, batch * self.wide.deep_width())?;
            self.wide.gather_deep_input(dev, dense, pooled, batch, deep_in)?;
            mlp.forward(dev, params, deep_in, batch, &mut self.cache)?;
            let out = self.cache.output().ok_or_else(|| GpuError::shape("device fm", "the deep part has no output"))?;
            add_assign(dev, logits, out, batch)?;
        }
        Ok(logits)
    }

    fn backward(
        &mut self,
        dev: &Device,
        params: &CudaSlice<f32>,
        dense: &CudaSlice<f32>,
        pooled: &CudaSlice<f32>,
        _seq: Sequences<'_>,
        dlogits: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
        dpooled: &mut CudaSlice<f32>,
        _dseq: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        let batch = self.batch;
        self.wide.backward(dev, dense, dlogits, batch, grads, dpooled)?;
        if let Some(fm) = &self.fm {
            fm.backward(dev, pooled, dlogits, batch, dpooled)?;
        }
        if let Some(mlp) = &self.deep {
            let deep_in =
                self.deep_in.as_ref().ok_or_else(|| GpuError::shape("device fm", "backward without a forward"))?;
            let d_in = dev.grown(&mut self.d_deep_in, batch * self.wide.deep_width())?;
            mlp.backward(dev, params, deep_in, &mut self.cache, dlogits, grads, Some(d_in))?;
            self.wide.scatter_deep_grad(dev, d_in, batch, dpooled)?;
        }
        Ok(())
    }

    fn partial(&mut self) -> Option<&mut dyn DevicePartialNet> {
        self.partial.as_mut().map(|p| p as &mut dyn DevicePartialNet)
    }
}
