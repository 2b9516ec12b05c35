//! The tiered store with its hot tier in another memory (a GPU's): PICASSO's
//! HybridHash as a GPU worker keeps it, the hot rows and their optimizer
//! state on the device, the cold tier in host memory.
//!
//! [`OffloadedTieredStore`] is a [`TieredStore`] (which keeps the plan, the
//! frequencies, the cold tier and a host copy of the hot tier) beside a
//! [`HotTierMemory`] holding the hot rows in the same slot order. Lookups and
//! updates of hot rows go to that memory, in one batch per call; cold rows
//! stay with the tiered store.
//!
//! ## Invariants
//!
//! * **The tiered store's numbers.** Every lookup, update, frequency, re-plan
//!   and eviction is the tiered store's, in the same order; only where a hot
//!   row's values live changes. A memory that updates rows as
//!   [`apply_row`] does (as [`HostHotTier`] does) trains the tiered store's
//!   model bit for bit.
//! * **One copy is current, and the other is brought up to date before it is
//!   read.** Updates make the memory's copy the current one; a re-plan, a
//!   restore and every export work on the host copy, so the memory's copy is
//!   read back first. The memory is loaded again only after the hot tier's
//!   layout or values changed on the host: a re-plan (every `flush_every`
//!   steps), a restore, a reset.
//! * **Failures are recorded, not raised** ([`DeviceStore::take_error`]): a
//!   lookup that fails gives zeros for its hot rows, an export that fails gives
//!   the host copy, and while the memory cannot be loaded the host copy serves
//!   and is updated; the trainer fails the step or the checkpoint on the error.

use super::{DeviceStore, EmbeddingStore, StoreStats, TieredStore};
use crate::optim::{apply_row, OptimizerParams, SparseOptimizerKind};
use crate::snapshot::{SketchCounters, TableRows};
use crate::OperatorError;
use std::cell::{Cell, RefCell};
use std::fmt;

/// A memory holding a tiered store's hot rows and their optimizer state, in
/// slot order (the GPU worker's device; [`HostHotTier`] on the host).
pub trait HotTierMemory: fmt::Debug {
    /// A failure of the memory.
    type Error: fmt::Display;
    /// Row width.
    fn dim(&self) -> usize;
    /// Replaces every row: `rows` (`n × dim`) and `state` (`n × state_width`).
    fn load(&mut self, rows: &[f32], state: &[f32]) -> Result<(), Self::Error>;
    /// Copies every row (`n × dim`) and its state (`n × state_width`) out, `n` as last loaded.
    fn read_all(&mut self, rows: &mut [f32], state: &mut [f32]) -> Result<(), Self::Error>;
    /// The values (`slots.len() × dim`) of rows `slots` (each below `n`), in their order.
    fn read(&mut self, slots: &[u32], out: &mut Vec<f32>) -> Result<(), Self::Error>;
    /// Updates rows `slots` (distinct, each below `n`) with `grads[k · dim ..][..dim]`
    /// as [`apply_row`] does under `kind` and `hp`.
    fn update(
        &mut self,
        slots: &[u32],
        grads: &[f32],
        kind: SparseOptimizerKind,
        hp: &OptimizerParams,
    ) -> Result<(), Self::Error>;
}

/// Hot rows in host memory, updated by [`apply_row`]: the reference for a
/// memory elsewhere, and the tiered store's own numbers.
#[derive(Clone, Debug, Default)]
pub struct HostHotTier {
    dim: usize,
    state_width: usize,
    rows: Vec<f32>,
    state: Vec<f32>,
}

impl HostHotTier {
    /// An empty hot tier of rows of width `dim`, with `state_width` optimizer values each.
    pub fn new(dim: usize, state_width: usize) -> Self {
        HostHotTier { dim, state_width, rows: Vec::new(), state: Vec::new() }
    }
}

impl HotTierMemory for HostHotTier {
    type Error = std::convert::Infallible;
    fn dim(&self) -> usize {
        self.dim
    }
    fn load(&mut self, rows: &[f32], state: &[f32]) -> Result<(), Self::Error> {
        self.rows = rows.to_vec();
        self.state = state.to_vec();
        Ok(())
    }
    fn read_all(&mut self, rows: &mut [f32], state: &mut [f32]) -> Result<(), Self::Error> {
        rows.copy_from_slice(&self.rows);
        state.copy_from_slice(&self.state);
        Ok(())
    }
    fn read(&mut self, slots: &[u32], out: &mut Vec<f32>) -> Result<(), Self::Error> {
        let d = self.dim;
        for &h in slots {
            out.extend_from_slice(&self.rows[h as usize * d..][..d]);
        }
        Ok(())
    }
    fn update(
        &mut self,
        slots: &[u32],
        grads: &[f32],
        kind: SparseOptimizerKind,
        hp: &OptimizerParams,
    ) -> Result<(), Self::Error> {
        update_at((&mut self.rows, &mut self.state), (self.dim, self.state_width), (slots, grads), (kind, hp));
        Ok(())
    }
}

/// Updates the rows `slots` of `rows` (width `d`) and `state` (width `w`) with
/// `grads[k · d ..][..d]` as [`apply_row`] does.
fn update_at(
    (rows, state): (&mut [f32], &mut [f32]),
    (d, w): (usize, usize),
    (slots, grads): (&[u32], &[f32]),
    (kind, hp): (SparseOptimizerKind, &OptimizerParams),
) {
    for (k, &h) in slots.iter().enumerate() {
        let h = h as usize;
        apply_row(kind, hp, &mut rows[h * d..][..d], &grads[k * d..][..d], &mut state[h * w..][..w]);
    }
}

/// A tiered store whose hot tier lives in `M` (see the module docs).
///
/// ```
/// use tiderec_operators::optim::{OptimizerParams, SparseOptimizerKind};
/// use tiderec_operators::store::{
///     DeviceStore, EmbeddingStore, HostHotTier, OffloadedTieredStore, StoreConfig, StoreKind, StoreParams,
///     TieredStore,
/// };
///
/// let config = StoreConfig { kind: StoreKind::Tiered, hot_rows: 2, warmup: 1, flush_every: 1, ..StoreConfig::default() };
/// let (optimizer, hp) = (SparseOptimizerKind::Sgd, OptimizerParams::with_lr(0.1));
/// let p = StoreParams { worker: 0, workers: 1, dim: 4, table_sizes: &[100], seed: 1, optimizer, hp };
/// let mut store = OffloadedTieredStore::new(TieredStore::new(&config, &p), HostHotTier::new(4, 0))?;
/// for step in 0..3 {
///     let mut rows = Vec::new();
///     store.gather(0, &[7, 9, 40], &mut rows);
///     store.apply_rows(&[(0, 7), (0, 9)], &[0.5; 8]);
///     store.end_step(step + 1);
/// }
/// // Rows 7 and 9, updated in two steps, were planned into the hot tier after the second.
/// assert_eq!(store.hot_ids(), [(0, 7), (0, 9)]);
/// assert_eq!(store.stats().hot_hits, 2);
/// assert_eq!(store.take_error(), None);
/// # Ok::<(), tiderec_operators::OperatorError>(())
/// ```
#[derive(Debug)]
pub struct OffloadedTieredStore<M: HotTierMemory> {
    host: RefCell<TieredStore>,
    memory: RefCell<M>,
    /// The memory holds the hot tier as it is now (layout and values).
    memory_current: Cell<bool>,
    /// The host copy of the hot rows holds their values as they are now.
    host_current: Cell<bool>,
    error: RefCell<Option<String>>,
    /// Per call: the hot rows' offsets in the output and slots, and their values or gradients.
    places: Vec<(usize, u32)>,
    slots: Vec<u32>,
    values: Vec<f32>,
}

impl<M: HotTierMemory> OffloadedTieredStore<M> {
    /// `store` (usually new, every row cold) with its hot tier kept in `memory`.
    pub fn new(store: TieredStore, memory: M) -> Result<Self, OperatorError> {
        if memory.dim() != store.dim() {
            return Err(OperatorError::config(
                "store",
                format!("a hot tier of width {} for rows of width {}", memory.dim(), store.dim()),
            ));
        }
        Ok(OffloadedTieredStore {
            host: RefCell::new(store),
            memory: RefCell::new(memory),
            memory_current: Cell::new(false),
            host_current: Cell::new(true),
            error: RefCell::new(None),
            places: Vec::new(),
            slots: Vec::new(),
            values: Vec::new(),
        })
    }

    /// The tiered store's hot rows, hottest first (see [`TieredStore::hot_ids`]).
    pub fn hot_ids(&self) -> Vec<(usize, u64)> {
        self.host.borrow().hot_ids()
    }

    /// Records `what` failing with `e` as this store's failure (the first one is kept).
    fn fail(&self, what: &str, e: impl fmt::Display) {
        let mut error = self.error.borrow_mut();
        if error.is_none() {
            *error = Some(format!("{what}: {e}"));
        }
    }

    /// Loads the hot tier into the memory unless it holds it already.
    fn push(&self) {
        let mut host = self.host.borrow_mut();
        if host.settle_restore() {
            self.memory_current.set(false);
        }
        if self.memory_current.get() {
            return;
        }
        let (rows, state) = host.hot_values();
        match self.memory.borrow_mut().load(rows, state) {
            Ok(()) => {
                // Both copies now hold the same values.
                self.memory_current.set(true);
                self.host_current.set(true);
            }
            Err(e) => self.fail("loading the hot rows", e),
        }
    }

    /// Copies the hot rows' values back to the host unless it holds them already.
    fn pull(&self) {
        if self.host_current.get() {
            return;
        }
        let mut host = self.host.borrow_mut();
        let (rows, state) = host.hot_values_mut();
        match self.memory.borrow_mut().read_all(rows, state) {
            Ok(()) => self.host_current.set(true),
            Err(e) => self.fail("reading the hot rows back", e),
        }
    }

    /// The host copy is about to change: it must hold the current values, and
    /// the memory loads it again before its next use.
    fn edit_on_host(&self) {
        self.pull();
        self.memory_current.set(false);
    }
}

impl<M: HotTierMemory> EmbeddingStore for OffloadedTieredStore<M> {
    fn dim(&self) -> usize {
        self.host.borrow().dim()
    }
    fn state_width(&self) -> usize {
        self.host.borrow().state_width()
    }
    fn gather(&mut self, table: usize, ids: &[u64], out: &mut Vec<f32>) {
        self.gather_many(&[(table, ids)], out);
    }
    /// Every lookup's cold rows from the host, then all their hot rows in one read of the memory.
    fn gather_many(&mut self, lookups: &[(usize, &[u64])], out: &mut Vec<f32>) {
        self.push();
        let d = self.host.get_mut().dim();
        self.places.clear();
        for &(table, ids) in lookups {
            self.host.get_mut().gather_cold(table, ids, out, &mut self.places);
        }
        if self.places.is_empty() {
            return;
        }
        if !self.memory_current.get() {
            // The memory could not be loaded (a failure is recorded): the host copy serves.
            let (rows, _) = self.host.get_mut().hot_values();
            for &(at, h) in &self.places {
                out[at..][..d].copy_from_slice(&rows[h as usize * d..][..d]);
            }
            return;
        }
        self.slots.clear();
        self.slots.extend(self.places.iter().map(|&(_, h)| h));
        self.values.clear();
        match self.memory.get_mut().read(&self.slots, &mut self.values) {
            Ok(()) => {
                for (k, &(at, _)) in self.places.iter().enumerate() {
                    out[at..][..d].copy_from_slice(&self.values[k * d..][..d]);
                }
            }
            Err(e) => self.fail("serving hot rows", e),
        }
    }
    fn apply(&mut self, table: usize, id: u64, grad: &[f32]) {
        self.apply_rows(&[(table as u32, id)], grad);
    }
    fn set_lr(&mut self, lr: f32) {
        self.host.get_mut().set_lr(lr);
    }
    fn end_step(&mut self, completed: u64) {
        if self.host.get_mut().relays_at(completed) {
            self.edit_on_host();
        }
        self.host.get_mut().end_step(completed);
    }
    fn export_table(&self, table: usize) -> TableRows {
        self.pull();
        self.host.borrow().export_table(table)
    }
    fn mark_checkpoint(&mut self) {
        self.host.get_mut().mark_checkpoint();
    }
    fn export_changes(&self, table: usize) -> TableRows {
        self.pull();
        self.host.borrow().export_changes(table)
    }
    fn reset(&mut self, completed: u64) {
        self.host.get_mut().reset(completed);
        self.host_current.set(true);
        self.memory_current.set(false);
    }
    fn set_row(&mut self, table: usize, id: u64, row: &[f32], state: &[f32]) -> Result<(), OperatorError> {
        self.edit_on_host();
        self.host.get_mut().set_row(table, id, row, state)
    }
    fn set_frequency(&mut self, table: usize, id: u64, count: u32, hot: Option<u32>) {
        self.edit_on_host();
        self.host.get_mut().set_frequency(table, id, count, hot);
    }
    fn set_last_seen(&mut self, table: usize, id: u64, step: u64) {
        self.edit_on_host();
        self.host.get_mut().set_last_seen(table, id, step);
    }
    fn admission_counters(&self) -> SketchCounters {
        self.host.borrow().admission_counters()
    }
    fn admission_changes(&self) -> Option<SketchCounters> {
        self.host.borrow().admission_changes()
    }
    fn set_admission_counters(&mut self, counters: &SketchCounters) {
        self.host.get_mut().set_admission_counters(counters);
    }
    fn stats(&self) -> StoreStats {
        self.host.borrow().stats()
    }
    fn num_rows(&self) -> usize {
        self.host.borrow().num_rows()
    }
    fn sum_of_squares(&self) -> f64 {
        self.pull();
        self.host.borrow().sum_of_squares()
    }
    fn holds_every_row(&self) -> bool {
        false
    }
}

impl<M: HotTierMemory> DeviceStore for OffloadedTieredStore<M> {
    fn apply_rows(&mut self, rows: &[(u32, u64)], grads: &[f32]) {
        self.push();
        let host = self.host.get_mut();
        let d = host.dim();
        if grads.len() != rows.len() * d {
            let message = format!("{} gradient values for {} rows of width {d}", grads.len(), rows.len());
            return self.fail("updating rows", message);
        }
        self.slots.clear();
        self.values.clear();
        for (k, &(t, id)) in rows.iter().enumerate() {
            let grad = &grads[k * d..][..d];
            if let Some(h) = host.apply_cold(t as usize, id, grad) {
                self.slots.push(h);
                self.values.extend_from_slice(grad);
            }
        }
        if self.slots.is_empty() {
            return;
        }
        let (kind, hp) = host.row_optimizer();
        if !self.memory_current.get() {
            // The memory could not be loaded (a failure is recorded): the host copy is updated.
            let w = host.state_width();
            update_at(host.hot_values_mut(), (d, w), (&self.slots, &self.values), (kind, &hp));
            return;
        }
        self.host_current.set(false);
        if let Err(e) = self.memory.get_mut().update(&self.slots, &self.values, kind, &hp) {
            self.fail("updating hot rows", e);
        }
    }
    fn take_error(&mut self) -> Option<String> {
        self.error.get_mut().take()
    }
}

#[cfg(test)]
mod tests;
