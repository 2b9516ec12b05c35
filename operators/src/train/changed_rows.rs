//! The rows a step engine's training steps changed since the last checkpoint
//! snapshot, kept on the host from what the engine reads back into the host
//! mirror, so that a trainer with an engine writes delta checkpoints as one
//! without does (see [`super::engine`]).
//!
//! ## Invariants
//!
//! * **Every changed row is listed.** Each read of the engine lists the rows
//!   its training steps updated since the read before
//!   ([`StepEngine::save_changed`](super::StepEngine::save_changed)), and a
//!   checkpoint snapshot reads first; so the rows of the reads since the mark
//!   are those of the batches trained since (a row whose summed gradient is
//!   zero is updated, and listed, as the host owner lists it; a step that
//!   updated nothing after a non-finite loss still lists its rows, whose
//!   values a delta then repeats). An engine that reads back every row makes
//!   every delta list every row. Nothing is noted per step.
//! * One bit per row of each table. Ids past a table are never marked.
//! * A mark names the checkpoint the bits count from: set by each checkpoint
//!   snapshot, cleared by a restore, so a delta always follows the snapshot
//!   taken just before it on this trainer. Without a mark nothing is noted:
//!   the next checkpoint is whole, and a run that writes none pays nothing.

use crate::snapshot::{TableRows, WorkerSnapshot};
use crate::OperatorError;

/// Rows changed since a mark, one bit per row (see the module docs).
pub(super) struct ChangedRows {
    bits: Vec<Vec<u64>>,
    marked: Option<u64>,
}

impl ChangedRows {
    /// Nothing marked, for tables of `table_sizes` rows.
    pub(super) fn new(table_sizes: &[u64]) -> Self {
        let bits = table_sizes.iter().map(|&n| vec![0u64; n.div_ceil(64) as usize]).collect();
        ChangedRows { bits, marked: None }
    }

    /// Marks every row `read`, a part the engine read back, lists, once a
    /// checkpoint has set the mark.
    pub(super) fn note(&mut self, read: &WorkerSnapshot) {
        if self.marked.is_none() {
            return;
        }
        for (words, table) in self.bits.iter_mut().zip(&read.tables) {
            for &id in &table.ids {
                if let Some(w) = words.get_mut((id / 64) as usize) {
                    *w |= 1 << (id % 64);
                }
            }
        }
    }

    fn contains(&self, table: usize, id: u64) -> bool {
        self.bits.get(table).and_then(|w| w.get((id / 64) as usize)).is_some_and(|w| w >> (id % 64) & 1 == 1)
    }

    /// The step of the checkpoint the marks count from (`None`: no delta can follow).
    pub(super) fn marked(&self) -> Option<u64> {
        self.marked
    }

    /// Counts afresh from the checkpoint of `step` (`None` after a restore).
    pub(super) fn mark(&mut self, step: Option<u64>) {
        self.bits.iter_mut().for_each(|w| w.fill(0));
        self.marked = step;
    }

    /// Reduces `part`, this trainer's whole snapshot, to the delta since the
    /// checkpoint of `parent`, which must be the mark: each table keeps the
    /// rows marked, the dense state stays whole.
    pub(super) fn delta(&self, part: &mut WorkerSnapshot, parent: u64) -> Result<(), OperatorError> {
        if self.marked != Some(parent) {
            return Err(not_the_mark(parent, self.marked));
        }
        let (dim, width) = (part.dim, part.state_width);
        for (t, rows) in part.tables.iter_mut().enumerate() {
            *rows = kept(std::mem::take(rows), dim, width, |id| self.contains(t, id));
        }
        part.delta_of = Some(parent);
        Ok(())
    }
}

/// The error for a delta asked since `parent` when changes count from `marked`.
pub(super) fn not_the_mark(parent: u64, marked: Option<u64>) -> OperatorError {
    OperatorError::config(
        "checkpoint",
        format!("a delta since step {parent} was asked for; this worker's changes count from {marked:?}"),
    )
}

/// The rows of `rows` whose ids `keep` accepts, in order, each with its values,
/// optimizer state, frequency and last-use step.
fn kept(rows: TableRows, dim: usize, width: usize, keep: impl Fn(u64) -> bool) -> TableRows {
    let mut out = TableRows { removed: rows.removed, ..TableRows::default() };
    for (i, &id) in rows.ids.iter().enumerate().filter(|&(_, &id)| keep(id)) {
        out.ids.push(id);
        out.rows.extend_from_slice(&rows.rows[i * dim..(i + 1) * dim]);
        out.state.extend_from_slice(&rows.state[i * width..(i + 1) * width]);
        out.counts.extend(rows.counts.get(i));
        out.hot.extend(rows.hot.get(i));
        out.last_seen.extend(rows.last_seen.get(i));
    }
    out
}
