//! The tiered store: PICASSO's HybridHash on the CPU.
//!
//! The cold tier is a [`DynamicStore`]. For the first `warmup` training steps
//! every row lives there while the store counts how often each row is
//! updated: exactly, in the row's bookkeeping (`freq_source = exact`); in a
//! [`CountMinSketch`] (`sketch`); or by a differential-dataflow `count` over
//! the update stream, optionally windowed ([`DifferentialFrequencies`],
//! `differential`; its module docs explain the private dataflow). Then, and every `flush_every` steps after, [`TieredStore`]
//! re-plans: the `hot_rows` most frequent rows (ties: table, then id; rows
//! updated in fewer than [`HOT_MIN_COUNT`] steps never qualify) move
//! into the hot tier — three contiguous arrays (values, optimizer state,
//! bookkeeping) in hotness order, so the hottest rows share pages and cache
//! lines — and the rows that dropped out move back to the cold tier. A lookup
//! first asks the hot tier's id → hot-slot map, which holds only `hot_rows`
//! entries and stays in cache; a hit then reads the dense hot array with no
//! further hashing. A move copies values, state and counts bit for bit, so a
//! re-plan never changes the model.
//!
//! With `ttl_steps`, a row that outlived the TTL is never planned hot, and at
//! each eviction step (every `flush_every` steps) an expired hot row moves
//! back to the cold tier, which evicts it: the TTL holds in both tiers.

use super::{
    CountMinSketch, DifferentialFrequencies, DynamicStore, EmbeddingStore, FiniteApply, FrequencySource, StoreConfig,
    StoreParams, StoreStats,
};
use crate::optim::{apply_row_finite, OptimizerParams, SparseOptimizerKind};
use crate::snapshot::{SketchCounters, TableRows, COLD};
use crate::OperatorError;
use rustc_hash::FxHashMap;
use std::cmp::Reverse;

use super::dynamic::Meta;

/// A row updated in fewer training steps than this is never hot: a hot tier
/// larger than the set of repeated rows would only add a second lookup to
/// the misses of rows seen once.
pub const HOT_MIN_COUNT: u32 = 2;

/// The counts a plan ranks by.
#[derive(Debug)]
enum Frequencies {
    /// The rows' own counts.
    Exact,
    /// A count-min sketch of every update.
    Sketch(CountMinSketch),
    /// A differential-dataflow count of every update (boxed: a timely worker
    /// and its dataflow are far larger than the other variants).
    Differential(Box<DifferentialFrequencies>),
}

/// A hot tier over a hash-table cold tier; see the module docs.
#[derive(Debug)]
pub struct TieredStore {
    cold: DynamicStore,
    dim: usize,
    state_width: usize,
    capacity: usize,
    warmup: u64,
    flush_every: u64,
    /// Per table: id → hot slot.
    hot_index: Vec<FxHashMap<u64, u32>>,
    hot_rows: Vec<f32>,
    hot_state: Vec<f32>,
    hot_meta: Vec<Meta>,
    freq: Frequencies,
    /// Hot rows of a restored checkpoint, `(table, id) → slot`, still in the
    /// cold tier until [`settle_restore`](Self::settle_restore) moves them.
    restored_hot: FxHashMap<(u32, u64), u32>,
    lookups: u64,
    hot_hits: u64,
    replans: u64,
    moves: u64,
    /// Changes of the hot tier's layout: re-plans and expiries.
    relayouts: u64,
    /// At the last checkpoint mark: the layout count and the hot rows `(table, id)`.
    marked_layout: (u64, Vec<(u32, u64)>),
}

impl TieredStore {
    /// An empty store (every row starts cold), with `config` and `p` checked first
    /// ([`StoreConfig::validate`], [`StoreParams::validate`]; errors name the key).
    pub fn try_new(config: &StoreConfig, p: &StoreParams<'_>) -> Result<Self, OperatorError> {
        config.validate()?;
        p.validate()?;
        Ok(Self::new(config, p))
    }

    /// An empty store (every row starts cold). Checks neither `config` nor `p`
    /// ([`try_new`](Self::try_new) and [`Store::new`](super::Store::new) do).
    ///
    /// # Panics
    /// Built from parameters [`try_new`](Self::try_new) refuses, it may panic at its
    /// first lookup or update (with no workers, [`shard_of`](crate::routing::shard_of)
    /// divides by zero).
    pub fn new(config: &StoreConfig, p: &StoreParams<'_>) -> Self {
        TieredStore {
            cold: DynamicStore::new(config, p),
            dim: p.dim,
            state_width: p.optimizer.state_width(p.dim),
            capacity: config.hot_rows,
            warmup: config.warmup,
            flush_every: config.flush_every.max(1),
            hot_index: p.table_sizes.iter().map(|_| FxHashMap::default()).collect(),
            hot_rows: Vec::new(),
            hot_state: Vec::new(),
            hot_meta: Vec::new(),
            freq: match config.frequency_source() {
                FrequencySource::Exact => Frequencies::Exact,
                FrequencySource::Sketch => {
                    Frequencies::Sketch(CountMinSketch::new(config.sketch_width, 4, p.seed ^ 0xf4e9))
                }
                FrequencySource::Differential => {
                    Frequencies::Differential(Box::new(DifferentialFrequencies::new(config.freq_window, 0)))
                }
            },
            restored_hot: FxHashMap::default(),
            lookups: 0,
            hot_hits: 0,
            replans: 0,
            moves: 0,
            relayouts: 0,
            marked_layout: (0, Vec::new()),
        }
    }

    /// Rows in the hot tier.
    pub fn hot_len(&self) -> usize {
        self.hot_meta.len()
    }

    /// The `(table, id)` of the hot rows, hottest first.
    pub fn hot_ids(&self) -> Vec<(usize, u64)> {
        self.hot_meta.iter().map(|m| (m.table as usize, m.id)).collect()
    }

    /// The frequency a plan ranks row `(table, id)` by.
    fn score(&self, m: &Meta) -> u32 {
        match &self.freq {
            Frequencies::Exact => m.count,
            Frequencies::Sketch(sketch) => sketch.estimate(CountMinSketch::key(m.table as usize, m.id)),
            Frequencies::Differential(dd) => dd.count(m.table as usize, m.id),
        }
    }

    /// Chooses the hot set from the current counts and moves rows between the
    /// tiers; every value, optimizer slot and count moves unchanged.
    pub fn replan(&mut self) {
        if let Frequencies::Differential(dd) = &mut self.freq {
            dd.settle();
        }
        let (d, w) = (self.dim, self.state_width);
        let step = self.cold.step();
        let mut ranked: Vec<(Reverse<u32>, u32, u64)> = self
            .hot_meta
            .iter()
            .chain(self.cold.live_meta())
            .filter(|m| !self.cold.expired(m, step))
            .map(|m| (Reverse(self.score(m)), m.table, m.id))
            .filter(|&(Reverse(score), ..)| score >= HOT_MIN_COUNT)
            .collect();
        let k = self.capacity.min(ranked.len());
        if k < ranked.len() && k > 0 {
            ranked.select_nth_unstable(k - 1);
        }
        ranked.truncate(k);
        ranked.sort_unstable();
        let mut rows = Vec::with_capacity(k * d);
        let mut state = Vec::with_capacity(k * w);
        let mut meta = Vec::with_capacity(k);
        let mut index: Vec<FxHashMap<u64, u32>> = self.hot_index.iter().map(|_| FxHashMap::default()).collect();
        for &(_, t, id) in &ranked {
            let t = t as usize;
            let slot = meta.len() as u32;
            if let Some(&h) = self.hot_index[t].get(&id) {
                let h = h as usize;
                rows.extend_from_slice(&self.hot_rows[h * d..(h + 1) * d]);
                state.extend_from_slice(&self.hot_state[h * w..(h + 1) * w]);
                meta.push(self.hot_meta[h]);
            } else {
                let m = self.cold.take(t, id, &mut rows, &mut state).expect("a ranked row is held cold");
                meta.push(m);
                self.moves += 1;
            }
            index[t].insert(id, slot);
        }
        // Rows that left the hot tier go back to the cold tier as they are.
        for (h, m) in self.hot_meta.iter().enumerate() {
            if !index[m.table as usize].contains_key(&m.id) {
                self.cold.insert_raw(*m, &self.hot_rows[h * d..(h + 1) * d], &self.hot_state[h * w..(h + 1) * w]);
                self.moves += 1;
            }
        }
        self.hot_rows = rows;
        self.hot_state = state;
        self.hot_meta = meta;
        self.hot_index = index;
        self.replans += 1;
        self.relayouts += 1;
    }

    /// True when [`end_step`](EmbeddingStore::end_step)`(completed)` evicts.
    fn evicts_at(&self, completed: u64) -> bool {
        completed.is_multiple_of(self.cold.flush_every())
    }

    /// True when `end_step(completed)` moves an expired hot row to the cold tier.
    fn expires_hot_at(&self, completed: u64) -> bool {
        self.evicts_at(completed) && self.hot_meta.iter().any(|m| self.cold.expired(m, completed))
    }

    /// Moves the hot rows that outlived the TTL back to the cold tier as they
    /// are (its eviction then drops them); the other hot rows keep their order.
    fn expire_hot(&mut self) {
        let step = self.cold.step();
        if !self.hot_meta.iter().any(|m| self.cold.expired(m, step)) {
            return;
        }
        let (d, w) = (self.dim, self.state_width);
        let mut rows = Vec::with_capacity(self.hot_rows.len());
        let mut state = Vec::with_capacity(self.hot_state.len());
        let mut meta = Vec::with_capacity(self.hot_meta.len());
        let mut index: Vec<FxHashMap<u64, u32>> = self.hot_index.iter().map(|_| FxHashMap::default()).collect();
        for (h, m) in self.hot_meta.iter().enumerate() {
            let (row, st) = (&self.hot_rows[h * d..(h + 1) * d], &self.hot_state[h * w..(h + 1) * w]);
            if self.cold.expired(m, step) {
                self.cold.insert_raw(*m, row, st);
                self.moves += 1;
            } else {
                index[m.table as usize].insert(m.id, meta.len() as u32);
                rows.extend_from_slice(row);
                state.extend_from_slice(st);
                meta.push(*m);
            }
        }
        self.hot_rows = rows;
        self.hot_state = state;
        self.hot_meta = meta;
        self.hot_index = index;
        self.relayouts += 1;
    }

    /// Moves the hot rows of a restored checkpoint into the hot tier, in the
    /// writer's slot order (by table and id where several writers' slots
    /// collide after re-sharding), at most `hot_rows` of them; values, state
    /// and counts move unchanged. With the writer's worker count this is the
    /// writer's hot tier exactly.
    /// Returns whether any row moved.
    pub(crate) fn settle_restore(&mut self) -> bool {
        if self.restored_hot.is_empty() {
            return false;
        }
        let mut order: Vec<(u32, u32, u64)> = self.restored_hot.drain().map(|((t, id), h)| (h, t, id)).collect();
        order.sort_unstable();
        for (_, t, id) in order {
            if self.hot_meta.len() == self.capacity {
                break;
            }
            let slot = self.hot_meta.len() as u32;
            if self.hot_index[t as usize].contains_key(&id) {
                continue;
            }
            if let Some(m) = self.cold.take(t as usize, id, &mut self.hot_rows, &mut self.hot_state) {
                self.hot_meta.push(m);
                self.hot_index[t as usize].insert(id, slot);
            }
        }
        true
    }

    /// `cold` (rows of the cold tier, ids ascending) merged with the hot rows of
    /// `table` that `keep` selects, with every row's count, hot slot and last-use step.
    fn merge_tiers(&self, table: usize, cold: TableRows, keep: impl Fn(&Meta) -> bool) -> TableRows {
        let (d, w) = (self.dim, self.state_width);
        let mut hot: Vec<(u64, u32)> = self.hot_index[table]
            .iter()
            .filter(|&(_, &h)| keep(&self.hot_meta[h as usize]))
            .map(|(&id, &h)| (id, h))
            .collect();
        hot.sort_unstable();
        let n = cold.ids.len() + hot.len();
        let mut out = TableRows {
            ids: Vec::with_capacity(n),
            rows: Vec::with_capacity(n * d),
            state: Vec::with_capacity(n * w),
            counts: Vec::with_capacity(n),
            hot: Vec::with_capacity(n),
            last_seen: Vec::with_capacity(n),
            removed: Vec::new(),
        };
        let (mut i, mut j) = (0, 0);
        while i < cold.ids.len() || j < hot.len() {
            if j == hot.len() || (i < cold.ids.len() && cold.ids[i] < hot[j].0) {
                let id = cold.ids[i];
                out.ids.push(id);
                out.rows.extend_from_slice(&cold.rows[i * d..(i + 1) * d]);
                out.state.extend_from_slice(&cold.state[i * w..(i + 1) * w]);
                out.counts.push(cold.counts[i]);
                out.last_seen.push(cold.last_seen[i]);
                // A restored hot row not yet moved back keeps its slot.
                out.hot.push(self.restored_hot.get(&(table as u32, id)).copied().unwrap_or(COLD));
                i += 1;
            } else {
                let h = hot[j].1 as usize;
                out.ids.push(hot[j].0);
                out.rows.extend_from_slice(&self.hot_rows[h * d..(h + 1) * d]);
                out.state.extend_from_slice(&self.hot_state[h * w..(h + 1) * w]);
                out.counts.push(self.hot_meta[h].count);
                out.last_seen.push(self.hot_meta[h].last_seen);
                out.hot.push(h as u32);
                j += 1;
            }
        }
        out
    }

    /// True at the steps that re-plan: `warmup`, then every `flush_every` steps.
    pub(crate) fn plans_at(&self, completed: u64) -> bool {
        completed >= self.warmup && (completed - self.warmup).is_multiple_of(self.flush_every)
    }

    /// True when [`end_step`](EmbeddingStore::end_step)`(completed)` may move
    /// rows between the tiers or between hot slots (a re-plan, an expired hot
    /// row, or a restore's hot rows still to settle); other steps change only
    /// the cold tier.
    pub(crate) fn relays_at(&self, completed: u64) -> bool {
        self.plans_at(completed) || !self.restored_hot.is_empty() || self.expires_hot_at(completed)
    }

    /// The hot rows' values and optimizer state, in slot order.
    pub(crate) fn hot_values(&self) -> (&[f32], &[f32]) {
        (&self.hot_rows, &self.hot_state)
    }

    /// The hot rows' values and optimizer state, in slot order, to overwrite.
    pub(crate) fn hot_values_mut(&mut self) -> (&mut [f32], &mut [f32]) {
        (&mut self.hot_rows, &mut self.hot_state)
    }

    /// The row optimizer both tiers update with, at its current learning rate.
    pub(crate) fn row_optimizer(&self) -> (SparseOptimizerKind, OptimizerParams) {
        self.cold.optimizer()
    }

    /// [`gather`](EmbeddingStore::gather) of the cold rows only: appends
    /// `ids.len() × dim` values to `out`, zeros in the places of hot rows,
    /// and pushes `(its offset in out, hot slot)` of each hot row to `hot`. Counts
    /// the lookups as `gather` does.
    pub(crate) fn gather_cold(&mut self, table: usize, ids: &[u64], out: &mut Vec<f32>, hot: &mut Vec<(usize, u32)>) {
        self.settle_restore();
        let d = self.dim;
        out.reserve(ids.len() * d);
        self.lookups += ids.len() as u64;
        let index = &self.hot_index[table];
        for &id in ids {
            match index.get(&id) {
                Some(&h) => {
                    self.hot_hits += 1;
                    hot.push((out.len(), h));
                    out.resize(out.len() + d, 0.0);
                }
                None => self.cold.gather_one(table, id, out),
            }
        }
    }

    /// Counts an update of row `id` of `table` (its frequency, and a hot
    /// row's count and last step) and returns its hot slot; `None` for a cold
    /// row, which is left to the cold tier's `apply`.
    fn note_update(&mut self, table: usize, id: u64) -> Option<usize> {
        self.settle_restore();
        match &mut self.freq {
            Frequencies::Exact => {}
            Frequencies::Sketch(sketch) => {
                sketch.add(CountMinSketch::key(table, id));
            }
            Frequencies::Differential(dd) => dd.record(table, id),
        }
        let h = *self.hot_index[table].get(&id)? as usize;
        let m = &mut self.hot_meta[h];
        m.count = m.count.saturating_add(1);
        m.last_seen = self.cold.step();
        Some(h)
    }

    /// [`apply`](EmbeddingStore::apply) of a cold row; a hot row's update is
    /// counted and its slot returned, its values left to the caller.
    pub(crate) fn apply_cold(&mut self, table: usize, id: u64, grad: &[f32]) -> Option<u32> {
        match self.note_update(table, id) {
            Some(h) => Some(h as u32),
            None => {
                self.cold.apply(table, id, grad);
                None
            }
        }
    }
}

impl FiniteApply for TieredStore {
    fn apply_finite(&mut self, table: usize, id: u64, grad: &[f32]) -> bool {
        match self.note_update(table, id) {
            Some(h) => {
                let (d, w) = (self.dim, self.state_width);
                let (kind, hp) = self.cold.optimizer();
                apply_row_finite(
                    kind,
                    &hp,
                    &mut self.hot_rows[h * d..(h + 1) * d],
                    grad,
                    &mut self.hot_state[h * w..(h + 1) * w],
                )
            }
            None => self.cold.apply_finite(table, id, grad),
        }
    }
}

impl EmbeddingStore for TieredStore {
    fn dim(&self) -> usize {
        self.dim
    }
    fn state_width(&self) -> usize {
        self.state_width
    }
    fn gather(&mut self, table: usize, ids: &[u64], out: &mut Vec<f32>) {
        self.settle_restore();
        let d = self.dim;
        out.reserve(ids.len() * d);
        self.lookups += ids.len() as u64;
        let hot = &self.hot_index[table];
        for &id in ids {
            match hot.get(&id) {
                Some(&h) => {
                    self.hot_hits += 1;
                    let h = h as usize;
                    out.extend_from_slice(&self.hot_rows[h * d..(h + 1) * d]);
                }
                None => self.cold.gather_one(table, id, out),
            }
        }
    }
    fn set_lr(&mut self, lr: f32) {
        // The hot tier updates with the cold tier's optimizer.
        self.cold.set_lr(lr);
    }
    fn apply(&mut self, table: usize, id: u64, grad: &[f32]) {
        self.apply_finite(table, id, grad);
    }
    fn end_step(&mut self, completed: u64) {
        self.settle_restore();
        self.cold.set_step(completed);
        if let Frequencies::Differential(dd) = &mut self.freq {
            dd.advance(completed);
        }
        if self.plans_at(completed) {
            self.replan();
        }
        if self.evicts_at(completed) {
            self.expire_hot();
            let budget = self.cold.max_rows().map(|b| b.saturating_sub(self.hot_len() as u64));
            self.cold.evict(budget);
        }
    }
    fn export_table(&self, table: usize) -> TableRows {
        self.merge_tiers(table, self.cold.export_table(table), |_| true)
    }
    fn mark_checkpoint(&mut self) {
        self.cold.mark_checkpoint();
        self.marked_layout = (self.relayouts, self.hot_meta.iter().map(|m| (m.table, m.id)).collect());
    }
    /// Rows changed since the mark; after a re-plan since, also every row hot
    /// now or at the mark, so that each row's hot slot is current.
    fn export_changes(&self, table: usize) -> TableRows {
        let since = self.cold.mark().unwrap_or(0);
        let (layouts, was_hot) = &self.marked_layout;
        let relaid = *layouts != self.relayouts;
        let moved: rustc_hash::FxHashSet<u64> = if relaid {
            was_hot.iter().filter(|&&(t, _)| t as usize == table).map(|&(_, id)| id).collect()
        } else {
            Default::default()
        };
        let cold = self.cold.export_where(table, |m| m.last_seen >= since || moved.contains(&m.id));
        let mut out = self.merge_tiers(table, cold, |m| relaid || m.last_seen >= since);
        out.removed = self.cold.evicted_ids(table);
        out
    }
    fn reset(&mut self, completed: u64) {
        for m in &mut self.hot_index {
            m.clear();
        }
        self.hot_rows.clear();
        self.hot_state.clear();
        self.hot_meta.clear();
        self.cold.reset(completed);
        self.restored_hot.clear();
        self.marked_layout = (self.relayouts, Vec::new());
        match &mut self.freq {
            Frequencies::Exact => {}
            Frequencies::Sketch(sketch) => sketch.clear(),
            Frequencies::Differential(dd) => **dd = DifferentialFrequencies::new(dd.window(), completed),
        }
    }
    fn set_row(&mut self, table: usize, id: u64, row: &[f32], state: &[f32]) -> Result<(), OperatorError> {
        match self.hot_index.get(table).and_then(|m| m.get(&id)) {
            Some(&h) if row.len() == self.dim && state.len() == self.state_width => {
                let (d, w, h) = (self.dim, self.state_width, h as usize);
                self.hot_rows[h * d..(h + 1) * d].copy_from_slice(row);
                self.hot_state[h * w..(h + 1) * w].copy_from_slice(state);
                Ok(())
            }
            _ => self.cold.set_row(table, id, row, state),
        }
    }
    fn set_frequency(&mut self, table: usize, id: u64, count: u32, hot: Option<u32>) {
        match self.hot_index.get(table).and_then(|m| m.get(&id)) {
            Some(&h) => self.hot_meta[h as usize].count = count,
            None => self.cold.set_count(table, id, count),
        }
        match &mut self.freq {
            Frequencies::Exact => {}
            Frequencies::Sketch(sketch) => sketch.add_n(CountMinSketch::key(table, id), count),
            Frequencies::Differential(dd) => dd.seed(table, id, count),
        }
        if let Some(slot) = hot {
            self.restored_hot.insert((table as u32, id), slot);
        }
    }
    fn set_last_seen(&mut self, table: usize, id: u64, step: u64) {
        match self.hot_index.get(table).and_then(|m| m.get(&id)) {
            Some(&h) => self.hot_meta[h as usize].last_seen = step,
            None => self.cold.set_last_seen(table, id, step),
        }
    }
    fn admission_counters(&self) -> SketchCounters {
        self.cold.admission_counters()
    }
    fn admission_changes(&self) -> Option<SketchCounters> {
        self.cold.admission_changes()
    }
    fn set_admission_counters(&mut self, counters: &SketchCounters) {
        self.cold.set_admission_counters(counters);
    }
    fn stats(&self) -> StoreStats {
        let cold = self.cold.raw_stats();
        StoreStats {
            lookups: self.lookups,
            hot_hits: self.hot_hits,
            hot_rows: self.hot_len() as u64,
            cold_rows: self.cold.num_rows() as u64,
            replans: self.replans,
            moves: self.moves,
            ..cold
        }
    }
    fn num_rows(&self) -> usize {
        self.hot_len() + self.cold.num_rows()
    }
    fn sum_of_squares(&self) -> f64 {
        let mut rows = self.cold.keyed_rows();
        for (t, m) in self.hot_index.iter().enumerate() {
            rows.extend(
                m.iter().map(|(&id, &s)| {
                    ((t as u32, id), &self.hot_rows[s as usize * self.dim..(s as usize + 1) * self.dim])
                }),
            );
        }
        super::dynamic::sum_of_squares_by_key(rows)
    }
    fn holds_every_row(&self) -> bool {
        false
    }
}
