//! # tiderec
//!
//! Configuration, dataflow assembly and the runs of tiderec: [`run::train`],
//! [`convert::convert`], [`predict::eval`], [`predict::predict`] and the
//! online trainer ([`online::online`]). The binary `tiderec` is a thin layer
//! over them; tests and other programs call them directly.
//!
//! # Cargo features
//!
//! * `cli` (default): what the `tiderec` binary needs (it requires this
//!   feature): `serve`, `prometheus`, and `plotters` for the binary's own modules
//!   (benchmarks, `tiderec plot`), which are not part of this library.
//! * `serve` (in `cli`): the HTTP scorer, module `serve` (`tiny_http`).
//! * `prometheus` (in `cli` and `kafka`): the Prometheus endpoint of `train`
//!   and `online` (`--metrics-addr`, module [`live_metrics`];
//!   `prometheus-client`, `tiny_http`). Without it `--metrics-addr` is a
//!   configuration error.
//! * `kafka` (default): the online trainer and `tiderec produce` over
//!   librdkafka (built from source), with `prometheus`. Without it
//!   [`online::online`] returns a configuration error.
//!
//! With `default-features = false` the library trains, converts, evaluates,
//! predicts and exports with none of those dependencies.

#![deny(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

pub mod applicable;
pub mod budget;
pub mod checkpointing;
pub mod cluster;
pub mod config;
pub mod convert;
pub mod data;
pub mod device;
pub mod dir_lock;
pub mod error;
pub mod evaluation;
pub mod exchange_plan;
pub mod feature_pipeline;
pub mod hygiene;
pub mod kernels;
pub mod live_metrics;
pub mod memory;
pub mod metrics_log;
pub mod online;
pub mod paths;
pub mod predict;
pub mod progress;
pub mod read_ahead;
pub mod run;
pub mod run_files;
#[cfg(feature = "serve")]
pub mod serve;
pub mod serving;
pub mod settings;
pub mod spec_fit;
pub mod stop;
pub mod tensorboard;

pub use config::TrainSettings;
pub use error::PipelineError;
