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

use crate::optim::{DenseOptimizerKind, DenseOptimizerState};
use crate::routing::shard_of;
use crate::OperatorError;

/// One table's rows held by one worker: `ids.len()` rows of `dim` values and
/// `state_width` optimizer slots each, row `i` of both belonging to `ids[i]`;
/// dynamic and tiered stores add each row's frequency and hot-tier slot
/// (both empty where a store keeps none, or in checkpoints older than them).
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
}

/// [`TableRows::hot`] of a row outside the hot tier.
pub const COLD: u32 = u32::MAX;

impl TableRows {
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

fn err(reason: String) -> OperatorError {
    OperatorError::Restore(reason)
}

/// Checks that `parts` form one complete, consistent checkpoint of a model
/// shaped as `expected` (see the module docs); nothing is modified.
pub fn check_parts<'a>(parts: &'a [WorkerSnapshot], expected: Expected<'_>) -> Result<CheckedParts<'a>, OperatorError> {
    let first = parts.first().ok_or_else(|| err("the checkpoint has no parts".into()))?;
    let writers = first.workers;
    if writers == 0 || parts.len() != writers {
        return Err(err(format!("{} parts for a checkpoint written by {writers} workers", parts.len())));
    }
    let mut seen_worker = vec![false; writers];
    for p in parts {
        if p.workers != writers || p.step != first.step {
            return Err(err(format!(
                "part of worker {} is from a run of {} workers at step {}, another from {writers} workers at step {}",
                p.worker, p.workers, p.step, first.step
            )));
        }
        match seen_worker.get_mut(p.worker) {
            Some(s) if !*s => *s = true,
            _ => return Err(err(format!("worker {} appears twice or is not below {writers}", p.worker))),
        }
        if p.dim != expected.dim || p.state_width != expected.state_width {
            return Err(err(format!(
                "part of worker {} has rows of {} values and {} optimizer slots, the model has {} and {}",
                p.worker, p.dim, p.state_width, expected.dim, expected.state_width
            )));
        }
        if p.tables.len() != expected.table_sizes.len() {
            return Err(err(format!(
                "part of worker {} has {} tables, the model has {}",
                p.worker,
                p.tables.len(),
                expected.table_sizes.len()
            )));
        }
    }
    check_rows(parts, expected)?;
    let with_params: Vec<&WorkerSnapshot> = parts.iter().filter(|p| !p.dense_params.is_empty()).collect();
    let Some(carrier) = with_params.first() else {
        return Err(err("no part carries the dense parameters".into()));
    };
    if let Some(p) = with_params.iter().find(|p| p.dense_params.len() != expected.dense_len) {
        return Err(err(format!(
            "part of worker {} has {} dense parameters, the model has {}",
            p.worker,
            p.dense_params.len(),
            expected.dense_len
        )));
    }
    let states: Vec<&DenseOptimizerState> = parts.iter().map(|p| &p.dense_optimizer).collect();
    let dense_optimizer = DenseOptimizerState::concat(&states, expected.dense_len)?;
    if dense_optimizer.kind != expected.dense_kind {
        return Err(err(format!(
            "dense optimizer state is {:?}, the trainer uses {:?}",
            dense_optimizer.kind, expected.dense_kind
        )));
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
            if (!rows.counts.is_empty() && rows.counts.len() != k) || (!rows.hot.is_empty() && rows.hot.len() != k) {
                return Err(err(format!(
                    "table {t} of worker {}: {k} ids but {} counts and {} hot slots",
                    p.worker,
                    rows.counts.len(),
                    rows.hot.len()
                )));
            }
            if rows.rows.len() != k * d || rows.state.len() != k * w {
                return Err(err(format!(
                    "table {t} of worker {}: {k} ids but {} values and {} optimizer slots",
                    p.worker,
                    rows.rows.len(),
                    rows.state.len()
                )));
            }
            for &id in &rows.ids {
                if id >= n || shard_of(t, id, p.workers) != p.worker {
                    return Err(err(format!(
                        "table {t}: row {id} in the part of worker {} of {} does not belong there (table of {n} rows)",
                        p.worker, p.workers
                    )));
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
                    return Err(err(format!("table {t}: row {id} appears twice")));
                }
                count += 1;
            }
        }
        if expected.every_row && count != n {
            return Err(err(format!(
                "table {t}: {count} of its {n} rows are in the checkpoint (a checkpoint of a dynamic store \
                 restores only into store = dynamic or tiered)"
            )));
        }
    }
    Ok(())
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
    fn broken_parts_are_errors_naming_the_problem() {
        type Break = Box<dyn Fn(&mut Vec<WorkerSnapshot>)>;
        let cases: Vec<(&str, Break)> = vec![
            ("no parts", Box::new(|p| p.clear())),
            ("1 parts", Box::new(|p| p.truncate(1))),
            ("appears twice", Box::new(|p| p[1].worker = 0)),
            ("at step", Box::new(|p| p[1].step = 8)),
            ("rows of 3 values", Box::new(|p| p[0].dim = 3)),
            (
                "has 1 tables",
                Box::new(|p| {
                    p[1].tables.pop();
                }),
            ),
            ("does not belong", Box::new(|p| p[0].tables[1].ids[0] = 0)),
            ("3 ids but", Box::new(|p| p[0].tables[0].state.push(0.0))),
            (
                "of its 130 rows",
                Box::new(|p| {
                    let t = &mut p[1].tables[1];
                    t.ids.pop();
                    t.rows.truncate(t.ids.len() * 2);
                    t.state.truncate(t.ids.len());
                }),
            ),
            (
                "appears twice",
                Box::new(|p| {
                    let t = &mut p[1].tables[1];
                    let last = t.ids.len() - 1;
                    t.ids[last] = t.ids[0];
                }),
            ),
            ("dense parameters", Box::new(|p| p[0].dense_params.clear())),
            ("has 3 dense", Box::new(|p| p[1].dense_params = vec![0.0; 3])),
            ("tile", Box::new(|p| p[1].dense_optimizer.offset = 3)),
            ("disagree", Box::new(|p| p[1].dense_optimizer.t = 2)),
        ];
        for (needle, breaks) in cases {
            let mut p = parts();
            breaks(&mut p);
            let e = check_parts(&p, expected()).unwrap_err().to_string();
            assert!(e.contains(needle), "expected `{needle}` in: {e}");
        }
        let mut other = expected();
        other.dense_kind = DenseOptimizerKind::Adam;
        assert!(check_parts(&parts(), other).unwrap_err().to_string().contains("Adam"));
    }
}
