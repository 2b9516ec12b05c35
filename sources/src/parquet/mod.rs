//! Featurized samples in Parquet: conversion target and batch-replay source.
//!
//! * [`schema`]: the column layout of a converted file and the JSON
//!   [`SchemaDescription`] kept in its key-value metadata ([`METADATA_KEY`]).
//! * [`writer`]: [`ParquetWriter`] streams [`Batch`](tiderec_operators::Batch)es
//!   into zstd-compressed `part-NNNNN.parquet` files.
//! * [`dataset`]: [`ParquetDataset`] lists a directory's files, reads their
//!   footers once, checks the columns and enumerates the (file, row group)
//!   pairs; [`assign_row_groups`] splits them across workers per epoch.
//! * [`reader`]: [`ParquetReader`] decodes one worker's row groups, reading
//!   only the columns the schema names, into `Batch`es.

pub mod dataset;
pub mod reader;
pub mod schema;
pub mod writer;

pub use dataset::{assign_row_groups, list_parquet_files, ParquetDataset, RowGroupRef};
pub use reader::ParquetReader;
pub use schema::{SchemaDescription, SparseColumn, SparseKind, METADATA_KEY};
pub use writer::{ParquetWriter, WriteSummary, WriterOptions, DEFAULT_ROW_GROUP_ROWS};
