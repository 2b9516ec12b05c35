//! Dense optimizers on the device, mirroring
//! `tiderec_operators::optim::DenseOptimizer`: the same update rules,
//! epsilons, initial accumulator and Adam bias correction (computed on the
//! host in fp32 exactly as the CPU computes it), one elementwise kernel per step.
//!
//! ## Invariants
//!
//! * **What changes per step is in device memory.** The learning rate (a
//!   schedule's value) and Adam's bias corrections are written to a small
//!   device buffer by one launch (`DenseOptimizer::stage_step`) before the
//!   update that reads them is queued (`DenseOptimizer::queue_update`); every
//!   other argument of the update is fixed for a slice. So the update can be
//!   captured once in a CUDA graph and replayed step after step, each replay
//!   reading the values staged for its step.

use crate::check::{self, grid_for};
use crate::{Device, GpuError};
use cudarc::driver::{CudaSlice, PushKernelArg};
use tiderec_operators::optim::{DenseOptimizerKind, DenseOptimizerState};

/// Dense optimizer kinds (as `DenseOptimizerKind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseKind {
    /// Plain SGD.
    Sgd,
    /// Adagrad, one accumulator per parameter.
    Adagrad,
    /// Adam with bias correction.
    Adam,
}

/// The hyper-parameters a dense optimizer reads (as `OptimizerParams`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DenseHyper {
    /// Learning rate.
    pub lr: f32,
    /// Adam β₁.
    pub beta1: f32,
    /// Adam β₂.
    pub beta2: f32,
    /// Denominator guard.
    pub eps: f32,
    /// Adagrad's initial accumulator.
    pub initial_accumulator: f32,
}

/// The device kind of a host optimizer kind.
pub fn kind_of(kind: DenseOptimizerKind) -> DenseKind {
    match kind {
        DenseOptimizerKind::Sgd => DenseKind::Sgd,
        DenseOptimizerKind::Adagrad => DenseKind::Adagrad,
        DenseOptimizerKind::Adam => DenseKind::Adam,
    }
}

/// The state and update rule of one dense slice of `len` parameters, on the device.
#[derive(Debug)]
pub struct DenseOptimizer {
    kind: DenseKind,
    hp: DenseHyper,
    len: usize,
    m: Option<CudaSlice<f32>>,
    v: Option<CudaSlice<f32>>,
    t: u64,
    /// The next update's per-step values (see the module docs).
    hyper: StepValues,
}

impl DenseOptimizer {
    /// Fresh state for `len` parameters (Adagrad's accumulators at
    /// `initial_accumulator`, Adam's moments at zero).
    pub fn new(dev: &Device, kind: DenseKind, hp: DenseHyper, len: usize) -> Result<Self, GpuError> {
        let (m, v) = match kind {
            DenseKind::Sgd => (None, None),
            DenseKind::Adagrad => (None, Some(dev.upload(&vec![hp.initial_accumulator; len])?)),
            DenseKind::Adam => (Some(dev.zeros(len)?), Some(dev.zeros(len)?)),
        };
        Ok(DenseOptimizer { kind, hp, len, m, v, t: 0, hyper: StepValues::new(dev)? })
    }

    /// Continues from a host optimizer's `state` over all `state.len` parameters
    /// (a checkpoint's, or the CPU optimizer's), with hyper-parameters `hp`.
    pub fn from_host(dev: &Device, hp: DenseHyper, state: &DenseOptimizerState) -> Result<Self, GpuError> {
        state.check().map_err(|e| GpuError::shape("dense optimizer state", e.to_string()))?;
        let some = |x: &[f32]| if x.is_empty() { Ok(None) } else { dev.upload(x).map(Some) };
        Ok(DenseOptimizer {
            kind: kind_of(state.kind),
            hp,
            len: state.len,
            m: some(&state.m)?,
            v: some(&state.v)?,
            t: state.t,
            hyper: StepValues::new(dev)?,
        })
    }

    /// The state in the host's checkpoint form, for the slice at `offset` (waits for the stream).
    pub fn to_host(&self, dev: &Device, offset: usize) -> Result<DenseOptimizerState, GpuError> {
        let get = |x: &Option<CudaSlice<f32>>| x.as_ref().map_or(Ok(Vec::new()), |x| dev.download(x, self.len));
        let kind = match self.kind {
            DenseKind::Sgd => DenseOptimizerKind::Sgd,
            DenseKind::Adagrad => DenseOptimizerKind::Adagrad,
            DenseKind::Adam => DenseOptimizerKind::Adam,
        };
        Ok(DenseOptimizerState { kind, t: self.t, offset, len: self.len, m: get(&self.m)?, v: get(&self.v)? })
    }

    /// Sets the learning rate of the next updates (a schedule's value).
    pub fn set_lr(&mut self, lr: f32) {
        self.hp.lr = lr;
    }

    /// Parameters this optimizer updates.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it updates no parameter.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Updates applied so far.
    pub fn steps(&self) -> u64 {
        self.t
    }

    /// Takes back the count of the last update, which the device skipped
    /// (see [`queue_update`](Self::queue_update)): the next
    /// update's bias correction is the one it would have had.
    pub(crate) fn forget_step(&mut self) {
        self.t = self.t.saturating_sub(1);
    }

    /// The first moments (Adam) and second moments or accumulators, on the device.
    pub fn moments(&self) -> (Option<&CudaSlice<f32>>, Option<&CudaSlice<f32>>) {
        (self.m.as_ref(), self.v.as_ref())
    }

    /// Updates the first `len` values of `params` from the gradient `scale · grads`.
    pub fn apply_scaled(
        &mut self,
        dev: &Device,
        params: &mut CudaSlice<f32>,
        grads: &CudaSlice<f32>,
        scale: f32,
    ) -> Result<(), GpuError> {
        self.stage_step(dev)?;
        let queued = self.queue_update(dev, params, grads, scale, None);
        if queued.is_err() {
            // Not applied: the next update's bias correction is the one this one would have had.
            self.forget_step();
        }
        queued
    }

    /// Counts the next update and queues the write of its per-step values
    /// (the learning rate set last, Adam's bias corrections for the new count)
    /// into the device buffer [`queue_update`](Self::queue_update) reads.
    pub(crate) fn stage_step(&mut self, dev: &Device) -> Result<(), GpuError> {
        self.t += 1;
        let DenseHyper { lr, beta1, beta2, .. } = self.hp;
        let values = match self.kind {
            DenseKind::Sgd | DenseKind::Adagrad => [lr, 0.0],
            DenseKind::Adam => {
                // The CPU's bias correction, in fp32, term for term.
                let t = self.t.min(i32::MAX as u64) as i32;
                let bc1 = 1.0 - beta1.powi(t);
                let bc2 = 1.0 - beta2.powi(t);
                [lr / bc1, bc2.sqrt()]
            }
        };
        let written = self.hyper.set(dev, values);
        if written.is_err() {
            // Not counted: the step's values never reached the device.
            self.t -= 1;
        }
        written
    }

    /// Queues the update of the first `len` values of `params` from the
    /// gradient `scale · grads` with the values [`stage_step`](Self::stage_step)
    /// wrote last; skipped by the device while `skip[0]` is not zero when the
    /// update runs (a step whose loss was not finite), so the host need not wait
    /// for the flag. The step counts as applied either way;
    /// [`forget_step`](Self::forget_step) takes a skipped one back. Its launch
    /// depends only on the buffers, `scale` and the hyper-parameters that stay
    /// fixed, so it may be captured in a CUDA graph.
    pub(crate) fn queue_update(
        &mut self,
        dev: &Device,
        params: &mut CudaSlice<f32>,
        grads: &CudaSlice<f32>,
        scale: f32,
        skip: Option<&CudaSlice<u32>>,
    ) -> Result<(), GpuError> {
        const OP: &str = "dense optimizer";
        let skip = skip.unwrap_or(&dev.never);
        let n = self.len;
        check::len(OP, "params", params, n, || format!("a slice of {n}"))?;
        check::len(OP, "grads", grads, n, || format!("a slice of {n}"))?;
        if n == 0 {
            return Ok(());
        }
        let n64 = n as u64;
        let DenseHyper { beta1, beta2, eps, .. } = self.hp;
        let hyper = &self.hyper.buf;
        let cfg = grid_for(n);
        match (self.kind, self.m.as_mut(), self.v.as_mut()) {
            (DenseKind::Sgd, _, _) => {
                let mut launch = dev.stream.launch_builder(dev.function("sgd_update"));
                launch.arg(skip).arg(hyper).arg(params).arg(grads).arg(&n64).arg(&scale);
                // SAFETY: both buffers hold at least n values, `skip` one word, `hyper` two.
                unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching sgd_update"))?;
            }
            (DenseKind::Adagrad, _, Some(v)) => {
                let mut launch = dev.stream.launch_builder(dev.function("adagrad_update"));
                launch.arg(skip).arg(hyper).arg(params).arg(grads).arg(v).arg(&n64).arg(&eps).arg(&scale);
                // SAFETY: the three buffers hold at least n values, `skip` one word, `hyper` two.
                unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching adagrad_update"))?;
            }
            (DenseKind::Adam, Some(m), Some(v)) => {
                let (omb1, omb2) = (1.0 - beta1, 1.0 - beta2);
                let mut launch = dev.stream.launch_builder(dev.function("adam_update"));
                launch
                    .arg(skip)
                    .arg(hyper)
                    .arg(params)
                    .arg(grads)
                    .arg(m)
                    .arg(v)
                    .arg(&n64)
                    .arg(&beta1)
                    .arg(&beta2)
                    .arg(&omb1)
                    .arg(&omb2)
                    .arg(&eps)
                    .arg(&scale);
                // SAFETY: the four buffers hold at least n values, `skip` one word, `hyper` two.
                unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching adam_update"))?;
            }
            _ => return Err(GpuError::shape(OP, "optimizer state missing for its kind")),
        }
        Ok(())
    }
}

/// Two per-step values an update kernel reads from device memory, and what
/// was written there last: a step whose values are those of the step before
/// (a constant learning rate) queues no write.
#[derive(Debug)]
pub(crate) struct StepValues {
    /// The two values, on the device.
    pub(crate) buf: CudaSlice<f32>,
    written: Option<[u32; 2]>,
}

impl StepValues {
    pub(crate) fn new(dev: &Device) -> Result<Self, GpuError> {
        Ok(StepValues { buf: dev.zeros(2)?, written: None })
    }

    /// Queues the write of `values` on the device's stream (one thread),
    /// unless they are the values written last, bit for bit.
    pub(crate) fn set(&mut self, dev: &Device, [a, b]: [f32; 2]) -> Result<(), GpuError> {
        let bits = [a.to_bits(), b.to_bits()];
        if self.written == Some(bits) {
            return Ok(());
        }
        let mut launch = dev.stream.launch_builder(dev.function("write_scalars"));
        launch.arg(&mut self.buf).arg(&a).arg(&b);
        let one = cudarc::driver::LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `buf` holds two values (allocated so); one thread writes them.
        unsafe { launch.launch(one) }.map_err(GpuError::driver("launching write_scalars"))?;
        self.written = Some(bits);
        Ok(())
    }
}
