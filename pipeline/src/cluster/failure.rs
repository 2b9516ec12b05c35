//! A worker's own error, reported to its process the moment the worker fails.
//!
//! A worker that fails inside a step tells every other worker through the step
//! (`failed_workers`), and all of them stop together. One that fails outside a
//! step (writing the metrics log, opening a file, a budget check of worker 0
//! only) tells nobody: the others wait for its next message forever, and so
//! would a process joining them. So the first error of a local worker is kept
//! here ([`Failure::report`]); the process stops waiting for its workers a
//! bounded time ([`GRACE`]) after it, or after another process was recorded as
//! lost, and ends with the first error; and the heartbeats tell the other
//! processes that this one failed ([`super::liveness`]).
//!
//! Invariant: the error given out is that of the lowest local worker that reported
//! one, so a run whose workers fail together (through a step) names the same error
//! whichever worker's thread came first; the time kept is that of the first report.

use crate::PipelineError;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a process waits for its workers after the first failure before it ends
/// without them: enough for workers that learnt of it through a step to finish theirs.
pub const GRACE: Duration = Duration::from_secs(5);

/// The local workers' own errors, and when the first came.
#[derive(Debug, Default)]
pub struct Failure {
    errors: Mutex<BTreeMap<usize, PipelineError>>,
    at: OnceLock<Instant>,
    failed: AtomicBool,
}

impl Failure {
    /// Keeps worker `worker`'s `error`.
    pub fn report(&self, worker: usize, error: PipelineError) {
        self.errors.lock().unwrap_or_else(|e| e.into_inner()).entry(worker).or_insert(error);
        let _ = self.at.set(Instant::now());
        self.failed.store(true, Ordering::Release);
    }

    /// Whether a local worker has failed.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// When the first failure came.
    pub fn since(&self) -> Option<Instant> {
        self.at.get().copied()
    }

    /// The error of the lowest worker that reported one, once.
    pub fn take(&self) -> Option<PipelineError> {
        self.errors.lock().unwrap_or_else(|e| e.into_inner()).pop_first().map(|(_, e)| e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::DataflowFailure;

    #[test]
    fn the_lowest_workers_error_is_given_out() {
        let f = Failure::default();
        assert!(!f.failed() && f.since().is_none() && f.take().is_none());
        f.report(3, PipelineError::dataflow(DataflowFailure::Start, "worker 3"));
        let first = f.since();
        f.report(1, PipelineError::dataflow(DataflowFailure::Start, "worker 1"));
        assert!(f.failed() && first.is_some() && f.since() == first, "the time of the first report");
        assert!(f.take().unwrap().to_string().contains("worker 1"));
        assert!(f.take().unwrap().to_string().contains("worker 3"));
        assert!(f.take().is_none() && f.failed(), "each taken once; the process still failed");
    }
}
