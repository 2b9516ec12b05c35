//! The dynamic store: a hash table `id → slot` over a slab of rows, with
//! admission and eviction.
//!
//! Rows live in one slab (`rows`, `state`, `meta` indexed by slot); each table
//! has an `FxHashMap<u64, u32>` from id to slot. Evicted slots go to a free
//! list and are reused, so the slab and the maps never grow past the most rows
//! ever held at once: at most `max_rows` plus the rows admitted within one
//! maintenance interval (`flush_every` steps). Each row's count and last-use
//! step travel in checkpoints ([`TableRows::counts`], [`TableRows::last_seen`]),
//! so a restored store evicts the rows the store it was taken from would.

use super::{init_row, CountMinSketch, EmbeddingStore, FiniteApply, StoreConfig, StoreParams, StoreStats};
use crate::optim::{apply_row_finite, OptimizerParams, SparseOptimizerKind};
use crate::rng::unit_f64;
use crate::snapshot::{check_row, SketchCounters, TableRows};
use crate::OperatorError;
use rustc_hash::FxHashMap;

/// Marks a free slot in [`Meta::table`].
pub(super) const FREE: u32 = u32::MAX;
/// Stream of the probabilistic admission draws (distinct from row initialisation).
const ADMIT_STREAM: u64 = 0xad31_7a11_0bad_5eed;

/// Bookkeeping of one slot.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Meta {
    /// The row's id.
    pub id: u64,
    /// Its table, or [`FREE`].
    pub table: u32,
    /// Training steps in which the row was updated (saturating).
    pub count: u32,
    /// The last training step (0-based) that updated it.
    pub last_seen: u64,
}

/// A hash-table store; see the module docs.
#[derive(Debug)]
pub struct DynamicStore {
    worker: usize,
    workers: usize,
    dim: usize,
    state_width: usize,
    seed: u64,
    optimizer: SparseOptimizerKind,
    hp: OptimizerParams,
    table_sizes: Vec<u64>,
    bounds: Vec<f32>,
    index: Vec<FxHashMap<u64, u32>>,
    rows: Vec<f32>,
    state: Vec<f32>,
    pub(super) meta: Vec<Meta>,
    free: Vec<u32>,
    admit_count: u32,
    admit_prob: Option<f64>,
    /// [`StoreConfig::admits_at_once`].
    at_once: bool,
    admission: Option<CountMinSketch>,
    ttl: Option<u64>,
    max_rows: Option<u64>,
    flush_every: u64,
    /// Training steps completed.
    step: u64,
    stats: StoreStats,
    initial_state: Vec<f32>,
    /// The step clock at the last checkpoint mark (`None`: no mark since the store was built or reset).
    mark: Option<u64>,
    /// `(table, id)` of the rows evicted since the mark.
    evicted: Vec<(u32, u64)>,
}

impl DynamicStore {
    /// An empty store, with `config` and `p` checked first
    /// ([`StoreConfig::validate`], [`StoreParams::validate`]; errors name the key).
    pub fn try_new(config: &StoreConfig, p: &StoreParams<'_>) -> Result<Self, OperatorError> {
        config.validate()?;
        p.validate()?;
        Ok(Self::new(config, p))
    }

    /// An empty store. Checks neither `config` nor `p` ([`try_new`](Self::try_new)
    /// and [`Store::new`](super::Store::new) do).
    ///
    /// # Panics
    /// Built from parameters [`try_new`](Self::try_new) refuses, it may panic at its
    /// first lookup or update (with no workers, [`shard_of`](crate::routing::shard_of)
    /// divides by zero).
    pub fn new(config: &StoreConfig, p: &StoreParams<'_>) -> Self {
        let state_width = p.optimizer.state_width(p.dim);
        let mut initial_state = vec![0.0; state_width];
        if state_width > 0 {
            p.optimizer.init_state(&p.hp, &mut initial_state);
        }
        let admit_count = config.admit_count;
        DynamicStore {
            worker: p.worker,
            workers: p.workers,
            dim: p.dim,
            state_width,
            seed: p.seed,
            optimizer: p.optimizer,
            hp: p.hp,
            table_sizes: p.table_sizes.to_vec(),
            bounds: p.table_sizes.iter().map(|&n| crate::rng::init_bound(n)).collect(),
            index: p.table_sizes.iter().map(|_| FxHashMap::default()).collect(),
            rows: Vec::new(),
            state: Vec::new(),
            meta: Vec::new(),
            free: Vec::new(),
            admit_count,
            admit_prob: config.admit_prob,
            at_once: config.admits_at_once(),
            admission: (admit_count > 1)
                .then(|| CountMinSketch::new(config.sketch_width, 4, p.seed ^ ADMIT_STREAM).track_changes()),
            ttl: config.ttl_steps,
            max_rows: config.max_rows,
            flush_every: config.flush_every.max(1),
            step: 0,
            stats: StoreStats::default(),
            initial_state,
            mark: None,
            evicted: Vec::new(),
        }
    }

    /// True when an unseen id gets its row (and its first update) at once.
    #[inline]
    fn admits_at_once(&self) -> bool {
        self.at_once
    }

    /// The slot of row `id` of `table`, if held.
    #[inline]
    pub(crate) fn slot(&self, table: usize, id: u64) -> Option<u32> {
        self.index[table].get(&id).copied()
    }

    /// Appends the row of `id` (its initial row or zeros when absent), counting the lookup.
    #[inline]
    pub(crate) fn gather_one(&mut self, table: usize, id: u64, out: &mut Vec<f32>) {
        let d = self.dim;
        match self.index[table].get(&id) {
            Some(&s) => {
                self.stats.cold_hits += 1;
                let s = s as usize;
                out.extend_from_slice(&self.rows[s * d..(s + 1) * d]);
            }
            None => {
                self.stats.misses += 1;
                let start = out.len();
                out.resize(start + d, 0.0);
                if self.admits_at_once() {
                    init_row(self.seed, table, id, self.bounds[table], &mut out[start..]);
                }
            }
        }
    }

    /// Decides whether an unseen id is admitted at this sighting.
    fn admit(&mut self, table: usize, id: u64) -> bool {
        if let Some(p) = self.admit_prob {
            return unit_f64(self.seed ^ ADMIT_STREAM, table as u64, id, self.step) < p;
        }
        match &mut self.admission {
            Some(sketch) => sketch.add(CountMinSketch::key(table, id)) >= self.admit_count,
            None => true,
        }
    }

    /// Inserts a row with the given values; the id must not be held.
    pub(crate) fn insert_raw(&mut self, meta: Meta, row: &[f32], state: &[f32]) -> u32 {
        let (d, w) = (self.dim, self.state_width);
        let slot = match self.free.pop() {
            Some(s) => {
                let u = s as usize;
                self.rows[u * d..(u + 1) * d].copy_from_slice(row);
                self.state[u * w..(u + 1) * w].copy_from_slice(state);
                self.meta[u] = meta;
                s
            }
            None => {
                self.rows.extend_from_slice(row);
                self.state.extend_from_slice(state);
                self.meta.push(meta);
                (self.meta.len() - 1) as u32
            }
        };
        self.index[meta.table as usize].insert(meta.id, slot);
        slot
    }

    /// Inserts the seeded initial row of `id` with fresh optimizer state.
    fn insert_init(&mut self, table: usize, id: u64) -> u32 {
        let mut row = vec![0.0f32; self.dim];
        init_row(self.seed, table, id, self.bounds[table], &mut row);
        let state = std::mem::take(&mut self.initial_state);
        let meta = Meta { id, table: table as u32, count: 0, last_seen: self.step };
        let slot = self.insert_raw(meta, &row, &state);
        self.initial_state = state;
        slot
    }

    /// Removes row `id` of `table`, copying its values and state into `row` and `state`.
    pub(crate) fn take(&mut self, table: usize, id: u64, row: &mut Vec<f32>, state: &mut Vec<f32>) -> Option<Meta> {
        let s = self.index[table].remove(&id)? as usize;
        let (d, w) = (self.dim, self.state_width);
        row.extend_from_slice(&self.rows[s * d..(s + 1) * d]);
        state.extend_from_slice(&self.state[s * w..(s + 1) * w]);
        let meta = self.meta[s];
        self.meta[s].table = FREE;
        self.free.push(s as u32);
        Some(meta)
    }

    /// Sets the count of row `id` of `table`, if held.
    pub(crate) fn set_count(&mut self, table: usize, id: u64, count: u32) {
        if let Some(s) = self.slot(table, id) {
            self.meta[s as usize].count = count;
        }
    }

    /// Every held row's bookkeeping.
    pub(crate) fn live_meta(&self) -> impl Iterator<Item = &Meta> + '_ {
        self.meta.iter().filter(|m| m.table != FREE)
    }

    /// Counts the update of slot `s` in this step.
    #[inline]
    fn touch(&mut self, s: usize) {
        let m = &mut self.meta[s];
        m.count = m.count.saturating_add(1);
        m.last_seen = self.step;
    }

    fn evict_slot(&mut self, s: usize) {
        let m = self.meta[s];
        self.index[m.table as usize].remove(&m.id);
        self.meta[s].table = FREE;
        self.free.push(s as u32);
        self.stats.evictions += 1;
        if self.mark.is_some() {
            self.evicted.push((m.table, m.id));
        }
    }

    /// True when a row last updated by `m.last_seen` has outlived the TTL once
    /// `completed` steps are done: no update in more than `ttl` steps.
    pub(crate) fn expired(&self, m: &Meta, completed: u64) -> bool {
        self.ttl.is_some_and(|ttl| completed.saturating_sub(m.last_seen.saturating_add(1)) > ttl)
    }

    /// Eviction: rows not updated for more than `ttl` steps, then the least
    /// frequently used rows (ties: least recently used, then table and id)
    /// beyond `budget`.
    pub(crate) fn evict(&mut self, budget: Option<u64>) {
        if self.ttl.is_some() {
            let stale: Vec<usize> = (0..self.meta.len())
                .filter(|&s| self.meta[s].table != FREE && self.expired(&self.meta[s], self.step))
                .collect();
            for s in stale {
                self.evict_slot(s);
            }
        }
        if let Some(budget) = budget {
            let live = self.num_rows() as u64;
            if live > budget {
                let excess = (live - budget) as usize;
                let mut order: Vec<(u32, u64, u32, u64, u32)> = (0..self.meta.len())
                    .filter(|&s| self.meta[s].table != FREE)
                    .map(|s| {
                        let m = &self.meta[s];
                        (m.count, m.last_seen, m.table, m.id, s as u32)
                    })
                    .collect();
                if excess < order.len() {
                    order.select_nth_unstable(excess);
                }
                for &(.., s) in &order[..excess] {
                    self.evict_slot(s as usize);
                }
            }
        }
    }

    /// The step clock at the last checkpoint mark.
    pub(crate) fn mark(&self) -> Option<u64> {
        self.mark
    }

    /// The rows of `table` held here that `keep` selects, ids ascending, with their counts and last-use steps.
    pub(crate) fn export_where(&self, table: usize, keep: impl Fn(&Meta) -> bool) -> TableRows {
        let (d, w) = (self.dim, self.state_width);
        let mut held: Vec<(u64, u32)> =
            self.index[table].iter().filter(|(_, &s)| keep(&self.meta[s as usize])).map(|(&id, &s)| (id, s)).collect();
        held.sort_unstable();
        let mut out = TableRows {
            ids: Vec::with_capacity(held.len()),
            rows: Vec::with_capacity(held.len() * d),
            state: Vec::with_capacity(held.len() * w),
            counts: Vec::with_capacity(held.len()),
            last_seen: Vec::with_capacity(held.len()),
            ..TableRows::default()
        };
        for (id, s) in held {
            let s = s as usize;
            out.counts.push(self.meta[s].count);
            out.last_seen.push(self.meta[s].last_seen);
            out.ids.push(id);
            out.rows.extend_from_slice(&self.rows[s * d..(s + 1) * d]);
            out.state.extend_from_slice(&self.state[s * w..(s + 1) * w]);
        }
        out
    }

    /// The ids of `table` evicted since the mark, ascending.
    pub(crate) fn evicted_ids(&self, table: usize) -> Vec<u64> {
        let mut ids: Vec<u64> = self.evicted.iter().filter(|&&(t, _)| t as usize == table).map(|&(_, id)| id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Sets the step clock without maintenance (the tiered store runs its own).
    pub(crate) fn set_step(&mut self, completed: u64) {
        self.step = completed;
    }

    /// The maintenance interval.
    pub(crate) fn flush_every(&self) -> u64 {
        self.flush_every
    }

    /// The row budget.
    pub(crate) fn max_rows(&self) -> Option<u64> {
        self.max_rows
    }

    /// Applies `grad` to slot `s` (already touched); returns whether the
    /// updated row and its optimizer state are finite.
    #[inline]
    fn update_slot(&mut self, s: usize, grad: &[f32]) -> bool {
        let (d, w) = (self.dim, self.state_width);
        apply_row_finite(
            self.optimizer,
            &self.hp,
            &mut self.rows[s * d..(s + 1) * d],
            grad,
            &mut self.state[s * w..(s + 1) * w],
        )
    }

    /// The values in slot `s` of the slab.
    /// Every row held, with its `(table, id)`, in no particular order.
    pub(crate) fn keyed_rows(&self) -> Vec<((u32, u64), &[f32])> {
        let rows = self.index.iter().enumerate().flat_map(|(t, m)| m.iter().map(move |(&id, &s)| ((t as u32, id), s)));
        rows.map(|(key, s)| (key, self.row_at(s as usize))).collect()
    }

    pub(crate) fn row_at(&self, s: usize) -> &[f32] {
        &self.rows[s * self.dim..(s + 1) * self.dim]
    }

    fn owner(&self) -> (usize, usize, usize, usize) {
        (self.worker, self.workers, self.dim, self.state_width)
    }

    /// Raw counters (lookup counters of the cold tier).
    pub(crate) fn raw_stats(&self) -> StoreStats {
        self.stats
    }

    pub(crate) fn set_lr(&mut self, lr: f32) {
        self.hp.lr = lr;
    }

    pub(crate) fn optimizer(&self) -> (SparseOptimizerKind, OptimizerParams) {
        (self.optimizer, self.hp)
    }

    pub(crate) fn step(&self) -> u64 {
        self.step
    }
}

impl FiniteApply for DynamicStore {
    fn apply_finite(&mut self, table: usize, id: u64, grad: &[f32]) -> bool {
        if let Some(s) = self.slot(table, id) {
            self.touch(s as usize);
            self.update_slot(s as usize, grad)
        } else if self.admit(table, id) {
            let s = self.insert_init(table, id) as usize;
            self.stats.admissions += 1;
            self.touch(s);
            // The lookup served the initial row when it admits at once, so its gradient applies.
            !self.admits_at_once() || self.update_slot(s, grad)
        } else {
            self.stats.rejections += 1;
            true
        }
    }
}

impl EmbeddingStore for DynamicStore {
    fn dim(&self) -> usize {
        self.dim
    }
    fn state_width(&self) -> usize {
        self.state_width
    }
    fn gather(&mut self, table: usize, ids: &[u64], out: &mut Vec<f32>) {
        out.reserve(ids.len() * self.dim);
        self.stats.lookups += ids.len() as u64;
        for &id in ids {
            self.gather_one(table, id, out);
        }
    }
    fn set_lr(&mut self, lr: f32) {
        DynamicStore::set_lr(self, lr);
    }
    fn apply(&mut self, table: usize, id: u64, grad: &[f32]) {
        self.apply_finite(table, id, grad);
    }
    fn end_step(&mut self, completed: u64) {
        self.step = completed;
        if completed.is_multiple_of(self.flush_every) {
            self.evict(self.max_rows);
        }
    }
    fn export_table(&self, table: usize) -> TableRows {
        self.export_where(table, |_| true)
    }
    fn mark_checkpoint(&mut self) {
        self.mark = Some(self.step);
        self.evicted.clear();
        if let Some(a) = &mut self.admission {
            a.mark();
        }
    }
    /// Rows updated or admitted since the mark: their `last_seen` is the step
    /// clock of then, which is at least the clock at the mark. (A restore clears
    /// the mark, so its rows, which keep the checkpoint's last-use steps, are all
    /// changes until the next one.)
    fn export_changes(&self, table: usize) -> TableRows {
        let since = self.mark.unwrap_or(0);
        let mut out = self.export_where(table, |m| m.last_seen >= since);
        out.removed = self.evicted_ids(table);
        out
    }
    fn reset(&mut self, completed: u64) {
        for m in &mut self.index {
            m.clear();
        }
        self.rows.clear();
        self.state.clear();
        self.meta.clear();
        self.free.clear();
        self.step = completed;
        self.mark = None;
        self.evicted.clear();
        // A restore's counters replace it; a checkpoint without them starts it empty.
        if let Some(a) = &mut self.admission {
            a.clear();
        }
    }
    fn set_row(&mut self, table: usize, id: u64, row: &[f32], state: &[f32]) -> Result<(), OperatorError> {
        check_row(self.owner(), &self.table_sizes, table, id, row, state)?;
        let (d, w) = (self.dim, self.state_width);
        match self.slot(table, id) {
            Some(s) => {
                let s = s as usize;
                self.rows[s * d..(s + 1) * d].copy_from_slice(row);
                self.state[s * w..(s + 1) * w].copy_from_slice(state);
            }
            None => {
                let meta = Meta { id, table: table as u32, count: 1, last_seen: self.step };
                self.insert_raw(meta, row, state);
            }
        }
        Ok(())
    }
    fn set_frequency(&mut self, table: usize, id: u64, count: u32, _hot: Option<u32>) {
        self.set_count(table, id, count);
    }
    fn set_last_seen(&mut self, table: usize, id: u64, step: u64) {
        if let Some(s) = self.slot(table, id) {
            self.meta[s as usize].last_seen = step;
        }
    }
    fn admission_counters(&self) -> SketchCounters {
        self.admission.as_ref().map(|a| SketchCounters::from_dense(a.counters())).unwrap_or_default()
    }
    fn admission_changes(&self) -> Option<SketchCounters> {
        self.admission.as_ref().and_then(CountMinSketch::changes)
    }
    fn set_admission_counters(&mut self, counters: &SketchCounters) {
        if let Some(a) = &mut self.admission {
            a.set_counters(counters);
        }
    }
    fn stats(&self) -> StoreStats {
        StoreStats { cold_rows: self.num_rows() as u64, ..self.stats }
    }
    fn num_rows(&self) -> usize {
        self.index.iter().map(|m| m.len()).sum()
    }
    fn sum_of_squares(&self) -> f64 {
        sum_of_squares_by_key(self.keyed_rows())
    }
    fn holds_every_row(&self) -> bool {
        false
    }
}

/// The sum of the squares of `rows`' values, summed in `(table, id)` order: the same
/// figure whatever order the rows were admitted, evicted or restored in (a hash map's
/// order depends on that history, and f64 sums on their order).
pub(crate) fn sum_of_squares_by_key(mut rows: Vec<((u32, u64), &[f32])>) -> f64 {
    rows.sort_unstable_by_key(|&(key, _)| key);
    rows.iter().map(|(_, row)| row.iter().map(|&v| v as f64 * v as f64).sum::<f64>()).sum()
}
