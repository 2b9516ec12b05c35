//! Runnable examples of using tiderec as a library; the programs are in the
//! `examples/` directory, and `tests/examples_run.rs` runs each one.
//!
//! * `own_dataflow`: reads Criteo lines with tiderec's reader, trains a DLRM
//!   with the synchronous trainer and evaluates it, in a timely program of your own.
//! * `featurize_stream`: raw lines through the `featurize` operator and a
//!   feature spec, malformed lines out as dead letters.
//! * `custom_model`: a model of your own (a field-weighted FM) through the
//!   `Model` trait, trained by `Trainer::with_model`.
//! * `online_training`: `Trainer::train_online` over an endless stream, with a
//!   callback that watches the prequential AUC and stops the run.
