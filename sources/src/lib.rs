//! # tiderec-sources
//!
//! Readers that turn raw datasets into [`tiderec_operators::Batch`]es, and
//! synthetic generators with a known achievable AUC.
//!
//! * [`criteo`]: Criteo Kaggle / 1TB TSV files, split across workers by
//!   line-aligned byte ranges.
//! * [`synthetic`]: a seeded Criteo-shaped stream whose labels come from a
//!   hidden teacher model.
//! * [`parquet`]: featurized samples in Parquet files: the writer behind
//!   `tiderec convert` and the row-group reader behind `--data parquet:DIR`.

pub mod avazu;
pub mod criteo;
pub mod elm;
pub mod error;
pub mod lines;
pub mod parquet;
pub mod synthetic;

pub use error::SourceError;
