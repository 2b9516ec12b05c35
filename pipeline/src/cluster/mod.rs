//! The processes of a cluster run (`--processes N --process I --hosts FILE`):
//! checked against each other before the dataflow starts, and a lost one
//! turned into one clear error on every survivor.
//!
//! * **Handshake** ([`handshake`]): the processes connect (every pair, within
//!   `--connect-timeout`), exchange a [`fingerprint`] of the settings that
//!   must agree and of the tiderec [`build`] each runs, and stop with an error
//!   naming every differing setting, its values and which process has which;
//!   with `--checkpoint-dir` they also check that it is one directory shared
//!   by all ([`shared_dir`]). The connections then carry timely's traffic
//!   ([`start`]).
//! * **Lost peer** ([`lost_peer`]): when a process dies mid-run, timely's
//!   communication threads and then the workers panic; [`join`] waits for
//!   every local worker, recognises the cascade and returns
//!   [`PipelineError::Cluster`] naming the lost process, the last step and
//!   the checkpoint to resume from.
//! * **Silent peer** ([`liveness`]): a process that sends no heartbeat for
//!   its reader's `--connect-timeout` seconds (stopped, hung, cut off) is recorded as lost
//!   and its connection shut down, so timely's threads fail as for a dead one
//!   and [`join`] returns the same error, instead of the workers waiting for
//!   it forever. The timeout may differ between processes: the handshake
//!   carries each one's, and every process beats often enough for the
//!   shortest.
//! * **A signal at start**: SIGINT or SIGTERM while the processes wait for
//!   each other ends the wait at once with [`ClusterFailure::Stopped`],
//!   before any worker starts.
//!
//! * **A worker's own error** ([`failure`]): a worker that fails outside a
//!   step tells no other worker; the process ends a bounded time after it
//!   (or after another process was recorded as lost) without waiting for the
//!   others, with that error, and its heartbeats tell the other processes,
//!   which then end naming it.
//!
//! A one-process run goes through `timely::execute`, with its workers' errors
//! kept as above.

pub mod build;
pub mod failure;
pub mod fingerprint;
pub mod handshake;
pub mod liveness;
pub mod lost_peer;
mod role;
pub mod shared_dir;

pub use role::ProcessRole;

use crate::config::Resolved;
use crate::error::{ClusterFailure, DataflowFailure};
use crate::{PipelineError, TrainSettings};
use fingerprint::Fingerprint;
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use timely::communication::allocator::zero_copy::initialize::initialize_networking_from_sockets;
use timely::communication::allocator::ProcessBuilder;
use timely::communication::initialize::WorkerGuards;
use timely::communication::{AllocatorBuilder, Hooks};
use timely::worker::Worker;

/// Where this process stands in its run, for the lost-peer error.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// This process's index.
    pub process: usize,
    /// `host:port` of every process (empty for one process).
    pub addresses: Vec<String>,
    /// Worker threads per process.
    pub threads: usize,
    /// How long to wait for the other processes at start-up.
    pub connect_timeout: Duration,
    /// The checkpoint directory, if any: checked to be one directory for every process at
    /// the handshake ([`shared_dir`]), named in the lost-peer error.
    pub checkpoint_dir: Option<PathBuf>,
    /// The last training step finished (updated by the workers).
    pub step: Arc<AtomicU64>,
    /// Set once the local workers are joined: heartbeats no longer matter.
    pub done: Arc<AtomicBool>,
    /// The first error of a local worker.
    pub failure: Arc<failure::Failure>,
}

impl Cluster {
    /// The cluster of a `train` or `online` run with these settings. A process other than
    /// 0 warns, in one line, of the outputs it was given that only process 0 writes.
    pub fn new(settings: &TrainSettings, resolved: &Resolved) -> Self {
        if let Some(line) = ignored_outputs(settings) {
            eprintln!("{line}");
        }
        Cluster {
            process: settings.cluster.process,
            addresses: resolved.hosts.clone(),
            threads: settings.cluster.workers,
            connect_timeout: Duration::from_secs_f64(settings.cluster.connect_timeout),
            checkpoint_dir: settings.checkpoints.checkpoint_dir.clone(),
            step: Arc::new(AtomicU64::new(0)),
            done: Arc::new(AtomicBool::new(false)),
            failure: Arc::default(),
        }
    }

    /// Records that training step `step` is finished.
    pub fn finished_step(&self, step: u64) {
        self.step.fetch_max(step, Ordering::Relaxed);
    }
}

/// The warning for the outputs given to a process other than 0 that only process 0
/// writes (`--metrics-json`, `--metrics-log`, `--tensorboard`, `--metrics-addr`), if any.
fn ignored_outputs(settings: &TrainSettings) -> Option<String> {
    let run = &settings.run;
    let given: Vec<&str> = [
        ("--metrics-json", run.metrics_json.is_some()),
        ("--metrics-log", run.metrics_log.is_some()),
        ("--tensorboard", run.tensorboard.is_some()),
        ("--metrics-addr", run.metrics_addr.is_some()),
    ]
    .into_iter()
    .filter_map(|(flag, set)| set.then_some(flag))
    .collect();
    let process = settings.cluster.process;
    (process > 0 && !given.is_empty())
        .then(|| format!("warning: process {process} ignores {}: only process 0 writes them", given.join(", ")))
}

/// What each worker returns: worker 0's summary, or an error.
pub type Outcome<T> = Result<Option<T>, PipelineError>;

/// Starts the workers running `func`: for several processes, after the handshake on the
/// fingerprint `print` makes, with this process's [`build::identity`] first (an error
/// names every setting that differs; one process makes none: it reads the data files'
/// first and last MiB), and on `cluster.checkpoint_dir` being one
/// directory for all. A worker's own error (not "another worker failed") goes to
/// `cluster.failure` the moment it returns.
pub fn start<T, F>(
    cluster: &Cluster,
    print: impl FnOnce() -> Fingerprint,
    func: F,
) -> Result<WorkerGuards<Outcome<T>>, PipelineError>
where
    T: Send + 'static,
    F: Fn(&mut Worker) -> Outcome<T> + Send + Sync + 'static,
{
    let failure = cluster.failure.clone();
    let func = move |worker: &mut Worker| match func(worker) {
        Err(e) if !e.is_peer_failure() => {
            failure.report(worker.index(), e);
            Err(PipelineError::dataflow(DataflowFailure::PeerFailed, "this worker's error is the process's"))
        }
        outcome => outcome,
    };
    let start_error =
        |e: String| PipelineError::dataflow(DataflowFailure::Start, "cannot start timely workers").with_source(e);
    if cluster.addresses.len() <= 1 {
        let role = ProcessRole { process: 0, processes: 1, addresses: Vec::new() };
        return timely::execute(role.timely_config(cluster.threads), func).map_err(start_error);
    }
    lost_peer::install();
    let mine = fingerprint::with_build(print(), build::identity());
    // The process's SIGINT/SIGTERM flag (installed by the run already): a signal while the
    // processes wait for each other ends this one at once.
    let stop = crate::stop::stop_flag()?;
    let links = handshake::connect_and_agree(handshake::Start {
        me: cluster.process,
        addresses: &cluster.addresses,
        mine: &mine,
        checkpoint_dir: cluster.checkpoint_dir.as_deref(),
        timeout: cluster.connect_timeout,
        stop: &stop,
    })?;
    // A silent or failed process is recorded as lost and its data connection shut down here, so
    // timely's threads fail as if it had died and the run ends through `join`.
    let switches =
        links.data.iter().map(|s| s.as_ref().map(TcpStream::try_clone).transpose()).collect::<Result<Vec<_>, _>>();
    let switches = switches.map_err(|e| start_error(e.to_string()))?;
    let on_lost = Arc::new(move |p: usize, cause: String| {
        lost_peer::record(lost_peer::Lost { process: p, cause });
        if let Some(s) = &switches[p] {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    });
    let beats = liveness::Beats {
        timeout: cluster.connect_timeout,
        interval: liveness::interval(links.shortest_timeout),
        done: cluster.done.clone(),
        failure: cluster.failure.clone(),
    };
    liveness::watch(links.beats, beats, on_lost)
        .map_err(|e| start_error(format!("cannot start the heartbeats: {e}")))?;
    let sockets = links.data;
    let hooks = Hooks::default();
    let local = ProcessBuilder::new_typed_vector(cluster.threads, hooks.refill.clone(), hooks.spill.clone());
    let (builders, guard) = initialize_networking_from_sockets(local, sockets, cluster.process, cluster.threads, hooks)
        .map_err(|e| start_error(e.to_string()))?;
    let builders = builders.into_iter().map(AllocatorBuilder::Tcp).collect();
    timely::execute::execute_from(builders, Box::new(guard), timely::WorkerConfig::default(), func).map_err(start_error)
}

/// Waits for every local worker (the failing worker's own error first, not its peers'); when a connection to
/// another process broke, the error names that process, the last finished step and the
/// newest checkpoint instead of timely's panics. Waits at most [`failure::GRACE`] after a
/// local worker's own error or a lost process: workers that still wait then wait for a
/// worker that will not come, and the process ends without them.
pub fn join<T: Send + 'static>(cluster: &Cluster, guards: WorkerGuards<Outcome<T>>) -> Outcome<T> {
    let (sender, joined) = std::sync::mpsc::channel();
    let joiner = std::thread::Builder::new().name("tiderec:join".into()).spawn(move || {
        // Joining timely's communication threads panics once one of them has.
        let _ = sender.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| join_workers(guards))));
    });
    let joined = match joiner {
        Ok(_) => wait_for(&joined, &cluster.failure),
        Err(e) => Some(Ok(Err(PipelineError::dataflow(DataflowFailure::Thread, "cannot start the joining thread")
            .with_source(e.to_string())))),
    };
    cluster.done.store(true, Ordering::Relaxed);
    if let Some(own) = cluster.failure.take() {
        return Err(own);
    }
    if let Some(lost) = lost_peer::lost() {
        return Err(PipelineError::cluster(ClusterFailure::Lost, Some(lost.process), lost_message(cluster, &lost)));
    }
    match joined {
        Some(Ok(outcome)) => outcome,
        Some(Err(panic)) => {
            Err(PipelineError::dataflow(DataflowFailure::Communication, "a communication thread failed")
                .with_source(lost_peer::payload(panic.as_ref())))
        }
        None => Err(PipelineError::dataflow(DataflowFailure::Incomplete, "the workers did not end")),
    }
}

/// The joined workers, or `None` when they did not end within [`failure::GRACE`] of a
/// local worker's own error or of a process recorded as lost.
fn wait_for<J>(joined: &std::sync::mpsc::Receiver<J>, failure: &failure::Failure) -> Option<J> {
    const POLL: Duration = Duration::from_millis(100);
    let mut lost_since = None;
    loop {
        match joined.recv_timeout(POLL) {
            Ok(j) => return Some(j),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return None,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        if lost_since.is_none() && lost_peer::lost().is_some() {
            lost_since = Some(std::time::Instant::now());
        }
        if failure.since().into_iter().chain(lost_since).any(|t| t.elapsed() >= failure::GRACE) {
            return None;
        }
    }
}

/// The error of a run that lost process `lost.process`.
fn lost_message(cluster: &Cluster, lost: &lost_peer::Lost) -> String {
    let address = cluster.addresses.get(lost.process).map_or("?", String::as_str);
    let step = cluster.step.load(Ordering::Relaxed);
    let resume = match &cluster.checkpoint_dir {
        None => "No checkpoints were written (no --checkpoint-dir); the run must start again".to_string(),
        Some(dir) => match tiderec_sinks::checkpoint::layout::list_checkpoints(dir).ok().and_then(|c| c.last().cloned()) {
            Some((step, path)) => format!(
                "The newest checkpoint is {} (step {step}): start every process again with --resume to continue from it",
                path.display()
            ),
            None => format!("No checkpoint was written in {} yet; the run must start again", dir.display()),
        },
    };
    format!(
        "lost process {} ({address}) after training step {step}: {}; this process stops too. {resume}",
        lost.process, lost.cause
    )
}

/// Waits for every worker; returns worker 0's result, or the failing worker's own error
/// rather than its peers' "another worker failed".
fn join_workers<T: Send + 'static>(
    guards: timely::communication::initialize::WorkerGuards<Result<Option<T>, PipelineError>>,
) -> Result<Option<T>, PipelineError> {
    let mut summary = None;
    let mut errors: Vec<PipelineError> = Vec::new();
    for result in guards.join() {
        match result {
            Ok(Ok(Some(s))) => summary = Some(s),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => errors.push(e),
            Err(panic) => {
                errors.push(PipelineError::dataflow(DataflowFailure::Panicked, "a worker panicked").with_source(panic))
            }
        }
    }
    if let Some(i) = errors.iter().position(|e| !e.is_peer_failure()) {
        return Err(errors.swap_remove(i));
    }
    match errors.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(summary),
    }
}
