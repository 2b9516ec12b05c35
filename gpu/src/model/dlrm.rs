//! DLRM on the device, mirroring `tiderec_operators::nn::dlrm::Dlrm`: the
//! bottom MLP (ReLU after every layer) from offset 0 of the flat buffer, the
//! dot interaction, then the top MLP (no ReLU after the last layer).

use super::{Buffer, DeviceNet, Sequences};
use crate::nn::interaction::DotInteraction;
use crate::nn::linear::{Mlp, MlpCache};
use crate::{Device, GpuError};
use cudarc::driver::CudaSlice;
use tiderec_operators::nn::DlrmConfig;

/// The device computation of a DLRM.
pub struct DeviceDlrm {
    dim: usize,
    bottom: Mlp,
    interaction: DotInteraction,
    top: Mlp,
    bottom_cache: MlpCache,
    top_cache: MlpCache,
    inter_out: Buffer,
    d_inter: Buffer,
    d_bottom: Buffer,
    batch: usize,
}

impl DeviceDlrm {
    /// The layers of `config`, in the CPU model's parameter layout.
    pub fn new(dev: &Device, config: &DlrmConfig) -> Result<Self, GpuError> {
        let mut widths = vec![config.num_dense];
        widths.extend(&config.bottom);
        let bottom = Mlp::new(&widths, 0, true);
        let interaction = DotInteraction::new(dev, config.num_sparse, config.dim, config.self_interaction)?;
        let mut widths = vec![interaction.output_dim()];
        widths.extend(&config.top);
        let top = Mlp::new(&widths, bottom.num_params(), false);
        Ok(DeviceDlrm {
            dim: config.dim,
            bottom,
            interaction,
            top,
            bottom_cache: MlpCache::default(),
            top_cache: MlpCache::default(),
            inter_out: Buffer::new(dev)?,
            d_inter: Buffer::new(dev)?,
            d_bottom: Buffer::new(dev)?,
            batch: 0,
        })
    }
}

fn missing(what: &str) -> GpuError {
    GpuError::Shape { op: "device dlrm", message: format!("no {what}: backward without a forward") }
}

impl DeviceNet for DeviceDlrm {
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
        self.bottom.forward(dev, params, dense, batch, &mut self.bottom_cache)?;
        let bottom_out = self.bottom_cache.output().ok_or_else(|| missing("bottom output"))?;
        let inter = self.inter_out.reserve(dev, batch * self.interaction.output_dim())?;
        self.interaction.forward(dev, bottom_out, pooled, batch, inter)?;
        self.top.forward(dev, params, &self.inter_out.0, batch, &mut self.top_cache)?;
        self.top_cache.output().ok_or_else(|| missing("logits"))
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
        let d_inter = self.d_inter.reserve(dev, batch * self.interaction.output_dim())?;
        self.top.backward(dev, params, &self.inter_out.0, &mut self.top_cache, dlogits, grads, Some(d_inter))?;
        let bottom_out = self.bottom_cache.output().ok_or_else(|| missing("bottom output"))?;
        let d_bottom = self.d_bottom.reserve(dev, batch * self.dim)?;
        self.interaction.backward(dev, bottom_out, pooled, &self.d_inter.0, batch, d_bottom, dpooled)?;
        self.bottom.backward(dev, params, dense, &mut self.bottom_cache, &self.d_bottom.0, grads, None)
    }
}
