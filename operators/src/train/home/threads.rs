//! The threads a home spreads a large step's planning, pooling and gradient
//! sums over: a pool of its own (so workers do not take each other's threads),
//! started once, used only for steps with enough entries to pay for it.
//!
//! Invariant: whether a step uses the pool changes when it finishes, never what
//! it computes (see the module above).

/// Entries of a step each thread takes at least: fewer cost more to hand out than they save.
pub(super) const MIN_ENTRIES_PER_THREAD: usize = 8192;

/// Up to `threads` threads for a home's steps.
pub(super) struct HostThreads {
    threads: usize,
    /// Started when `threads` > 1 (`None` also where the threads could not be
    /// started: the work then stays on the worker's thread).
    pool: Option<rayon::ThreadPool>,
}

impl HostThreads {
    /// A home's threads: `threads` (at least 1; 1 starts none).
    pub(super) fn new(threads: usize) -> Self {
        let threads = threads.max(1);
        let pool = (threads > 1)
            .then(|| rayon::ThreadPoolBuilder::new().num_threads(threads).thread_name(|i| format!("tiderec-home-{i}")))
            .and_then(|builder| builder.build().ok());
        HostThreads { threads, pool }
    }

    /// The threads a step of `entries` entries is spread over: at most the
    /// home's, each with at least [`MIN_ENTRIES_PER_THREAD`] entries, at least one.
    pub(super) fn threads_for(&self, entries: usize) -> usize {
        match self.pool {
            Some(_) => self.threads.min(entries / MIN_ENTRIES_PER_THREAD).max(1),
            None => 1,
        }
    }

    /// The pool, when a step of `entries` entries is spread over more than one thread.
    pub(super) fn for_entries(&self, entries: usize) -> Option<&rayon::ThreadPool> {
        self.pool.as_ref().filter(|_| self.threads_for(entries) > 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_takes_more_threads_only_with_enough_entries() {
        let one = HostThreads::new(1);
        assert!(one.pool.is_none());
        assert_eq!(one.threads_for(1 << 30), 1);
        let four = HostThreads::new(4);
        assert_eq!(four.threads_for(0), 1);
        assert!(four.for_entries(2 * MIN_ENTRIES_PER_THREAD - 1).is_none());
        assert_eq!(four.threads_for(3 * MIN_ENTRIES_PER_THREAD), 3);
        assert!(four.for_entries(2 * MIN_ENTRIES_PER_THREAD).is_some());
        assert_eq!(four.threads_for(100 * MIN_ENTRIES_PER_THREAD), 4);
        assert_eq!(HostThreads::new(0).threads_for(1 << 30), 1);
    }
}
