//! The one error type of this crate.

use thiserror::Error;
use tiderec_operators::{ConfigError, OperatorError};
use tiderec_sources::SourceError;

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
    /// A checkpoint could not be written or restored; the message names the path.
    #[error("{0}")]
    Checkpoint(String),
    /// The processes of a cluster run disagree, one is missing, or one was lost; the
    /// message names the process (and its address, the settings, or the step).
    #[error("{0}")]
    Cluster(String),
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
        PipelineError::Config(ConfigError::new(key, reason))
    }
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
