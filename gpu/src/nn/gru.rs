//! The split GRU cell on the device, forward and backward through time,
//! mirroring `tiderec_operators::nn::gru::Gru` (gate order `r, z, n`; masked
//! padded steps; parameters `W_ih [3H × I]`, `W_hh [3H × H]`, `b_ih`, `b_hh`
//! at `offset`).
//!
//! Split cell: the input projections of every step, `X·W_ihᵀ`, are one sgemm
//! before the recurrence; inside it each step runs one sgemm `h_{t−1}·W_hhᵀ`
//! and one elementwise kernel. Backward mirrors it: per step the gate
//! gradients and `dh_{t−1} += dGh·W_hh`; after the loop `dW_ih`, `dW_hh`, `dx`
//! (one sgemm each over all steps) and the bias gradients (column sums).

use crate::blas::{gemm, Op};
use crate::check::{self, grid_for};
use crate::nn::linear::column_sum;
use crate::{Device, GpuError};
use cudarc::driver::{CudaSlice, PushKernelArg};

/// GRU layer shape and parameter offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gru {
    /// Input width `I`.
    pub input: usize,
    /// Hidden width `H`.
    pub hidden: usize,
    /// Where `W_ih` starts in the flat parameter buffer.
    pub offset: usize,
}

/// Activations kept from `forward` for `backward`, and both passes'
/// workspaces. Every buffer is grown when a batch needs more and never
/// shrunk or cleared, so a layer allocates only for a batch larger than any
/// before: each value a pass reads it or the pass before it wrote first
/// (the first step writes `h_0 = 0`; the last step of the backward starts
/// from a zero `dh` without reading it).
#[derive(Debug, Default)]
pub struct GruCache {
    /// `h_0 … h_T`, each `[B × H]`, time-major (`h_0` = 0), at the front of the buffer.
    pub states: Option<CudaSlice<f32>>,
    r: Option<CudaSlice<f32>>,
    z: Option<CudaSlice<f32>>,
    n: Option<CudaSlice<f32>>,
    hn: Option<CudaSlice<f32>>,
    gx: Option<CudaSlice<f32>>,
    gh: Option<CudaSlice<f32>>,
    dh: Option<CudaSlice<f32>>,
    dh_prev: Option<CudaSlice<f32>>,
    dgx: Option<CudaSlice<f32>>,
    dgh: Option<CudaSlice<f32>>,
    batch: usize,
    steps: usize,
}

impl Gru {
    fn w_ih(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + 3 * self.hidden * self.input
    }
    fn w_hh(&self) -> std::ops::Range<usize> {
        let s = self.w_ih().end;
        s..s + 3 * self.hidden * self.hidden
    }
    fn b_ih(&self) -> std::ops::Range<usize> {
        let s = self.w_hh().end;
        s..s + 3 * self.hidden
    }
    fn b_hh(&self) -> std::ops::Range<usize> {
        let s = self.b_ih().end;
        s..s + 3 * self.hidden
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        3 * self.hidden * (self.input + self.hidden + 2)
    }

    fn check(
        &self,
        op: &'static str,
        params: &CudaSlice<f32>,
        x: &CudaSlice<f32>,
        lengths: &CudaSlice<u32>,
        batch: usize,
        steps: usize,
    ) -> Result<(), GpuError> {
        check::positive(op, "input", self.input)?;
        check::positive(op, "hidden", self.hidden)?;
        check::len(op, "params", params, self.offset + self.num_params(), || {
            format!("GRU {}→{} at offset {}", self.input, self.hidden, self.offset)
        })?;
        check::len(op, "x", x, check::product(op, &[batch, steps, self.input])?, || {
            format!("batch {batch} × {steps} steps × {}", self.input)
        })?;
        check::len(op, "lengths", lengths, batch, || format!("batch {batch}"))?;
        check::u32_of(op, "batch × steps × 3H", check::product(op, &[batch, steps, 3 * self.hidden])?)?;
        Ok(())
    }

    /// Runs the cell over `x: [B × T × I]` (batch-major) with `lengths[b]`
    /// valid steps per row; the states are in `cache.states`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        dev: &Device,
        params: &CudaSlice<f32>,
        x: &CudaSlice<f32>,
        lengths: &CudaSlice<u32>,
        batch: usize,
        steps: usize,
        cache: &mut GruCache,
    ) -> Result<(), GpuError> {
        const OP: &str = "gru forward";
        self.check(OP, params, x, lengths, batch, steps)?;
        let (h, h3) = (self.hidden, 3 * self.hidden);
        let bh = batch * h;
        cache.batch = batch;
        cache.steps = steps;
        let GruCache { states, r, z, n, hn, gx, gh, .. } = cache;
        let states = dev.grown(states, (steps + 1) * bh)?;
        let gx = dev.grown(gx, batch * steps * h3)?;
        let gh = dev.grown(gh, bh * 3)?;
        let r = dev.grown(r, steps * bh)?;
        let z = dev.grown(z, steps * bh)?;
        let n = dev.grown(n, steps * bh)?;
        let hn = dev.grown(hn, steps * bh)?;
        if batch > 0 && steps > 0 {
            let w_ih = params.slice(self.w_ih());
            let w_hh = params.slice(self.w_hh());
            let (b_ih, b_hh) = (params.slice(self.b_ih()), params.slice(self.b_hh()));
            gemm(
                dev,
                OP,
                (Op::N, Op::T),
                (batch * steps, h3, self.input),
                x,
                self.input,
                &w_ih,
                self.input,
                0.0,
                gx,
                h3,
            )?;
            let (t32, b32, h32) = (steps as u32, batch as u32, h as u32);
            for t in 0..steps {
                let (mut done, mut rest) = states.split_at_mut((t + 1) * bh);
                let mut prev = done.slice_mut(t * bh..);
                // The first step reads no `h_0 · W_hhᵀ`: its kernel writes h_0 = 0 and takes gh as zero.
                if t > 0 {
                    gemm(dev, OP, (Op::N, Op::T), (batch, h3, h), &prev, h, &w_hh, h, 0.0, gh, h3)?;
                }
                let mut out = rest.slice_mut(..bh);
                let tt = t as u32;
                let mut launch = dev.stream.launch_builder(dev.function("gru_step_forward"));
                launch
                    .arg(&*gx)
                    .arg(&*gh)
                    .arg(&b_ih)
                    .arg(&b_hh)
                    .arg(lengths)
                    .arg(&tt)
                    .arg(&t32)
                    .arg(&b32)
                    .arg(&h32)
                    .arg(&mut prev)
                    .arg(&mut out)
                    .arg(&mut *r)
                    .arg(&mut *z)
                    .arg(&mut *n)
                    .arg(&mut *hn);
                // SAFETY: gx holds B·T rows of 3H, gh B rows, the planes T·B·H values, prev and out B·H.
                unsafe { launch.launch(grid_for(bh)) }.map_err(GpuError::driver("launching gru_step_forward"))?;
            }
        }
        Ok(())
    }

    /// Back-propagates `dstates: [T × B × H]` (the gradient of `h_1 … h_T`)
    /// through the last forward: parameter gradients into `grads`
    /// (overwritten) and `dx: [B × T × I]` (overwritten).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        dev: &Device,
        params: &CudaSlice<f32>,
        x: &CudaSlice<f32>,
        lengths: &CudaSlice<u32>,
        cache: &mut GruCache,
        dstates: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
    ) -> Result<(), GpuError> {
        const OP: &str = "gru backward";
        let (batch, steps) = (cache.batch, cache.steps);
        self.check(OP, params, x, lengths, batch, steps)?;
        let GruCache { states, r, z, n, hn, dh, dh_prev, dgx, dgh, .. } = cache;
        let (Some(states), Some(r), Some(z), Some(n), Some(hn)) = (&*states, &*r, &*z, &*n, &*hn) else {
            return Err(GpuError::shape(OP, "backward without a forward"));
        };
        let (h, h3, i) = (self.hidden, 3 * self.hidden, self.input);
        let bh = batch * h;
        // A forward whose buffers failed to grow leaves its shape with the smaller buffers.
        let kept = || format!("the forward's {steps} steps × batch {batch} × {h}");
        check::len(OP, "states", states, (steps + 1) * bh, kept)?;
        for (name, buf) in [("r", r), ("z", z), ("n", n), ("hn", hn)] {
            check::len(OP, name, buf, steps * bh, kept)?;
        }
        check::len(OP, "dstates", dstates, steps * bh, || format!("{steps} steps × batch {batch} × {h}"))?;
        check::len(OP, "grads", grads, self.offset + self.num_params(), || "the GRU's parameters".into())?;
        check::len(OP, "dx", dx, batch * steps * i, || format!("batch {batch} × {steps} steps × {i}"))?;
        if batch == 0 || steps == 0 {
            let mut g = grads.slice_mut(self.offset..self.offset + self.num_params());
            return dev.stream.memset_zeros(&mut g).map_err(GpuError::driver("zeroing the GRU's gradients"));
        }
        let w_ih = params.slice(self.w_ih());
        let w_hh = params.slice(self.w_hh());
        let mut dh = dev.grown(dh, bh)?;
        let mut dh_prev = dev.grown(dh_prev, bh)?;
        let dgx = dev.grown(dgx, batch * steps * h3)?;
        let dgh = dev.grown(dgh, steps * batch * h3)?;
        let (t32, b32, h32) = (steps as u32, batch as u32, h as u32);
        for t in (0..steps).rev() {
            let tt = t as u32;
            let ds = dstates.slice(t * bh..(t + 1) * bh);
            let prev = states.slice(t * bh..(t + 1) * bh);
            let mut launch = dev.stream.launch_builder(dev.function("gru_step_backward"));
            launch
                .arg(&*dh)
                .arg(&ds)
                .arg(r)
                .arg(z)
                .arg(n)
                .arg(hn)
                .arg(&prev)
                .arg(lengths)
                .arg(&tt)
                .arg(&t32)
                .arg(&b32)
                .arg(&h32)
                .arg(&mut *dgx)
                .arg(&mut *dgh)
                .arg(&mut *dh_prev);
            // SAFETY: as in `forward`; dgx holds B·T rows of 3H, dgh T·B rows.
            unsafe { launch.launch(grid_for(bh)) }.map_err(GpuError::driver("launching gru_step_backward"))?;
            let dgh_t = dgh.slice(t * batch * h3..(t + 1) * batch * h3);
            gemm(dev, OP, (Op::N, Op::N), (batch, h, h3), &dgh_t, h3, &w_hh, h, 1.0, dh_prev, h)?;
            std::mem::swap(&mut dh, &mut dh_prev);
        }
        {
            let hprev = states.slice(..steps * bh);
            let mut g = grads.slice_mut(self.w_hh());
            gemm(dev, OP, (Op::T, Op::N), (h3, h, steps * batch), &*dgh, h3, &hprev, h, 0.0, &mut g, h)?;
        }
        {
            let mut g = grads.slice_mut(self.w_ih());
            gemm(dev, OP, (Op::T, Op::N), (h3, i, batch * steps), &*dgx, h3, x, i, 0.0, &mut g, i)?;
        }
        gemm(dev, OP, (Op::N, Op::N), (batch * steps, i, h3), &*dgx, h3, &w_ih, i, 0.0, dx, i)?;
        column_sum(dev, dgh, steps * batch, h3, grads, self.b_hh().start)?;
        column_sum(dev, dgx, batch * steps, h3, grads, self.b_ih().start)?;
        Ok(())
    }
}
