//! The one error type of this crate.
use thiserror::Error;

/// Errors raised by readers and generators.
#[derive(Debug, Error)]
pub enum SourceError {
    /// A file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A malformed record under `--on-bad-record fail`.
    #[error("bad record at {0}")]
    BadRecord(tiderec_operators::bad_record::BadRecord),
    /// The dead-letter sink failed to store a bad record.
    #[error("cannot write to the dead-letter sink: {source}")]
    DeadLetter {
        /// The sink's error.
        #[source]
        source: std::io::Error,
    },
    /// A configuration value is invalid; `key` names it.
    #[error("invalid configuration `{key}`: {reason}")]
    Config { key: String, reason: String },
}
