//! Feature crosses for the wide part of Wide & Deep.
//!
//! A cross of fields `a` and `b` is a new sparse field whose id, per sample,
//! is a seeded hash of the pair `(id_a, id_b)` bucketed into the cross's
//! table. Multi-valued fields cross every pair (at most [`MAX_PAIRS`] per
//! sample, in bag order); an absent value on either side gives an absent
//! cross (an empty bag), never a fake id. Crosses are appended after the
//! batch's own fields, in the order given.

use super::{field_seed, hash_bucket, mix64};
use crate::batch::{Batch, SparseField};

/// Most pairs crossed per sample and cross.
pub const MAX_PAIRS: usize = 64;
/// Mixed into the reader's hashing seed before the per-cross seeds are derived from it.
pub const CROSS_SALT: u64 = 0xc205_5e5e;
/// Left rotation of the second id before it is combined with the first.
pub const CROSS_ROTATE: u32 = 29;

/// The cross id of `(a, b)` for cross number `cross` (`seed` as the reader's hashing seed):
/// `hash_bucket(field_seed(seed ^ CROSS_SALT, cross), mix64(a) ^ b.rotate_left(CROSS_ROTATE), buckets)`.
#[inline]
pub fn cross_id(seed: u64, cross: usize, a: u64, b: u64, buckets: u64) -> u64 {
    hash_bucket(field_seed(seed ^ CROSS_SALT, cross), mix64(a) ^ b.rotate_left(CROSS_ROTATE), buckets)
}

/// Appends one field per pair in `pairs` (indices of `batch.sparse`) holding the crosses.
///
/// # Panics
/// If a pair names a field the batch does not have (callers validate the pairs first).
pub fn append_crosses(batch: &mut Batch, pairs: &[(usize, usize)], seed: u64, buckets: u64) {
    for (c, &(fa, fb)) in pairs.iter().enumerate() {
        let mut field = SparseField::new();
        let (a, b) = (&batch.sparse[fa], &batch.sparse[fb]);
        for i in 0..batch.len() {
            let mut n = 0;
            'pairs: for &x in a.bag(i) {
                for &y in b.bag(i) {
                    if n == MAX_PAIRS {
                        break 'pairs;
                    }
                    field.ids.push(cross_id(seed, c, x, y, buckets));
                    n += 1;
                }
            }
            field.close_bag();
        }
        batch.sparse.push(field);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crosses_pair_every_id_and_keep_absent_values_absent() {
        let mut b = Batch::new(0, 3);
        // sample 0: {1} × {2}; sample 1: {} × {2}; sample 2: {1, 4} × {5, 6}
        for (x, y) in [(vec![1u64], vec![2u64]), (vec![], vec![2]), (vec![1, 4], vec![5, 6])] {
            b.labels.push(0.0);
            b.sparse[0].ids.extend(&x);
            b.sparse[0].close_bag();
            b.sparse[1].ids.extend(&y);
            b.sparse[1].close_bag();
            b.sparse[2].close_bag();
        }
        append_crosses(&mut b, &[(0, 1), (1, 0)], 7, 1000);
        b.check().unwrap();
        assert_eq!(b.sparse.len(), 5);
        assert_eq!(b.sparse[3].bag(0), &[cross_id(7, 0, 1, 2, 1000)]);
        assert!(b.sparse[3].bag(1).is_empty(), "absent on one side: no cross");
        assert_eq!(b.sparse[3].bag(2).len(), 4);
        assert!(b.sparse[3].ids.iter().all(|&id| id < 1000));
        // Order matters and crosses are separate tables: (0,1) and (1,0) hash apart.
        assert_ne!(cross_id(7, 0, 1, 2, 1 << 40), cross_id(7, 1, 2, 1, 1 << 40));
        assert_ne!(cross_id(7, 0, 1, 2, 1 << 40), cross_id(7, 0, 2, 1, 1 << 40));
    }
}
