//! Step bookkeeping shared by the stages: message rendezvous and the byte ledger.

use super::messages::Routed;
use super::StepStats;
use std::collections::HashMap;

/// Bytes this worker sent to other workers, by the step (timestamp) of each
/// message. A worker may serve a faster peer's next step before its own step
/// completes, so a plain running counter read at a step boundary would depend
/// on timing; counting per step keeps every figure deterministic.
#[derive(Default)]
pub(super) struct ByteLedger {
    /// Bytes of steps that are still open here (a message of step `t` can be sent until this worker completes `t`).
    open: std::collections::BTreeMap<u64, u64>,
    /// Bytes of the steps before `settled_through`.
    settled: u64,
    settled_through: u64,
}

impl ByteLedger {
    fn add(&mut self, t: u64, bytes: u64) {
        debug_assert!(t >= self.settled_through, "a message of step {t} after that step completed");
        *self.open.entry(t).or_default() += bytes;
    }

    /// Counts, in step `t`, the messages of `sent` that leave this worker.
    pub(super) fn count<M: Routed>(&mut self, t: u64, sent: &[M]) {
        for m in sent {
            let (from, to) = m.route();
            if from != to {
                self.add(t, m.wire_bytes());
            }
        }
    }

    /// Bytes of the steps before `t`.
    pub(super) fn before(&self, t: u64) -> u64 {
        self.settled + self.open.range(..t).map(|(_, b)| b).sum::<u64>()
    }

    /// Folds the steps before `t` (all complete) into the settled total.
    pub(super) fn settle(&mut self, t: u64) {
        let later = self.open.split_off(&t);
        self.settled += self.open.values().sum::<u64>();
        self.open = later;
        self.settled_through = self.settled_through.max(t);
    }
}

/// Collects the `W` messages each worker sends a stage for one timestamp.
pub(super) struct Rendezvous<M> {
    workers: usize,
    stash: HashMap<u64, Vec<M>>,
}

impl<M: Routed> Rendezvous<M> {
    pub(super) fn new(workers: usize) -> Self {
        Rendezvous { workers, stash: HashMap::new() }
    }

    /// Adds the messages of timestamp `t`; returns all `W` of them, in sender
    /// order, once complete.
    pub(super) fn offer(&mut self, t: u64, data: &mut Vec<M>) -> Option<Vec<M>> {
        let entry = self.stash.entry(t).or_default();
        entry.append(data);
        if entry.len() == self.workers {
            let mut all = self.stash.remove(&t)?;
            all.sort_by_key(|m| m.route().0);
            Some(all)
        } else {
            None
        }
    }
}

/// The outcome of the last completed step on this worker, and how many steps it has begun.
#[derive(Default)]
pub(super) struct Outcome {
    completed: u64,
    started: u64,
    stats: StepStats,
}

impl Outcome {
    /// Records that this worker began step `t` (its command reached the plan stage).
    pub(super) fn start(&mut self, t: u64) {
        self.started = self.started.max(t + 1);
    }

    /// Number of steps this worker has begun: the owner serves no request of a
    /// later step, whose rows a change between steps (a restore) may still replace.
    pub(super) fn started(&self) -> u64 {
        self.started
    }

    /// Records that step `t` (the timestamp; steps count from 1) completed with `stats`.
    pub(super) fn complete(&mut self, t: u64, stats: StepStats) {
        self.completed = t + 1;
        self.stats = stats;
    }

    /// Number of steps completed.
    pub(super) fn completed(&self) -> u64 {
        self.completed
    }

    /// The global statistics of the last completed step.
    pub(super) fn stats(&self) -> StepStats {
        self.stats
    }
}
