//! # tiderec-sources
//!
//! Readers that turn raw datasets into [`tiderec_records::Batch`]es, and
//! synthetic generators with a known achievable AUC.
//!
//! * [`criteo`]: Criteo Kaggle / 1TB TSV files, split across workers by
//!   line-aligned byte ranges.
//! * [`avazu`]: Avazu CSV; [`elm`]: an Ele.me-shaped line generator.
//! * [`amazon`]: Amazon reviews in the DIEN sample format (behaviour histories).
//! * [`taobao`]: Taobao UserBehavior logs turned into DIEN samples by a
//!   differential-dataflow operator.
//! * [`synthetic`]: a seeded Criteo-shaped stream whose labels come from a
//!   hidden teacher model; [`synthetic_behavior`]: a seeded DIEN-shaped stream
//!   whose teacher depends on the order of the history.
//! * [`unlabeled`]: a labeled line format reading test files without their label column.
//! * [`parquet`]: featurized samples in Parquet files: the writer behind
//!   `tiderec convert` and the row-group reader behind `--data parquet:DIR`.
//! * [`shuffle`]: the order of a training reader's epochs after the first
//!   (blocks of each worker's byte ranges, permuted per epoch).
//! * [`request_body`]: the records of a JSON request body of `tiderec serve`,
//!   counted against a cap before anything is copied.

#![deny(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod amazon;
pub mod avazu;
pub mod criteo;
pub mod elm;
pub mod error;
pub mod json;
pub mod json_object;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod lines;
pub mod offset_reset;
pub mod parquet;
pub mod request_body;
pub mod shuffle;
pub mod synthetic;
pub mod synthetic_behavior;
pub mod taobao;
pub mod unlabeled;

pub use error::SourceError;
