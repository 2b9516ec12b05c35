//! Rows of a device table copied to or from a list of row numbers, bit for
//! bit: the rows a host reads back (a checkpoint, a mirror) and the rows a
//! restore writes, so that only those rows cross PCIe; and a list of rows
//! updated from the host's gradients ([`update_rows`]).
//!
//! Invariants: the callers check every row number against the table on the
//! host before it reaches the device; a scatter's row numbers are distinct.

use crate::sparse::{RowTable, SparseRule};
use crate::{check, Device, GpuError};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

/// Values (rows × width) copied per launch at most: 64 MiB of rows, whatever
/// their width, so a read's scratch stays small beside the table.
const CHUNK_VALUES: usize = 1 << 24;

/// Rows of width `dim` copied per launch (see [`CHUNK_VALUES`]; at least one).
pub(crate) fn chunk_rows(dim: usize) -> usize {
    (CHUNK_VALUES / dim.max(1)).max(1)
}

/// Device buffers a read or write of rows reuses from call to call (grown, never shrunk).
#[derive(Debug, Default)]
pub(crate) struct RowScratch {
    pub(crate) at: Option<CudaSlice<u32>>,
    pub(crate) values: Option<CudaSlice<f32>>,
    pub(crate) state: Option<CudaSlice<f32>>,
}

/// The rows (`at.len() × dim`) and optimizer states (one each) of `table`'s rows
/// `at` (each below its row count, checked by the caller), in their order,
/// [`chunk_rows`] at a time. Waits for the device.
pub(crate) fn read_rows(
    dev: &Device,
    table: &RowTable,
    at: &[u32],
    s: &mut RowScratch,
) -> Result<(Vec<f32>, Vec<f32>), GpuError> {
    let mut state = Vec::with_capacity(at.len());
    let rows = read(dev, table, at, s, Some(&mut state))?;
    Ok((rows, state))
}

/// The rows (`at.len() × dim`) of `table`'s rows `at`, as [`read_rows`]
/// without their states (a lookup's). Waits for the device.
pub(crate) fn read_values(
    dev: &Device,
    table: &RowTable,
    at: &[u32],
    s: &mut RowScratch,
) -> Result<Vec<f32>, GpuError> {
    read(dev, table, at, s, None)
}

/// [`read_rows`], the states into `state` when given.
fn read(
    dev: &Device,
    table: &RowTable,
    at: &[u32],
    s: &mut RowScratch,
    mut state: Option<&mut Vec<f32>>,
) -> Result<Vec<f32>, GpuError> {
    let d = table.dim;
    let mut rows = Vec::with_capacity(at.len() * d);
    for chunk in at.chunks(chunk_rows(d)) {
        let n = chunk.len();
        let d_at = dev.upload_into(&mut s.at, chunk)?;
        let r = dev.grown(&mut s.values, n * d)?;
        gather_rows(dev, (&table.rows, d), d_at, n, r)?;
        if let Some(state) = state.as_deref_mut() {
            let st = dev.grown(&mut s.state, n)?;
            gather_rows(dev, (&table.state, 1), d_at, n, st)?;
            state.extend(dev.download(st, n)?);
        }
        rows.extend(dev.download(r, n * d)?);
    }
    Ok(rows)
}

/// Uploads the distinct row numbers `at` (each below the table's row count,
/// checked by the caller) and their gradients `grads` (`at.len() × dim`)
/// through `s`, and queues their update under `rule`: a batch of rows a host
/// store updates on the device, each once.
pub(crate) fn update_rows(
    dev: &Device,
    table: &mut RowTable,
    s: &mut RowScratch,
    (at, grads): (&[u32], &[f32]),
    rule: SparseRule,
) -> Result<(), GpuError> {
    let d_at = dev.upload_into(&mut s.at, at)?;
    let d_grads = dev.upload_into(&mut s.values, grads)?;
    table.stage_rule(dev, rule)?;
    table.queue_in_range(dev, (d_at, d_grads, at.len()), 1.0, None)
}

/// `out[i · width + c] = src[rows_of[i] · width + c]` for the first `n` row
/// numbers of `rows_of`.
pub(crate) fn gather_rows(
    dev: &Device,
    (src, width): (&CudaSlice<f32>, usize),
    rows_of: &CudaSlice<u32>,
    n: usize,
    out: &mut CudaSlice<f32>,
) -> Result<(), GpuError> {
    const OP: &str = "gather_rows";
    let Some((cfg, w32, n64)) = shape(OP, rows_of, n, width, out.len())? else { return Ok(()) };
    let mut launch = dev.stream.launch_builder(dev.function("gather_rows"));
    launch.arg(src).arg(&w32).arg(rows_of).arg(&n64).arg(out);
    // SAFETY: `rows_of` holds n row numbers, each a row of `src` (checked by the
    // caller); `out` holds n × width values (checked by `shape`).
    unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching gather_rows"))?;
    Ok(())
}

/// `dst[rows_of[i] · width + c] = values[i · width + c]` for the first `n`
/// (distinct) row numbers of `rows_of`.
pub(crate) fn scatter_rows(
    dev: &Device,
    (dst, width): (&mut CudaSlice<f32>, usize),
    rows_of: &CudaSlice<u32>,
    n: usize,
    values: &CudaSlice<f32>,
) -> Result<(), GpuError> {
    const OP: &str = "scatter_rows";
    let Some((cfg, w32, n64)) = shape(OP, rows_of, n, width, values.len())? else { return Ok(()) };
    let mut launch = dev.stream.launch_builder(dev.function("scatter_rows"));
    launch.arg(dst).arg(&w32).arg(rows_of).arg(&n64).arg(values);
    // SAFETY: `rows_of` holds n distinct row numbers, each a row of `dst` (checked
    // by the caller); `values` holds n × width values (checked by `shape`).
    unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching scatter_rows"))?;
    Ok(())
}

/// The launch of a copy of `n` rows of `width` whose packed side holds
/// `packed_len` values, with the width and count as the kernel takes them;
/// `None` when there is nothing to copy.
fn shape(
    op: &'static str,
    rows_of: &CudaSlice<u32>,
    n: usize,
    width: usize,
    packed_len: usize,
) -> Result<Option<(LaunchConfig, u32, u64)>, GpuError> {
    if n == 0 {
        return Ok(None);
    }
    check::len(op, "row numbers", rows_of, n, || format!("{n} rows"))?;
    let packed = check::product(op, &[n, width])?;
    if packed_len < packed {
        return Err(GpuError::shape(op, format!("{packed_len} values for {n} rows of width {width}")));
    }
    Ok(Some((check::grid_for(packed.min(1 << 22)), check::u32_of(op, "width", width)?, n as u64)))
}
