//! # tiderec-operators
//!
//! The reusable core of tiderec: columnar [`batch::Batch`]es, feature kernels,
//! sharded embedding storage, neural-network layers and models, optimizers,
//! metrics, and the timely-dataflow operators that train a model synchronously
//! across workers.
//!
//! Nothing here depends on Kafka, Parquet, Arrow or CUDA: a timely program can
//! take the parsers' output types, the kernels and the models without the rest
//! of tiderec.
//!
//! Invariants that hold across the crate:
//! * Sparse features are CSR bags; an absent value is an empty bag (a zero
//!   pooled vector), never a made-up id.
//! * Every parameter of a model lives in one flat buffer, so a gradient
//!   all-reduce or a checkpoint is one slice operation.
//! * Every embedding row has exactly one owner, given by [`routing::shard_of`].

#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod bad_record;
pub mod batch;
pub mod behavior;
pub mod collective;
pub mod error;
pub mod exchange;
pub mod features;
pub mod finite;
pub mod format;
pub mod freq;
mod huge;
pub mod metrics;
pub mod nn;
pub mod optim;
pub mod rng;
pub mod routing;
pub mod schedule;
pub mod shard;
pub mod snapshot;
pub mod spec;
pub mod store;
pub mod stream;
pub mod train;

pub use batch::{Batch, BatchError, BatchField, SparseField};
pub use error::{ConfigError, OperatorError};
