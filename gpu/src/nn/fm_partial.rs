//! The home's side of the DES partial exchange for the LR / FM / DeepFM /
//! Wide & Deep models, mirroring the `PartialModel` form of
//! `tiderec_operators::nn::deepfm::Fm` (see `tiderec_operators::nn::FmPartial`
//! and `FirstLayer`).
//!
//! A sample arrives as its summed partial result `p` of
//! [`FmPartial::width`] values: the FM sums `[c, S]` (`1 + k` values with a
//! second-order term, `[c]` without), then, with a deep part, the first
//! layer's shares `Σ_f W_f·v_f` (`hidden` values). These functions turn the
//! FM sums into the logit's interaction term and back, and the shares into the
//! first layer's pre-activation and back; the model
//! ([`crate::model::DeviceFm`]) adds the linear part, the first layer's bias
//! and dense columns and runs the rest of the MLP.
//!
//! Invariants: every kernel sums in the CPU's order (`FmPartial::logit`
//! adds the squares in column order), so the FM term of a sample equals the
//! CPU's bit for bit; the gradient functions overwrite exactly their columns of
//! `dpartial` and leave the others alone.

use crate::check::{self, grid_for};
use crate::{Device, GpuError};
use cudarc::driver::{CudaSlice, PushKernelArg};
use tiderec_operators::nn::FmPartial;

/// Factor columns of the FM sums that enter the logit squared (0 without a second-order term).
fn second_order_dim(part: &FmPartial) -> usize {
    part.fm_width() - 1
}

fn check_partial(
    op: &'static str,
    name: &str,
    buf: &CudaSlice<f32>,
    part: &FmPartial,
    batch: usize,
) -> Result<[u32; 3], GpuError> {
    let width = part.width();
    check::len(op, name, buf, check::product(op, &[batch, width])?, || format!("batch {batch} × {width}"))?;
    Ok([
        check::u32_of(op, "batch", batch)?,
        check::u32_of(op, "width", width)?,
        check::u32_of(op, "dim", second_order_dim(part))?,
    ])
}

/// `logits[b] += c_b + ½‖S_b‖²` (`FmPartial::logit`) for every sample of `partial` (`[batch × width]`).
pub fn add_partial_logits(
    dev: &Device,
    part: &FmPartial,
    partial: &CudaSlice<f32>,
    batch: usize,
    logits: &mut CudaSlice<f32>,
) -> Result<(), GpuError> {
    const OP: &str = "partial logits";
    let [b, w, k] = check_partial(OP, "partial", partial, part, batch)?;
    check::len(OP, "logits", logits, batch, || format!("batch {batch}"))?;
    if batch == 0 {
        return Ok(());
    }
    let mut launch = dev.stream.launch_builder(dev.function("fm_partial_logit"));
    launch.arg(partial).arg(&b).arg(&w).arg(&k).arg(logits);
    // SAFETY: partial holds batch × width values and logits batch (checked above); one thread per sample.
    unsafe { launch.launch(grid_for(batch)) }.map_err(GpuError::driver("launching fm_partial_logit"))?;
    Ok(())
}

/// Overwrites the FM sums' columns of `dpartial` with `[g, g·S]` (`FmPartial::logit_grad`),
/// `g` each sample's `dlogits`; the shares' columns are left alone.
pub fn partial_logit_grads(
    dev: &Device,
    part: &FmPartial,
    partial: &CudaSlice<f32>,
    dlogits: &CudaSlice<f32>,
    batch: usize,
    dpartial: &mut CudaSlice<f32>,
) -> Result<(), GpuError> {
    const OP: &str = "partial logit gradients";
    let [b, w, k] = check_partial(OP, "partial", partial, part, batch)?;
    check_partial(OP, "dpartial", dpartial, part, batch)?;
    check::len(OP, "dlogits", dlogits, batch, || format!("batch {batch}"))?;
    let n = batch * part.fm_width();
    if n == 0 {
        return Ok(());
    }
    let mut launch = dev.stream.launch_builder(dev.function("fm_partial_grad"));
    launch.arg(partial).arg(dlogits).arg(&b).arg(&w).arg(&k).arg(dpartial);
    // SAFETY: both partial buffers hold batch × width values (checked above); one thread per FM column.
    unsafe { launch.launch(grid_for(n)) }.map_err(GpuError::driver("launching fm_partial_grad"))?;
    Ok(())
}

/// The shares' columns (`hidden` of them, after the FM sums) of `partial` plus
/// the first layer's bias `params[bias..bias + hidden]`, into `z` (`[batch × hidden]`).
pub fn shares_plus_bias(
    dev: &Device,
    part: &FmPartial,
    partial: &CudaSlice<f32>,
    params: &CudaSlice<f32>,
    bias: usize,
    batch: usize,
    z: &mut CudaSlice<f32>,
) -> Result<(), GpuError> {
    const OP: &str = "shares plus bias";
    let hidden = shares_width(OP, part)?;
    let [b, w, _] = check_partial(OP, "partial", partial, part, batch)?;
    check::len(OP, "params", params, bias + hidden, || format!("the bias of {hidden} at {bias}"))?;
    check::len(OP, "z", z, batch * hidden, || format!("batch {batch} × {hidden}"))?;
    if batch == 0 {
        return Ok(());
    }
    let (offset, h) = (check::u32_of(OP, "offset", part.fm_width())?, check::u32_of(OP, "hidden", hidden)?);
    let bias = params.slice(bias..bias + hidden);
    let mut launch = dev.stream.launch_builder(dev.function("shares_plus_bias"));
    launch.arg(partial).arg(&bias).arg(&b).arg(&w).arg(&offset).arg(&h).arg(z);
    // SAFETY: partial holds batch × width values, bias hidden and z batch × hidden (checked above).
    unsafe { launch.launch(grid_for(batch * hidden)) }.map_err(GpuError::driver("launching shares_plus_bias"))?;
    Ok(())
}

/// `z = max(z, 0)` over the first `n` values (a negative zero becomes positive, as on the CPU).
pub fn relu(dev: &Device, z: &mut CudaSlice<f32>, n: usize) -> Result<(), GpuError> {
    const OP: &str = "relu";
    check::len(OP, "z", z, n, || format!("{n} values"))?;
    if n == 0 {
        return Ok(());
    }
    let n64 = n as u64;
    let mut launch = dev.stream.launch_builder(dev.function("relu_rows"));
    launch.arg(z).arg(&n64);
    // SAFETY: z holds at least n values (checked above).
    unsafe { launch.launch(grid_for(n)) }.map_err(GpuError::driver("launching relu_rows"))?;
    Ok(())
}

/// Overwrites the shares' columns of `dpartial` with the first layer's
/// pre-activation gradient `dz` (`[batch × hidden]`); the FM sums' columns are left alone.
pub fn shares_grad(
    dev: &Device,
    part: &FmPartial,
    dz: &CudaSlice<f32>,
    batch: usize,
    dpartial: &mut CudaSlice<f32>,
) -> Result<(), GpuError> {
    const OP: &str = "shares gradient";
    let hidden = shares_width(OP, part)?;
    let [b, w, _] = check_partial(OP, "dpartial", dpartial, part, batch)?;
    check::len(OP, "dz", dz, batch * hidden, || format!("batch {batch} × {hidden}"))?;
    if batch == 0 {
        return Ok(());
    }
    let (offset, h) = (check::u32_of(OP, "offset", part.fm_width())?, check::u32_of(OP, "hidden", hidden)?);
    let mut launch = dev.stream.launch_builder(dev.function("shares_grad"));
    launch.arg(dz).arg(&b).arg(&w).arg(&offset).arg(&h).arg(dpartial);
    // SAFETY: dpartial holds batch × width values and dz batch × hidden (checked above).
    unsafe { launch.launch(grid_for(batch * hidden)) }.map_err(GpuError::driver("launching shares_grad"))?;
    Ok(())
}

/// The first layer's width, or an error for a partial form without a deep part.
fn shares_width(op: &'static str, part: &FmPartial) -> Result<usize, GpuError> {
    part.deep.map(|l| l.hidden).ok_or_else(|| GpuError::shape(op, "this partial form has no deep part"))
}
