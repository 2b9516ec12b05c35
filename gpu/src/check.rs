//! Shape checks and launch geometry shared by the operation wrappers.

use crate::GpuError;
use cudarc::driver::{DeviceSlice, LaunchConfig};

/// Fails unless `buf` holds at least `needed` values.
pub(crate) fn len<T, S: DeviceSlice<T> + ?Sized>(
    op: &'static str,
    name: &str,
    buf: &S,
    needed: usize,
    shape: impl FnOnce() -> String,
) -> Result<(), GpuError> {
    if buf.len() < needed {
        return Err(GpuError::shape(
            op,
            format!("`{name}` holds {} values, {} needed ({})", buf.len(), needed, shape()),
        ));
    }
    Ok(())
}

/// `a · b · …` without overflow.
pub(crate) fn product(op: &'static str, factors: &[usize]) -> Result<usize, GpuError> {
    factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .ok_or_else(|| GpuError::shape(op, format!("the size {factors:?} overflows")))
}

/// `v` as the `unsigned int` a kernel takes.
pub(crate) fn u32_of(op: &'static str, name: &str, v: usize) -> Result<u32, GpuError> {
    u32::try_from(v).map_err(|_| GpuError::shape(op, format!("`{name}` = {v} does not fit 32 bits")))
}

/// Fails when `v` is zero.
pub(crate) fn positive(op: &'static str, name: &str, v: usize) -> Result<(), GpuError> {
    if v == 0 {
        return Err(GpuError::shape(op, format!("`{name}` must be at least 1")));
    }
    Ok(())
}

/// Threads per block of the elementwise kernels.
pub(crate) const THREADS: u32 = 256;

/// A grid of `THREADS`-thread blocks, one thread per item of `n` (at least one block).
pub(crate) fn grid_for(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(THREADS as usize).clamp(1, i32::MAX as usize) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// One block of `threads` per item (`n` items, positive, within the grid limit).
pub(crate) fn block_per_item(op: &'static str, n: usize, threads: u32, smem: usize) -> Result<LaunchConfig, GpuError> {
    let blocks = u32::try_from(n)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| GpuError::shape(op, format!("{n} blocks exceed the grid limit")))?;
    if smem > MAX_SHARED {
        return Err(GpuError::shape(
            op,
            format!("needs {smem} bytes of shared memory per block, at most {MAX_SHARED}"),
        ));
    }
    Ok(LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: smem as u32 })
}

/// Dynamic shared memory one block may take without opting in to more (48 KiB on every device).
pub(crate) const MAX_SHARED: usize = 48 * 1024;

/// One warp per item, `WARPS_PER_BLOCK` warps a block, `smem_per_warp` bytes of shared memory each.
pub(crate) fn warp_per_item(op: &'static str, n: usize, smem_per_warp: usize) -> Result<LaunchConfig, GpuError> {
    let blocks = n.div_ceil(WARPS_PER_BLOCK);
    block_per_item(op, blocks, (WARPS_PER_BLOCK * 32) as u32, smem_per_warp * WARPS_PER_BLOCK)
}

/// One warp per item, as many warps a block (up to `max_warps`) as leave each
/// its `smem_per_warp` bytes of shared memory within [`MAX_SHARED`]; the
/// kernel finds its warps per block as `blockDim.x / 32`.
pub(crate) fn warps_sharing_memory(
    op: &'static str,
    n: usize,
    smem_per_warp: usize,
    max_warps: usize,
) -> Result<LaunchConfig, GpuError> {
    let warps = (MAX_SHARED / smem_per_warp.max(1)).clamp(1, max_warps.max(1));
    block_per_item(op, n.div_ceil(warps), (warps * 32) as u32, smem_per_warp * warps)
}

/// Warps per block of the warp-per-row kernels.
pub(crate) const WARPS_PER_BLOCK: usize = 4;
