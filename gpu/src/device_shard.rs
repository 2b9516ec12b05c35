//! The rows one GPU worker among several owns, kept on its device with their
//! optimizer state: the trainer's owner side serves them and updates them
//! there ([`DeviceStore`]), while the rows other workers own still travel
//! through the timely exchange.
//!
//! ## Invariants
//!
//! * **The CPU shard's layout and starting point.** Table `t`'s rows lie from
//!   device row `bases[t]` at the CPU shard's local index `id / W`
//!   (`tiderec_operators::shard`), so row `id` of table `t` is device row
//!   `bases[t] + id / W`; they start as [`EmbeddingShard`] starts them for the
//!   seed, this worker and `W` workers.
//! * **The fixed store's numbers.** An update is the device row update with
//!   each row once, its gradient summed over the senders and averaged by the
//!   owner on the host, as the fixed store's `apply` takes it: SGD and
//!   row-wise Adagrad as `apply_row`. The store keeps the fixed store's marks
//!   (updated since the start, changed since the last checkpoint), so its
//!   checkpoints list the same rows.
//! * **Checked on the host.** An id outside its table or owned by another
//!   worker reaches neither the device nor the table: the call records the
//!   failure (a gather gives zeros in its place).
//! * **Writes go up together.** [`set_row`](EmbeddingStore::set_row) (a restore)
//!   collects rows on the host; they go up in one copy before the next read or
//!   update, so a restore of millions of rows is not millions of copies. A
//!   reset sends the updated rows' seeded values up the same way, into the
//!   table already there.
//! * **Failures are recorded, not raised.** [`DeviceStore::take_error`] gives
//!   the first one, naming the device; the trainer fails the step (or the
//!   checkpoint) on it.

use crate::row_copy::{chunk_rows, read_rows, read_values, scatter_rows, update_rows, RowScratch};
use crate::sparse::{RowTable, SparseRule};
use crate::{Device, GpuError};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use tiderec_operators::optim::{OptimizerParams, SparseOptimizerKind};
use tiderec_operators::shard::{shard_of, EmbeddingShard};
use tiderec_operators::snapshot::TableRows;
use tiderec_operators::store::{DeviceStore, EmbeddingStore, StoreKind, StoreStats};
use tiderec_operators::train::TrainerConfig;
use tiderec_operators::{rng, OperatorError};

/// Mark of a row updated since the start (or the last reset).
const UPDATED: u8 = 1;
/// Mark of a row changed since the last checkpoint.
const CHANGED: u8 = 2;

/// Rows a restore (or a reset) wrote, not yet on the device: device row → values.
#[derive(Debug, Default)]
struct Pending {
    at: Vec<u32>,
    rows: Vec<f32>,
    state: Vec<f32>,
    index: FxHashMap<u32, usize>,
}

/// One worker's rows on its device (see the module docs).
#[derive(Debug)]
pub struct DeviceShard {
    dev: Device,
    /// The rows and their state (in a cell: a read first sends up what a restore wrote).
    table: RefCell<RowTable>,
    dim: usize,
    worker: usize,
    workers: usize,
    table_sizes: Vec<u64>,
    seed: u64,
    kind: SparseOptimizerKind,
    hp: OptimizerParams,
    /// First device row of each table.
    bases: Vec<usize>,
    /// Rows this worker owns in each table.
    counts: Vec<usize>,
    /// Per owned row, [`UPDATED`] and [`CHANGED`].
    marks: Vec<u8>,
    pending: RefCell<Pending>,
    scratch: RefCell<RowScratch>,
    lookups: u64,
    error: RefCell<Option<String>>,
}

impl DeviceShard {
    /// Why `config`'s rows cannot live on a GPU worker's device, if they cannot.
    pub fn supports(config: &TrainerConfig, workers: usize) -> Result<(), String> {
        if config.store.kind != StoreKind::Fixed {
            return Err("only the fixed store lives on the device".into());
        }
        rows_update_on_device(config)?;
        let owned: u64 = config.table_sizes.iter().map(|&n| n.div_ceil(workers.max(1) as u64)).sum();
        if owned > u32::MAX as u64 {
            return Err(format!("{owned} rows on one worker exceed the device's 32-bit row numbers"));
        }
        Ok(())
    }

    /// The rows worker `worker` of `workers` owns under `config`, on `dev`, as
    /// the fixed store starts them.
    pub fn new(dev: &Device, config: &TrainerConfig, (worker, workers): (usize, usize)) -> Result<Self, GpuError> {
        Self::supports(config, workers).map_err(GpuError::Unsupported)?;
        let dim = config.model.embedding_dim();
        let (kind, hp) = (config.sparse_optimizer, config.sparse_hp);
        let (rows, state, counts) = seeded((dim, &config.table_sizes, config.seed), (kind, hp), (worker, workers))?;
        let mut bases = Vec::with_capacity(counts.len());
        let mut total = 0;
        for &c in &counts {
            bases.push(total);
            total += c;
        }
        Ok(DeviceShard {
            table: RefCell::new(RowTable::upload(dev, &rows, &state, dim)?),
            dim,
            dev: dev.clone(),
            worker,
            workers,
            table_sizes: config.table_sizes.clone(),
            seed: config.seed,
            kind,
            hp,
            bases,
            counts,
            marks: vec![0; total],
            pending: RefCell::default(),
            scratch: RefCell::default(),
            lookups: 0,
            error: RefCell::new(None),
        })
    }

    /// The device row of `id` in `table`, when this worker owns it.
    fn device_row(&self, table: usize, id: u64) -> Result<u32, String> {
        let size = *self.table_sizes.get(table).ok_or_else(|| format!("no table {table}"))?;
        if id >= size {
            return Err(format!("table {table}: id {id} is not below {size}"));
        }
        if shard_of(table, id, self.workers) != self.worker {
            return Err(format!("table {table}: row {id} is not owned by worker {}", self.worker));
        }
        Ok((self.bases[table] + (id / self.workers as u64) as usize) as u32)
    }

    /// Records `message` as this store's failure (the first one is kept).
    fn fail(&self, message: impl std::fmt::Display) {
        let mut error = self.error.borrow_mut();
        if error.is_none() {
            *error = Some(format!("CUDA device {}: {message}", self.dev.ordinal()));
        }
    }

    /// Sends the rows a restore or a reset wrote to the device.
    fn flush(&self) -> Result<(), GpuError> {
        let mut pending = self.pending.borrow_mut();
        if pending.at.is_empty() {
            return Ok(());
        }
        let (d, dev) = (self.dim, &self.dev);
        let (mut table, mut scratch) = (self.table.borrow_mut(), self.scratch.borrow_mut());
        let s = &mut *scratch;
        let per = chunk_rows(d);
        for (k, at) in pending.at.chunks(per).enumerate() {
            let first = k * per;
            let n = at.len();
            let d_at = dev.upload_into(&mut s.at, at)?;
            let rows = dev.upload_into(&mut s.values, &pending.rows[first * d..(first + n) * d])?;
            scatter_rows(dev, (&mut table.rows, d), d_at, n, rows)?;
            let state = dev.upload_into(&mut s.state, &pending.state[first..first + n])?;
            scatter_rows(dev, (&mut table.state, 1), d_at, n, state)?;
        }
        *pending = Pending::default();
        Ok(())
    }

    /// The table and id of device row `at` (one this worker owns).
    fn table_and_id(&self, at: u32) -> (usize, u64) {
        let at = at as usize;
        // The last table starting at or before `at`: a table owning no row here
        // starts where the next one does.
        let table = self.bases.partition_point(|&base| base <= at) - 1;
        (table, EmbeddingShard::id_of(table, at - self.bases[table], self.worker, self.workers))
    }

    /// The rows (`at.len() × dim`) and states (one each) of the device rows `at`.
    fn read(&self, at: &[u32]) -> Result<(Vec<f32>, Vec<f32>), GpuError> {
        self.flush()?;
        read_rows(&self.dev, &self.table.borrow(), at, &mut self.scratch.borrow_mut())
    }

    /// The rows (`at.len() × dim`) of the device rows `at`, without their states (a lookup's).
    fn read_served(&self, at: &[u32]) -> Result<Vec<f32>, GpuError> {
        self.flush()?;
        read_values(&self.dev, &self.table.borrow(), at, &mut self.scratch.borrow_mut())
    }

    /// The rows of `table` whose marks include `mark`, ids ascending, with their state.
    fn export_marked(&self, table: usize, mark: u8) -> TableRows {
        let (base, count) = (self.bases[table], self.counts[table]);
        let locals: Vec<usize> = (0..count).filter(|&l| self.marks[base + l] & mark != 0).collect();
        let ids: Vec<u64> =
            locals.iter().map(|&l| EmbeddingShard::id_of(table, l, self.worker, self.workers)).collect();
        let at: Vec<u32> = locals.iter().map(|&l| (base + l) as u32).collect();
        match self.read(&at) {
            Ok((rows, state)) => {
                let state = if self.state_width() == 0 { Vec::new() } else { state };
                TableRows { ids, rows, state, ..TableRows::default() }
            }
            Err(e) => {
                self.fail(format!("reading table {table} back: {e}"));
                TableRows::default()
            }
        }
    }

    /// [`DeviceStore::apply_rows`] with its failure returned.
    fn try_apply_rows(&mut self, rows: &[(u32, u64)], grads: &[f32]) -> Result<(), String> {
        let d = self.dim;
        if grads.len() != rows.len() * d {
            return Err(format!("{} gradient values for {} rows of width {d}", grads.len(), rows.len()));
        }
        let at = rows.iter().map(|&(t, id)| self.device_row(t as usize, id)).collect::<Result<Vec<u32>, _>>()?;
        if at.is_empty() {
            return Ok(());
        }
        let on_device = |e: GpuError| e.to_string();
        self.flush().map_err(on_device)?;
        let rule = row_rule(self.kind, &self.hp).map_err(on_device)?;
        let scratch = &mut self.scratch.borrow_mut();
        update_rows(&self.dev, self.table.get_mut(), scratch, (&at, grads), rule).map_err(on_device)?;
        for &r in &at {
            self.marks[r as usize] |= UPDATED | CHANGED;
        }
        Ok(())
    }
}

/// Why `config`'s rows cannot be served and updated on a GPU worker's device
/// under any store, if they cannot: only the `rows` exchange serves them from
/// there, and the device's row update is SGD or row-wise Adagrad without an L2 penalty.
pub(crate) fn rows_update_on_device(config: &TrainerConfig) -> Result<(), String> {
    if config.exchange.any_partial() || config.exchange.replicated_rows() > 0 {
        return Err("only the rows exchange serves rows from the device".into());
    }
    if !matches!(config.sparse_optimizer, SparseOptimizerKind::Sgd | SparseOptimizerKind::RowwiseAdagrad) {
        return Err(format!("the {} row optimizer runs on the host", config.sparse_optimizer));
    }
    if config.sparse_hp.l2_penalty != 0.0 {
        return Err("an L2 penalty on the rows is applied on the host".into());
    }
    // The row update holds a row per warp in shared memory.
    let dim = config.model.embedding_dim();
    let most = crate::check::MAX_SHARED / (crate::check::WARPS_PER_BLOCK * 4);
    if dim > most {
        return Err(format!("rows of {dim} values are wider than the device's row update takes ({most})"));
    }
    Ok(())
}

/// The device row update of `kind` at `hp`'s learning rate and epsilon (no L2
/// penalty: [`rows_update_on_device`] refuses one).
pub(crate) fn row_rule(kind: SparseOptimizerKind, hp: &OptimizerParams) -> Result<SparseRule, GpuError> {
    match kind {
        SparseOptimizerKind::Sgd => Ok(SparseRule::Sgd { lr: hp.lr }),
        SparseOptimizerKind::RowwiseAdagrad => Ok(SparseRule::RowwiseAdagrad { lr: hp.lr, eps: hp.eps }),
        other => Err(GpuError::Unsupported(format!("the {other} row optimizer runs on the host"))),
    }
}

/// Worker `worker`'s rows of every table (width `dim`, `sizes` rows, seeded by
/// `seed`) under the row optimizer `kind`, in device order, with one optimizer
/// value each (zero for SGD), and the rows it owns per table.
#[allow(clippy::type_complexity)]
fn seeded(
    (dim, sizes, seed): (usize, &[u64], u64),
    (kind, hp): (SparseOptimizerKind, OptimizerParams),
    (worker, workers): (usize, usize),
) -> Result<(Vec<f32>, Vec<f32>, Vec<usize>), GpuError> {
    let shard = EmbeddingShard::new(worker, workers, dim, sizes, seed, kind, hp)
        .map_err(|e| GpuError::Unsupported(format!("embedding rows: {e}")))?;
    let (mut rows, mut state, mut counts) = (Vec::new(), Vec::new(), Vec::new());
    for t in 0..sizes.len() {
        // Every owned row, ids (and local indices) ascending from local index 0.
        let table = shard.export_table(t);
        counts.push(table.ids.len());
        rows.extend_from_slice(&table.rows);
        if table.state.is_empty() {
            state.resize(state.len() + table.ids.len(), 0.0);
        } else {
            state.extend_from_slice(&table.state);
        }
    }
    Ok((rows, state, counts))
}

impl EmbeddingStore for DeviceShard {
    fn dim(&self) -> usize {
        self.dim
    }
    fn state_width(&self) -> usize {
        self.kind.state_width(self.dim)
    }
    fn gather(&mut self, table: usize, ids: &[u64], out: &mut Vec<f32>) {
        self.gather_many(&[(table, ids)], out);
    }
    /// Every lookup's rows in one gather and one copy down.
    fn gather_many(&mut self, lookups: &[(usize, &[u64])], out: &mut Vec<f32>) {
        let n: usize = lookups.iter().map(|(_, ids)| ids.len()).sum();
        self.lookups += n as u64;
        let read = lookups
            .iter()
            .flat_map(|&(table, ids)| ids.iter().map(move |&id| (table, id)))
            .map(|(table, id)| self.device_row(table, id))
            .collect::<Result<Vec<u32>, _>>()
            .and_then(|at| self.read_served(&at).map_err(|e| e.to_string()));
        match read {
            Ok(rows) => out.extend_from_slice(&rows),
            Err(e) => {
                self.fail(format!("serving rows: {e}"));
                out.resize(out.len() + n * self.dim, 0.0);
            }
        }
    }
    fn apply(&mut self, table: usize, id: u64, grad: &[f32]) {
        self.apply_rows(&[(table as u32, id)], grad);
    }
    fn set_lr(&mut self, lr: f32) {
        self.hp.lr = lr;
    }
    fn end_step(&mut self, _completed: u64) {}
    /// The updated rows only: every other row holds its seeded initial values.
    fn export_table(&self, table: usize) -> TableRows {
        self.export_marked(table, UPDATED)
    }
    fn exports_updated_only(&self) -> bool {
        true
    }
    fn mark_checkpoint(&mut self) {
        self.marks.iter_mut().for_each(|m| *m &= !CHANGED);
    }
    fn export_changes(&self, table: usize) -> TableRows {
        self.export_marked(table, CHANGED)
    }
    /// Every row back to its seeded initial values: the rows updated since the
    /// start and the rows written and not yet sent up (the others still hold
    /// them) get their seeded values (as the fixed store's reset makes them
    /// again, row by row), which go up as a restore's rows do, into the table
    /// the device already holds: a reset needs no second table, on the device
    /// or on the host.
    fn reset(&mut self, _completed: u64) {
        let (d, w) = (self.dim, self.state_width());
        let queued = std::mem::take(&mut *self.pending.borrow_mut()).at;
        let mut rows: Vec<u32> = (0..self.marks.len())
            .filter(|&at| self.marks[at] & UPDATED != 0)
            .map(|at| at as u32)
            .chain(queued)
            .collect();
        rows.sort_unstable();
        rows.dedup();
        let mut initial_state = vec![0.0; w];
        self.kind.init_state(&self.hp, &mut initial_state);
        let mut pending = Pending::default();
        let mut row = vec![0.0; d];
        for at in rows {
            let (table, id) = self.table_and_id(at);
            rng::init_row(self.seed, table, id, rng::init_bound(self.table_sizes[table]), &mut row);
            pending.index.insert(at, pending.at.len());
            pending.at.push(at);
            pending.rows.extend_from_slice(&row);
            pending.state.push(initial_state.first().copied().unwrap_or(0.0));
        }
        *self.pending.borrow_mut() = pending;
        self.marks.fill(0);
    }
    fn set_row(&mut self, table: usize, id: u64, row: &[f32], state: &[f32]) -> Result<(), OperatorError> {
        let (d, w) = (self.dim, self.state_width());
        if row.len() != d || state.len() != w {
            return Err(OperatorError::config(
                "checkpoint",
                format!("a row of width {} and state {} for width {d} and state {w}", row.len(), state.len()),
            ));
        }
        let at = self.device_row(table, id).map_err(|e| OperatorError::config("checkpoint", e))?;
        let mut pending = self.pending.borrow_mut();
        let p = &mut *pending;
        match p.index.get(&at) {
            Some(&k) => {
                p.rows[k * d..(k + 1) * d].copy_from_slice(row);
                p.state[k] = state.first().copied().unwrap_or(0.0);
            }
            None => {
                p.index.insert(at, p.at.len());
                p.at.push(at);
                p.rows.extend_from_slice(row);
                p.state.push(state.first().copied().unwrap_or(0.0));
            }
        }
        self.marks[at as usize] |= UPDATED | CHANGED;
        Ok(())
    }
    fn stats(&self) -> StoreStats {
        StoreStats {
            lookups: self.lookups,
            hot_hits: self.lookups,
            hot_rows: self.num_rows() as u64,
            ..StoreStats::default()
        }
    }
    /// The fixed store's count: every table's `⌈rows / W⌉` local rows, the
    /// last of a table past its end included.
    fn num_rows(&self) -> usize {
        let w = self.workers.max(1) as u64;
        self.table_sizes.iter().map(|&n| n.div_ceil(w) as usize).sum()
    }
    /// Summed a chunk of rows at a time, so the host never holds the shard.
    fn sum_of_squares(&self) -> f64 {
        let per = chunk_rows(self.dim);
        let mut sum = 0.0;
        for first in (0..self.marks.len()).step_by(per) {
            let at: Vec<u32> = (first..self.marks.len().min(first + per)).map(|a| a as u32).collect();
            match self.read_served(&at) {
                // Row by row, as the CPU shard adds them.
                Ok(rows) => {
                    for row in rows.chunks_exact(self.dim.max(1)) {
                        sum += row.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>();
                    }
                }
                Err(e) => {
                    self.fail(format!("reading the rows back: {e}"));
                    return f64::NAN;
                }
            }
        }
        sum
    }
    fn holds_every_row(&self) -> bool {
        true
    }
}

impl DeviceStore for DeviceShard {
    fn apply_rows(&mut self, rows: &[(u32, u64)], grads: &[f32]) {
        if let Err(e) = self.try_apply_rows(rows, grads) {
            self.fail(format!("updating rows: {e}"));
        }
    }
    fn take_error(&mut self) -> Option<String> {
        self.error.borrow_mut().take()
    }
}
