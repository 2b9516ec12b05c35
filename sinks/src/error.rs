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
    /// A configuration value is invalid; `key` names it.
    #[error("invalid configuration `{key}`: {reason}")]
    Config {
        /// The offending key.
        key: String,
        /// Why it is invalid.
        reason: String,
    },
}
