//! # tiderec-sinks
//!
//! Outputs of tiderec other than the model itself.
//!
//! * [`checkpoint`]: checkpoint directories (safetensors + manifest), written durably, verified on load.
//! * [`dead_letters`]: files of malformed input records, one per line.
//! * [`metrics`]: the run summary written by `--metrics-json`.
//! * [`temp`]: temporary names for files written whole, then renamed into place.
//! * [`error`]: the crate's error type, [`SinkError`].

#![deny(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod checkpoint;
pub mod dead_letters;
pub mod error;
pub mod metrics;
pub mod temp;

pub use error::SinkError;
