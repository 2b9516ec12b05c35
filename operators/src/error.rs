//! The one error type of this crate.

use thiserror::Error;

/// Errors raised by operators, models and configuration checks in this crate.
#[derive(Debug, Error)]
pub enum OperatorError {
    /// A configuration value is out of range or inconsistent; `key` names it.
    #[error("invalid configuration `{key}`: {reason}")]
    Config { key: String, reason: String },
    /// A batch does not match the shape the model was built for.
    #[error("batch shape mismatch: {0}")]
    Shape(String),
    /// A checkpoint's state cannot be restored into this trainer; the message says why.
    #[error("cannot restore checkpoint: {0}")]
    Restore(String),
    /// A buffer's size overflows, or the system refused the memory; the message names the buffer.
    #[error("out of memory: {0}")]
    Memory(String),
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
        OperatorError::Config { key: key.into(), reason: reason.into() }
    }
}
