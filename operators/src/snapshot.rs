//! Checkpoint snapshots of one worker's training state, and their re-sharding.
//!
//! A [`WorkerSnapshot`] is what worker `k` of `W` contributes to a checkpoint:
//! its replica of the dense parameters (identical on every worker after a
//! step, so only one part needs to carry them), the dense-optimizer state of
//! its slice [`dense_slice`](crate::routing::dense_slice)`(len, k, W)`, and every
//! embedding row it owns (`shard_of(t, id, W) == k`) with the row's optimizer
//! slots, plus the number of training steps taken.
//!
//! Restoring does not depend on the writer's worker count. [`check_parts`]
//! verifies, before anything is overwritten, that the parts of all `W'`
//! writers together hold:
//! * every row of every table exactly once, each in the part of its owner
//!   under `W'`, with `dim` values and `state_width` slots;
//! * dense-optimizer slices of one kind and update count that tile the dense
//!   buffer exactly;
//! * one dense parameter buffer of the model's length.
//!
//! A worker of the new run then picks the rows [`shard_of`] assigns it under
//! the new `W` and re-slices the dense-optimizer state, so a 2-worker
//! checkpoint restores into 1 or 3 workers with every value bit-identical.
//!
//! Parts of *updated rows only* ([`WorkerSnapshot::updated_only`]) leave out
//! the rows no step ever changed; a store that holds every row re-creates
//! those from the seed, so such a checkpoint's size follows what was trained.
//! A *delta* ([`WorkerSnapshot::delta_of`]) holds the rows changed since the
//! previous checkpoint of its run, the ids removed since, and the whole dense
//! state; [`apply_delta`] applies it onto that checkpoint's whole parts, and
//! only whole parts restore.

use crate::optim::{DenseOptimizerKind, DenseOptimizerState};
use crate::routing::shard_of;
use crate::{OperatorError, RestoreError};

/// One table's rows held by one worker: `ids.len()` rows of `dim` values and
/// `state_width` optimizer slots each, row `i` of both belonging to `ids[i]`;
/// dynamic and tiered stores add each row's frequency, hot-tier slot and
/// last-use step (each empty where a store keeps none, or in checkpoints older
/// than them).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TableRows {
    /// Global row ids.
    pub ids: Vec<u64>,
    /// `ids.len() × dim` values.
    pub rows: Vec<f32>,
    /// `ids.len() × state_width` optimizer slots.
    pub state: Vec<f32>,
    /// Empty, or per row the training steps that updated it (the frequency
    /// that hot-tier plans and LFU eviction rank by).
    pub counts: Vec<u32>,
    /// Empty, or per row its slot in the writer's hot tier ([`COLD`] when cold).
    pub hot: Vec<u32>,
    /// Empty, or per row the step clock of its last update (or of its
    /// admission): what TTL eviction and the ties of LFU eviction read, so a
    /// resumed store evicts the rows the uninterrupted one would.
    pub last_seen: Vec<u64>,
    /// In a delta's part only: ids the store dropped (evicted) since the
    /// checkpoint the delta follows, ascending; a row both dropped and held
    /// again since is listed here and among `ids`.
    pub removed: Vec<u64>,
}

/// [`TableRows::hot`] of a row outside the hot tier.
pub const COLD: u32 = u32::MAX;

impl TableRows {
    /// Row `i`'s last-use step, when the part carries them.
    pub fn last_seen_of(&self, i: usize) -> Option<u64> {
        self.last_seen.get(i).copied()
    }

    /// Row `i`'s `(count, hot slot)`, when the part carries frequencies.
    pub fn frequency(&self, i: usize) -> Option<(u32, Option<u32>)> {
        let count = *self.counts.get(i)?;
        let hot = self.hot.get(i).copied().filter(|&h| h != COLD);
        Some((count, hot))
    }
}

/// One worker's share of a checkpoint (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerSnapshot {
    /// The worker that wrote this part.
    pub worker: usize,
    /// Workers of the run that wrote the checkpoint.
    pub workers: usize,
    /// Training steps taken (parameter updates).
    pub step: u64,
    /// Embedding row width.
    pub dim: usize,
    /// Optimizer slots per embedding row.
    pub state_width: usize,
    /// The dense parameters; may be empty in every part but one.
    pub dense_params: Vec<f32>,
    /// The dense-optimizer state of this worker's slice.
    pub dense_optimizer: DenseOptimizerState,
    /// Per table, the rows this worker owns.
    pub tables: Vec<TableRows>,
    /// Rows absent from every part were never updated: a store that holds
    /// every row (the fixed store) re-creates them from the seed. False for
    /// parts that list every row.
    pub updated_only: bool,
    /// `Some(parent)`: a delta, holding only the rows changed since the
    /// checkpoint of step `parent` (with the ids removed since), and the whole
    /// dense state; [`apply_delta`] turns it and the parts of `parent` into
    /// whole parts. Restoring needs whole parts.
    pub delta_of: Option<u64>,
    /// The seed of the writer's row initialisation.
    pub seed: u64,
    /// The writer's table sizes (empty where not recorded: older checkpoints).
    pub table_sizes: Vec<u64>,
    /// The counters of the writer's admission sketch (`--admit-count`:
    /// sightings of ids not held), empty without one (and in older checkpoints);
    /// in a delta, possibly only those that grew since its parent
    /// ([`SketchCounters::changes_only`]).
    pub admission: SketchCounters,
}

/// A count-min sketch's counters as a checkpoint holds them: `len` counters,
/// those at `index` (ascending) holding `value` and every other one zero. Only
/// the non-zero ones are kept, so a file's claim of `len` costs no memory
/// until a sketch of that size takes them. A delta may hold only the counters
/// that changed since its parent (`changes_only`), which [`apply_delta`] lays
/// over the parent's: the admission sketch's counters only grow between two
/// checkpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SketchCounters {
    /// Counters in the sketch (depth × width).
    pub len: usize,
    /// Positions of the non-zero counters, ascending.
    pub index: Vec<u32>,
    /// Their values.
    pub value: Vec<u32>,
    /// Only the counters changed since the parent checkpoint (a delta's), every
    /// other one as the parent holds it; otherwise the whole sketch.
    pub changes_only: bool,
}

impl SketchCounters {
    /// The non-zero counters of `dense` (empty for an empty slice; a sketch
    /// has fewer than 2³² counters, as its width is at most 2³⁰).
    pub fn from_dense(dense: &[u32]) -> Self {
        let (index, value) = dense.iter().enumerate().filter(|(_, &c)| c != 0).map(|(i, &c)| (i as u32, c)).unzip();
        SketchCounters { len: dense.len(), index, value, changes_only: false }
    }

    /// Lays `changes` (a delta's counters changed since these, of a sketch of the
    /// same length: [`apply_delta`] checks it) over these counters: the changed
    /// ones take its values, the rest keep theirs.
    pub fn overlay(&mut self, changes: &SketchCounters) {
        let (old, new) = (&*self, changes);
        let (mut index, mut value) = (Vec::with_capacity(old.index.len()), Vec::with_capacity(old.value.len()));
        let (mut a, mut b) = (0, 0);
        while a < old.index.len() || b < new.index.len() {
            let take_new = match (old.index.get(a), new.index.get(b)) {
                (Some(&i), Some(&j)) => j <= i,
                (None, Some(_)) => true,
                _ => false,
            };
            if take_new {
                a += usize::from(old.index.get(a) == Some(&new.index[b]));
                index.push(new.index[b]);
                value.push(new.value[b]);
                b += 1;
            } else {
                index.push(old.index[a]);
                value.push(old.value[a]);
                a += 1;
            }
        }
        (self.index, self.value) = (index, value);
    }

    /// True when there is no sketch.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Overwrites `dense` with these counters; false, with `dense` unchanged,
    /// when it is not `len` long or the positions are not ascending inside it.
    pub fn write_into(&self, dense: &mut [u32]) -> bool {
        let fits = dense.len() == self.len && self.index.len() == self.value.len();
        let ascending = self.index.windows(2).all(|w| w[0] < w[1]);
        if !fits || !ascending || self.index.last().is_some_and(|&i| i as usize >= self.len) {
            return false;
        }
        dense.fill(0);
        for (&i, &v) in self.index.iter().zip(&self.value) {
            dense[i as usize] = v;
        }
        true
    }
}

/// What the trainer expects a checkpoint to hold.
#[derive(Clone, Copy, Debug)]
pub struct Expected<'a> {
    /// Rows per table.
    pub table_sizes: &'a [u64],
    /// Embedding row width.
    pub dim: usize,
    /// Optimizer slots per row.
    pub state_width: usize,
    /// Dense parameters of the model.
    pub dense_len: usize,
    /// The dense optimizer.
    pub dense_kind: DenseOptimizerKind,
    /// True when the checkpoint must hold every row of every table (the fixed
    /// store); dynamic stores hold, and checkpoint, only the rows they have.
    pub every_row: bool,
    /// The trainer's seed (parts of updated rows only must have it).
    pub seed: u64,
}

/// The verified content of a checkpoint's parts.
#[derive(Debug)]
pub struct CheckedParts<'a> {
    /// Training steps taken.
    pub step: u64,
    /// The dense parameters.
    pub dense_params: &'a [f32],
    /// The dense-optimizer state over the whole buffer.
    pub dense_optimizer: DenseOptimizerState,
}

/// Checks that `parts` form one complete, consistent checkpoint of a model
/// shaped as `expected` (see the module docs); nothing is modified.
pub fn check_parts<'a>(parts: &'a [WorkerSnapshot], expected: Expected<'_>) -> Result<CheckedParts<'a>, OperatorError> {
    let first = parts.first().ok_or(RestoreError::NoParts)?;
    let writers = first.workers;
    if writers == 0 || parts.len() != writers {
        return Err(RestoreError::PartCount { parts: parts.len(), writers }.into());
    }
    let mut seen_worker = vec![false; writers];
    for p in parts {
        if p.workers != writers || p.step != first.step {
            return Err(RestoreError::MixedParts {
                worker: p.worker,
                workers: p.workers,
                step: p.step,
                writers,
                first_step: first.step,
            }
            .into());
        }
        if let Some(parent) = p.delta_of {
            return Err(RestoreError::UnresolvedDelta { worker: p.worker, parent }.into());
        }
        match seen_worker.get_mut(p.worker) {
            Some(s) if !*s => *s = true,
            _ => return Err(RestoreError::DuplicateWorker { worker: p.worker, writers }.into()),
        }
        if p.dim != expected.dim || p.state_width != expected.state_width {
            return Err(RestoreError::PartRowWidths {
                worker: p.worker,
                dim: p.dim,
                state_width: p.state_width,
                expected_dim: expected.dim,
                expected_state_width: expected.state_width,
            }
            .into());
        }
        if !p.table_sizes.is_empty() && p.table_sizes != expected.table_sizes {
            return Err(RestoreError::TableSizes {
                worker: p.worker,
                sizes: p.table_sizes.clone(),
                expected: expected.table_sizes.to_vec(),
            }
            .into());
        }
        if p.updated_only && expected.every_row && p.seed != expected.seed {
            return Err(RestoreError::Seed { worker: p.worker, seed: p.seed, expected: expected.seed }.into());
        }
        if p.tables.len() != expected.table_sizes.len() {
            return Err(RestoreError::TableCount {
                worker: p.worker,
                tables: p.tables.len(),
                expected: expected.table_sizes.len(),
            }
            .into());
        }
    }
    // A part of updated rows only leaves the other rows at their seeded values.
    let every_row = expected.every_row && !parts.iter().any(|p| p.updated_only);
    check_rows(parts, Expected { every_row, ..expected })?;
    let with_params: Vec<&WorkerSnapshot> = parts.iter().filter(|p| !p.dense_params.is_empty()).collect();
    let Some(carrier) = with_params.first() else {
        return Err(RestoreError::NoDenseParams.into());
    };
    if let Some(p) = with_params.iter().find(|p| p.dense_params.len() != expected.dense_len) {
        return Err(RestoreError::DenseParamCount {
            worker: p.worker,
            len: p.dense_params.len(),
            expected: expected.dense_len,
        }
        .into());
    }
    let states: Vec<&DenseOptimizerState> = parts.iter().map(|p| &p.dense_optimizer).collect();
    let dense_optimizer = DenseOptimizerState::concat(&states, expected.dense_len)?;
    if dense_optimizer.kind != expected.dense_kind {
        return Err(RestoreError::OptimizerKind {
            found: dense_optimizer.kind.to_string(),
            expected: expected.dense_kind.to_string(),
        }
        .into());
    }
    Ok(CheckedParts { step: first.step, dense_params: &carrier.dense_params, dense_optimizer })
}

/// Every row at most once (exactly once with `every_row`), in its owner's part, with matching widths.
fn check_rows(parts: &[WorkerSnapshot], expected: Expected<'_>) -> Result<(), OperatorError> {
    let (d, w) = (expected.dim, expected.state_width);
    for (t, &n) in expected.table_sizes.iter().enumerate() {
        let mut seen = if expected.every_row { vec![0u64; (n as usize).div_ceil(64)] } else { Vec::new() };
        let mut seen_sparse = rustc_hash::FxHashSet::default();
        let mut count = 0u64;
        for p in parts {
            let rows = &p.tables[t];
            let k = rows.ids.len();
            let partial = |n: usize| n != 0 && n != k;
            if partial(rows.counts.len()) || partial(rows.hot.len()) || partial(rows.last_seen.len()) {
                return Err(RestoreError::FrequencyCount {
                    table: t,
                    worker: p.worker,
                    ids: k,
                    counts: rows.counts.len(),
                    hot: rows.hot.len(),
                    last_seen: rows.last_seen.len(),
                }
                .into());
            }
            if let Some((i, &last_seen)) = rows.last_seen.iter().enumerate().find(|&(_, &s)| s > p.step) {
                let (table, worker, id, step) = (t, p.worker, rows.ids[i], p.step);
                return Err(RestoreError::LastSeenAfterStep { table, worker, id, last_seen, step }.into());
            }
            if rows.rows.len() != k * d || rows.state.len() != k * w {
                return Err(RestoreError::PartTableWidths {
                    table: t,
                    worker: p.worker,
                    ids: k,
                    values: rows.rows.len(),
                    slots: rows.state.len(),
                }
                .into());
            }
            for &id in &rows.ids {
                if id >= n || shard_of(t, id, p.workers) != p.worker {
                    return Err(RestoreError::MisplacedRow {
                        table: t,
                        id,
                        worker: p.worker,
                        workers: p.workers,
                        rows: n,
                    }
                    .into());
                }
                let twice = if expected.every_row {
                    let (word, bit) = ((id / 64) as usize, id % 64);
                    let was = seen[word] & (1 << bit) != 0;
                    seen[word] |= 1 << bit;
                    was
                } else {
                    !seen_sparse.insert(id)
                };
                if twice {
                    return Err(RestoreError::DuplicateRow { table: t, id }.into());
                }
                count += 1;
            }
        }
        if expected.every_row && count != n {
            return Err(RestoreError::MissingRows { table: t, present: count, rows: n }.into());
        }
    }
    Ok(())
}

/// Checks one row restored into worker `worker` of `workers`, whose store keeps rows
/// of `dim` values and `state_width` optimizer slots: the table exists, the row is
/// in it and owned by this worker (`shard_of(table, id, workers) == worker`), and
/// `row` and `state` have those widths. Every store's restore runs it before
/// overwriting the row.
pub(crate) fn check_row(
    (worker, workers, dim, state_width): (usize, usize, usize, usize),
    table_sizes: &[u64],
    table: usize,
    id: u64,
    row: &[f32],
    state: &[f32],
) -> Result<(), RestoreError> {
    let rows = *table_sizes.get(table).ok_or(RestoreError::NoSuchTable { table })?;
    if id >= rows || shard_of(table, id, workers) != worker {
        return Err(RestoreError::NotOwned { table, id, worker, workers, rows });
    }
    if row.len() != dim || state.len() != state_width {
        return Err(RestoreError::RowWidths {
            table,
            id,
            values: row.len(),
            slots: state.len(),
            expected_values: dim,
            expected_slots: state_width,
        });
    }
    Ok(())
}

/// Applies the parts of a delta (see [`WorkerSnapshot::delta_of`]) onto the whole
/// parts of the checkpoint it follows, in place: per table, the removed ids
/// leave, the delta's rows replace or join the base's (ids stay ascending), and
/// the step, dense parameters and dense-optimizer state become the delta's.
/// Both must come from the same writers (a chain is written by one run), and
/// the delta must follow exactly the base's step. On error `base` is unchanged.
pub fn apply_delta(base: &mut [WorkerSnapshot], delta: Vec<WorkerSnapshot>) -> Result<(), RestoreError> {
    let first = base.first().ok_or(RestoreError::NoParts)?;
    let (base_step, base_workers) = (first.step, first.workers);
    if delta.len() != base.len() {
        return Err(RestoreError::PartCount { parts: delta.len(), writers: base_workers });
    }
    for (k, (b, d)) in base.iter().zip(&delta).enumerate() {
        let follows = d.delta_of == Some(b.step) && b.delta_of.is_none() && b.step == base_step;
        if !follows || d.worker != k || b.worker != k || d.workers != b.workers || d.workers != base_workers {
            return Err(RestoreError::DeltaParent {
                worker: d.worker,
                workers: d.workers,
                parent: d.delta_of,
                base_step,
                base_workers,
            });
        }
        if d.dim != b.dim || d.state_width != b.state_width {
            return Err(RestoreError::PartRowWidths {
                worker: d.worker,
                dim: d.dim,
                state_width: d.state_width,
                expected_dim: b.dim,
                expected_state_width: b.state_width,
            });
        }
        if d.tables.len() != b.tables.len() {
            return Err(RestoreError::TableCount { worker: k, tables: d.tables.len(), expected: b.tables.len() });
        }
        if d.admission.changes_only && d.admission.len != b.admission.len {
            let (len, expected) = (d.admission.len, b.admission.len);
            return Err(RestoreError::AdmissionLength { worker: k, len, expected });
        }
    }
    let mut merged = Vec::with_capacity(base.len());
    for (b, d) in base.iter().zip(&delta) {
        let tables = b
            .tables
            .iter()
            .zip(&d.tables)
            .enumerate()
            .map(|(t, (bt, dt))| merge_rows(bt, dt, (t, b.worker, b.dim, b.state_width)))
            .collect::<Result<Vec<_>, _>>()?;
        merged.push(tables);
    }
    for ((b, d), tables) in base.iter_mut().zip(delta).zip(merged) {
        b.tables = tables;
        b.step = d.step;
        b.dense_params = d.dense_params;
        b.dense_optimizer = d.dense_optimizer;
        // A delta carries the admission counters changed since its parent (or, written
        // before those were tracked, the whole sketch).
        if d.admission.changes_only {
            b.admission.overlay(&d.admission);
        } else {
            b.admission = d.admission;
        }
    }
    Ok(())
}

/// The admission-sketch counters worker `me` of `workers` restores from `parts`:
/// with the writer's worker count its own part's (the sketch it had); with
/// another, the largest of every part's counter in each cell. A sketch counted
/// only the ids its worker owned, so for any id that maximum is at least what
/// the id's old owner counted: count-min's guarantee (never below the true
/// count) holds. Parts without counters, or with another number of them than
/// the first part that has some, are left out; empty when none has any.
pub fn admission_for(parts: &[WorkerSnapshot], me: usize, workers: usize) -> SketchCounters {
    let with: Vec<&WorkerSnapshot> = parts.iter().filter(|p| !p.admission.is_empty()).collect();
    let Some(first) = with.first() else { return SketchCounters::default() };
    if first.workers == workers {
        return parts.iter().find(|p| p.worker == me).map(|p| p.admission.clone()).unwrap_or_default();
    }
    let len = first.admission.len;
    let mut cells: Vec<(u32, u32)> = with
        .iter()
        .filter(|p| p.admission.len == len)
        .flat_map(|p| p.admission.index.iter().copied().zip(p.admission.value.iter().copied()))
        .collect();
    cells.sort_unstable();
    // Sorted by position, then value: the last of each position is its largest.
    cells.dedup_by(|later, kept| {
        let same = later.0 == kept.0;
        if same {
            kept.1 = later.1;
        }
        same
    });
    let (index, value) = cells.into_iter().unzip();
    SketchCounters { len, index, value, changes_only: false }
}

/// One table of [`apply_delta`]: a merge of two ascending id lists.
fn merge_rows(
    base: &TableRows,
    delta: &TableRows,
    (table, worker, d, w): (usize, usize, usize, usize),
) -> Result<TableRows, RestoreError> {
    let ascending = |ids: &[u64]| ids.windows(2).all(|p| p[0] < p[1]);
    if !ascending(&base.ids) || !ascending(&delta.ids) || !ascending(&delta.removed) {
        return Err(RestoreError::UnsortedRows { table, worker });
    }
    for rows in [base, delta] {
        let k = rows.ids.len();
        if rows.rows.len() != k * d || rows.state.len() != k * w {
            return Err(RestoreError::PartTableWidths {
                table,
                worker,
                ids: k,
                values: rows.rows.len(),
                slots: rows.state.len(),
            });
        }
    }
    // Frequencies are kept when either side has them; then both must (or have no rows).
    let with_counts = !base.counts.is_empty() || !delta.counts.is_empty();
    let with_hot = !base.hot.is_empty() || !delta.hot.is_empty();
    let with_last_seen = !base.last_seen.is_empty() || !delta.last_seen.is_empty();
    for rows in [base, delta] {
        let k = rows.ids.len();
        let bad = |n: usize, wanted: bool| if wanted { n != k } else { n != 0 };
        if bad(rows.counts.len(), with_counts)
            || bad(rows.hot.len(), with_hot)
            || bad(rows.last_seen.len(), with_last_seen)
        {
            return Err(RestoreError::FrequencyCount {
                table,
                worker,
                ids: k,
                counts: rows.counts.len(),
                hot: rows.hot.len(),
                last_seen: rows.last_seen.len(),
            });
        }
    }
    let mut out = TableRows::default();
    let push = |out: &mut TableRows, from: &TableRows, i: usize| {
        out.ids.push(from.ids[i]);
        out.rows.extend_from_slice(&from.rows[i * d..(i + 1) * d]);
        out.state.extend_from_slice(&from.state[i * w..(i + 1) * w]);
        if with_counts {
            out.counts.push(from.counts[i]);
        }
        if with_hot {
            out.hot.push(from.hot[i]);
        }
        if with_last_seen {
            out.last_seen.push(from.last_seen[i]);
        }
    };
    let (mut i, mut j, mut r) = (0, 0, 0);
    while i < base.ids.len() || j < delta.ids.len() {
        let take_base = j == delta.ids.len() || (i < base.ids.len() && base.ids[i] < delta.ids[j]);
        if take_base {
            let id = base.ids[i];
            while r < delta.removed.len() && delta.removed[r] < id {
                r += 1;
            }
            if delta.removed.get(r) != Some(&id) {
                push(&mut out, base, i);
            }
            i += 1;
        } else {
            if i < base.ids.len() && base.ids[i] == delta.ids[j] {
                i += 1; // replaced
            }
            push(&mut out, delta, j);
            j += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(worker: usize, workers: usize, sizes: &[u64], params: Vec<f32>) -> WorkerSnapshot {
        let tables = sizes
            .iter()
            .enumerate()
            .map(|(t, &n)| {
                let ids: Vec<u64> = (0..n).filter(|&id| shard_of(t, id, workers) == worker).collect();
                TableRows {
                    rows: ids.iter().flat_map(|&id| [id as f32, t as f32]).collect(),
                    state: vec![1.0; ids.len()],
                    ids,
                    ..TableRows::default()
                }
            })
            .collect();
        let slice = crate::routing::dense_slice(4, worker, workers);
        WorkerSnapshot {
            worker,
            workers,
            step: 7,
            dim: 2,
            state_width: 1,
            dense_params: params,
            dense_optimizer: DenseOptimizerState {
                kind: DenseOptimizerKind::Adagrad,
                t: 7,
                offset: slice.start,
                len: slice.len(),
                m: Vec::new(),
                v: vec![0.5; slice.len()],
            },
            tables,
            updated_only: false,
            delta_of: None,
            seed: 1,
            table_sizes: Vec::new(),
            admission: Default::default(),
        }
    }

    const SIZES: [u64; 2] = [5, 130];

    fn expected() -> Expected<'static> {
        Expected {
            table_sizes: &SIZES,
            dim: 2,
            state_width: 1,
            dense_len: 4,
            dense_kind: DenseOptimizerKind::Adagrad,
            every_row: true,
            seed: 1,
        }
    }

    fn parts() -> Vec<WorkerSnapshot> {
        vec![part(0, 2, &SIZES, vec![1.0, 2.0, 3.0, 4.0]), part(1, 2, &SIZES, Vec::new())]
    }

    #[test]
    fn complete_parts_check() {
        let parts = parts();
        let c = check_parts(&parts, expected()).unwrap();
        assert_eq!(c.step, 7);
        assert_eq!(c.dense_params, &[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(c.dense_optimizer.v, vec![0.5; 4]);
    }

    #[test]
    fn broken_parts_are_typed_errors_naming_the_problem() {
        type Break = Box<dyn Fn(&mut Vec<WorkerSnapshot>)>;
        let twice = parts()[1].tables[1].ids[0];
        let first_slice = crate::train::dense_slice(4, 0, 2).len();
        let cases: Vec<(&str, Break, RestoreError)> = vec![
            ("no parts", Box::new(|p| p.clear()), RestoreError::NoParts),
            ("1 parts", Box::new(|p| p.truncate(1)), RestoreError::PartCount { parts: 1, writers: 2 }),
            ("appears twice", Box::new(|p| p[1].worker = 0), RestoreError::DuplicateWorker { worker: 0, writers: 2 }),
            (
                "at step",
                Box::new(|p| p[1].step = 8),
                RestoreError::MixedParts { worker: 1, workers: 2, step: 8, writers: 2, first_step: 7 },
            ),
            (
                "rows of 3 values",
                Box::new(|p| p[0].dim = 3),
                RestoreError::PartRowWidths {
                    worker: 0,
                    dim: 3,
                    state_width: 1,
                    expected_dim: 2,
                    expected_state_width: 1,
                },
            ),
            (
                "has 1 tables",
                Box::new(|p| {
                    p[1].tables.pop();
                }),
                RestoreError::TableCount { worker: 1, tables: 1, expected: 2 },
            ),
            (
                "does not belong",
                Box::new(|p| p[0].tables[1].ids[0] = 0),
                RestoreError::MisplacedRow { table: 1, id: 0, worker: 0, workers: 2, rows: 130 },
            ),
            (
                "3 ids but",
                Box::new(|p| p[0].tables[0].state.push(0.0)),
                RestoreError::PartTableWidths { table: 0, worker: 0, ids: 3, values: 6, slots: 4 },
            ),
            (
                "1 counts",
                Box::new(|p| p[1].tables[0].counts = vec![1]),
                RestoreError::FrequencyCount { table: 0, worker: 1, ids: 2, counts: 1, hot: 0, last_seen: 0 },
            ),
            (
                "3 last-use steps",
                Box::new(|p| p[1].tables[0].last_seen = vec![4, 4, 4]),
                RestoreError::FrequencyCount { table: 0, worker: 1, ids: 2, counts: 0, hot: 0, last_seen: 3 },
            ),
            (
                "after the checkpoint's step 7",
                Box::new(|p| p[1].tables[0].last_seen = vec![7, 8]),
                RestoreError::LastSeenAfterStep { table: 0, worker: 1, id: 3, last_seen: 8, step: 7 },
            ),
            (
                "of its 130 rows",
                Box::new(|p| {
                    let t = &mut p[1].tables[1];
                    t.ids.pop();
                    t.rows.truncate(t.ids.len() * 2);
                    t.state.truncate(t.ids.len());
                }),
                RestoreError::MissingRows { table: 1, present: 129, rows: 130 },
            ),
            (
                "appears twice",
                Box::new(|p| {
                    let t = &mut p[1].tables[1];
                    let last = t.ids.len() - 1;
                    t.ids[last] = t.ids[0];
                }),
                RestoreError::DuplicateRow { table: 1, id: twice },
            ),
            ("dense parameters", Box::new(|p| p[0].dense_params.clear()), RestoreError::NoDenseParams),
            (
                "has 3 dense",
                Box::new(|p| p[1].dense_params = vec![0.0; 3]),
                RestoreError::DenseParamCount { worker: 1, len: 3, expected: 4 },
            ),
            (
                "tile",
                Box::new(|p| p[1].dense_optimizer.offset = 3),
                RestoreError::OptimizerSlicesGap { start: 3, expected: first_slice },
            ),
            (
                "disagree",
                Box::new(|p| p[1].dense_optimizer.t = 2),
                RestoreError::OptimizerSlicesDisagree {
                    optimizer: "adagrad".into(),
                    t: 7,
                    other_optimizer: "adagrad".into(),
                    other_t: 2,
                },
            ),
            (
                "second moments",
                Box::new(|p| {
                    p[1].dense_optimizer.v.pop();
                }),
                RestoreError::OptimizerMoments {
                    optimizer: "adagrad".into(),
                    len: 4 - first_slice,
                    offset: first_slice,
                    first: 0,
                    second: 4 - first_slice - 1,
                    expected_first: 0,
                    expected_second: 4 - first_slice,
                },
            ),
        ];
        for (needle, breaks, want) in cases {
            let mut p = parts();
            breaks(&mut p);
            match check_parts(&p, expected()).unwrap_err() {
                OperatorError::Restore(e) => {
                    assert_eq!(e, want);
                    let text = e.to_string();
                    assert!(text.contains(needle), "expected `{needle}` in: {text}");
                }
                other => panic!("not a restore error: {other:?}"),
            }
        }
        let mut other = expected();
        other.dense_kind = DenseOptimizerKind::Adam;
        let e = check_parts(&parts(), other).unwrap_err();
        assert!(
            matches!(&e, OperatorError::Restore(RestoreError::OptimizerKind { found, expected })
                if found == "adagrad" && expected == "adam"),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "dense optimizer state is adagrad, the trainer uses adam");
    }

    fn rows(ids: &[u64], removed: &[u64]) -> TableRows {
        TableRows {
            ids: ids.to_vec(),
            rows: ids.iter().flat_map(|&id| [id as f32, 0.5]).collect(),
            state: ids.iter().map(|&id| id as f32).collect(),
            counts: ids.iter().map(|&id| id as u32 + 1).collect(),
            last_seen: ids.iter().map(|&id| 10 * id).collect(),
            removed: removed.to_vec(),
            ..TableRows::default()
        }
    }

    /// The admission counters a worker restores: its own part's with the
    /// writer's worker count; with another, the largest counter of every part
    /// in each cell (parts without counters, or with another number, left out).
    #[test]
    fn admission_counters_restore_from_the_own_part_or_the_largest_of_all() {
        let dense = |v: &[u32]| SketchCounters::from_dense(v);
        let mut p = parts();
        assert!(admission_for(&p, 1, 2).is_empty(), "none written");
        p[0].admission = dense(&[3, 0, 7, 1]);
        p[1].admission = dense(&[1, 5, 2, 1]);
        assert_eq!(admission_for(&p, 0, 2), dense(&[3, 0, 7, 1]));
        assert_eq!(admission_for(&p, 1, 2), dense(&[1, 5, 2, 1]));
        for (me, workers) in [(0, 1), (2, 3)] {
            assert_eq!(admission_for(&p, me, workers), dense(&[3, 5, 7, 1]), "resharded to {workers}");
        }
        p[1].admission = dense(&[9; 3]);
        assert_eq!(admission_for(&p, 0, 3), dense(&[3, 0, 7, 1]), "another length is left out");
        p[0].admission = SketchCounters::default();
        assert_eq!(admission_for(&p, 0, 3), dense(&[9; 3]), "the first part with counters sets the length");
        // Into a sketch: only of its own size, every position inside it.
        let mut sketch = vec![5u32; 4];
        assert!(dense(&[0, 2, 0, 4]).write_into(&mut sketch));
        assert_eq!(sketch, [0, 2, 0, 4]);
        assert!(!dense(&[1, 1, 1]).write_into(&mut sketch), "another size");
        let past = SketchCounters { len: 4, index: vec![1, 4], value: vec![1, 1], changes_only: false };
        assert!(!past.write_into(&mut sketch) && sketch == [0, 2, 0, 4], "a position past the end changes nothing");
        let twice = SketchCounters { len: 4, index: vec![2, 2], value: vec![1, 3], changes_only: false };
        assert!(!twice.write_into(&mut sketch) && sketch == [0, 2, 0, 4], "nor positions out of order");
    }

    /// A delta's changed counters laid over its parent's equal the whole counters
    /// of its step; whole counters (a delta written before changes were tracked)
    /// replace the parent's.
    #[test]
    fn a_deltas_changed_counters_lie_over_its_parents() {
        let whole = |v: &[u32]| SketchCounters::from_dense(v);
        let changed = |len: usize, cells: &[(u32, u32)]| SketchCounters {
            len,
            index: cells.iter().map(|c| c.0).collect(),
            value: cells.iter().map(|c| c.1).collect(),
            changes_only: true,
        };
        // (the parent's counters, the changed ones, the counters now)
        type Case<'a> = (&'a [u32], &'a [(u32, u32)], &'a [u32]);
        let cases: [Case<'_>; 5] = [
            (&[0, 3, 0, 1, 0, 0], &[(0, 2), (1, 4), (5, 1)], &[2, 4, 0, 1, 0, 1]),
            (&[0, 0, 0], &[(2, 7)], &[0, 0, 7]),
            (&[5, 5, 5], &[], &[5, 5, 5]),
            (&[0, 0, 0, 0], &[(0, 1), (1, 1), (2, 1), (3, 1)], &[1, 1, 1, 1]),
            (&[9, 0, 0, 2], &[(3, 3)], &[9, 0, 0, 3]),
        ];
        for (parent, cells, now) in cases {
            let mut counters = whole(parent);
            counters.overlay(&changed(parent.len(), cells));
            assert_eq!(counters, whole(now), "{parent:?} + {cells:?}");
        }
        let mut base = vec![part(0, 1, &[], vec![1.0; 4])];
        base[0].tables = vec![rows(&[1], &[])];
        base[0].admission = whole(&[1, 0, 2, 0]);
        let mut delta = base.clone();
        (delta[0].step, delta[0].delta_of) = (base[0].step + 1, Some(base[0].step));
        delta[0].admission = changed(4, &[(1, 3), (2, 5)]);
        let mut merged = base.clone();
        apply_delta(&mut merged, delta.clone()).unwrap();
        assert_eq!(merged[0].admission, whole(&[1, 3, 5, 0]), "laid over");
        delta[0].admission = changed(5, &[(1, 3)]);
        let e = apply_delta(&mut base.clone(), delta.clone()).unwrap_err();
        assert!(matches!(e, RestoreError::AdmissionLength { worker: 0, len: 5, expected: 4 }), "{e:?}");
        delta[0].admission = whole(&[0, 3, 5, 0]);
        apply_delta(&mut base, delta).unwrap();
        assert_eq!(base[0].admission, whole(&[0, 3, 5, 0]), "replaced");
    }

    /// A delta replaces changed rows, adds new ones, drops removed ones (unless
    /// held again), and brings its step and dense state; the scalar oracle is a
    /// map from id to row.
    #[test]
    fn a_delta_applies_onto_its_parent() {
        let mut base = vec![part(0, 1, &[], vec![1.0; 4])];
        base[0].tables = vec![rows(&[1, 3, 5, 8], &[])];
        base[0].admission = SketchCounters::from_dense(&[1, 1]);
        let mut delta = vec![part(0, 1, &[], vec![2.0; 4])];
        delta[0].admission = SketchCounters::from_dense(&[4, 2]);
        delta[0].step = 9;
        delta[0].delta_of = Some(7);
        let mut changed = rows(&[0, 3, 6, 8], &[5, 6, 8]);
        changed.rows.iter_mut().for_each(|v| *v += 100.0);
        delta[0].tables = vec![changed.clone()];
        let mut oracle = std::collections::BTreeMap::new();
        for (i, &id) in base[0].tables[0].ids.iter().enumerate() {
            oracle.insert(id, base[0].tables[0].rows[2 * i..2 * i + 2].to_vec());
        }
        for id in &changed.removed {
            oracle.remove(id);
        }
        for (i, &id) in changed.ids.iter().enumerate() {
            oracle.insert(id, changed.rows[2 * i..2 * i + 2].to_vec());
        }
        apply_delta(&mut base, delta).unwrap();
        assert_eq!(
            base[0].admission,
            SketchCounters::from_dense(&[4, 2]),
            "the delta's admission counters, as its dense state"
        );
        let got = &base[0].tables[0];
        assert_eq!(got.ids, oracle.keys().copied().collect::<Vec<_>>());
        assert_eq!(got.rows, oracle.values().flatten().copied().collect::<Vec<_>>());
        assert_eq!(got.counts, vec![1, 2, 4, 7, 9]);
        assert_eq!(got.last_seen, vec![0, 10, 30, 60, 80], "last-use steps travel with their rows");
        assert_eq!((base[0].step, base[0].dense_params[0]), (9, 2.0));
    }

    #[test]
    fn a_delta_of_another_step_or_run_is_refused_and_changes_nothing() {
        let mut base = parts();
        let before = base.clone();
        let mut delta = parts();
        for d in &mut delta {
            d.delta_of = Some(6);
        }
        let e = apply_delta(&mut base, delta.clone()).unwrap_err();
        assert!(matches!(e, RestoreError::DeltaParent { parent: Some(6), base_step: 7, .. }), "{e:?}");
        delta.truncate(1);
        delta[0].delta_of = Some(7);
        assert!(matches!(apply_delta(&mut base, delta).unwrap_err(), RestoreError::PartCount { .. }));
        let mut unsorted = parts();
        for d in &mut unsorted {
            d.delta_of = Some(7);
        }
        unsorted[0].tables[1].ids.swap(0, 1);
        let e = apply_delta(&mut base, unsorted).unwrap_err();
        assert_eq!(e, RestoreError::UnsortedRows { table: 1, worker: 0 });
        assert_eq!(base, before);
        let mut delta = parts();
        delta[0].delta_of = Some(7);
        let e = check_parts(&delta, expected()).unwrap_err();
        assert!(e.to_string().contains("only the changes since step 7"), "{e}");
    }
}
