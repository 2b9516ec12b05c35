//! # tiderec-records
//!
//! The record and feature layer of tiderec: columnar [`Batch`]es, the record
//! formats and their [`BadRecord`](bad_record::BadRecord)s, the feature spec and
//! its parser, the SIMD feature kernels (hashing, bucketing, crosses, the
//! vectorized split, fused feature subgraphs), the vector extensions every
//! kernel may use ([`cpu`], capped by `TIDEREC_MAX_ISA`), behaviour sequences, the
//! counter-based random numbers, finiteness checks, evaluation metrics and the
//! error types every tiderec crate shares.
//!
//! It depends on no other tiderec crate and knows nothing of models, stores or
//! training: a timely program that parses and featurizes records takes this
//! crate alone.
//!
//! Invariants that hold across the crate:
//! * Sparse features are CSR bags; an absent value is an empty bag (a zero
//!   pooled vector), never a made-up id.
//! * A [`Batch`] that left a reader satisfies [`Batch::check`]; the trainer may
//!   rely on it without checking again.
//! * Every random number is a pure function of its seed and coordinates
//!   ([`rng`]), so a run is reproducible for a seed whatever the worker count.

#![deny(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod bad_record;
pub mod batch;
pub mod behavior;
pub mod cpu;
pub mod error;
pub mod features;
pub mod finite;
pub mod format;
pub mod metrics;
pub mod rng;
pub mod spec;
pub mod stream;

pub use batch::{Batch, BatchError, BatchField, BatchValue, SparseField};
pub use error::{ConfigError, DataflowError, OperatorError, RestoreError, ShapeError};
