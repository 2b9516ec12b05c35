//! Where every piece of the model lives among `W` workers.
//!
//! Invariant: one function routes each kind of state, and every path uses it.
//! [`shard_of`] places embedding rows: a lookup goes to the row's owner, the
//! row's gradient goes back to the same owner, a checkpoint part holds exactly
//! the rows its writer owns, and a restore keeps exactly the rows the new
//! worker count assigns to each worker. [`dense_slice`] places the dense
//! optimizer state: worker `k` updates, checkpoints and restores the slice it
//! returns. Because nothing computes a placement any other way, a row or a
//! slice is never served by one worker and updated or saved by another.
//!
//! This module depends on nothing else in the crate.

/// The worker that owns row `id` of `table` among `workers`.
///
/// Row `id` of table `t` lives on worker `(id + t) mod W` at local index
/// `id / W`; within one owner those local indices are distinct, so a shard
/// stores its rows densely with no hashing.
///
/// # Panics
/// When `workers` is 0 (a division by zero). It routes every lookup, so it checks
/// nothing: the constructors that take a worker count refuse 0
/// ([`Store::new`](crate::store::Store::new), [`EmbeddingShard::new`](crate::shard::EmbeddingShard::new)).
#[inline]
pub fn shard_of(table: usize, id: u64, workers: usize) -> usize {
    ((id % workers as u64 + table as u64 % workers as u64) % workers as u64) as usize
}

/// The range of the flat dense buffer of `len` values whose optimizer state
/// worker `k` of `workers` owns; the ranges of all workers tile the buffer.
///
/// # Panics
/// When `workers` is 0 (a division by zero). For `k ≥ workers` the range lies past
/// `len`.
pub fn dense_slice(len: usize, k: usize, workers: usize) -> std::ops::Range<usize> {
    len * k / workers..len * (k + 1) / workers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_slices_tile_the_buffer() {
        for len in [0usize, 1, 7, 100] {
            for workers in 1..6 {
                let mut next = 0;
                for k in 0..workers {
                    let s = dense_slice(len, k, workers);
                    assert_eq!(s.start, next, "slice {k} of {workers} over {len} starts where {} ended", k.max(1) - 1);
                    next = s.end;
                }
                assert_eq!(next, len);
            }
        }
    }

    #[test]
    fn every_row_has_one_owner_in_range() {
        for workers in 1..6 {
            for t in 0..4 {
                for id in 0..50u64 {
                    let o = shard_of(t, id, workers);
                    assert!(o < workers);
                    assert_eq!(o as u64, (id + t as u64) % workers as u64);
                }
            }
        }
    }
}
