//! `tiderec bench`: each benchmark in its own module, and the command that
//! runs them and prints or reports their results ([`command`]).
//!
//! [`dlrm`] times training on the real multi-worker path (`bench dlrm`,
//! `bench model`); [`gru`] the GRU cell, split against unsplit; [`features`]
//! the sequence-feature kernels against the unfused pipelines they replace;
//! [`replay`] Parquet batch replay against the raw Criteo TSV; [`mod@serve`]
//! the HTTP scorer under a concurrent load; [`kernels`] the GEMM kernels
//! against the FMA peak; [`cache`] the tiered store; [`exchange`] the DES
//! exchange; [`processes`] training across processes.

pub mod cache;
pub mod command;
pub mod dlrm;
pub mod exchange;
pub mod features;
pub mod gru;
pub mod kernels;
pub mod processes;
pub mod replay;
pub mod serve;
