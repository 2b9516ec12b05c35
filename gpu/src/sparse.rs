//! Sparse row updates on the device, mirroring the CPU owner's step
//! (`operators/src/train/owner.rs` and `optim::apply_row`): the gradients of
//! duplicate rows are summed in entry order, the sum is scaled once, and each
//! distinct row is updated once with SGD or row-wise Adagrad.
//!
//! The duplicates are grouped on the device by a stable radix sort of the row
//! numbers; then each distinct row's entries are summed in entry order (the
//! first copied, the others added) by one thread for a short run of
//! duplicates, by a warp for a long one, and the row is updated once. No atomics
//! touch a value, so a step gives the same table on every run.

use crate::check;
use crate::sort::{check_below, sort_keys_with, SortScratch};
use crate::{Device, GpuError};
use cudarc::driver::{CudaSlice, PushKernelArg};

/// The sparse optimizers the device implements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SparseRule {
    /// `w -= lr · g`.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// `a += Σ_c g_c² / dim; w -= lr / (√a + eps) · g`, one accumulator per row.
    RowwiseAdagrad {
        /// Learning rate.
        lr: f32,
        /// Denominator guard.
        eps: f32,
    },
}

/// A dense table of `num_rows × dim` embedding rows on the device with one
/// optimizer value per row (row-wise Adagrad's accumulator; unused by SGD),
/// addressed by row number. The table the update kernels work on, not an
/// embedding store.
#[derive(Debug)]
pub struct RowTable {
    /// The rows, row-major.
    pub rows: CudaSlice<f32>,
    /// One optimizer value per row.
    pub state: CudaSlice<f32>,
    /// Rows in the table.
    pub num_rows: usize,
    /// Row width.
    pub dim: usize,
    /// The sort's buffers, kept from step to step.
    sort: SortScratch,
}

impl RowTable {
    /// A table holding `rows` (`num_rows × dim`) and `state` (`num_rows`).
    pub fn upload(dev: &Device, rows: &[f32], state: &[f32], dim: usize) -> Result<RowTable, GpuError> {
        const OP: &str = "row table";
        check::positive(OP, "dim", dim)?;
        if !rows.len().is_multiple_of(dim) || state.len() != rows.len() / dim {
            return Err(GpuError::shape(
                OP,
                format!("{} values are not {} rows of width {dim}", rows.len(), state.len()),
            ));
        }
        Ok(RowTable {
            rows: dev.upload(rows)?,
            state: dev.upload(state)?,
            num_rows: state.len(),
            dim,
            sort: SortScratch::default(),
        })
    }

    /// Applies one step: `ids[k]` (`entries` row numbers, duplicates allowed)
    /// with gradient `grads[k·dim ..][..dim]`, each row's sum scaled by `scale`.
    /// Fails with [`GpuError::Index`] (before changing anything) for a row
    /// number outside the table. Waits for the stream (the check reads back).
    pub fn apply(
        &mut self,
        dev: &Device,
        rule: SparseRule,
        ids: &CudaSlice<u32>,
        grads: &CudaSlice<f32>,
        entries: usize,
        scale: f32,
    ) -> Result<(), GpuError> {
        const OP: &str = "sparse row update";
        check::len(OP, "ids", ids, entries, || format!("{entries} entries"))?;
        check_below(dev, OP, "row", ids, entries, self.num_rows)?;
        self.apply_in_range(dev, rule, (ids, grads, entries), scale, None)
    }

    /// [`apply`](Self::apply) for row numbers the caller has checked to be
    /// below `num_rows` (on the host, say): no check on the device, no wait.
    /// With `skip`, the device updates nothing while `skip[0]` is not zero when
    /// the update runs (a step whose loss was not finite).
    pub(crate) fn apply_in_range(
        &mut self,
        dev: &Device,
        rule: SparseRule,
        (ids, grads, entries): (&CudaSlice<u32>, &CudaSlice<f32>, usize),
        scale: f32,
        skip: Option<&CudaSlice<u32>>,
    ) -> Result<(), GpuError> {
        const OP: &str = "sparse row update";
        let d = self.dim;
        check::len(OP, "ids", ids, entries, || format!("{entries} entries"))?;
        check::len(OP, "grads", grads, check::product(OP, &[entries, d])?, || format!("{entries} entries × {d}"))?;
        check::len(OP, "rows", &self.rows, self.num_rows * d, || format!("{} rows × {d}", self.num_rows))?;
        check::len(OP, "state", &self.state, self.num_rows, || format!("{} rows", self.num_rows))?;
        if entries == 0 {
            return Ok(());
        }
        let pair = sort_keys_with(dev, OP, (ids, entries, self.num_rows), &mut self.sort)?;
        let (sorted_keys, sorted_pos) = self.sort.sorted(pair).ok_or_else(|| GpuError::shape(OP, "nothing sorted"))?;
        let (kind, lr, eps) = match rule {
            SparseRule::Sgd { lr } => (0i32, lr, 0.0f32),
            SparseRule::RowwiseAdagrad { lr, eps } => (1, lr, eps),
        };
        let (n32, d32, rows32) = (
            check::u32_of(OP, "entries", entries)?,
            check::u32_of(OP, "dim", d)?,
            check::u32_of(OP, "num_rows", self.num_rows)?,
        );
        // One warp per 32 sorted entries, dim floats of shared memory each.
        let cfg = check::warp_per_item(OP, entries.div_ceil(32), d * 4)?;
        let mut launch = dev.stream.launch_builder(dev.function("sparse_update_rows"));
        launch
            .arg(skip.unwrap_or(&dev.never))
            .arg(sorted_keys)
            .arg(sorted_pos)
            .arg(&n32)
            .arg(grads)
            .arg(&d32)
            .arg(&scale)
            .arg(&kind)
            .arg(&lr)
            .arg(&eps)
            .arg(&rows32)
            .arg(&mut self.rows)
            .arg(&mut self.state);
        // SAFETY: every sorted row is below num_rows (checked), every position below entries;
        // the shared memory holds dim floats per warp; `skip` holds one word.
        unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching sparse_update_rows"))?;
        Ok(())
    }
}
