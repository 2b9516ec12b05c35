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
        source: DescriptionError,
    },
    /// A partition no longer holds the records a run stands at: its offset is outside
    /// the broker's records, or the record before it is another one (the topic was
    /// re-created, the broker lost its storage). Names everything needed to decide.
    #[error(
        "Kafka {brokers} topic `{topic}` partition {partition}: {reason} (the run stands at offset {offset}; \
         the broker holds offsets {low}..{end}); nothing was trained past it. \
         `--on-offset-reset earliest` or `latest` accepts the reset"
    )]
    OffsetReset {
        /// The bootstrap brokers.
        brokers: String,
        /// The topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The next offset the run would read (from the checkpoint, or reached by this run).
        offset: i64,
        /// The partition's oldest offset (low watermark).
        low: i64,
        /// One past the partition's last offset.
        end: i64,
        /// What does not match.
        reason: String,
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

/// Why a [`SchemaDescription`](crate::parquet::SchemaDescription) is refused by [`SchemaDescription::validate`](crate::parquet::SchemaDescription::validate) or
/// [`SchemaDescription::from_json`](crate::parquet::SchemaDescription::from_json).
#[derive(Debug, thiserror::Error)]
pub enum DescriptionError {
    /// The metadata is not JSON of a description (the parser's error names the line and column).
    #[error("bad `{key}` JSON: {source}")]
    Json {
        /// The metadata key that holds the description.
        key: &'static str,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },
    /// Written by a newer (or unknown) description format.
    #[error("schema version {version} is not supported (this build reads {supported})")]
    Version {
        /// The version in the description.
        version: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// `num_dense` disagrees with the number of dense column names.
    #[error("num_dense is {num_dense} but {named} dense columns are named")]
    DenseCount {
        /// The `num_dense` field.
        num_dense: usize,
        /// Entries of `dense`.
        named: usize,
    },
    /// Neither a dense nor a sparse column.
    #[error("the schema has no feature column")]
    NoFeatures,
    /// Two columns (label, dense, sparse, sequence or `_line_start`) share a name.
    #[error("column `{column}` appears twice")]
    DuplicateColumn {
        /// The name used twice.
        column: String,
    },
    /// A sparse column's table has no rows.
    #[error("sparse column `{column}` has table_size 0")]
    EmptyTable {
        /// The sparse column.
        column: String,
    },
    /// A line source's input sizes (`lines.file_bytes`) add up past [`MAX_INPUT_BYTES`](crate::parquet::schema::MAX_INPUT_BYTES).
    #[error(
        "lines.file_bytes: the {files} input file(s) add up to {total} bytes; an input has at most {max} (a \
         damaged description)"
    )]
    InputBytes {
        /// Their sum, as text (it may overflow 64 bits).
        total: String,
        /// Number of input files.
        files: usize,
        /// The most bytes allowed.
        max: u64,
    },
    /// A sequence column names a sparse field that does not exist.
    #[error(
        "sequence column `{column}` names sparse field {table} as its table and {target} as its target, but there are {fields}"
    )]
    SequenceField {
        /// The sequence column.
        column: String,
        /// Its `table` field index.
        table: usize,
        /// Its `target` field index.
        target: usize,
        /// Sparse fields in the description.
        fields: usize,
    },
}
