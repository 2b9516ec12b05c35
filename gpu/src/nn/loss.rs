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
    if n == 0 {
        return Ok(0.0);
    }
    let mut sums = dev.zeros::<f64>(bce_sum_len(n))?;
    let at = bce_sum_queued(dev, logits, labels, n, &mut sums)?;
    let mut v = [0f64];
    dev.stream.memcpy_dtoh(&sums.slice(at..at + 1), &mut v).map_err(GpuError::driver("reading the loss"))?;
    dev.synchronize()?;
    Ok(v[0])
}

/// `bce_sum`'s chunk (BCE_CHUNK in loss.cu).
const CHUNK: usize = 2048;

/// The values [`bce_sum_queued`] needs in its buffer for `n` logits.
pub(crate) fn bce_sum_len(n: usize) -> usize {
    n.div_ceil(CHUNK) + 1
}

/// [`bce_sum`] queued on the stream without waiting: the blocks' partial
/// sums go to the front of `sums` (at least [`bce_sum_len`] values) and the
/// total after them, at the index returned.
pub(crate) fn bce_sum_queued(
    dev: &Device,
    logits: &CudaSlice<f32>,
    labels: &CudaSlice<f32>,
    n: usize,
    sums: &mut CudaSlice<f64>,
) -> Result<usize, GpuError> {
    const OP: &str = "bce sum";
    for (name, b) in [("logits", logits), ("labels", labels)] {
        check::len(OP, name, b, n, || format!("{n} values"))?;
    }
    let blocks = n.div_ceil(CHUNK);
    check::len(OP, "sums", sums, blocks + 1, || format!("{blocks} blocks and their total"))?;
    if n == 0 {
        dev.stream.memset_zeros(&mut sums.slice_mut(0..1)).map_err(GpuError::driver("clearing the loss"))?;
        return Ok(0);
    }
    let blocks32 = check::u32_of(OP, "blocks", blocks)?;
    let n64 = n as u64;
    let cfg = LaunchConfig { grid_dim: (blocks32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let (mut head, mut rest) = sums.split_at_mut(blocks);
    let mut launch = dev.stream.launch_builder(dev.function("bce_sum"));
    launch.arg(logits).arg(labels).arg(&n64).arg(&mut head);
    // SAFETY: both inputs hold at least n values; one block of 256 threads per chunk, one part each.
    unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching bce_sum"))?;
    let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut launch = dev.stream.launch_builder(dev.function("sum_f64"));
    launch.arg(&mut head).arg(&blocks32).arg(&mut rest);
    // SAFETY: `head` holds the blocks' parts, `rest` at least one value; one block of 256 threads.
    unsafe { launch.launch(one) }.map_err(GpuError::driver("launching sum_f64"))?;
    Ok(blocks)
}

/// Sets `flag[0]` to 1 when `sums[at]` (a loss [`bce_sum_queued`] left there)
/// is not finite, else to 0, without waiting: the updates that read the flag
/// skip themselves after a non-finite loss. Also sets `cleared[0]` to 0 (a
/// flag the rest of the step may set), saving the step a memset.
pub(crate) fn loss_guard(
    dev: &Device,
    (sums, at): (&CudaSlice<f64>, usize),
    flag: &mut CudaSlice<u32>,
    cleared: &mut CudaSlice<u32>,
) -> Result<(), GpuError> {
    const OP: &str = "loss guard";
    check::len(OP, "sums", sums, at + 1, || format!("a loss at {at}"))?;
    check::len(OP, "flag", flag, 1, || "one word".to_string())?;
    check::len(OP, "cleared", cleared, 1, || "one word".to_string())?;
    let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
    let loss = sums.slice(at..at + 1);
    let mut launch = dev.stream.launch_builder(dev.function("loss_guard"));
    launch.arg(&loss).arg(flag).arg(cleared);
    // SAFETY: `loss` is one value inside `sums`, `flag` and `cleared` hold a word each; one thread.
    unsafe { launch.launch(one) }.map_err(GpuError::driver("launching loss_guard"))?;
    Ok(())
}
