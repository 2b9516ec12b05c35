//! Bilinear softmax attention pooling on the device, mirroring
//! `tiderec_operators::nn::attention::AttentionPooling`: `s_t = k_tᵀ W q`,
//! `α = softmax(s)` over the first `min(lengths[b], T)` keys, `out = Σ α_t k_t`
//! (an empty sequence pools to zeros). `W` (`D × D`) is at `offset`.

use crate::blas::{gemm, Op};
use crate::check;
use crate::{Device, GpuError};
use cudarc::driver::{CudaSlice, PushKernelArg};

/// Floats of shared memory past the last one a kernel indexes: for the
/// unrolled remainder of a loop over the scores `ptxas` may read three floats
/// at once from the last valid one (seen as an out-of-bounds shared read by
/// `compute-sanitizer` on `sm_90`), so the buffer ends a vector later.
const SLACK: usize = 4;

/// Attention pooling of `[B × T × D]` keys against `[B × D]` queries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionPooling {
    /// Key and query width `D`.
    pub dim: usize,
    /// Where `W` starts in the flat parameter buffer.
    pub offset: usize,
}

/// The softmax weights (`[B × T]`) and `W q` (`[B × D]`) kept for backward,
/// and the backward's `k̄` (`[B × D]`). The buffers grow when a batch needs
/// more and are never cleared: the kernels write every value they later read.
#[derive(Debug, Default)]
pub struct AttentionCache {
    alpha: Option<CudaSlice<f32>>,
    wq: Option<CudaSlice<f32>>,
    kbar: Option<CudaSlice<f32>>,
    batch: usize,
    steps: usize,
}

impl AttentionPooling {
    /// Number of parameters (`D²`).
    pub fn num_params(&self) -> usize {
        self.dim * self.dim
    }

    #[allow(clippy::too_many_arguments)]
    fn check(
        &self,
        op: &'static str,
        params: &CudaSlice<f32>,
        query: &CudaSlice<f32>,
        keys: &CudaSlice<f32>,
        lengths: &CudaSlice<u32>,
        batch: usize,
        steps: usize,
    ) -> Result<usize, GpuError> {
        let d = self.dim;
        check::positive(op, "dim", d)?;
        check::len(op, "params", params, self.offset + d * d, || format!("W {d}×{d} at offset {}", self.offset))?;
        check::len(op, "query", query, check::product(op, &[batch, d])?, || format!("batch {batch} × {d}"))?;
        check::len(op, "keys", keys, check::product(op, &[batch, steps, d])?, || {
            format!("batch {batch} × {steps} steps × {d}")
        })?;
        check::len(op, "lengths", lengths, batch, || format!("batch {batch}"))?;
        check::u32_of(op, "steps × dim", steps * d)?;
        Ok((d + steps + SLACK) * 4)
    }

    /// `out: [B × D]` from `query: [B × D]` and `keys: [B × T × D]`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        dev: &Device,
        params: &CudaSlice<f32>,
        query: &CudaSlice<f32>,
        keys: &CudaSlice<f32>,
        lengths: &CudaSlice<u32>,
        batch: usize,
        steps: usize,
        out: &mut CudaSlice<f32>,
        cache: &mut AttentionCache,
    ) -> Result<(), GpuError> {
        const OP: &str = "attention forward";
        let smem = self.check(OP, params, query, keys, lengths, batch, steps)?;
        let d = self.dim;
        check::len(OP, "out", out, batch * d, || format!("batch {batch} × {d}"))?;
        cache.batch = batch;
        cache.steps = steps;
        let alpha = dev.grown(&mut cache.alpha, batch * steps)?;
        let wq = dev.grown(&mut cache.wq, batch * d)?;
        if batch > 0 {
            let cfg = check::block_per_item(OP, batch, 128, smem)?;
            let w = params.slice(self.offset..self.offset + d * d);
            let (b32, t32, d32) = (batch as u32, steps as u32, d as u32);
            let mut launch = dev.stream.launch_builder(dev.function("attention_forward"));
            launch.arg(&w).arg(query).arg(keys).arg(lengths).arg(&b32).arg(&t32).arg(&d32).arg(out).arg(alpha).arg(wq);
            // SAFETY: shapes checked above; the shared memory holds D + T floats.
            unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching attention_forward"))?;
        }
        Ok(())
    }

    /// `dquery`, `dkeys` and the gradient of `W` (all overwritten) from `dout: [B × D]`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        dev: &Device,
        params: &CudaSlice<f32>,
        query: &CudaSlice<f32>,
        keys: &CudaSlice<f32>,
        lengths: &CudaSlice<u32>,
        dout: &CudaSlice<f32>,
        cache: &mut AttentionCache,
        grads: &mut CudaSlice<f32>,
        dquery: &mut CudaSlice<f32>,
        dkeys: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        const OP: &str = "attention backward";
        let (batch, steps) = (cache.batch, cache.steps);
        self.check(OP, params, query, keys, lengths, batch, steps)?;
        let AttentionCache { alpha, wq, kbar, .. } = cache;
        let (Some(alpha), Some(wq)) = (&*alpha, &*wq) else {
            return Err(GpuError::shape(OP, "backward without a forward"));
        };
        let d = self.dim;
        // A forward whose buffers failed to grow leaves its shape with the smaller buffers.
        check::len(OP, "alpha", alpha, batch * steps, || format!("the forward's batch {batch} × {steps} steps"))?;
        check::len(OP, "wq", wq, batch * d, || format!("the forward's batch {batch} × {d}"))?;
        check::len(OP, "dout", dout, batch * d, || format!("batch {batch} × {d}"))?;
        check::len(OP, "grads", grads, self.offset + d * d, || format!("W {d}×{d} at offset {}", self.offset))?;
        check::len(OP, "dquery", dquery, batch * d, || format!("batch {batch} × {d}"))?;
        check::len(OP, "dkeys", dkeys, batch * steps * d, || format!("batch {batch} × {steps} steps × {d}"))?;
        let wrange = self.offset..self.offset + d * d;
        if batch == 0 {
            let mut g = grads.slice_mut(wrange);
            return dev.stream.memset_zeros(&mut g).map_err(GpuError::driver("zeroing the attention gradient"));
        }
        let kbar = dev.grown(kbar, batch * d)?;
        let cfg = check::block_per_item(OP, batch, 128, (steps + SLACK) * 4)?;
        let (b32, t32, d32) = (batch as u32, steps as u32, d as u32);
        let mut launch = dev.stream.launch_builder(dev.function("attention_backward"));
        launch
            .arg(keys)
            .arg(lengths)
            .arg(dout)
            .arg(alpha)
            .arg(wq)
            .arg(&b32)
            .arg(&t32)
            .arg(&d32)
            .arg(dkeys)
            .arg(&mut *kbar);
        // SAFETY: shapes checked above; the shared memory holds T floats.
        unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching attention_backward"))?;
        let w = params.slice(wrange.clone());
        gemm(dev, OP, (Op::N, Op::N), (batch, d, d), &*kbar, d, &w, d, 0.0, dquery, d)?;
        let mut g = grads.slice_mut(wrange);
        gemm(dev, OP, (Op::T, Op::N), (d, d, batch), &*kbar, d, query, d, 0.0, &mut g, d)
    }
}
