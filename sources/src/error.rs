//! The one error type of this crate.
use thiserror::Error;
use tiderec_records::ConfigError;

/// Errors raised by readers and generators.
#[derive(Debug, Error)]
pub enum SourceError {
    /// A file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// An input file was truncated or rewritten while it was being read.
    #[error("input file {path} changed while being read: {reason}")]
    Changed {
        /// The file.
        path: String,
        /// What changed (it shrank, ended early or was modified).
        reason: String,
    },
    /// A malformed record under `--on-bad-record fail`.
    #[error("bad record at {0}")]
    BadRecord(tiderec_records::bad_record::BadRecord),
    /// The dead-letter sink failed to store a bad record.
    #[error("cannot write to the dead-letter sink: {source}")]
    DeadLetter {
        /// The sink's error.
        #[source]
        source: std::io::Error,
    },
    /// A configuration value is invalid; its `key` names it.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A Parquet file could not be read or written (not Parquet, corrupt, I/O).
    #[error("Parquet file {path}: {source}")]
    Parquet {
        /// The file.
        path: String,
        /// The Parquet library's error.
        #[source]
        source: parquet::errors::ParquetError,
    },
    /// Arrow rejected a column while a file was written or read.
    #[error("Parquet file {path}: {source}")]
    Arrow {
        /// The file.
        path: String,
        /// Arrow's error.
        #[source]
        source: arrow_schema::ArrowError,
    },
    /// A Parquet file or directory does not hold what tiderec needs (missing
    /// column, wrong type, no schema metadata, an id beyond its table, …).
    #[error("{path}: {reason}")]
    Schema {
        /// The file or dataset directory.
        path: String,
        /// What is missing or wrong, naming the column.
        reason: String,
    },
    /// A Parquet file's schema description (its `tiderec.schema` metadata) is refused.
    #[error("{path}: {source}")]
    Description {
        /// The file or dataset directory.
        path: String,
        /// What is wrong with the description.
        #[source]
        source: crate::parquet::schema::DescriptionError,
    },
    /// A Kafka broker could not be reached or refused an operation; names the brokers and topic.
    #[error("Kafka {brokers} topic `{topic}`: {reason}")]
    Kafka {
        /// The bootstrap brokers, `host:port[,host:port…]`.
        brokers: String,
        /// The topic.
        topic: String,
        /// The client's or broker's error.
        reason: String,
    },
}

impl SourceError {
    /// Shorthand for a [`SourceError::Config`] naming `key`.
    pub fn config(key: impl Into<String>, reason: impl Into<String>) -> Self {
        SourceError::Config(ConfigError::new(key, reason))
    }

    /// Shorthand for a [`SourceError::Schema`] naming `path`.
    pub fn schema(path: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        SourceError::Schema { path: path.to_string(), reason: reason.into() }
    }
}

/// Refuses a batch whose field counts differ from the reader's (`config` error
/// on the key `batch`): readers append into the caller's batch, which must
/// have the shape of the records they read.
pub(crate) fn check_batch_shape(
    out: &tiderec_records::Batch,
    num_dense: usize,
    num_sparse: usize,
    num_sequences: usize,
) -> Result<(), SourceError> {
    if out.num_dense != num_dense || out.sparse.len() != num_sparse || out.sequences.len() != num_sequences {
        return Err(SourceError::config(
            "batch",
            format!(
                "batch has {} dense / {} sparse / {} sequence fields, expected {num_dense} / {num_sparse} / \
                 {num_sequences}",
                out.num_dense,
                out.sparse.len(),
                out.sequences.len()
            ),
        ));
    }
    Ok(())
}
