//! Models whose compute runs on a CUDA device behind the host's
//! [`Model`] interface, so a trainer worker can compute on a GPU without
//! knowing it.
//!
//! ## Invariants
//!
//! * **The host holds the model.** The flat parameter and gradient buffers
//!   live on the host, in the CPU model's layout (the same `params` vector is
//!   the same model on either side), so the trainer's reduce-scatter,
//!   all-gather, dense optimizer and checkpoints work unchanged and a
//!   checkpoint does not depend on the device that wrote it. Initial
//!   parameters are the CPU model's for the same seed.
//! * **One round trip per pass.** `forward` uploads the parameters only when
//!   the host copy may have changed since the last upload (after
//!   `params_mut` or `params_and_grads`), then the dense and pooled inputs,
//!   runs the layers on the device's stream and downloads the logits.
//!   `backward` uploads the logits' gradient, runs, and downloads the
//!   parameter gradients and the pooled vectors' gradient. Activations stay
//!   on the device between the two. Host buffers are ordinary (pageable) memory.
//! * **Failures are reported, never panics.** [`Model`] calls cannot return
//!   errors: the first device error is kept, the logits of that and every
//!   later pass are NaN and gradients zero, and [`Model::take_error`] hands
//!   the error to the trainer, which fails the step.
//! * No DES partial form ([`Model::partial_model`] is `None`): the partial
//!   exchange computes on the host only.

mod dlrm;
mod fm;

use crate::{Device, GpuError};
use cudarc::driver::CudaSlice;
use tiderec_operators::nn::{Model, ModelConfig};

pub use dlrm::DeviceDlrm;
pub use fm::DeviceFm;

/// The device-side computation of one model kind: parameters, inputs and
/// outputs are device buffers in the CPU model's layouts.
pub trait DeviceNet: Send {
    /// Runs the forward pass; the logits (`[batch]`) are the returned buffer's first values.
    fn forward(
        &mut self,
        dev: &Device,
        params: &CudaSlice<f32>,
        dense: &CudaSlice<f32>,
        pooled: &CudaSlice<f32>,
        batch: usize,
    ) -> Result<&CudaSlice<f32>, GpuError>;

    /// Back-propagates `dlogits` through the last forward (same inputs):
    /// overwrites every parameter gradient in `grads` and `dpooled`.
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &mut self,
        dev: &Device,
        params: &CudaSlice<f32>,
        dense: &CudaSlice<f32>,
        pooled: &CudaSlice<f32>,
        dlogits: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
        dpooled: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError>;
}

/// Builds the model of `config` on `dev`, initialised from `seed` exactly as
/// the CPU model (`config.build::<f32>(seed)`). DIEN has no device form yet.
pub fn build(config: &ModelConfig, seed: u64, dev: &Device) -> Result<Box<dyn Model<f32>>, GpuError> {
    let cpu = config.build::<f32>(seed).map_err(|e| GpuError::Unsupported(format!("model: {e}")))?;
    let params = cpu.params().to_vec();
    let dim = cpu.embedding_dim();
    Ok(match config {
        ModelConfig::Dlrm(c) => {
            Box::new(DeviceModel::new(dev, DeviceDlrm::new(dev, c)?, params, c.num_dense, c.num_sparse, dim)?)
        }
        ModelConfig::Fm(c) => {
            Box::new(DeviceModel::new(dev, DeviceFm::new(c), params, c.num_dense, c.num_sparse, dim)?)
        }
        ModelConfig::Dien(c) => {
            return Err(GpuError::Unsupported(format!(
                "the {} model on a CUDA device (train it with --device cpu)",
                c.name()
            )))
        }
    })
}

/// A grow-only device buffer: reallocated only when a batch needs more.
#[derive(Debug)]
struct Buffer(CudaSlice<f32>);

impl Buffer {
    fn new(dev: &Device) -> Result<Self, GpuError> {
        Ok(Buffer(dev.zeros(1)?))
    }

    /// Holds at least `len` values (the contents are not kept when it grows).
    fn reserve(&mut self, dev: &Device, len: usize) -> Result<&mut CudaSlice<f32>, GpuError> {
        if self.0.len() < len {
            self.0 = dev.zeros(len)?;
        }
        Ok(&mut self.0)
    }

    /// Copies `host` to the front of the buffer.
    fn upload(&mut self, dev: &Device, host: &[f32]) -> Result<(), GpuError> {
        self.reserve(dev, host.len())?;
        if !host.is_empty() {
            let mut front = self.0.slice_mut(..host.len());
            dev.stream.memcpy_htod(host, &mut front).map_err(GpuError::driver("copying to the device"))?;
        }
        Ok(())
    }
}

/// Copies the first `host.len()` values of `dev_buf` into `host` (queued on the stream; synchronise before reading).
fn download_into(dev: &Device, dev_buf: &CudaSlice<f32>, host: &mut [f32]) -> Result<(), GpuError> {
    if host.is_empty() {
        return Ok(());
    }
    if dev_buf.len() < host.len() {
        return Err(GpuError::shape(
            "download",
            format!("{} values asked from a buffer of {}", host.len(), dev_buf.len()),
        ));
    }
    dev.stream.memcpy_dtoh(&dev_buf.slice(..host.len()), host).map_err(GpuError::driver("copying from the device"))
}

/// A [`DeviceNet`] behind the host's [`Model`] interface (see the module doc).
pub struct DeviceModel<N: DeviceNet> {
    dev: Device,
    net: N,
    num_dense: usize,
    num_sparse: usize,
    dim: usize,
    params: Vec<f32>,
    grads: Vec<f32>,
    logits: Vec<f32>,
    d_params: CudaSlice<f32>,
    d_grads: CudaSlice<f32>,
    d_dense: Buffer,
    d_pooled: Buffer,
    d_dlogits: Buffer,
    d_dpooled: Buffer,
    /// The host parameters may differ from the device's copy.
    stale: bool,
    batch: usize,
    /// A device call has failed: every later pass is skipped.
    failed: bool,
    /// That failure, until the trainer takes it.
    error: Option<GpuError>,
}

impl<N: DeviceNet> DeviceModel<N> {
    /// Wraps `net` with the host parameters `params` (uploaded at the first forward).
    pub fn new(
        dev: &Device,
        net: N,
        params: Vec<f32>,
        num_dense: usize,
        num_sparse: usize,
        dim: usize,
    ) -> Result<Self, GpuError> {
        let n = params.len();
        Ok(DeviceModel {
            d_params: dev.zeros(n)?,
            d_grads: dev.zeros(n)?,
            d_dense: Buffer::new(dev)?,
            d_pooled: Buffer::new(dev)?,
            d_dlogits: Buffer::new(dev)?,
            d_dpooled: Buffer::new(dev)?,
            dev: dev.clone(),
            net,
            num_dense,
            num_sparse,
            dim,
            grads: vec![0.0; n],
            params,
            logits: Vec::new(),
            stale: true,
            batch: 0,
            failed: false,
            error: None,
        })
    }

    fn fail(&mut self, e: GpuError) {
        self.failed = true;
        self.error = Some(e);
    }

    fn try_forward(&mut self, dense: &[f32], pooled: &[f32], batch: usize) -> Result<(), GpuError> {
        let (nd, f, e) = (self.num_dense, self.num_sparse, self.dim);
        if dense.len() < batch * nd || pooled.len() < batch * f * e {
            return Err(GpuError::shape(
                "device model forward",
                format!("{} dense and {} pooled values for a batch of {batch}", dense.len(), pooled.len()),
            ));
        }
        let dev = &self.dev;
        if self.stale {
            dev.stream
                .memcpy_htod(&self.params[..], &mut self.d_params)
                .map_err(GpuError::driver("copying the parameters to the device"))?;
            self.stale = false;
        }
        self.d_dense.upload(dev, &dense[..batch * nd])?;
        self.d_pooled.upload(dev, &pooled[..batch * f * e])?;
        let out = self.net.forward(dev, &self.d_params, &self.d_dense.0, &self.d_pooled.0, batch)?;
        download_into(dev, out, &mut self.logits)?;
        dev.synchronize()
    }

    fn try_backward(&mut self, dlogits: &[f32], dpooled: &mut [f32]) -> Result<(), GpuError> {
        let (batch, f, e) = (self.batch, self.num_sparse, self.dim);
        let n = batch * f * e;
        if dlogits.len() < batch || dpooled.len() < n {
            return Err(GpuError::shape(
                "device model backward",
                format!("{} logit and {} pooled gradients for a batch of {batch}", dlogits.len(), dpooled.len()),
            ));
        }
        let dev = &self.dev;
        self.d_dlogits.upload(dev, &dlogits[..batch])?;
        self.d_dpooled.reserve(dev, n)?;
        self.net.backward(
            dev,
            &self.d_params,
            &self.d_dense.0,
            &self.d_pooled.0,
            &self.d_dlogits.0,
            &mut self.d_grads,
            &mut self.d_dpooled.0,
        )?;
        download_into(dev, &self.d_grads, &mut self.grads)?;
        download_into(dev, &self.d_dpooled.0, &mut dpooled[..n])?;
        dev.synchronize()
    }
}

impl<N: DeviceNet> Model<f32> for DeviceModel<N> {
    fn params(&self) -> &[f32] {
        &self.params
    }
    fn params_mut(&mut self) -> &mut [f32] {
        self.stale = true;
        &mut self.params
    }
    fn grads(&self) -> &[f32] {
        &self.grads
    }
    fn params_and_grads(&mut self) -> (&mut [f32], &[f32]) {
        self.stale = true;
        (&mut self.params, &self.grads)
    }
    fn grads_mut(&mut self) -> &mut [f32] {
        &mut self.grads
    }
    fn embedding_dim(&self) -> usize {
        self.dim
    }
    fn forward(&mut self, dense: &[f32], pooled: &[f32], batch: usize) -> &[f32] {
        self.batch = batch;
        self.logits.clear();
        self.logits.resize(batch, 0.0);
        if !self.failed {
            if let Err(e) = self.try_forward(dense, pooled, batch) {
                self.fail(e);
            }
        }
        if self.failed {
            self.logits.fill(f32::NAN);
        }
        &self.logits
    }
    fn backward(&mut self, _dense: &[f32], _pooled: &[f32], dlogits: &[f32], dpooled: &mut [f32]) {
        if !self.failed {
            if let Err(e) = self.try_backward(dlogits, dpooled) {
                self.fail(e);
            }
        }
        if self.failed {
            self.grads.fill(0.0);
            dpooled.fill(0.0);
        }
    }
    fn take_error(&mut self) -> Option<String> {
        self.error.take().map(|e| format!("CUDA device {}: {e}", self.dev.ordinal()))
    }
}
