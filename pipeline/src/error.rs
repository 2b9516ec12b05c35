//! The one error type of this crate.
//!
//! Every variant names what failed and where in fields a caller can match on
//! (the path, step, worker, process or setting), and carries the error
//! underneath as its [`source`](std::error::Error::source) where there is one.
//! The message is built from the same fields, so it says no more and no less
//! than they do; it ends with the source's own message, as the other crates'
//! errors do.

use std::path::PathBuf;
use thiserror::Error;
use tiderec_operators::{ConfigError, OperatorError};
use tiderec_sources::SourceError;

/// An error underneath another, of any type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors of a training run, from configuration to the last metric.
#[derive(Debug, Error)]
pub enum PipelineError {
    /// A configuration value is invalid; its `key` names it. Configuration errors of
    /// the operators and sources crates arrive here too, not inside
    /// [`PipelineError::Operator`] or [`PipelineError::Source`].
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The configuration file could not be read or parsed.
    #[error("cannot load config {path}: {reason}")]
    ConfigFile {
        /// The configuration file.
        path: String,
        /// Why it cannot be used (the I/O or TOML error, with its line).
        reason: String,
    },
    /// A reader failed (missing file, bad record under `--on-bad-record fail`, …).
    #[error(transparent)]
    Source(SourceError),
    /// A sink failed (metrics file, dead letters).
    #[error(transparent)]
    Sink(#[from] tiderec_sinks::SinkError),
    /// The model or trainer rejected its input.
    #[error(transparent)]
    Operator(OperatorError),
    /// A checkpoint could not be written, restored or read.
    #[error("{}", checkpoint_message(*.action, .path, *.step, *.worker, .reason, .source))]
    Checkpoint {
        /// What was being done with it.
        action: CheckpointAction,
        /// The checkpoint (a `ckpt-<step>` directory, a checkpoint directory or its
        /// `best` link), when one is concerned.
        path: Option<PathBuf>,
        /// The training step of the checkpoint, when known.
        step: Option<u64>,
        /// The worker that reported the failure, when one did.
        worker: Option<usize>,
        /// What is wrong.
        reason: String,
        /// The error underneath (I/O, format, a model that does not fit), when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// The processes of a cluster run disagree, one is missing, or one was lost.
    #[error("{}", and_source(.reason, .source))]
    Cluster {
        /// What went wrong.
        failure: ClusterFailure,
        /// The other process concerned (unreachable, silent, lost, or sending a bad
        /// handshake), when one is.
        process: Option<usize>,
        /// The whole account: which processes (and their addresses), which settings
        /// differ or after which step, and what to do.
        reason: String,
        /// The error underneath (a socket's, the handshake's encoding), when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// An input is mostly malformed or yields no sample (see [`crate::budget`]).
    #[error("{split} input {input}: {reason}")]
    BadInput {
        /// What the input was read for: `training`, `evaluation`, `conversion` or `prediction`.
        split: &'static str,
        /// The input (its files or source).
        input: String,
        /// What is wrong: the share of malformed records, or no sample at all.
        reason: String,
    },
    /// An output would overwrite an input, another output, or an existing file (see
    /// [`crate::paths`]); refused before anything was written.
    #[error(transparent)]
    Paths(#[from] crate::paths::PathError),
    /// `--resume` with other data files than the checkpoint was trained on.
    #[error(
        "cannot resume from {checkpoint}: it was trained on other data ({}); its data position (epoch {epoch}, \
         {steps_in_epoch} steps into it) means nothing for these files. Give the same files, or add --new-data \
         to keep the model and read the new data from its start",
        .differences.join("; ")
    )]
    OtherData {
        /// The checkpoint.
        checkpoint: String,
        /// Its data position.
        epoch: u64,
        /// Global steps into that epoch.
        steps_in_epoch: u64,
        /// Every difference, one line each.
        differences: Vec<String>,
    },
    /// A data file could not be read for its fingerprint.
    #[error("{flag} {path}: cannot read it: {source}")]
    InputUnreadable {
        /// The flag that names it.
        flag: String,
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The run would not fit: a size overflows, or the memory estimate exceeds what is available
    /// (see [`crate::memory`]).
    #[error(transparent)]
    Resources(#[from] ResourceError),
    /// A directory the run writes is locked by another run (see [`crate::dir_lock`]).
    #[error(transparent)]
    Lock(#[from] crate::dir_lock::LockError),
    /// Training diverged: a non-finite loss, gradient or parameter. Every worker stopped
    /// after the same step; no checkpoint of the diverged state was written.
    #[error("{}", diverged_message(*.step, .cause, .last_checkpoint, *.checkpointing))]
    Diverged {
        /// The global training step whose statistics were not finite.
        step: u64,
        /// What was not finite.
        cause: Divergence,
        /// The newest durable checkpoint, from before the step (`--resume` starts from it).
        last_checkpoint: Option<PathBuf>,
        /// Whether the run wrote checkpoints (`--checkpoint-dir`).
        checkpointing: bool,
    },
    /// Timely could not start, a worker or thread failed, or an output of the run
    /// could not be written.
    #[error("dataflow: {}", with_worker(*.worker, .reason, .source))]
    Dataflow {
        /// What failed.
        failure: DataflowFailure,
        /// The worker that failed, when known.
        worker: Option<usize>,
        /// What happened.
        reason: String,
        /// The error underneath (I/O, a panic's message, timely's), when there is one.
        #[source]
        source: Option<BoxError>,
    },
}

/// What a [`PipelineError::Checkpoint`] was doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointAction {
    /// Writing a checkpoint of the run (snapshot, files, commit).
    Write,
    /// Restoring the run from a checkpoint (`--resume`, the best model at the end).
    Restore,
    /// Reading a checkpoint to score, export or serve its model.
    Read,
    /// Scoring records with a checkpoint's model (they do not fit it).
    Score,
}

/// What a [`PipelineError::Cluster`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterFailure {
    /// This process cannot listen on its address or accept connections.
    Listen,
    /// Another process could not be reached, or did not connect, in time.
    Connect,
    /// The start-up handshake failed (a bad frame, a connection closed during it).
    Handshake,
    /// The processes were started with different settings.
    Disagree,
    /// A process was lost mid-run (it died, or sent no heartbeat).
    Lost,
    /// A signal stopped this process while it waited for the others at start.
    Stopped,
}

/// What failed in a [`PipelineError::Dataflow`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataflowFailure {
    /// Timely's workers could not start.
    Start,
    /// This worker (or a thread of this process) panicked.
    Panicked,
    /// Another worker failed; its own error is the one to report.
    PeerFailed,
    /// Timely's communication between processes failed.
    Communication,
    /// A thread of the run (signal handler, metrics endpoint, server) could not start.
    Thread,
    /// An output of the run (dead letters, metrics log) could not be written.
    Output,
    /// The broker acknowledged fewer records than were sent.
    Delivery,
    /// The workers left the run in a state it cannot finish from (no model kept, no summary).
    Incomplete,
}

/// What was not finite in a [`PipelineError::Diverged`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Divergence {
    /// The loss, summed over the step's samples.
    Loss(f64),
    /// The loss was finite, the gradients or updated parameters were not.
    Parameters,
}

/// Why a run would not fit ([`PipelineError::Resources`]).
#[derive(Debug, Error)]
pub enum ResourceError {
    /// A size in bytes overflows 64 bits.
    #[error("{what}: the size in bytes does not fit in 64 bits; lower it")]
    Overflow {
        /// What was being sized (a table, a layer, the run).
        what: String,
    },
    /// The memory estimate exceeds what is available.
    #[error(
        "{estimate}: the run needs more memory than is available ({limit}); lower --buckets/table_sizes or --dim, \
         spread the tables over more processes, bound a --store dynamic/tiered with --max-rows, or pass \
         --max-memory unlimited (or a size) to run anyway"
    )]
    Memory {
        /// Bytes the run would need (the estimate's total).
        needed: u64,
        /// Bytes available.
        available: u64,
        /// Where `available` comes from (`--max-memory`, the cgroup limit, `MemAvailable`).
        limit: &'static str,
        /// The estimate, item by item, as printed at start-up.
        estimate: String,
    },
}

impl PipelineError {
    /// Shorthand for a configuration error naming `key`.
    pub fn config(key: impl Into<String>, reason: impl Into<String>) -> Self {
        PipelineError::Config(ConfigError::new(key, reason))
    }

    /// A [`PipelineError::Checkpoint`] about `path` (when given) failing to `action`.
    pub fn checkpoint(action: CheckpointAction, path: Option<PathBuf>, reason: impl Into<String>) -> Self {
        PipelineError::Checkpoint { action, path, step: None, worker: None, reason: reason.into(), source: None }
    }

    /// A [`PipelineError::Cluster`] with no error underneath.
    pub fn cluster(failure: ClusterFailure, process: Option<usize>, reason: impl Into<String>) -> Self {
        PipelineError::Cluster { failure, process, reason: reason.into(), source: None }
    }

    /// A [`PipelineError::Dataflow`] with no worker named and no error underneath.
    pub fn dataflow(failure: DataflowFailure, reason: impl Into<String>) -> Self {
        PipelineError::Dataflow { failure, worker: None, reason: reason.into(), source: None }
    }

    /// Attaches `source` as the error underneath a `Checkpoint`, `Cluster` or `Dataflow`
    /// error (other variants are returned unchanged).
    pub fn with_source(mut self, error: impl Into<BoxError>) -> Self {
        match &mut self {
            PipelineError::Checkpoint { source, .. }
            | PipelineError::Cluster { source, .. }
            | PipelineError::Dataflow { source, .. } => *source = Some(error.into()),
            _ => {}
        }
        self
    }

    /// Whether this is a worker reporting that another one failed (the other's error is the
    /// one worth showing).
    pub fn is_peer_failure(&self) -> bool {
        matches!(self, PipelineError::Dataflow { failure: DataflowFailure::PeerFailed, .. })
    }
}

/// `reason`, then `: source` when there is one.
fn and_source(reason: &str, source: &Option<BoxError>) -> String {
    match source {
        Some(s) => format!("{reason}: {s}"),
        None => reason.to_string(),
    }
}

/// `reason (worker W)`, then `: source` when there is one.
fn with_worker(worker: Option<usize>, reason: &str, source: &Option<BoxError>) -> String {
    match worker {
        Some(w) => and_source(&format!("{reason} (worker {w})"), source),
        None => and_source(reason, source),
    }
}

fn checkpoint_message(
    action: CheckpointAction,
    path: &Option<PathBuf>,
    step: Option<u64>,
    worker: Option<usize>,
    reason: &str,
    source: &Option<BoxError>,
) -> String {
    let mut m = match action {
        CheckpointAction::Write => "writing the checkpoint",
        CheckpointAction::Restore => "restoring the checkpoint",
        CheckpointAction::Read => "reading the checkpoint",
        CheckpointAction::Score => "scoring with the checkpoint",
    }
    .to_string();
    if let Some(s) = step {
        m += &format!(" of step {s}");
    }
    if let Some(p) = path {
        m += &format!(" {}", p.display());
    }
    m += " failed";
    if let Some(w) = worker {
        m += &format!(" on worker {w}");
    }
    format!("{m}: {}", and_source(reason, source))
}

fn diverged_message(step: u64, cause: &Divergence, last: &Option<PathBuf>, checkpointing: bool) -> String {
    let what = match cause {
        Divergence::Loss(loss) => format!("the loss is {loss}"),
        Divergence::Parameters => "the gradients or updated parameters are not finite".to_string(),
    };
    let last = match (checkpointing, last) {
        (_, Some(path)) => format!("the last good checkpoint is {} (--resume starts from it)", path.display()),
        (true, None) => "no checkpoint was written before it".into(),
        (false, None) => "no checkpoint was written (no --checkpoint-dir)".into(),
    };
    format!(
        "training diverged at step {step}: {what}; every worker stopped and no checkpoint of this state was \
         written; {last}. Lower --lr, or check the input for extreme values"
    )
}

impl From<OperatorError> for PipelineError {
    fn from(e: OperatorError) -> Self {
        match e {
            OperatorError::Config(c) => PipelineError::Config(c),
            e => PipelineError::Operator(e),
        }
    }
}

impl From<SourceError> for PipelineError {
    fn from(e: SourceError) -> Self {
        match e {
            SourceError::Config(c) => PipelineError::Config(c),
            e => PipelineError::Source(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_message_names_step_path_worker_and_source() {
        let io = std::io::Error::other("No space left on device");
        let e = PipelineError::Checkpoint {
            action: CheckpointAction::Write,
            path: Some(PathBuf::from("/ck/ckpt-30")),
            step: Some(30),
            worker: Some(1),
            reason: "cannot write table.safetensors".into(),
            source: Some(io.into()),
        };
        assert_eq!(
            e.to_string(),
            "writing the checkpoint of step 30 /ck/ckpt-30 failed on worker 1: cannot write table.safetensors: \
             No space left on device"
        );
        let source = std::error::Error::source(&e).expect("the I/O error is the source");
        assert_eq!(source.to_string(), "No space left on device");
    }

    #[test]
    fn peer_failures_are_told_apart() {
        let peer = PipelineError::dataflow(DataflowFailure::PeerFailed, "another worker failed (1 failed)");
        assert!(peer.is_peer_failure());
        assert_eq!(peer.to_string(), "dataflow: another worker failed (1 failed)");
        let own = PipelineError::dataflow(DataflowFailure::Panicked, "a worker panicked").with_source("index 3");
        assert!(!own.is_peer_failure());
        assert_eq!(own.to_string(), "dataflow: a worker panicked: index 3");
    }

    #[test]
    fn diverged_names_the_step_and_the_checkpoint_to_resume_from() {
        let e = PipelineError::Diverged {
            step: 7,
            cause: Divergence::Loss(f64::NAN),
            last_checkpoint: Some(PathBuf::from("/ck/ckpt-5")),
            checkpointing: true,
        };
        let m = e.to_string();
        assert!(m.starts_with("training diverged at step 7: the loss is NaN;"), "{m}");
        assert!(m.contains("the last good checkpoint is /ck/ckpt-5 (--resume starts from it)"), "{m}");
        let e = PipelineError::Diverged {
            step: 7,
            cause: Divergence::Parameters,
            last_checkpoint: None,
            checkpointing: false,
        };
        assert!(e.to_string().contains("no checkpoint was written (no --checkpoint-dir)"), "{e}");
    }
}
