//! The fixed store: the dense per-worker table of [`EmbeddingShard`].

use super::{EmbeddingStore, StoreStats};
use crate::shard::EmbeddingShard;
use crate::snapshot::TableRows;
use crate::OperatorError;

/// Every id below the table size, stored densely at local index `id / W`.
/// Lookups are counted as hot-tier hits; nothing is ever admitted or evicted.
#[derive(Debug)]
pub struct FixedStore {
    /// The dense rows.
    pub shard: EmbeddingShard,
    lookups: u64,
}

impl FixedStore {
    /// Wraps a shard.
    pub fn new(shard: EmbeddingShard) -> Self {
        FixedStore { shard, lookups: 0 }
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
    }
    fn set_lr(&mut self, lr: f32) {
        self.shard.set_lr(lr);
    }
    #[inline]
    fn prefetch_row(&self, table: usize, id: u64) {
        self.shard.prefetch_row(table, id);
    }
    fn end_step(&mut self, _completed: u64) {}
    fn export_table(&self, table: usize) -> TableRows {
        self.shard.export_table(table)
    }
    fn reset(&mut self, _completed: u64) {}
    fn set_row(&mut self, table: usize, id: u64, row: &[f32], state: &[f32]) -> Result<(), OperatorError> {
        self.shard.set_row(table, id, row, state)
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
