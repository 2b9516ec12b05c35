//! # tiderec-operators
//!
//! The training layer of tiderec: sharded embedding storage (fixed, dynamic and
//! tiered stores), frequency sketches, the exchange strategies between workers,
//! snapshots and collectives, and the synchronous [`train::Trainer`] with the
//! timely-dataflow operators that drive it.
//!
//! It builds on the record layer (`tiderec-records`: batches, formats, feature
//! kernels, metrics) and the model layer (`tiderec-nn`: layers, models, GEMM
//! kernels, optimizers), and re-exports both under their module names
//! (`tiderec_operators::batch`, `tiderec_operators::nn`, …) so that a timely
//! program needs this one dependency. Nothing here depends on Kafka, Parquet,
//! Arrow or CUDA.
//!
//! Invariants that hold across the crate:
//! * Every parameter of a model lives in one flat buffer, so a gradient
//!   all-reduce or a checkpoint is one slice operation.
//! * Every embedding row has exactly one owner, given by [`routing::shard_of`].
//! * `W` workers train the model one worker trains on the same global batches,
//!   up to the reassociation of float sums.

#![deny(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod collective;
pub mod exchange;
pub mod freq;
mod huge;
pub mod routing;
pub mod shard;
pub mod snapshot;
pub mod store;
pub mod train;

pub use tiderec_nn as nn;
pub use tiderec_nn::{optim, schedule};
pub use tiderec_records::{
    bad_record, batch, behavior, cpu, error, features, finite, format, metrics, rng, spec, stream,
};

pub use batch::{Batch, BatchError, BatchField, BatchValue, SparseField};
pub use error::{ConfigError, DataflowError, OperatorError, RestoreError, ShapeError};
