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
//! * **The DES partial form where the CPU model has one** (LR, FM, DeepFM,
//!   Wide & Deep without wide-only crosses; [`Model::partial_model`]): the
//!   home's forward and backward from the summed partial results run on the
//!   device with the same round trip (the partial results up in place of the
//!   pooled vectors, their gradient down); the owners' shares and their row
//!   gradients are computed on the host, as for a CPU worker.

mod dien;
mod dlrm;
mod fm;
mod fm_partial;

use crate::{Device, GpuError};
use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use tiderec_operators::nn::{FmPartial, Model, ModelConfig, PartialModel, SequenceInput};

pub use dien::DeviceDien;
pub use dlrm::DeviceDlrm;
pub use fm::DeviceFm;

/// A batch's behaviour sequences on the device (see `SequenceInput`):
/// `rows: [B × steps × width]`, `lengths: [B]`.
#[derive(Clone, Copy, Debug)]
pub struct Sequences<'a> {
    /// Padded rows, batch-major.
    pub rows: &'a CudaSlice<f32>,
    /// Valid steps per sample.
    pub lengths: &'a CudaSlice<u32>,
    /// Padded length.
    pub steps: usize,
}

/// The device-side computation of one model kind: parameters, inputs and
/// outputs are device buffers in the CPU model's layouts.
pub trait DeviceNet: Send {
    /// Width of one sequence step (0: the model reads no sequences, and
    /// `seq` is empty with `steps` 0).
    fn sequence_width(&self) -> usize {
        0
    }

    /// Runs the forward pass; the logits (`[batch]`) are the returned buffer's first values.
    fn forward(
        &mut self,
        dev: &Device,
        params: &CudaSlice<f32>,
        dense: &CudaSlice<f32>,
        pooled: &CudaSlice<f32>,
        seq: Sequences<'_>,
        batch: usize,
    ) -> Result<&CudaSlice<f32>, GpuError>;

    /// Back-propagates `dlogits` through the last forward (same inputs):
    /// overwrites every parameter gradient in `grads`, `dpooled` and `dseq`.
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &mut self,
        dev: &Device,
        params: &CudaSlice<f32>,
        dense: &CudaSlice<f32>,
        pooled: &CudaSlice<f32>,
        seq: Sequences<'_>,
        dlogits: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
        dpooled: &mut CudaSlice<f32>,
        dseq: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError>;

    /// The model's DES partial-result form, where the CPU model has one.
    fn partial(&mut self) -> Option<&mut dyn DevicePartialNet> {
        None
    }
}

/// The device side of a model's DES partial-result form (see
/// `tiderec_operators::nn::PartialModel`): a sample's input is its dense
/// values and its summed partial result (`[batch × shape().width()]`).
pub trait DevicePartialNet: Send {
    /// The partial result's shape.
    fn shape(&self) -> FmPartial;

    /// Runs the forward pass from the partial results; the logits (`[batch]`)
    /// are the returned buffer's first values.
    fn forward_partial(
        &mut self,
        dev: &Device,
        params: &CudaSlice<f32>,
        dense: &CudaSlice<f32>,
        partial: &CudaSlice<f32>,
        batch: usize,
    ) -> Result<&CudaSlice<f32>, GpuError>;

    /// Back-propagates `dlogits` through the last `forward_partial` (same
    /// inputs): overwrites every parameter gradient in `grads` (the first
    /// layer's factor columns with zeros: the owners add theirs) and `dpartial`.
    #[allow(clippy::too_many_arguments)]
    fn backward_partial(
        &mut self,
        dev: &Device,
        params: &CudaSlice<f32>,
        dense: &CudaSlice<f32>,
        partial: &CudaSlice<f32>,
        dlogits: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
        dpartial: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError>;
}

/// Builds the model of `config` on `dev`, initialised from `seed` exactly as
/// the CPU model (`config.build::<f32>(seed)`).
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
            Box::new(DeviceModel::new(dev, DeviceDien::new(dev, c)?, params, c.num_dense, c.num_sparse, dim)?)
        }
        ModelConfig::Custom(_) => {
            return Err(GpuError::Unsupported("a custom model has no device form: it trains on CPU workers".into()))
        }
    })
}

/// The device computation of `config`'s model, for a worker that owns its
/// parameters on the device (see [`crate::resident`]); `None` for a custom model.
pub(crate) fn net(config: &ModelConfig, dev: &Device) -> Result<Option<Box<dyn DeviceNet>>, GpuError> {
    Ok(match config {
        ModelConfig::Dlrm(c) => Some(Box::new(DeviceDlrm::new(dev, c)?)),
        ModelConfig::Fm(c) => Some(Box::new(DeviceFm::new(c))),
        ModelConfig::Dien(c) => Some(Box::new(DeviceDien::new(dev, c)?)),
        ModelConfig::Custom(_) => None,
    })
}

/// A grow-only device buffer: reallocated only when a batch needs more.
#[derive(Debug)]
pub(crate) struct Buffer<T = f32>(pub(crate) CudaSlice<T>);

impl<T: DeviceRepr + ValidAsZeroBits> Buffer<T> {
    pub(crate) fn new(dev: &Device) -> Result<Self, GpuError> {
        Ok(Buffer(dev.zeros(1)?))
    }

    /// Holds at least `len` values (the contents are not kept when it grows).
    pub(crate) fn reserve(&mut self, dev: &Device, len: usize) -> Result<&mut CudaSlice<T>, GpuError> {
        if self.0.len() < len {
            self.0 = dev.zeros(len)?;
        }
        Ok(&mut self.0)
    }

    /// Copies `host` to the front of the buffer.
    pub(crate) fn upload(&mut self, dev: &Device, host: &[T]) -> Result<(), GpuError> {
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
    d_seq: Buffer,
    d_lengths: Buffer<u32>,
    d_dseq: Buffer,
    lengths: Vec<u32>,
    steps: usize,
    /// The host parameters may differ from the device's copy.
    stale: bool,
    batch: usize,
    /// The net's partial-result form's shape, when it has one.
    partial: Option<FmPartial>,
    /// Which form's forward ran last (`true`: the partial form): a backward
    /// of the other form is refused, not run on the other form's inputs.
    last_partial: Option<bool>,
    /// A device call has failed: every later pass is skipped.
    failed: bool,
    /// That failure, until the trainer takes it.
    error: Option<GpuError>,
}

impl<N: DeviceNet> DeviceModel<N> {
    /// Wraps `net` with the host parameters `params` (uploaded at the first forward).
    pub fn new(
        dev: &Device,
        mut net: N,
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
            d_seq: Buffer::new(dev)?,
            d_lengths: Buffer::new(dev)?,
            d_dseq: Buffer::new(dev)?,
            lengths: Vec::new(),
            steps: 0,
            dev: dev.clone(),
            partial: net.partial().map(|p| p.shape()),
            last_partial: None,
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

    /// Uploads what changed and the inputs, runs the forward, downloads the logits.
    fn try_forward(
        &mut self,
        dense: &[f32],
        pooled: &[f32],
        seq: Option<&SequenceInput<f32>>,
        batch: usize,
    ) -> Result<(), GpuError> {
        let (nd, f, e, w) = (self.num_dense, self.num_sparse, self.dim, self.net.sequence_width());
        let steps = if w > 0 { seq.map_or(0, |q| q.steps) } else { 0 };
        let seq_len = batch * steps * w;
        if dense.len() < batch * nd
            || pooled.len() < batch * f * e
            || seq.is_some_and(|q| w > 0 && (q.rows.len() < seq_len || q.lengths.len() < batch))
        {
            return Err(GpuError::shape(
                "device model forward",
                format!(
                    "{} dense, {} pooled and {} sequence values for a batch of {batch}",
                    dense.len(),
                    pooled.len(),
                    seq.map_or(0, |q| q.rows.len())
                ),
            ));
        }
        self.upload_params()?;
        self.last_partial = Some(false);
        let dev = &self.dev;
        self.d_dense.upload(dev, &dense[..batch * nd])?;
        self.d_pooled.upload(dev, &pooled[..batch * f * e])?;
        self.steps = steps;
        if w > 0 {
            self.lengths.clear();
            match seq {
                Some(q) if steps > 0 => self.lengths.extend(q.lengths[..batch].iter().map(|&l| l.min(steps) as u32)),
                _ => self.lengths.resize(batch, 0),
            }
            self.d_lengths.upload(dev, &self.lengths)?;
            if let Some(q) = seq {
                self.d_seq.upload(dev, &q.rows[..seq_len])?;
            }
        }
        let seq = Sequences { rows: &self.d_seq.0, lengths: &self.d_lengths.0, steps };
        let out = self.net.forward(dev, &self.d_params, &self.d_dense.0, &self.d_pooled.0, seq, batch)?;
        download_into(dev, out, &mut self.logits)?;
        dev.synchronize()
    }

    /// Uploads the logits' gradient, runs the backward, downloads the gradients.
    fn try_backward(&mut self, dlogits: &[f32], dpooled: &mut [f32], dseq: &mut [f32]) -> Result<(), GpuError> {
        let (batch, f, e) = (self.batch, self.num_sparse, self.dim);
        let n = batch * f * e;
        let ns = batch * self.steps * self.net.sequence_width();
        if dlogits.len() < batch || dpooled.len() < n || dseq.len() < ns {
            return Err(GpuError::shape(
                "device model backward",
                format!(
                    "{} logit, {} pooled and {} sequence gradients for a batch of {batch}",
                    dlogits.len(),
                    dpooled.len(),
                    dseq.len()
                ),
            ));
        }
        self.check_last_forward(false, "device model backward")?;
        let dev = &self.dev;
        self.d_dlogits.upload(dev, &dlogits[..batch])?;
        self.d_dpooled.reserve(dev, n)?;
        self.d_dseq.reserve(dev, ns)?;
        let seq = Sequences { rows: &self.d_seq.0, lengths: &self.d_lengths.0, steps: self.steps };
        self.net.backward(
            dev,
            &self.d_params,
            &self.d_dense.0,
            &self.d_pooled.0,
            seq,
            &self.d_dlogits.0,
            &mut self.d_grads,
            &mut self.d_dpooled.0,
            &mut self.d_dseq.0,
        )?;
        download_into(dev, &self.d_grads, &mut self.grads)?;
        download_into(dev, &self.d_dpooled.0, &mut dpooled[..n])?;
        download_into(dev, &self.d_dseq.0, &mut dseq[..ns])?;
        if self.net.sequence_width() == 0 {
            // As the CPU models without sequences: their sequence gradient is zero.
            dseq.fill(0.0);
        }
        dev.synchronize()
    }

    /// Uploads what changed, the dense values and the summed partial results,
    /// runs the partial form's forward, downloads the logits.
    fn try_forward_partial(&mut self, dense: &[f32], partial: &[f32], batch: usize) -> Result<(), GpuError> {
        let width = self.partial_width()?;
        let nd = self.num_dense;
        if dense.len() < batch * nd || partial.len() < batch * width {
            return Err(GpuError::shape(
                "device model partial forward",
                format!("{} dense and {} partial values for a batch of {batch}", dense.len(), partial.len()),
            ));
        }
        self.upload_params()?;
        self.last_partial = Some(true);
        let dev = &self.dev;
        self.d_dense.upload(dev, &dense[..batch * nd])?;
        // The partial results take the pooled vectors' buffer: a step has one or the other.
        self.d_pooled.upload(dev, &partial[..batch * width])?;
        let net = self.net.partial().ok_or_else(|| GpuError::Unsupported("this model has no partial form".into()))?;
        let out = net.forward_partial(dev, &self.d_params, &self.d_dense.0, &self.d_pooled.0, batch)?;
        download_into(dev, out, &mut self.logits)?;
        dev.synchronize()
    }

    /// Uploads the logits' gradient, runs the partial form's backward,
    /// downloads the gradients and the partial results' gradient.
    fn try_backward_partial(&mut self, dlogits: &[f32], dpartial: &mut [f32]) -> Result<(), GpuError> {
        let (batch, width) = (self.batch, self.partial_width()?);
        let n = batch * width;
        if dlogits.len() < batch || dpartial.len() < n {
            return Err(GpuError::shape(
                "device model partial backward",
                format!("{} logit and {} partial gradients for a batch of {batch}", dlogits.len(), dpartial.len()),
            ));
        }
        self.check_last_forward(true, "device model partial backward")?;
        let dev = &self.dev;
        self.d_dlogits.upload(dev, &dlogits[..batch])?;
        self.d_dpooled.reserve(dev, n.max(1))?;
        let net = self.net.partial().ok_or_else(|| GpuError::Unsupported("this model has no partial form".into()))?;
        net.backward_partial(
            dev,
            &self.d_params,
            &self.d_dense.0,
            &self.d_pooled.0,
            &self.d_dlogits.0,
            &mut self.d_grads,
            &mut self.d_dpooled.0,
        )?;
        download_into(dev, &self.d_grads, &mut self.grads)?;
        download_into(dev, &self.d_dpooled.0, &mut dpartial[..n])?;
        dev.synchronize()
    }

    /// Fails unless the last forward was of the form this backward belongs to.
    fn check_last_forward(&self, partial: bool, op: &'static str) -> Result<(), GpuError> {
        if self.last_partial == Some(partial) {
            return Ok(());
        }
        let form = |p: bool| if p { "the partial form" } else { "the pooled form" };
        Err(GpuError::shape(op, format!("a backward of {} without a forward of it", form(partial))))
    }

    fn partial_width(&self) -> Result<usize, GpuError> {
        self.partial.map(|p| p.width()).ok_or_else(|| GpuError::Unsupported("this model has no partial form".into()))
    }

    /// Uploads the host parameters when they may have changed since the last upload.
    fn upload_params(&mut self) -> Result<(), GpuError> {
        if self.stale {
            self.dev
                .stream
                .memcpy_htod(&self.params[..], &mut self.d_params)
                .map_err(GpuError::driver("copying the parameters to the device"))?;
            self.stale = false;
        }
        Ok(())
    }

    /// Runs `pass` unless the model has failed; a failure is kept and the
    /// logits of this and every later pass are NaN.
    fn run_forward_with(&mut self, batch: usize, pass: impl FnOnce(&mut Self) -> Result<(), GpuError>) {
        self.batch = batch;
        self.logits.clear();
        self.logits.resize(batch, 0.0);
        if !self.failed {
            if let Err(e) = pass(self) {
                self.fail(e);
            }
        }
        if self.failed {
            self.logits.fill(f32::NAN);
        }
    }

    fn run_forward(&mut self, dense: &[f32], pooled: &[f32], seq: Option<&SequenceInput<f32>>, batch: usize) {
        self.run_forward_with(batch, |m| m.try_forward(dense, pooled, seq, batch));
    }

    fn run_backward(&mut self, dlogits: &[f32], dpooled: &mut [f32], dseq: &mut [f32]) {
        if !self.failed {
            if let Err(e) = self.try_backward(dlogits, dpooled, dseq) {
                self.fail(e);
            }
        }
        if self.failed {
            self.grads.fill(0.0);
            dpooled.fill(0.0);
            dseq.fill(0.0);
        }
    }
}

impl<N: DeviceNet> PartialModel<f32> for DeviceModel<N> {
    fn shape(&self) -> FmPartial {
        self.partial.expect("partial_model hands out only a model with a partial form")
    }

    fn forward_partial(&mut self, dense: &[f32], partial: &[f32], batch: usize) -> &[f32] {
        self.run_forward_with(batch, |m| m.try_forward_partial(dense, partial, batch));
        &self.logits
    }

    fn backward_partial(&mut self, _dense: &[f32], _partial: &[f32], dlogits: &[f32], dpartial: &mut [f32]) {
        if !self.failed {
            if let Err(e) = self.try_backward_partial(dlogits, dpartial) {
                self.fail(e);
            }
        }
        if self.failed {
            self.grads.fill(0.0);
            dpartial.fill(0.0);
        }
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
        self.run_forward(dense, pooled, None, batch);
        &self.logits
    }
    fn backward(&mut self, _dense: &[f32], _pooled: &[f32], dlogits: &[f32], dpooled: &mut [f32]) {
        self.run_backward(dlogits, dpooled, &mut [])
    }
    fn forward_sequences(&mut self, dense: &[f32], pooled: &[f32], seq: &SequenceInput<f32>, batch: usize) -> &[f32] {
        self.run_forward(dense, pooled, Some(seq), batch);
        &self.logits
    }
    fn backward_sequences(
        &mut self,
        _dense: &[f32],
        _pooled: &[f32],
        _seq: &SequenceInput<f32>,
        dlogits: &[f32],
        dpooled: &mut [f32],
        dseq: &mut [f32],
    ) {
        self.run_backward(dlogits, dpooled, dseq)
    }
    fn partial_model(&mut self) -> Option<&mut dyn PartialModel<f32>> {
        self.partial.is_some().then_some(self as &mut dyn PartialModel<f32>)
    }
    fn take_error(&mut self) -> Option<String> {
        self.error.take().map(|e| format!("CUDA device {}: {e}", self.dev.ordinal()))
    }
}
