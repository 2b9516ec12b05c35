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
//! Invariant: the error kept is the first one reported; later ones are dropped
//! (they are the first one's consequences or came at the same time).

use crate::PipelineError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a process waits for its workers after the first failure before it ends
/// without them: enough for workers that learnt of it through a step to finish theirs.
pub const GRACE: Duration = Duration::from_secs(5);

/// The first error of a local worker, and when it came.
#[derive(Debug, Default)]
pub struct Failure {
    error: Mutex<Option<PipelineError>>,
    at: OnceLock<Instant>,
    failed: AtomicBool,
}

impl Failure {
    /// Keeps `error` unless one is kept already.
    pub fn report(&self, error: PipelineError) {
        let mut kept = self.error.lock().unwrap_or_else(|e| e.into_inner());
        if kept.is_none() {
            *kept = Some(error);
            let _ = self.at.set(Instant::now());
            self.failed.store(true, Ordering::Release);
        }
    }

    /// Whether a local worker has failed.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// When the first failure came.
    pub fn since(&self) -> Option<Instant> {
        self.at.get().copied()
    }

    /// The error kept, once.
    pub fn take(&self) -> Option<PipelineError> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::DataflowFailure;

    #[test]
    fn the_first_error_is_kept() {
        let f = Failure::default();
        assert!(!f.failed() && f.since().is_none() && f.take().is_none());
        f.report(PipelineError::dataflow(DataflowFailure::Start, "first"));
        f.report(PipelineError::dataflow(DataflowFailure::Start, "second"));
        assert!(f.failed() && f.since().is_some());
        assert!(f.take().unwrap().to_string().contains("first"));
        assert!(f.take().is_none() && f.failed(), "taken once; the process still failed");
    }
}
