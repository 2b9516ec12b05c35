//! The one error type of this crate.
use thiserror::Error;

/// Errors raised by sinks.
#[derive(Debug, Error)]
pub enum SinkError {
    /// A file could not be created or written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file concerned.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file or directory could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file concerned.
        path: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint could not be encoded or is unusable.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// The checkpoint or file concerned.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A checkpoint was written by a run with another configuration.
    #[error("checkpoint {path} was written with a different configuration: {differences}")]
    Incompatible {
        /// The checkpoint.
        path: String,
        /// Every difference, `key: X in the checkpoint, Y now`.
        differences: String,
    },
}
