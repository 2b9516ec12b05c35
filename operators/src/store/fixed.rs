//! The fixed store: the dense per-worker table of [`EmbeddingShard`].
//!
//! Besides the rows it keeps two bits per row, side by side in one word so an
//! update sets both with one write: *updated* (some step or restore changed the
//! row since the store was built or reset) and *changed* (since the last
//! checkpoint mark). A checkpoint lists only updated rows (the others are the
//! seeded rows a new store starts with), a delta only changed ones.

use super::{EmbeddingStore, FiniteApply, StoreStats};
use crate::shard::EmbeddingShard;
use crate::snapshot::TableRows;
use crate::OperatorError;

/// Rows per word of the bit pairs.
const ROWS_PER_WORD: usize = 32;
/// The *updated* bits of a word (even positions); *changed* are the odd ones.
const UPDATED_BITS: u64 = 0x5555_5555_5555_5555;

/// Every id below the table size, stored densely at local index `id / W`.
/// Lookups are counted as hot-tier hits; nothing is ever admitted or evicted.
#[derive(Debug)]
pub struct FixedStore {
    /// The dense rows.
    pub shard: EmbeddingShard,
    lookups: u64,
    /// Per table, two bits per local row (see the module docs).
    bits: Vec<Vec<u64>>,
}

impl FixedStore {
    /// Wraps a shard whose rows all hold their seeded initial values.
    pub fn new(shard: EmbeddingShard) -> Self {
        let bits =
            (0..shard.table_sizes.len()).map(|t| vec![0u64; shard.local_len(t).div_ceil(ROWS_PER_WORD)]).collect();
        FixedStore { shard, lookups: 0, bits }
    }

    /// Marks row `id` of `table` updated and changed.
    #[inline]
    fn mark_row(&mut self, table: usize, id: u64) {
        let l = (id / self.shard.workers as u64) as usize;
        self.bits[table][l / ROWS_PER_WORD] |= 0b11 << (2 * (l % ROWS_PER_WORD));
    }

    /// The rows of `table` whose bit `which` (0: updated, 1: changed) is set, ids ascending.
    fn export_marked(&self, table: usize, which: u32) -> TableRows {
        let mut out = TableRows::default();
        for (k, &word) in self.bits[table].iter().enumerate() {
            let mut set = (word >> which) & UPDATED_BITS;
            while set != 0 {
                let bit = set.trailing_zeros() as usize;
                set &= set - 1;
                let id = self.shard.id_at(table, k * ROWS_PER_WORD + bit / 2);
                self.shard.push_row(table, id, &mut out);
            }
        }
        out
    }
}

impl FiniteApply for FixedStore {
    /// The row's values and its optimizer state are checked as the shard writes them.
    #[inline]
    fn apply_finite(&mut self, table: usize, id: u64, grad: &[f32]) -> bool {
        let finite = self.shard.apply_finite(table, id, grad);
        self.mark_row(table, id);
        finite
    }
}

impl EmbeddingStore for FixedStore {
    fn dim(&self) -> usize {
        self.shard.dim
    }
    fn state_width(&self) -> usize {
        self.shard.state_width()
    }
    #[inline]
    fn gather(&mut self, table: usize, ids: &[u64], out: &mut Vec<f32>) {
        self.lookups += ids.len() as u64;
        self.shard.gather(table, ids, out);
    }
    #[inline]
    fn apply(&mut self, table: usize, id: u64, grad: &[f32]) {
        self.shard.apply(table, id, grad);
        self.mark_row(table, id);
    }
    fn set_lr(&mut self, lr: f32) {
        self.shard.set_lr(lr);
    }
    /// The row, its optimizer state and its word of marks (read and written by `apply`).
    #[inline]
    fn prefetch_row(&self, table: usize, id: u64) {
        self.shard.prefetch_row(table, id);
        let l = (id / self.shard.workers as u64) as usize;
        if let Some(word) = self.bits[table].get(l / ROWS_PER_WORD) {
            crate::huge::prefetch(word);
        }
    }
    fn end_step(&mut self, _completed: u64) {}
    /// The updated rows only: every other row holds its seeded initial values.
    fn export_table(&self, table: usize) -> TableRows {
        self.export_marked(table, 0)
    }
    fn exports_updated_only(&self) -> bool {
        true
    }
    fn mark_checkpoint(&mut self) {
        for word in self.bits.iter_mut().flatten() {
            *word &= UPDATED_BITS;
        }
    }
    fn export_changes(&self, table: usize) -> TableRows {
        self.export_marked(table, 1)
    }
    /// Sets every updated row back to its seeded initial values.
    fn reset(&mut self, _completed: u64) {
        for t in 0..self.bits.len() {
            for k in 0..self.bits[t].len() {
                let mut set = self.bits[t][k] & UPDATED_BITS;
                while set != 0 {
                    let bit = set.trailing_zeros() as usize;
                    set &= set - 1;
                    let id = self.shard.id_at(t, k * ROWS_PER_WORD + bit / 2);
                    self.shard.reinit_row(t, id);
                }
                self.bits[t][k] = 0;
            }
        }
    }
    fn set_row(&mut self, table: usize, id: u64, row: &[f32], state: &[f32]) -> Result<(), OperatorError> {
        self.shard.set_row(table, id, row, state)?;
        self.mark_row(table, id);
        Ok(())
    }
    fn stats(&self) -> StoreStats {
        StoreStats {
            lookups: self.lookups,
            hot_hits: self.lookups,
            hot_rows: self.shard.num_rows() as u64,
            ..StoreStats::default()
        }
    }
    fn num_rows(&self) -> usize {
        self.shard.num_rows()
    }
    fn sum_of_squares(&self) -> f64 {
        self.shard.sum_of_squares()
    }
    fn holds_every_row(&self) -> bool {
        true
    }
}
