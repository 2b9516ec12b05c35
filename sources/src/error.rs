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
    /// An input file was truncated or rewritten while it was being read.
    #[error("input file {path} changed while being read: {reason}")]
    Changed { path: String, reason: String },
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
    /// A Parquet file could not be read or written (not Parquet, corrupt, I/O).
    #[error("Parquet file {path}: {source}")]
    Parquet {
        path: String,
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// Arrow rejected a column while a file was written or read.
    #[error("Parquet file {path}: {source}")]
    Arrow {
        path: String,
        #[source]
        source: arrow_schema::ArrowError,
    },
    /// A Parquet file or directory does not hold what tiderec needs (missing
    /// column, wrong type, no schema metadata, an id beyond its table, …).
    #[error("{path}: {reason}")]
    Schema { path: String, reason: String },
    /// A Kafka broker could not be reached or refused an operation; names the brokers and topic.
    #[error("Kafka {brokers} topic `{topic}`: {reason}")]
    Kafka { brokers: String, topic: String, reason: String },
}

impl SourceError {
    /// Shorthand for a [`SourceError::Schema`] naming `path`.
    pub fn schema(path: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        SourceError::Schema { path: path.to_string(), reason: reason.into() }
    }
}
