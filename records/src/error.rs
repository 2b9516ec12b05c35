//! The error types of this crate, and the configuration error every tiderec crate shares.

use thiserror::Error;

/// A configuration value that is out of range or inconsistent with another.
///
/// The one configuration error of tiderec: the error types of the other crates
/// (`SourceError`, `PipelineError`) wrap it unchanged, so a caller matches
/// [`ConfigError::key`] the same way whichever crate refused the value.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("invalid configuration `{key}`: {reason}")]
pub struct ConfigError {
    /// The offending key, as written in a configuration file or on the command line
    /// (`table_sizes`, `model.dim`, `span`, …).
    pub key: String,
    /// Why the value is refused, with the value itself where it helps.
    pub reason: String,
}

impl ConfigError {
    /// A configuration error naming `key`.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError { key: key.into(), reason: reason.into() }
    }
}

/// Errors raised by operators, models and configuration checks in this crate.
#[derive(Debug, Error)]
pub enum OperatorError {
    /// A configuration value is out of range or inconsistent.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A batch does not match the shape the model was built for.
    #[error("batch shape mismatch: {0}")]
    Shape(String),
    /// A batch breaks its own invariants (see [`Batch::check`](crate::Batch::check)).
    #[error("batch shape mismatch: {0}")]
    Batch(#[from] crate::batch::BatchError),
    /// A checkpoint's state cannot be restored into this trainer; the message says why.
    #[error("cannot restore checkpoint: {0}")]
    Restore(String),
    /// A buffer's byte size overflows, or the system refused the memory.
    #[error("out of memory: {what}: {reason}")]
    Memory {
        /// The buffer being allocated (`table 3`, `dense optimizer state`, …).
        what: String,
        /// Why it could not be had: its size, and the system's error if one was given.
        reason: String,
    },
    /// The dataflow stopped on a worker; the message says why.
    #[error("dataflow error: {0}")]
    Dataflow(String),
    /// The model's compute device failed (a GPU worker's CUDA error).
    #[error("compute device error: {0}")]
    Device(String),
}

impl OperatorError {
    /// Shorthand for a configuration error naming `key`.
    pub fn config(key: impl Into<String>, reason: impl Into<String>) -> Self {
        OperatorError::Config(ConfigError::new(key, reason))
    }

    /// Shorthand for a [`OperatorError::Memory`] naming the buffer `what`.
    pub fn memory(what: impl Into<String>, reason: impl Into<String>) -> Self {
        OperatorError::Memory { what: what.into(), reason: reason.into() }
    }
}
