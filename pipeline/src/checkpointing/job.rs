//! A piece of checkpoint writing handed to a background thread.
//!
//! A [`Job`] owns everything it writes (the snapshot was copied out of the
//! trainer before it started), so training may go on while it runs. Its
//! outcome is kept until [`Job::wait`] takes it: an error (or a panic of the
//! thread) is never lost, it becomes the `Err` that `wait` returns.

use std::sync::{Arc, Mutex};

/// One background write; its result is an error message naming the path on failure.
pub(super) struct Job<T> {
    inner: Inner<T>,
}

enum Inner<T> {
    /// Running (or finished) on its thread.
    Thread(std::thread::JoinHandle<Result<T, String>>),
    /// Ran on the caller's thread, because no thread could be started.
    Done(Result<T, String>),
}

impl<T: Send + 'static> Job<T> {
    /// Starts `work` on a thread named `name`. If no thread can be started,
    /// `work` runs here instead (slower, never wrong).
    pub(super) fn spawn(name: &str, work: impl FnOnce() -> Result<T, String> + Send + 'static) -> Job<T> {
        // The work goes through a slot, so it is still here if the thread cannot start.
        let slot = Arc::new(Mutex::new(Some(work)));
        let theirs = slot.clone();
        let run = move || match theirs.lock().ok().and_then(|mut w| w.take()) {
            Some(work) => work(),
            None => Err("the checkpoint writer found no work".to_string()),
        };
        let inner = match std::thread::Builder::new().name(name.to_string()).spawn(run) {
            Ok(handle) => Inner::Thread(handle),
            Err(e) => Inner::Done(match slot.lock().ok().and_then(|mut w| w.take()) {
                Some(work) => work(),
                None => Err(format!("cannot start a checkpoint writer thread: {e}")),
            }),
        };
        Job { inner }
    }

    /// A job that already ended with `outcome`: work that failed before it could
    /// start, whose error is reported in the round that collects every job's outcome.
    pub(super) fn finished(outcome: Result<T, String>) -> Job<T> {
        Job { inner: Inner::Done(outcome) }
    }

    /// True when the work has finished (successfully or not); never blocks.
    pub(super) fn is_done(&self) -> bool {
        match &self.inner {
            Inner::Thread(h) => h.is_finished(),
            Inner::Done(_) => true,
        }
    }

    /// Waits for the work and returns its outcome.
    pub(super) fn wait(self) -> Result<T, String> {
        match self.inner {
            Inner::Thread(h) => h.join().unwrap_or_else(|_| Err("the checkpoint writer thread panicked".to_string())),
            Inner::Done(outcome) => outcome,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_outcome_and_errors_come_back() {
        let ok = Job::spawn("t-ok", || Ok(7u32));
        assert_eq!(ok.wait(), Ok(7));
        let err: Job<u32> = Job::spawn("t-err", || Err("disk full at /x".into()));
        assert_eq!(err.wait(), Err("disk full at /x".to_string()));
        let panics: Job<u32> = Job::spawn("t-panic", || panic!("boom"));
        assert!(panics.wait().unwrap_err().contains("panicked"));
        let finished: Job<u32> = Job::finished(Err("the snapshot failed".into()));
        assert!(finished.is_done());
        assert_eq!(finished.wait(), Err("the snapshot failed".to_string()));
    }

    #[test]
    fn is_done_does_not_block_while_the_work_runs() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let job = Job::spawn("t-slow", move || {
            rx.recv().map_err(|e| e.to_string())?;
            Ok(1u8)
        });
        std::thread::sleep(Duration::from_millis(20));
        assert!(!job.is_done());
        tx.send(()).unwrap();
        assert_eq!(job.wait(), Ok(1));
    }
}
