//! The one error type of this crate.

use thiserror::Error;

/// Errors of a training run, from configuration to the last metric.
#[derive(Debug, Error)]
pub enum PipelineError {
    /// A configuration value is invalid; `key` names it.
    #[error("invalid configuration `{key}`: {reason}")]
    Config { key: String, reason: String },
    /// The configuration file could not be read or parsed.
    #[error("cannot load config {path}: {reason}")]
    ConfigFile { path: String, reason: String },
    /// A reader failed (missing file, bad record under `--on-bad-record fail`, …).
    #[error(transparent)]
    Source(#[from] tiderec_sources::SourceError),
    /// A sink failed (metrics file, dead letters).
    #[error(transparent)]
    Sink(#[from] tiderec_sinks::SinkError),
    /// The model or trainer rejected its input or configuration.
    #[error(transparent)]
    Operator(#[from] tiderec_operators::OperatorError),
    /// A checkpoint could not be written or restored; the message names the path.
    #[error("{0}")]
    Checkpoint(String),
    /// The processes of a cluster run disagree, one is missing, or one was lost; the
    /// message names the process (and its address, the settings, or the step).
    #[error("{0}")]
    Cluster(String),
    /// An input is mostly malformed or yields no sample (see [`crate::budget`]).
    #[error("{split} input {input}: {reason}")]
    BadInput { split: &'static str, input: String, reason: String },
    /// The run would not fit: a size overflows, or the memory estimate exceeds what is available
    /// (see [`crate::memory`]).
    #[error("{0}")]
    Resources(String),
    /// Training diverged: a non-finite loss, gradient or parameter; names the step
    /// and the last good checkpoint.
    #[error("{0}")]
    Diverged(String),
    /// Timely could not start or a worker failed.
    #[error("dataflow: {0}")]
    Dataflow(String),
}

impl PipelineError {
    /// Shorthand for a configuration error naming `key`.
    pub fn config(key: impl Into<String>, reason: impl Into<String>) -> Self {
        PipelineError::Config { key: key.into(), reason: reason.into() }
    }
}
