//! Binary cross-entropy on logits on the device, mirroring
//! `tiderec_operators::nn::loss::{bce_with_logits_grad, bce_with_logits_sum}`.

use crate::check::{self, grid_for};
use crate::{Device, GpuError};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

/// `grad[i] = (σ(logits[i]) − labels[i]) · scale` for the first `n` values.
pub fn bce_grad(
    dev: &Device,
    logits: &CudaSlice<f32>,
    labels: &CudaSlice<f32>,
    n: usize,
    scale: f32,
    grad: &mut CudaSlice<f32>,
) -> Result<(), GpuError> {
    const OP: &str = "bce gradient";
    for (name, b) in [("logits", logits), ("labels", labels)] {
        check::len(OP, name, b, n, || format!("{n} values"))?;
    }
    check::len(OP, "grad", grad, n, || format!("{n} values"))?;
    if n == 0 {
        return Ok(());
    }
    let n64 = n as u64;
    let mut launch = dev.stream.launch_builder(dev.function("bce_grad"));
    launch.arg(logits).arg(labels).arg(&n64).arg(&scale).arg(grad);
    // SAFETY: the three buffers hold at least n values.
    unsafe { launch.launch(grid_for(n)) }.map_err(GpuError::driver("launching bce_grad"))?;
    Ok(())
}

/// `Σᵢ BCE(σ(logitᵢ), labelᵢ)` over the first `n` values, in fp64 with a fixed
/// summation order. Reads the sum back (waits for the stream).
pub fn bce_sum(dev: &Device, logits: &CudaSlice<f32>, labels: &CudaSlice<f32>, n: usize) -> Result<f64, GpuError> {
    const OP: &str = "bce sum";
    for (name, b) in [("logits", logits), ("labels", labels)] {
        check::len(OP, name, b, n, || format!("{n} values"))?;
    }
    if n == 0 {
        return Ok(0.0);
    }
    // bce_sum's chunk (BCE_CHUNK in loss.cu).
    const CHUNK: usize = 2048;
    let blocks = n.div_ceil(CHUNK);
    let blocks32 = check::u32_of(OP, "blocks", blocks)?;
    let mut parts = dev.zeros::<f64>(blocks + 1)?;
    let n64 = n as u64;
    let cfg = LaunchConfig { grid_dim: (blocks32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut launch = dev.stream.launch_builder(dev.function("bce_sum"));
    launch.arg(logits).arg(labels).arg(&n64).arg(&mut parts);
    // SAFETY: both inputs hold at least n values; one block of 256 threads per chunk, one part each.
    unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching bce_sum"))?;
    let (mut head, mut out) = parts.split_at_mut(blocks);
    let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut launch = dev.stream.launch_builder(dev.function("sum_f64"));
    launch.arg(&mut head).arg(&blocks32).arg(&mut out);
    // SAFETY: `head` holds the blocks' parts, `out` one value; one block of 256 threads.
    unsafe { launch.launch(one) }.map_err(GpuError::driver("launching sum_f64"))?;
    let out = out.slice(0..1);
    let mut v = [0f64];
    dev.stream.memcpy_dtoh(&out, &mut v).map_err(GpuError::driver("reading the loss"))?;
    dev.synchronize()?;
    Ok(v[0])
}
