//! Sparse row updates on the device, mirroring the CPU owner's step
//! (`operators/src/train/owner.rs` and `optim::apply_row`): the gradients of
//! duplicate rows are summed in entry order, the sum is scaled once, and each
//! distinct row is updated once with SGD or row-wise Adagrad.
//!
//! The duplicates are grouped on the device by a stable radix sort of the row
//! numbers; then each distinct row's entries are summed in entry order (the
//! first copied, the others added) by one thread for a short run of
//! duplicates, by a warp for a long one, and the row is updated once. A hot
//! row — a run of at least [`HotRows::Split`]'s `min_run` duplicates — is
//! split: whole chunks of [`CHUNK`] sorted positions are summed in parallel,
//! one warp each, and the run's warp adds the chunks' sums in chunk order, so
//! a row repeated thousands of times does not serialise the update on one
//! warp. That order is fixed by the sorted positions, so it does not change
//! between runs, but it is not the CPU's (the two agree to rounding).
//! No atomics touch a value, so a step gives the same table on every run.
//!
//! The learning rate, a schedule's value that changes from step to step, is
//! written to device memory before the update is queued
//! (`RowTable::stage_rule`, then the queued update reads it), so the queued
//! update can be captured in a CUDA graph and replayed with each step's rate.

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

/// Sorted positions per chunk of a hot row's run summed by one warp.
pub const CHUNK: usize = 64;

/// How the update sums the duplicates of a hot row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HotRows {
    /// A run of at least `min_run` duplicates (at least 2 [`CHUNK`]s) is summed
    /// from its whole chunks' sums, computed in parallel (the default, with
    /// `min_run` [`DEFAULT_SPLIT_RUN`]).
    Split {
        /// The shortest run that is split.
        min_run: usize,
    },
    /// Every run is summed in entry order by one warp (the CPU's order; a
    /// baseline: a row repeated 20,000 times is 20,000 additions in a row).
    OneWarp,
}

/// The shortest run of duplicates [`HotRows::Split`] splits by default.
pub const DEFAULT_SPLIT_RUN: usize = 4 * CHUNK;

impl Default for HotRows {
    fn default() -> Self {
        HotRows::Split { min_run: DEFAULT_SPLIT_RUN }
    }
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
    /// How hot rows are summed.
    hot_rows: HotRows,
    /// The whole chunks' sums of hot rows (`entries / CHUNK × dim`), kept from step to step.
    partial: Option<CudaSlice<f32>>,
    /// The rule of the next update ([`stage_rule`](Self::stage_rule)); its
    /// learning rate is in `lr`, on the device.
    rule: Option<SparseRule>,
    lr: crate::optim::StepValues,
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
        Self::holding(dev, (dev.upload(rows)?, dev.upload(state)?), state.len(), dim)
    }

    /// A table of `num_rows` rows of width `dim`, every value and state zero.
    pub fn zeros(dev: &Device, num_rows: usize, dim: usize) -> Result<RowTable, GpuError> {
        const OP: &str = "row table";
        check::positive(OP, "dim", dim)?;
        let buffers = (dev.zeros(check::product(OP, &[num_rows, dim])?)?, dev.zeros(num_rows)?);
        Self::holding(dev, buffers, num_rows, dim)
    }

    /// The table of `num_rows` rows of width `dim` in `(rows, state)`, with the
    /// update's buffers still to size.
    fn holding(
        dev: &Device,
        (rows, state): (CudaSlice<f32>, CudaSlice<f32>),
        num_rows: usize,
        dim: usize,
    ) -> Result<RowTable, GpuError> {
        Ok(RowTable {
            rows,
            state,
            num_rows,
            dim,
            sort: SortScratch::default(),
            hot_rows: HotRows::default(),
            partial: None,
            rule: None,
            lr: crate::optim::StepValues::new(dev)?,
        })
    }

    /// Sets how the update sums a hot row's duplicates. A split below two
    /// chunks is refused: the run must hold a whole chunk wherever it starts.
    pub fn set_hot_rows(&mut self, hot_rows: HotRows) -> Result<(), GpuError> {
        if let HotRows::Split { min_run } = hot_rows {
            if min_run < 2 * CHUNK || u32::try_from(min_run).is_err() {
                return Err(GpuError::shape(
                    "row table",
                    format!("a hot row's run of {min_run} is not between {} and {}", 2 * CHUNK, u32::MAX),
                ));
            }
        }
        self.hot_rows = hot_rows;
        Ok(())
    }

    /// How the update sums a hot row's duplicates.
    pub fn hot_rows(&self) -> HotRows {
        self.hot_rows
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
        self.stage_rule(dev, rule)?;
        self.queue_in_range(dev, (ids, grads, entries), scale, None)
    }

    /// Sets the rule of the next update and queues the write of its learning
    /// rate to the device, where [`queue_in_range`](Self::queue_in_range)'s
    /// kernel reads it.
    pub(crate) fn stage_rule(&mut self, dev: &Device, rule: SparseRule) -> Result<(), GpuError> {
        let lr = match rule {
            SparseRule::Sgd { lr } | SparseRule::RowwiseAdagrad { lr, .. } => lr,
        };
        self.lr.set(dev, [lr, 0.0])?;
        self.rule = Some(rule);
        Ok(())
    }

    /// Queues [`apply`](Self::apply)'s update, for row numbers the caller has
    /// checked to be below `num_rows` (on the host, say: no check on the device,
    /// no wait), under the rule [`stage_rule`](Self::stage_rule) set, reading the
    /// learning rate it wrote from the device. With `skip`, the device updates
    /// nothing while `skip[0]` is not zero when the update runs (a step whose
    /// loss was not finite). The launches depend only on the buffers, the entries,
    /// `scale`, the rule's kind and epsilon, and the hot-row setting, so they may
    /// be captured in a CUDA graph.
    pub(crate) fn queue_in_range(
        &mut self,
        dev: &Device,
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
        let (kind, eps) = match self.rule.ok_or_else(|| GpuError::shape(OP, "no rule was staged"))? {
            SparseRule::Sgd { .. } => (0i32, 0.0f32),
            SparseRule::RowwiseAdagrad { eps, .. } => (1, eps),
        };
        let (n32, d32, rows32) = (
            check::u32_of(OP, "entries", entries)?,
            check::u32_of(OP, "dim", d)?,
            check::u32_of(OP, "num_rows", self.num_rows)?,
        );
        let chunk32 = CHUNK as u32;
        let split_min = match self.hot_rows {
            HotRows::Split { min_run } if entries >= min_run => min_run as u32,
            _ => u32::MAX,
        };
        let chunks = entries / CHUNK;
        if split_min != u32::MAX {
            let need = chunks * d;
            let partial = dev.grown(&mut self.partial, need)?;
            let mut launch = dev.stream.launch_builder(dev.function("chunk_partial_sums"));
            launch.arg(sorted_keys).arg(sorted_pos).arg(&n32).arg(grads).arg(&d32).arg(&chunk32).arg(partial);
            // SAFETY: one warp per whole chunk; every sorted position is below entries, and the
            // partial sums hold entries / CHUNK × dim floats.
            unsafe { launch.launch(check::warp_per_item(OP, chunks, 0)?) }
                .map_err(GpuError::driver("launching chunk_partial_sums"))?;
        }
        // One warp per 32 sorted entries, dim floats of shared memory each.
        let cfg = check::warp_per_item(OP, entries.div_ceil(32), d * 4)?;
        let mut launch = dev.stream.launch_builder(dev.function("sparse_update_rows"));
        launch.arg(skip.unwrap_or(&dev.never)).arg(&self.lr.buf).arg(sorted_keys).arg(sorted_pos).arg(&n32).arg(grads);
        // Without a split the kernel never reads the chunks' sums; it still takes a pointer.
        match &self.partial {
            Some(p) if split_min != u32::MAX => launch.arg(p),
            _ => launch.arg(&*dev.never),
        };
        launch
            .arg(&d32)
            .arg(&chunk32)
            .arg(&split_min)
            .arg(&scale)
            .arg(&kind)
            .arg(&eps)
            .arg(&rows32)
            .arg(&mut self.rows)
            .arg(&mut self.state);
        // SAFETY: every sorted row is below num_rows (checked), every position below entries;
        // the shared memory holds dim floats per warp; `skip` holds one word, `lr` two; with a split the
        // chunks' sums were queued above on the same stream.
        unsafe { launch.launch(cfg) }.map_err(GpuError::driver("launching sparse_update_rows"))?;
        Ok(())
    }
}
