//! Embedding stores: where a worker keeps the rows it owns.
//!
//! [`EmbeddingStore`] is the contract between the trainer's owner side and
//! the memory that holds embedding rows and their optimizer state. Three
//! implementations:
//!
//! * [`FixedStore`]: the dense per-worker table of [`EmbeddingShard`] (local
//!   index `id / W`, no hashing). Every id below the table size exists from
//!   the start. The default and the fastest when the id space is known and fits.
//! * [`DynamicStore`]: a hash table `id → slot` over a slab of rows. A row is
//!   created on first sight with the same seeded initialisation as the fixed
//!   table (`rng::row_uniform(seed, table, id, …)`), optionally only once the id
//!   passes **admission** (seen in `admit_count` training steps, counted in a
//!   count-min sketch, or with probability `admit_prob` per sighting); rows
//!   leave by **eviction** (not seen for `ttl_steps` steps, then least frequently
//!   used beyond `max_rows`). Memory is bounded under a growing id space.
//! * [`TieredStore`]: PICASSO's HybridHash on the CPU. A [`DynamicStore`] is the
//!   cold tier; after `warmup` training steps the `hot_rows` most frequent ids
//!   move into a dense, contiguous hot tier (hottest first) found through one
//!   small id → hot-slot map, and the split is re-planned every `flush_every`
//!   steps. [`OffloadedTieredStore`] keeps that hot tier in another memory
//!   (a GPU worker's device) behind [`HotTierMemory`].
//!
//! Invariants every store keeps (the tests check each):
//! * **Values never depend on placement.** Moving a row between tiers moves its
//!   values and optimizer state bit for bit; a re-plan changes speed, never the
//!   model. With admission and eviction off, a dynamic or tiered store trains
//!   exactly the model of the fixed table (same seeded rows, same updates in the
//!   same order).
//! * **Determinism across worker counts.** Frequencies, admission and the
//!   step clock advance once per training step per distinct row, from the
//!   owner's de-duplicated, worker-ordered update list; a probabilistic
//!   admission hashes `(seed, table, id, step)`. So W workers make the same
//!   probabilistic admission decisions as one. Admission by count is the
//!   exception: each owner counts its ids in a count-min sketch of its own,
//!   whose collisions (over-counts that admit an id early) depend on which
//!   ids share it, so they may differ between worker counts (deterministic
//!   for one worker count).
//! * **Structural changes happen only at step boundaries.** Admission inserts a
//!   row during the update of the step that admits it; eviction and re-planning
//!   run only in [`EmbeddingStore::end_step`], after every update of a step and
//!   before any lookup of the next, so a checkpoint (taken between steps) is
//!   always a consistent cut of rows, optimizer state and membership.
//! * A non-admitted id reads as a zero row and its gradient is dropped; an
//!   evicted id that comes back starts again from its seeded initial row.
//! * **An update tells a ruined row.** [`FiniteApply::apply_finite`] updates
//!   a row exactly as [`EmbeddingStore::apply`] does and returns `false` when
//!   the updated row or its optimizer state holds an infinity or NaN, checked
//!   while the row is still in L1 (every CPU store). The cold tier of a tiered
//!   store whose hot tier lives in another memory is updated through the plain
//!   [`EmbeddingStore::apply`], unchecked.

pub mod differential;
mod dynamic;
mod fixed;
pub mod offloaded;
mod sketch;
pub mod tiered;

pub use differential::DifferentialFrequencies;
pub use dynamic::DynamicStore;
pub use fixed::FixedStore;
pub use offloaded::{HostHotTier, HotTierMemory, OffloadedTieredStore};
pub use sketch::CountMinSketch;
pub use tiered::TieredStore;

use crate::optim::{OptimizerParams, SparseOptimizerKind};
use crate::shard::EmbeddingShard;
use crate::snapshot::{SketchCounters, TableRows};
use crate::OperatorError;
use serde::{Deserialize, Serialize};

/// Which store holds the rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoreKind {
    /// Dense per-worker table of every id below the table size.
    #[default]
    Fixed,
    /// Hash table with admission and eviction.
    Dynamic,
    /// Frequency-aware hot tier over a dynamic cold tier.
    Tiered,
}

impl std::str::FromStr for StoreKind {
    type Err = OperatorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fixed" => Ok(StoreKind::Fixed),
            "dynamic" => Ok(StoreKind::Dynamic),
            "tiered" => Ok(StoreKind::Tiered),
            _ => Err(OperatorError::config("store", format!("unknown store `{s}` (fixed, dynamic, tiered)"))),
        }
    }
}

impl std::fmt::Display for StoreKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreKind::Fixed => "fixed",
            StoreKind::Dynamic => "dynamic",
            StoreKind::Tiered => "tiered",
        })
    }
}

/// Where the tiered store's hot-tier plan takes its frequencies from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FrequencySource {
    /// Each held row's exact count of training steps that updated it.
    #[default]
    Exact,
    /// A count-min sketch of every update (fixed memory, estimates ≥ the counts).
    Sketch,
    /// A differential-dataflow `count` over the update stream, optionally
    /// over the last `freq_window` steps ([`DifferentialFrequencies`]).
    Differential,
}

impl std::str::FromStr for FrequencySource {
    type Err = OperatorError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exact" => Ok(FrequencySource::Exact),
            "sketch" => Ok(FrequencySource::Sketch),
            "differential" => Ok(FrequencySource::Differential),
            _ => Err(OperatorError::config(
                "freq_source",
                format!("unknown frequency source `{s}` (exact, sketch, differential)"),
            )),
        }
    }
}

impl std::fmt::Display for FrequencySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FrequencySource::Exact => "exact",
            FrequencySource::Sketch => "sketch",
            FrequencySource::Differential => "differential",
        })
    }
}

/// Settings of the embedding store; the default is the fixed table, so
/// configurations and checkpoints written before stores existed still load.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// The store.
    pub kind: StoreKind,
    /// Row budget per worker (dynamic / tiered): least frequently used rows
    /// beyond it are evicted at each maintenance boundary. `None`: unbounded.
    pub max_rows: Option<u64>,
    /// Admit an id once it was seen in this many training steps (≤ 1: at once).
    pub admit_count: u32,
    /// Admit an unseen id with this probability per sighting (`None`: always).
    pub admit_prob: Option<f64>,
    /// Evict rows not updated for this many training steps (`None`: never).
    pub ttl_steps: Option<u64>,
    /// Rows per worker in the hot tier (tiered).
    pub hot_rows: usize,
    /// Training steps of frequency counting before the first hot-tier plan (tiered).
    pub warmup: u64,
    /// Maintenance interval in training steps: eviction (dynamic, tiered) and re-planning (tiered).
    pub flush_every: u64,
    /// Where hot candidates' frequencies come from (tiered).
    pub freq_source: FrequencySource,
    /// Count only the last this many training steps (`freq_source = differential`; `None`: all).
    pub freq_window: Option<u64>,
    /// Older spelling of `freq_source = "sketch"`, still read.
    pub freq_sketch: bool,
    /// Counters per row of the count-min sketches (admission, `freq_sketch`).
    pub sketch_width: usize,
}

impl StoreConfig {
    /// True when a dynamic or tiered store admits an unseen id at its first
    /// sighting: it then reads a row it does not hold as the seeded row it
    /// would admit ([`init_row`]); otherwise as zeros.
    pub fn admits_at_once(&self) -> bool {
        self.admit_count <= 1 && self.admit_prob.is_none()
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            kind: StoreKind::Fixed,
            max_rows: None,
            admit_count: 0,
            admit_prob: None,
            ttl_steps: None,
            hot_rows: 65_536,
            warmup: 100,
            flush_every: 1000,
            freq_source: FrequencySource::Exact,
            freq_window: None,
            freq_sketch: false,
            sketch_width: 1 << 20,
        }
    }
}

impl StoreConfig {
    /// Checks the settings; errors name the key.
    pub fn validate(&self) -> Result<(), OperatorError> {
        if self.max_rows == Some(0) {
            return Err(OperatorError::config("max_rows", "a row budget must be at least 1"));
        }
        if let Some(p) = self.admit_prob {
            if !(p.is_finite() && p > 0.0 && p <= 1.0) {
                return Err(OperatorError::config("admit_prob", format!("must be in (0, 1], got {p}")));
            }
            if self.admit_count > 1 {
                return Err(OperatorError::config("admit_prob", "give admit_count or admit_prob, not both"));
            }
        }
        if self.ttl_steps == Some(0) {
            return Err(OperatorError::config("ttl_steps", "must be at least 1"));
        }
        if self.flush_every == 0 {
            return Err(OperatorError::config("flush_every", "must be at least 1"));
        }
        if self.kind == StoreKind::Tiered && self.hot_rows == 0 {
            return Err(OperatorError::config("hot_rows", "the tiered store needs at least one hot row"));
        }
        if self.hot_rows > u32::MAX as usize / 2 {
            return Err(OperatorError::config("hot_rows", format!("{} is too large", self.hot_rows)));
        }
        if !(16..=1 << 30).contains(&self.sketch_width) {
            return Err(OperatorError::config("sketch_width", "must be between 16 and 2^30"));
        }
        if self.freq_sketch && self.freq_source == FrequencySource::Differential {
            return Err(OperatorError::config("freq_sketch", "give freq_source or freq_sketch, not both"));
        }
        if let Some(w) = self.freq_window {
            if w == 0 {
                return Err(OperatorError::config("freq_window", "must be at least 1"));
            }
            if self.frequency_source() != FrequencySource::Differential {
                return Err(OperatorError::config(
                    "freq_window",
                    "a frequency window needs freq_source = differential",
                ));
            }
        }
        if self.kind == StoreKind::Fixed
            && (self.max_rows.is_some()
                || self.admit_count > 1
                || self.admit_prob.is_some()
                || self.ttl_steps.is_some())
        {
            return Err(OperatorError::config(
                "store",
                "max_rows, admit_count, admit_prob and ttl_steps need store = dynamic or tiered",
            ));
        }
        Ok(())
    }

    /// The frequency source, reading the older `freq_sketch` too.
    pub fn frequency_source(&self) -> FrequencySource {
        if self.freq_sketch {
            FrequencySource::Sketch
        } else {
            self.freq_source
        }
    }

    /// True when every id is admitted at once and nothing is ever evicted, so
    /// the store trains exactly the model of the fixed table.
    pub fn is_exact(&self) -> bool {
        self.kind == StoreKind::Fixed
            || (self.max_rows.is_none()
                && self.admit_count <= 1
                && self.admit_prob.is_none()
                && self.ttl_steps.is_none())
    }
}

/// Counters of one store (or, summed with [`StoreStats::add`], of all workers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreStats {
    /// Rows looked up.
    pub lookups: u64,
    /// Lookups served by the hot tier (the dense table counts here).
    pub hot_hits: u64,
    /// Lookups served by the cold (hash) tier.
    pub cold_hits: u64,
    /// Lookups of ids without a row (served their initial row, or zeros before admission).
    pub misses: u64,
    /// Rows in the hot tier (the dense table's rows).
    pub hot_rows: u64,
    /// Rows in the cold tier.
    pub cold_rows: u64,
    /// Rows created (ids admitted).
    pub admissions: u64,
    /// Updates dropped because their id was not admitted.
    pub rejections: u64,
    /// Rows evicted.
    pub evictions: u64,
    /// Hot-tier plans made.
    pub replans: u64,
    /// Rows moved between tiers by re-planning.
    pub moves: u64,
}

impl StoreStats {
    /// Adds another worker's counters.
    pub fn add(&mut self, o: &StoreStats) {
        self.lookups += o.lookups;
        self.hot_hits += o.hot_hits;
        self.cold_hits += o.cold_hits;
        self.misses += o.misses;
        self.hot_rows += o.hot_rows;
        self.cold_rows += o.cold_rows;
        self.admissions += o.admissions;
        self.rejections += o.rejections;
        self.evictions += o.evictions;
        self.replans += o.replans;
        self.moves += o.moves;
    }

    /// Fraction of lookups served by the hot tier.
    pub fn hot_hit_ratio(&self) -> f64 {
        self.hot_hits as f64 / self.lookups.max(1) as f64
    }
}

/// The rows one worker owns, with their optimizer state.
///
/// Contracts (every method, every implementation):
/// * Only rows routed here by [`shard_of`](crate::routing::shard_of) are asked
///   for; `table` is below the number of tables and `id` below its size.
/// * [`gather`](Self::gather) appends exactly `ids.len() × dim` values, row
///   by row in `ids` order. It may count statistics but never changes a value
///   or which rows exist.
/// * [`apply`](Self::apply) is called once per distinct row per training step,
///   with the row's gradient already summed over workers and averaged; it runs
///   the sparse optimizer on the row, or (dynamic stores) admits or rejects it.
/// * [`end_step`](Self::end_step) is the maintenance hook, called after every
///   update of a training step with the number of training steps completed.
///   Eviction and tier moves happen only there.
/// * [`export_table`](Self::export_table) lists every row held, ids ascending,
///   with its optimizer state (a store that [exports updated rows
///   only](Self::exports_updated_only) leaves out the rows still at their seeded
///   values); [`reset`](Self::reset) followed by [`restore_row`] for each
///   exported row and [`set_admission_counters`](Self::set_admission_counters)
///   rebuilds the same state.
/// * [`export_changes`](Self::export_changes) lists, ids ascending, every row
///   whose values, optimizer state or frequency changed since the last
///   [`mark_checkpoint`](Self::mark_checkpoint), and in `removed` the ids
///   dropped since; applying that onto the export taken at the mark
///   ([`crate::snapshot::apply_delta`]) gives the export of now.
pub trait EmbeddingStore {
    /// Row width.
    fn dim(&self) -> usize;
    /// Optimizer values per row.
    fn state_width(&self) -> usize;
    /// Appends the rows of `ids` of `table` to `out`.
    fn gather(&mut self, table: usize, ids: &[u64], out: &mut Vec<f32>);
    /// Appends the rows of every lookup `(table, ids)` in turn, as
    /// [`gather`](Self::gather) of each would: one request's rows at once, so
    /// a store in another memory reads them in one round trip.
    fn gather_many(&mut self, lookups: &[(usize, &[u64])], out: &mut Vec<f32>) {
        for &(table, ids) in lookups {
            self.gather(table, ids, out);
        }
    }
    /// Applies the averaged gradient `grad` to row `id` of `table`.
    fn apply(&mut self, table: usize, id: u64, grad: &[f32]);
    /// Sets the row optimizer's learning rate for the next updates (a schedule's value).
    fn set_lr(&mut self, lr: f32);
    /// Hints that row `id` of `table` will be updated soon.
    fn prefetch_row(&self, _table: usize, _id: u64) {}
    /// Maintenance after a training step; `completed` counts the training steps done.
    fn end_step(&mut self, completed: u64);
    /// Every row of `table` held here, ids ascending, with its optimizer state.
    fn export_table(&self, table: usize) -> TableRows;
    /// True when [`export_table`](Self::export_table) leaves out the rows that
    /// hold their seeded initial values (the fixed store).
    fn exports_updated_only(&self) -> bool {
        false
    }
    /// A checkpoint's snapshot was just taken: changes count from here.
    fn mark_checkpoint(&mut self);
    /// The rows of `table` changed since the last mark and the ids removed since (see the contracts).
    fn export_changes(&self, table: usize) -> TableRows;
    /// Drops every row a dynamic store holds and sets the step clock (before a restore).
    fn reset(&mut self, completed: u64);
    /// Overwrites (or inserts) row `id` of `table` and its optimizer state.
    fn set_row(&mut self, table: usize, id: u64, row: &[f32], state: &[f32]) -> Result<(), OperatorError>;
    /// Restores the frequency of row `id` of `table` (set just before by
    /// [`set_row`](Self::set_row)): the training steps that updated it and,
    /// when it was hot, its slot in the writer's hot tier. Stores that keep no
    /// frequencies ignore it.
    fn set_frequency(&mut self, _table: usize, _id: u64, _count: u32, _hot: Option<u32>) {}
    /// Restores the last-use step of row `id` of `table` (set just before by
    /// [`set_row`](Self::set_row)), which TTL and LFU eviction read. Stores
    /// that evict nothing ignore it.
    fn set_last_seen(&mut self, _table: usize, _id: u64, _step: u64) {}
    /// The counters of the store's admission sketch (`--admit-count`:
    /// sightings of ids not held), empty without one; a checkpoint keeps them.
    fn admission_counters(&self) -> SketchCounters {
        SketchCounters::default()
    }
    /// The admission sketch's counters that changed since the last
    /// [`mark_checkpoint`](Self::mark_checkpoint) (`changes_only`), for a delta;
    /// `None` where the store cannot tell, and the delta carries
    /// [`admission_counters`](Self::admission_counters) whole.
    fn admission_changes(&self) -> Option<SketchCounters> {
        None
    }
    /// Restores the admission sketch's counters (a checkpoint's); ignored by a
    /// store without a sketch or with one of another size.
    fn set_admission_counters(&mut self, _counters: &SketchCounters) {}
    /// Counters and sizes.
    fn stats(&self) -> StoreStats;
    /// Rows held.
    fn num_rows(&self) -> usize;
    /// Σ of squares of the rows held, in f64.
    fn sum_of_squares(&self) -> f64;
    /// True when the store holds every id below the table sizes (a checkpoint must then hold all of them).
    fn holds_every_row(&self) -> bool;
}

/// A store in this process's memory whose row updates report whether the
/// updated row stayed finite (the CPU stores; see the module docs).
pub trait FiniteApply: EmbeddingStore {
    /// [`EmbeddingStore::apply`], with the same values, and whether the updated
    /// row and its optimizer state are finite. An
    /// update that changes nothing (a rejected id, a row admitted without
    /// its first gradient) reports `true`.
    fn apply_finite(&mut self, table: usize, id: u64, grad: &[f32]) -> bool;
}

/// Restores row `i` of `part`, a checkpoint's rows of `table`, into `store`:
/// its values and optimizer state, then its frequency and hot slot and its
/// last-use step where the part carries them (a restore's order: after
/// [`reset`](EmbeddingStore::reset), each row once).
pub fn restore_row<S: EmbeddingStore + ?Sized>(
    store: &mut S,
    table: usize,
    part: &TableRows,
    i: usize,
) -> Result<(), OperatorError> {
    let (d, w, id) = (store.dim(), store.state_width(), part.ids[i]);
    store.set_row(table, id, &part.rows[i * d..(i + 1) * d], &part.state[i * w..(i + 1) * w])?;
    if let Some((count, hot)) = part.frequency(i) {
        store.set_frequency(table, id, count, hot);
    }
    if let Some(step) = part.last_seen_of(i) {
        store.set_last_seen(table, id, step);
    }
    Ok(())
}

/// Everything a store is built from.
///
/// Invariant of every store built from it: `worker < workers` and `dim > 0`
/// ([`StoreParams::validate`]; [`Store::new`] checks it).
#[derive(Clone, Debug)]
pub struct StoreParams<'a> {
    /// This worker.
    pub worker: usize,
    /// Number of workers.
    pub workers: usize,
    /// Row width.
    pub dim: usize,
    /// Logical rows per table (ids are below them; the initialisation bound is `1/√n`).
    pub table_sizes: &'a [u64],
    /// Seed of the row initialisation.
    pub seed: u64,
    /// Row optimizer.
    pub optimizer: SparseOptimizerKind,
    /// Its hyper-parameters.
    pub hp: OptimizerParams,
}

impl StoreParams<'_> {
    /// Checks the worker's place and the row width
    /// ([`check_placement`](crate::shard::check_placement)); errors name the key
    /// (`workers`, `worker`, `dim`).
    pub fn validate(&self) -> Result<(), OperatorError> {
        crate::shard::check_placement(self.worker, self.workers, self.dim)
    }
}

/// A store whose rows live in another memory (a GPU's): the owner hands it a
/// step's row updates at once, and it reports a failure of that memory inside
/// the step (the owner asks after serving and after updating) instead of
/// failing a call.
///
/// Contracts, beyond [`EmbeddingStore`]'s: [`apply_rows`](Self::apply_rows)
/// updates each row as [`EmbeddingStore::apply`] would, in the order given; a
/// call that fails (the device is lost, say) leaves its results undefined
/// and records the failure for [`take_error`](Self::take_error), which the
/// trainer reads inside the step, after serving a request, after updating the
/// rows and after reading them for a report, failing that step on every worker
/// (a failure while serving before any owner updates anything). A gather
/// that fails still appends its `ids.len() · dim` values (zeros).
pub trait DeviceStore: EmbeddingStore + std::fmt::Debug {
    /// Applies `grads[k·dim ..][..dim]`, the summed and averaged gradient of
    /// row `rows[k]` (table, id; all distinct), to each row.
    fn apply_rows(&mut self, rows: &[(u32, u64)], grads: &[f32]);
    /// The first failure since the last call, if any, naming the device.
    fn take_error(&mut self) -> Option<String>;
}

/// One of the stores, dispatched by `match` so the fixed arm stays a direct call.
// One per worker, built once and never moved on a hot path: boxing the larger
// variants would only add an indirection to every lookup.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Store {
    /// Dense table.
    Fixed(FixedStore),
    /// Hash table.
    Dynamic(DynamicStore),
    /// Hot tier over a hash table.
    Tiered(TieredStore),
    /// Rows in another memory (a GPU worker's rows on its device).
    Device(Box<dyn DeviceStore>),
}

impl Store {
    /// Builds the store `config` names.
    ///
    /// Errors: [`OperatorError::Config`] naming the key when `config` or `p` is refused
    /// ([`StoreConfig::validate`], [`StoreParams::validate`]); the fixed store's
    /// [`OperatorError::Memory`] when its tables cannot be allocated.
    pub fn new(config: &StoreConfig, p: &StoreParams<'_>) -> Result<Self, OperatorError> {
        config.validate()?;
        p.validate()?;
        Ok(match config.kind {
            StoreKind::Fixed => Store::Fixed(FixedStore::new(EmbeddingShard::new(
                p.worker,
                p.workers,
                p.dim,
                p.table_sizes,
                p.seed,
                p.optimizer,
                p.hp,
            )?)),
            StoreKind::Dynamic => Store::Dynamic(DynamicStore::new(config, p)),
            StoreKind::Tiered => Store::Tiered(TieredStore::new(config, p)),
        })
    }
}

macro_rules! dispatch {
    ($self:expr, $s:ident => $e:expr) => {
        match $self {
            Store::Fixed($s) => $e,
            Store::Dynamic($s) => $e,
            Store::Tiered($s) => $e,
            Store::Device($s) => $e,
        }
    };
}

impl EmbeddingStore for Store {
    fn dim(&self) -> usize {
        dispatch!(self, s => s.dim())
    }
    fn state_width(&self) -> usize {
        dispatch!(self, s => s.state_width())
    }
    fn gather(&mut self, table: usize, ids: &[u64], out: &mut Vec<f32>) {
        dispatch!(self, s => s.gather(table, ids, out))
    }
    fn gather_many(&mut self, lookups: &[(usize, &[u64])], out: &mut Vec<f32>) {
        dispatch!(self, s => s.gather_many(lookups, out))
    }
    fn apply(&mut self, table: usize, id: u64, grad: &[f32]) {
        dispatch!(self, s => s.apply(table, id, grad))
    }
    fn set_lr(&mut self, lr: f32) {
        dispatch!(self, s => s.set_lr(lr))
    }
    fn prefetch_row(&self, table: usize, id: u64) {
        dispatch!(self, s => s.prefetch_row(table, id))
    }
    fn end_step(&mut self, completed: u64) {
        dispatch!(self, s => s.end_step(completed))
    }
    fn export_table(&self, table: usize) -> TableRows {
        dispatch!(self, s => s.export_table(table))
    }
    fn exports_updated_only(&self) -> bool {
        dispatch!(self, s => s.exports_updated_only())
    }
    fn mark_checkpoint(&mut self) {
        dispatch!(self, s => s.mark_checkpoint())
    }
    fn export_changes(&self, table: usize) -> TableRows {
        dispatch!(self, s => s.export_changes(table))
    }
    fn reset(&mut self, completed: u64) {
        dispatch!(self, s => s.reset(completed))
    }
    fn set_row(&mut self, table: usize, id: u64, row: &[f32], state: &[f32]) -> Result<(), OperatorError> {
        dispatch!(self, s => s.set_row(table, id, row, state))
    }
    fn set_frequency(&mut self, table: usize, id: u64, count: u32, hot: Option<u32>) {
        dispatch!(self, s => s.set_frequency(table, id, count, hot))
    }
    fn set_last_seen(&mut self, table: usize, id: u64, step: u64) {
        dispatch!(self, s => s.set_last_seen(table, id, step))
    }
    fn admission_counters(&self) -> SketchCounters {
        dispatch!(self, s => s.admission_counters())
    }
    fn admission_changes(&self) -> Option<SketchCounters> {
        dispatch!(self, s => s.admission_changes())
    }
    fn set_admission_counters(&mut self, counters: &SketchCounters) {
        dispatch!(self, s => s.set_admission_counters(counters))
    }
    fn stats(&self) -> StoreStats {
        dispatch!(self, s => s.stats())
    }
    fn num_rows(&self) -> usize {
        dispatch!(self, s => s.num_rows())
    }
    fn sum_of_squares(&self) -> f64 {
        dispatch!(self, s => s.sum_of_squares())
    }
    fn holds_every_row(&self) -> bool {
        dispatch!(self, s => s.holds_every_row())
    }
}

pub use crate::rng::{init_bound, init_row, UNIT_OFFSET};

#[cfg(test)]
mod tests;
