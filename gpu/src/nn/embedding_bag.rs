//! Embedding-bag pooling of one field on the device, and its gradient,
//! mirroring `tiderec_operators::nn::embedding_bag::{pool_sum, pool_sum_backward}`:
//! `pooled[b, field, :] = Σ_k w_k · unique[index[k], :]` over the bag's entries
//! in order; an empty bag pools to zeros.
//!
//! Both functions check the offsets and indices on the device first and
//! return [`GpuError::Index`] for a bad one (this reads a flag back, so they
//! wait for the stream). The backward adds into `dunique` deterministically:
//! the entries are sorted by row (stable), and one warp per distinct row adds
//! the row's terms in entry order, as the CPU does.

use crate::check::{self, grid_for};
use crate::sort::{check_below, check_offsets, sort_keys};
use crate::{Device, GpuError};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

/// How a bag's entries are weighted.
#[derive(Clone, Copy, Debug)]
pub enum Pooling<'a> {
    /// Each entry counts once (no product).
    Sum,
    /// Each entry of a bag of `n` has weight `1 / n` (computed in fp32 as the batch builder does).
    Mean,
    /// Entry `k` has weight `weights[k]`.
    Weighted(&'a CudaSlice<f32>),
}

/// The bags of one field: bag `b` holds entries `offsets[b] .. offsets[b + 1]`
/// of `index` (row numbers into `unique`).
#[derive(Clone, Copy, Debug)]
pub struct Bags<'a> {
    /// `batch + 1` offsets, from 0 to `entries`.
    pub offsets: &'a CudaSlice<u32>,
    /// `entries` row numbers.
    pub index: &'a CudaSlice<u32>,
    /// Bags (samples).
    pub batch: usize,
    /// Entries over all bags.
    pub entries: usize,
}

/// Where the pooled rows go: `field` of `num_fields` per sample, width `dim`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolShape {
    /// Row width.
    pub dim: usize,
    /// This field.
    pub field: usize,
    /// Fields per sample in the pooled output.
    pub num_fields: usize,
    /// Rows in `unique`.
    pub num_unique: usize,
}

/// Checks the shapes and the indices; returns the kernel's weight mode and weights buffer.
fn prepare<'a>(
    dev: &Device,
    op: &'static str,
    bags: &Bags<'a>,
    pooling: Pooling<'a>,
    shape: &PoolShape,
    fallback: &'a CudaSlice<f32>,
) -> Result<(i32, &'a CudaSlice<f32>), GpuError> {
    check::positive(op, "dim", shape.dim)?;
    if shape.field >= shape.num_fields {
        return Err(GpuError::shape(op, format!("field {} of {} fields", shape.field, shape.num_fields)));
    }
    check::len(op, "index", bags.index, bags.entries, || format!("{} entries", bags.entries))?;
    check_offsets(dev, op, bags.offsets, bags.batch, bags.entries)?;
    check_below(dev, op, "row", bags.index, bags.entries, shape.num_unique)?;
    Ok(match pooling {
        Pooling::Sum => (0, fallback),
        Pooling::Mean => (1, fallback),
        Pooling::Weighted(w) => {
            check::len(op, "weights", w, bags.entries, || format!("{} entries", bags.entries))?;
            (2, w)
        }
    })
}

fn u32s(op: &'static str, bags: &Bags<'_>, shape: &PoolShape) -> Result<[u32; 6], GpuError> {
    Ok([
        check::u32_of(op, "num_unique", shape.num_unique)?,
        check::u32_of(op, "dim", shape.dim)?,
        check::u32_of(op, "batch", bags.batch)?,
        check::u32_of(op, "field", shape.field)?,
        check::u32_of(op, "num_fields", shape.num_fields)?,
        check::u32_of(op, "entries", bags.entries)?,
    ])
}

/// Pools one field of `unique[num_unique × dim]` into `pooled[batch × num_fields × dim]`.
pub fn pool_forward(
    dev: &Device,
    unique: &CudaSlice<f32>,
    bags: Bags<'_>,
    pooling: Pooling<'_>,
    shape: PoolShape,
    pooled: &mut CudaSlice<f32>,
) -> Result<(), GpuError> {
    const OP: &str = "embedding-bag pooling";
    let d = shape.dim;
    check::len(OP, "unique", unique, check::product(OP, &[shape.num_unique, d])?, || {
        format!("{} rows × {d}", shape.num_unique)
    })?;
    check::len(OP, "pooled", pooled, check::product(OP, &[bags.batch, shape.num_fields, d])?, || {
        format!("batch {} × {} fields × {d}", bags.batch, shape.num_fields)
    })?;
    let none = dev.zeros::<f32>(1)?;
    let (mode, weights) = prepare(dev, OP, &bags, pooling, &shape, &none)?;
    if bags.batch == 0 {
        return Ok(());
    }
    let [nu, dim, batch, field, nf, _] = u32s(OP, &bags, &shape)?;
    let cfg = check::block_per_item(OP, bags.batch, d.clamp(32, 128).next_multiple_of(32) as u32, 0)?;
    let mut launch = dev.stream.launch_builder(dev.function("pool_forward"));
    launch
        .arg(unique)
        .arg(&nu)
        .arg(&dim)
        .arg(bags.offsets)
        .arg(bags.index)
        .arg(weights)
        .arg(&mode)
        .arg(&batch)
        .arg(&field)
        .arg(&nf)
        .arg(pooled);
    // SAFETY: the offsets and indices were checked on the device above, the buffers' sizes on the host.
    unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching pool_forward"))?;
    Ok(())
}

/// Adds the pooling's adjoint into `dunique[num_unique × dim]` from `dpooled[batch × num_fields × dim]`.
pub fn pool_backward(
    dev: &Device,
    dpooled: &CudaSlice<f32>,
    bags: Bags<'_>,
    pooling: Pooling<'_>,
    shape: PoolShape,
    dunique: &mut CudaSlice<f32>,
) -> Result<(), GpuError> {
    const OP: &str = "embedding-bag pooling backward";
    let d = shape.dim;
    check::len(OP, "dunique", dunique, check::product(OP, &[shape.num_unique, d])?, || {
        format!("{} rows × {d}", shape.num_unique)
    })?;
    check::len(OP, "dpooled", dpooled, check::product(OP, &[bags.batch, shape.num_fields, d])?, || {
        format!("batch {} × {} fields × {d}", bags.batch, shape.num_fields)
    })?;
    let none = dev.zeros::<f32>(1)?;
    let (mode, weights) = prepare(dev, OP, &bags, pooling, &shape, &none)?;
    if bags.entries == 0 {
        return Ok(());
    }
    let [nu, dim, batch, field, nf, entries] = u32s(OP, &bags, &shape)?;
    let mut bag_of = dev.zeros::<u32>(bags.entries)?;
    {
        let mut launch = dev.stream.launch_builder(dev.function("entry_bags"));
        launch.arg(bags.offsets).arg(&batch).arg(&mut bag_of);
        // SAFETY: the offsets were checked to end at `entries`, the length of `bag_of`.
        unsafe { launch.launch(grid_for(bags.batch)) }.map_err(GpuError::driver("launching entry_bags"))?;
    }
    let sorted = sort_keys(dev, OP, bags.index, bags.entries, shape.num_unique)?;
    let cfg: LaunchConfig = check::warp_per_item(OP, bags.entries, 0)?;
    let mut launch = dev.stream.launch_builder(dev.function("pool_backward_rows"));
    launch
        .arg(dpooled)
        .arg(&dim)
        .arg(bags.offsets)
        .arg(&bag_of)
        .arg(&sorted.keys)
        .arg(&sorted.pos)
        .arg(&entries)
        .arg(weights)
        .arg(&mode)
        .arg(&field)
        .arg(&nf)
        .arg(&nu)
        .arg(dunique);
    // SAFETY: sorted rows are below num_unique (checked), positions below entries, bags below batch.
    unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching pool_backward_rows"))?;
    Ok(())
}
