//! Id frequencies as a differential-dataflow computation.
//!
//! [`IdFrequencies`] turns a collection of lookups — one `(table, id)` record
//! per occurrence, at the timestamp (training step) of the occurrence — into
//! the collection of per-key counts `((table, id), n)`, maintained
//! incrementally by differential dataflow's `count_total`: each timestamp
//! produces only the changes of the keys seen (or expiring) at it.
//!
//! * [`id_counts`](IdFrequencies::id_counts) counts every occurrence so far.
//! * [`id_counts_within`](IdFrequencies::id_counts_within) counts a sliding
//!   window: an occurrence at time `t` is retracted at `expire(t)` (for steps,
//!   `t + window`), so the count of a key at time `s` is the number of its
//!   occurrences at times `t` with `t ≤ s < expire(t)`. A key whose window
//!   empties leaves the output.
//!
//! [`CountTable`] reads a count collection back into a plain map. It folds
//! every output update `((key, n), t, diff)` into `total[key] += n · diff`:
//! the accumulated count collection holds exactly one `(key, n)` with
//! multiplicity 1 per present key, so the sum is `n` whatever order the
//! updates arrive in, and 0 (the entry is removed) for an absent key. The
//! table equals the counts at time `s` once a probe of the count collection
//! has passed `s` and before any later time is released — the caller owns
//! that frontier discipline (see [`crate::store::differential`], which
//! advances its input one step at a time).
//!
//! With `W > 1` workers every count is one worker's: `count_total` exchanges the
//! lookups by key, so each worker's count collection holds only the keys that hash
//! to it, and a [`CountTable`] attached on a worker shows only those keys. A key
//! looked up on every worker reads its whole count on one worker and 0 on the
//! others; a reader that needs every key on one worker exchanges the counts to it
//! first, or sums the workers' tables (see the example at [`CountTable`]).
//!
//! The oracle is [`counts_from_scratch`]; the tests compare the two at every
//! timestamp, with and without a window.

use differential_dataflow::hashable::Hashable;
use differential_dataflow::lattice::Lattice;
use differential_dataflow::operators::CountTotal;
use differential_dataflow::{ExchangeData, VecCollection};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::hash::Hash;
use std::rc::Rc;
use timely::order::TotalOrder;
use timely::progress::Timestamp;

/// A row of an embedding table: `(table, id)`.
pub type RowKey = (u32, u64);

/// Per-key occurrence counts of a collection of lookups, incrementally.
///
/// ```
/// use differential_dataflow::input::Input;
/// use tiderec_operators::freq::{CountTable, IdFrequencies};
///
/// timely::execute_directly(|worker| {
///     let table = CountTable::default();
///     let counts = table.clone();
///     worker.dataflow::<u64, _, _>(|scope| {
///         // Three lookups of row 7 of table 0, one of row 9 of table 1.
///         let lookups = vec![(0u32, 7u64), (0, 7), (1, 9), (0, 7)];
///         let (_input, ids) = scope.new_collection_from(lookups);
///         table.attach(ids.id_counts());
///     });
///     // The input closed with the dataflow's construction: run it to completion.
///     while worker.step() {}
///     assert_eq!(counts.get(&(0, 7)), 3);
///     assert_eq!(counts.get(&(1, 9)), 1);
///     assert_eq!(counts.get(&(2, 7)), 0);
///     assert_eq!(counts.len(), 2);
/// });
/// ```
pub trait IdFrequencies<'scope, T: Timestamp + Lattice + TotalOrder, K> {
    /// `(key, n)`: `n` occurrences of `key` so far.
    fn id_counts(self) -> VecCollection<'scope, T, (K, isize)>;
    /// `(key, n)`: `n` occurrences of `key` at times `t` with `expire(t)` still
    /// in the future. `expire` must be monotonic and never earlier than `t`.
    fn id_counts_within<F: FnMut(&T) -> T + 'static>(self, expire: F) -> VecCollection<'scope, T, (K, isize)>;
}

impl<'scope, T, K> IdFrequencies<'scope, T, K> for VecCollection<'scope, T, K, isize>
where
    T: Timestamp + Lattice + TotalOrder,
    K: ExchangeData + Hashable,
{
    fn id_counts(self) -> VecCollection<'scope, T, (K, isize)> {
        self.count_total()
    }
    fn id_counts_within<F: FnMut(&T) -> T + 'static>(self, expire: F) -> VecCollection<'scope, T, (K, isize)> {
        let retractions = self.clone().delay(expire).negate();
        self.concat(retractions).count_total()
    }
}

/// A map `key → count` fed by a count collection; cloning shares the map.
///
/// It holds what its worker's count collection holds: with several workers, only
/// the keys that hash to this worker (see the [module docs](self)). Two workers
/// each looking row 7 of table 0 up once see its count 2 on one worker and 0 on
/// the other:
///
/// ```
/// use differential_dataflow::input::Input;
/// use tiderec_operators::freq::{CountTable, IdFrequencies};
///
/// let seen = timely::execute(timely::Config::process(2), |worker| {
///     let table = CountTable::default();
///     let counts = table.clone();
///     worker.dataflow::<u64, _, _>(|scope| {
///         let (_input, ids) = scope.new_collection_from(vec![(0u32, 7u64)]);
///         table.attach(ids.id_counts());
///     });
///     while worker.step() {}
///     counts.get(&(0, 7))
/// })
/// .unwrap()
/// .join();
/// let mut per_worker: Vec<i64> = seen.into_iter().map(|r| r.unwrap()).collect();
/// per_worker.sort();
/// assert_eq!(per_worker, [0, 2], "the whole count on one worker, none on the other");
/// ```
#[derive(Clone, Debug)]
pub struct CountTable<K> {
    counts: Rc<RefCell<FxHashMap<K, i64>>>,
}

impl<K> Default for CountTable<K> {
    fn default() -> Self {
        CountTable { counts: Rc::default() }
    }
}

impl<K: Clone + Eq + Hash + 'static> CountTable<K> {
    /// Folds every update of `counts` into this table (see the module docs)
    /// and returns the collection unchanged.
    pub fn attach<'scope, T>(
        &self,
        counts: VecCollection<'scope, T, (K, isize)>,
    ) -> VecCollection<'scope, T, (K, isize)>
    where
        T: Timestamp + Lattice,
        K: differential_dataflow::Data,
    {
        let map = self.counts.clone();
        counts.inspect(move |((key, n), _t, diff)| {
            let mut map = map.borrow_mut();
            let add = *n as i64 * *diff as i64;
            let e = map.entry(key.clone()).or_insert(0);
            *e += add;
            if *e == 0 {
                map.remove(key);
            }
        })
    }

    /// The count of `key` (0 when absent).
    pub fn get(&self, key: &K) -> i64 {
        self.counts.borrow().get(key).copied().unwrap_or(0)
    }

    /// Keys with a non-zero count.
    pub fn len(&self) -> usize {
        self.counts.borrow().len()
    }

    /// True when no key has a count.
    pub fn is_empty(&self) -> bool {
        self.counts.borrow().is_empty()
    }

    /// Every `(key, count)`, in no particular order.
    pub fn to_vec(&self) -> Vec<(K, i64)> {
        self.counts.borrow().iter().map(|(k, &n)| (k.clone(), n)).collect()
    }
}

/// The oracle: counts of `occurrences` (each `(key, time)`) at time `at`,
/// counting an occurrence at `t` when `t ≤ at` and (with a window) `at < t + window`.
pub fn counts_from_scratch<K: Clone + Eq + Hash>(
    occurrences: &[(K, u64)],
    at: u64,
    window: Option<u64>,
) -> FxHashMap<K, i64> {
    let mut out: FxHashMap<K, i64> = FxHashMap::default();
    for (k, t) in occurrences {
        if *t <= at && window.is_none_or(|w| at < t + w) {
            *out.entry(k.clone()).or_insert(0) += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::mix64;
    use differential_dataflow::input::InputSession;

    /// Zipf-like keys over a few tables, with per-step batches of varying size.
    fn occurrences(seed: u64, steps: u64) -> Vec<(RowKey, u64)> {
        let mut out = Vec::new();
        for s in 0..steps {
            for k in 0..5 + mix64(seed ^ s) % 40 {
                let h = mix64(seed ^ mix64(s * 1000 + k));
                let u = (h >> 11) as f64 / (1u64 << 53) as f64;
                let id = (500f64.powf(u) as u64).saturating_sub(1);
                out.push((((h % 3) as u32, id), s));
            }
        }
        out
    }

    fn check(window: Option<u64>, seed: u64) {
        let steps = 30u64;
        let occ = occurrences(seed, steps);
        let occ2 = occ.clone();
        timely::execute_directly(move |worker| {
            let mut input = InputSession::<u64, RowKey, isize>::new();
            let table = CountTable::<RowKey>::default();
            let t2 = table.clone();
            let probe = worker.dataflow(|scope| {
                let ids = input.to_collection(scope);
                let counts = match window {
                    None => ids.id_counts(),
                    Some(w) => ids.id_counts_within(move |t| t + w),
                };
                t2.attach(counts).probe().0
            });
            let mut nonzero_drops = 0;
            for s in 0..steps {
                for (k, _) in occ2.iter().filter(|(_, t)| *t == s) {
                    input.insert(*k);
                }
                input.advance_to(s + 1);
                input.flush();
                worker.step_while(|| probe.less_than(input.time()));
                let want = counts_from_scratch(&occ2, s, window);
                let mut got: Vec<(RowKey, i64)> = table.to_vec();
                got.sort_unstable();
                let mut want: Vec<(RowKey, i64)> = want.into_iter().collect();
                want.sort_unstable();
                assert_eq!(got, want, "window {window:?}, step {s}");
                if s > 0 && table.len() < counts_from_scratch(&occ2, s, None).len() {
                    nonzero_drops += 1;
                }
            }
            if window.is_some() {
                assert!(nonzero_drops > 0, "the window retracted keys");
            }
        });
        assert!(!occ.is_empty());
    }

    #[test]
    fn differential_counts_equal_a_count_from_scratch_at_every_step() {
        for seed in [1, 2, 3] {
            check(None, seed);
        }
    }

    #[test]
    fn windowed_counts_equal_a_windowed_count_from_scratch_at_every_step() {
        for (seed, w) in [(4, 1), (5, 3), (6, 10)] {
            check(Some(w), seed);
        }
    }
}
