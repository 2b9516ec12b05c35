//! The tiered store's hot tier on a GPU worker's device (PICASSO's HybridHash
//! as a GPU keeps it): [`DeviceHotTier`] holds the hot rows and their
//! optimizer state in device memory, in the tiered store's slot order, behind
//! [`HotTierMemory`]; [`device_tiered_store`] puts it under the tiered store,
//! whose plan, frequencies and cold tier stay on the host
//! ([`OffloadedTieredStore`]).
//!
//! ## Invariants
//!
//! * **The rows allocated once.** The device holds `hot_rows` rows (the
//!   tier's capacity) from the start; a load (after a re-plan or a restore)
//!   copies the `n ≤ hot_rows` rows of the new layout over its front. Only the
//!   buffers of reads and updates grow, when a call is larger than any before.
//! * **The fixed store's row update.** An update is the device row update
//!   with each slot once, its gradient summed over the senders and averaged
//!   on the host, as [`DeviceShard`](crate::device_shard::DeviceShard)'s: SGD
//!   and row-wise Adagrad with no L2 penalty ([`supports`]).
//! * **Slots are checked on the host** against the rows loaded before they
//!   reach the device.

use crate::device_shard::row_rule;
use crate::row_copy::{read_values, update_rows, RowScratch};
use crate::sparse::RowTable;
use crate::{Device, GpuError};
use tiderec_operators::optim::{OptimizerParams, SparseOptimizerKind};
use tiderec_operators::store::{HotTierMemory, OffloadedTieredStore, StoreKind, TieredStore};
use tiderec_operators::train::TrainerConfig;

/// A failure of the hot tier's device, naming it.
#[derive(Debug, thiserror::Error)]
#[error("CUDA device {ordinal}: {error}")]
pub struct HotTierError {
    /// The device.
    pub ordinal: usize,
    /// What failed.
    pub error: GpuError,
}

/// The hot rows of a tiered store on a device (see the module docs).
#[derive(Debug)]
pub struct DeviceHotTier {
    dev: Device,
    /// `capacity` rows and their states.
    table: RowTable,
    /// Rows loaded.
    len: usize,
    /// Optimizer values per row on the host: 0 (SGD) or 1 (row-wise Adagrad).
    state_width: usize,
    scratch: RowScratch,
}

/// Why `config`'s tiered store cannot keep its hot tier on a GPU worker's
/// device, if it cannot.
pub fn supports(config: &TrainerConfig) -> Result<(), String> {
    if config.store.kind != StoreKind::Tiered {
        return Err("only the tiered store keeps a hot tier".into());
    }
    crate::device_shard::rows_update_on_device(config)
}

/// Worker `worker` of `workers`'s tiered store under `config`, its hot tier
/// on `dev` (every row cold until the first plan).
pub fn device_tiered_store(
    dev: &Device,
    config: &TrainerConfig,
    (worker, workers): (usize, usize),
) -> Result<OffloadedTieredStore<DeviceHotTier>, GpuError> {
    supports(config).map_err(GpuError::Unsupported)?;
    config.store.validate().map_err(|e| GpuError::Unsupported(format!("the tiered store: {e}")))?;
    let (dim, optimizer) = (config.model.embedding_dim(), config.sparse_optimizer);
    let memory = DeviceHotTier::new(dev, dim, optimizer.state_width(dim), config.store.hot_rows)?;
    OffloadedTieredStore::new(TieredStore::new(&config.store, &config.store_params((worker, workers))), memory)
        .map_err(|e| GpuError::Unsupported(format!("the tiered store: {e}")))
}

impl DeviceHotTier {
    /// Room for `capacity` rows of width `dim` on `dev`, with `state_width`
    /// (0 or 1) optimizer values each on the host.
    pub fn new(dev: &Device, dim: usize, state_width: usize, capacity: usize) -> Result<Self, GpuError> {
        if state_width > 1 {
            return Err(GpuError::Unsupported(format!("{state_width} optimizer values per row on the device")));
        }
        Ok(DeviceHotTier {
            table: RowTable::zeros(dev, capacity, dim)?,
            dev: dev.clone(),
            len: 0,
            state_width,
            scratch: RowScratch::default(),
        })
    }

    /// `error` as this tier's failure.
    fn failed(&self, error: GpuError) -> HotTierError {
        HotTierError { ordinal: self.dev.ordinal(), error }
    }

    /// Checks `slots` against the rows loaded.
    fn check_slots(&self, op: &'static str, slots: &[u32]) -> Result<(), GpuError> {
        match slots.iter().find(|&&h| h as usize >= self.len) {
            Some(h) => Err(GpuError::Index { op, message: format!("hot slot {h} of {} rows", self.len) }),
            None => Ok(()),
        }
    }

    fn try_load(&mut self, rows: &[f32], state: &[f32]) -> Result<(), GpuError> {
        const OP: &str = "loading the hot tier";
        let (d, w) = (self.table.dim, self.state_width);
        let n = rows.len() / d;
        if rows.len() != n * d || state.len() != n * w || n > self.table.num_rows {
            return Err(GpuError::shape(
                OP,
                format!(
                    "{} values and {} states for {} rows of width {d}",
                    rows.len(),
                    state.len(),
                    self.table.num_rows
                ),
            ));
        }
        if n > 0 {
            let stream = &self.dev.stream;
            stream
                .memcpy_htod(rows, &mut self.table.rows.slice_mut(..n * d))
                .map_err(GpuError::driver("copying the hot rows to the device"))?;
            if w == 1 {
                stream
                    .memcpy_htod(state, &mut self.table.state.slice_mut(..n))
                    .map_err(GpuError::driver("copying the hot rows' state to the device"))?;
            }
        }
        self.len = n;
        Ok(())
    }

    fn try_read_all(&mut self, rows: &mut [f32], state: &mut [f32]) -> Result<(), GpuError> {
        let (n, d, w) = (self.len, self.table.dim, self.state_width);
        if rows.len() != n * d || state.len() != n * w {
            return Err(GpuError::shape(
                "reading the hot tier",
                format!("room for {} values and {} states, {n} rows of width {d} held", rows.len(), state.len()),
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let stream = &self.dev.stream;
        stream
            .memcpy_dtoh(&self.table.rows.slice(..n * d), rows)
            .map_err(GpuError::driver("copying the hot rows from the device"))?;
        if w == 1 {
            stream
                .memcpy_dtoh(&self.table.state.slice(..n), state)
                .map_err(GpuError::driver("copying the hot rows' state from the device"))?;
        }
        self.dev.synchronize()
    }

    fn try_read(&mut self, slots: &[u32], out: &mut Vec<f32>) -> Result<(), GpuError> {
        self.check_slots("serving hot rows", slots)?;
        out.extend_from_slice(&read_values(&self.dev, &self.table, slots, &mut self.scratch)?);
        Ok(())
    }

    fn try_update(
        &mut self,
        slots: &[u32],
        grads: &[f32],
        kind: SparseOptimizerKind,
        hp: &OptimizerParams,
    ) -> Result<(), GpuError> {
        const OP: &str = "updating hot rows";
        let d = self.table.dim;
        if grads.len() != slots.len() * d {
            return Err(GpuError::shape(
                OP,
                format!("{} gradient values for {} rows of width {d}", grads.len(), slots.len()),
            ));
        }
        self.check_slots(OP, slots)?;
        if slots.is_empty() {
            return Ok(());
        }
        update_rows(&self.dev, &mut self.table, &mut self.scratch, (slots, grads), row_rule(kind, hp)?)
    }
}

impl HotTierMemory for DeviceHotTier {
    type Error = HotTierError;
    fn dim(&self) -> usize {
        self.table.dim
    }
    fn load(&mut self, rows: &[f32], state: &[f32]) -> Result<(), HotTierError> {
        self.try_load(rows, state).map_err(|e| self.failed(e))
    }
    fn read_all(&mut self, rows: &mut [f32], state: &mut [f32]) -> Result<(), HotTierError> {
        self.try_read_all(rows, state).map_err(|e| self.failed(e))
    }
    fn read(&mut self, slots: &[u32], out: &mut Vec<f32>) -> Result<(), HotTierError> {
        self.try_read(slots, out).map_err(|e| self.failed(e))
    }
    fn update(
        &mut self,
        slots: &[u32],
        grads: &[f32],
        kind: SparseOptimizerKind,
        hp: &OptimizerParams,
    ) -> Result<(), HotTierError> {
        self.try_update(slots, grads, kind, hp).map_err(|e| self.failed(e))
    }
}
