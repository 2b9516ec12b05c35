//! Featurized samples in Parquet: conversion target and batch-replay source.
//!
//! * [`schema`]: the column layout of a converted file and the JSON
//!   [`SchemaDescription`] kept in its key-value metadata ([`METADATA_KEY`]).
//! * [`writer`]: [`ParquetWriter`] streams [`Batch`](tiderec_records::Batch)es
//!   into zstd-compressed `part-NNNNN.parquet` files.
//! * [`dataset`]: [`ParquetDataset`] lists a directory's files, reads their
//!   footers once, checks the columns and enumerates the (file, row group)
//!   pairs; [`ParquetDataset::worker_segments`] splits their rows across
//!   workers per epoch (as the raw files were split, for converted line files).
//! * [`reader`]: [`ParquetReader`] decodes one worker's rows, reading
//!   only the columns the schema names, into `Batch`es.
//! * `decode`: the parquet crate's decoder behind a panic guard, which every
//!   read of a file's data goes through.
//! * [`scores`]: [`ScoreWriter`](scores::ScoreWriter) writes `tiderec predict`'s scores.
//! * [`json_row`]: rows given as JSON objects (`tiderec serve`'s records), appended by the
//!   reader's own row decoding.

pub mod dataset;
mod decode;
pub mod json_row;
pub mod reader;
pub mod schema;
pub mod scores;
pub mod writer;

pub use dataset::{list_parquet_files, ParquetDataset, RowGroupRef, Segment};
pub use reader::ParquetReader;
pub use schema::{DescriptionError, SchemaDescription, SparseColumn, SparseKind, METADATA_KEY};
pub use writer::{ParquetWriter, WriteSummary, WriterOptions, DEFAULT_ROW_GROUP_ROWS};
