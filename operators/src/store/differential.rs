//! The tiered store's differential-dataflow frequency source.
//!
//! The store lives inside the trainer's owner state, a plain struct driven by
//! the trainer's dataflow; it cannot add operators to that dataflow. So
//! [`DifferentialFrequencies`] runs its own small dataflow on a private,
//! single-threaded timely [`Worker`] owned by the store (one per training
//! worker, no communication): the store's update stream — one `(table, id)`
//! per distinct row per training step, exactly what the exact counts see —
//! enters an [`InputSession`] at the timestamp of the training step, and
//! [`IdFrequencies`] keeps the per-row counts (all-time, or over the last
//! `window` steps by retracting each occurrence `window` steps later) with
//! differential dataflow's `count_total`. A [`CountTable`] folds the count
//! collection's changes into a map that the hot-tier plan reads.
//!
//! Invariants:
//! * Timestamps are training steps: updates of step `s` (0-based) enter at
//!   time `s`; [`advance`](DifferentialFrequencies::advance)`(completed)`
//!   closes every time below `completed` and lets the dataflow run one round.
//! * [`settle`](DifferentialFrequencies::settle) runs the private worker until
//!   its probe has passed every closed time; only then does
//!   [`count`](DifferentialFrequencies::count) equal the count of the
//!   occurrences at times `< completed` (within the window). A plan settles
//!   first, so it ranks by exactly those counts.
//! * Without a window the counts equal the exact per-row counts of a store
//!   that never evicts (the same occurrences); rows that are evicted or were
//!   never admitted keep their stream counts here.
//! * A restore starts a fresh dataflow at the restored step and seeds it with
//!   each restored row's count at that step. With a window the seeded counts
//!   expire `window` steps after the restore (the checkpoint holds totals, not
//!   per-step history), an approximation of the uninterrupted run.

use crate::freq::{CountTable, IdFrequencies, RowKey};
use differential_dataflow::input::InputSession;
use timely::communication::allocator::thread::Thread;
use timely::communication::Allocator;
use timely::dataflow::operators::probe::Handle as ProbeHandle;
use timely::worker::Worker;
use timely::WorkerConfig;

/// Per-row update counts kept by a private differential dataflow; see the module docs.
pub struct DifferentialFrequencies {
    // Field order is drop order: the input closes before the worker goes.
    input: InputSession<u64, RowKey, isize>,
    probe: ProbeHandle<u64>,
    table: CountTable<RowKey>,
    worker: Worker,
    window: Option<u64>,
}

impl std::fmt::Debug for DifferentialFrequencies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DifferentialFrequencies")
            .field("time", self.input.time())
            .field("window", &self.window)
            .field("keys", &self.table.len())
            .finish()
    }
}

impl DifferentialFrequencies {
    /// A dataflow whose first updates belong to training step `start`;
    /// `window`: count only the last `window` steps.
    pub fn new(window: Option<u64>, start: u64) -> Self {
        let mut worker = Worker::new(WorkerConfig::default(), Allocator::Thread(Thread::default()), None);
        let mut input = InputSession::<u64, RowKey, isize>::new();
        let table = CountTable::<RowKey>::default();
        let sink = table.clone();
        let probe = worker.dataflow::<u64, _, _>(|scope| {
            let ids = input.to_collection(scope);
            let counts = match window {
                None => ids.id_counts(),
                Some(w) => ids.id_counts_within(move |t| t.saturating_add(w)),
            };
            sink.attach(counts).probe().0
        });
        input.advance_to(start);
        input.flush();
        DifferentialFrequencies { input, probe, table, worker, window }
    }

    /// The window in steps (`None`: all time).
    pub fn window(&self) -> Option<u64> {
        self.window
    }

    /// One update of row `id` of `table` in the current training step.
    #[inline]
    pub fn record(&mut self, table: usize, id: u64) {
        self.input.update((table as u32, id), 1);
    }

    /// Adds `count` occurrences of row `id` of `table` at the current step (a restore).
    pub fn seed(&mut self, table: usize, id: u64, count: u32) {
        if count > 0 {
            self.input.update((table as u32, id), count as isize);
        }
    }

    /// Closes the training steps below `completed` and runs the dataflow one round.
    pub fn advance(&mut self, completed: u64) {
        if *self.input.time() < completed {
            self.input.advance_to(completed);
        }
        self.input.flush();
        self.worker.step();
    }

    /// Runs the dataflow until every closed step is counted.
    pub fn settle(&mut self) {
        self.input.flush();
        let (probe, time) = (&self.probe, *self.input.time());
        self.worker.step_while(|| probe.less_than(&time));
    }

    /// The count of row `id` of `table` as of the last [`settle`](Self::settle).
    #[inline]
    pub fn count(&self, table: usize, id: u64) -> u32 {
        self.table.get(&(table as u32, id)).clamp(0, u32::MAX as i64) as u32
    }

    /// Rows with a non-zero count.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// True when no row has a count.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_the_steps_and_the_window() {
        let mut all = DifferentialFrequencies::new(None, 0);
        let mut last2 = DifferentialFrequencies::new(Some(2), 0);
        // Row (0, 5) in steps 0, 1, 2; row (1, 5) in step 1 only.
        for s in 0..3u64 {
            for f in [&mut all, &mut last2] {
                f.record(0, 5);
                if s == 1 {
                    f.record(1, 5);
                }
                f.advance(s + 1);
                f.settle();
            }
            assert_eq!(all.count(0, 5), s as u32 + 1);
            assert_eq!(last2.count(0, 5), (s as u32 + 1).min(2));
        }
        assert_eq!((all.count(1, 5), last2.count(1, 5)), (1, 1));
        for f in [&mut all, &mut last2] {
            f.advance(4);
            f.settle();
        }
        assert_eq!((all.count(1, 5), last2.count(1, 5)), (1, 0), "step 1 left the window at step 3");
        assert_eq!((all.len(), last2.len()), (2, 1));
        // A restored dataflow starts at its step with seeded counts.
        let mut restored = DifferentialFrequencies::new(None, 10);
        restored.seed(0, 5, 7);
        restored.record(0, 5);
        restored.advance(11);
        restored.settle();
        assert_eq!(restored.count(0, 5), 8);
    }
}
