//! # tiderec
//!
//! Configuration, dataflow assembly and the command-line interface of
//! tiderec. The binary `tiderec` is a thin layer over [`run::train`],
//! [`convert::convert`] and [`mod@bench`]; tests and other programs call them directly.

#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod applicable;
pub mod bench;
pub mod budget;
pub mod checkpointing;
pub mod cluster;
pub mod config;
pub mod convert;
pub mod data;
pub mod device;
pub mod error;
pub mod evaluation;
pub mod exchange_plan;
pub mod feature_pipeline;
pub mod hygiene;
pub mod memory;
pub mod online;
pub mod plot;
pub mod predict;
pub mod progress;
pub mod run;
pub mod serve;
pub mod serving;
pub mod settings;
pub mod stop;

pub use config::TrainSettings;
pub use error::PipelineError;
