//! Checkpoints: the whole training state at one step, in a directory that is
//! either complete or absent.
//!
//! Layout (see [`layout`]): `DIR/ckpt-<step>/` holds `dense.safetensors`
//! (dense parameters and dense-optimizer state), one `shard-<k>.safetensors`
//! per worker of the writing run (the embedding rows worker `k` owns, with
//! their global ids and optimizer slots) and `manifest.json` ([`Manifest`]:
//! step, epoch, data position, config hash, worker count, a checksum of every
//! file).
//!
//! Guarantees:
//! * Durable before visible: every file is fsynced, the directory is written
//!   under a temporary name, fsynced, renamed, and the parent fsynced
//!   ([`mod@write`]); old checkpoints are pruned only after that.
//! * Verified before use: [`find_latest`] returns the newest checkpoint whose
//!   manifest parses and whose files match their sizes and checksums, and
//!   reports every newer one it skipped and why.
//! * Any worker count: the parts hold global row ids, so a checkpoint of `W`
//!   workers restores into any other number (`Trainer::restore` re-shards).
//! * Deltas: a checkpoint may hold only what changed since the previous one
//!   of its run ([`Manifest::delta`]); it is read with its chain back to a whole
//!   checkpoint ([`load`](mod@load)), and pruning keeps every link a kept
//!   checkpoint needs ([`write::prune`]). Fixed-store checkpoints list only the
//!   rows some step updated ([`Manifest::updated_only`]).
//!
//! Errors are [`SinkError`](crate::SinkError)s naming the path; nothing here panics on bad files.

pub mod export;
pub mod inputs;
pub mod layout;
pub mod load;
pub mod manifest;
mod tensors;
pub mod write;

pub use inputs::{input_differences, InputFile};
pub use load::{find_latest, Checkpoint, LoadError, Search, Skipped};
pub use manifest::{
    config_differences, config_hash, value_differences, DataPosition, DeltaLink, FileEntry, Manifest, TrainingProgress,
    FORMAT_VERSION,
};
pub use tensors::TensorError;

#[cfg(test)]
mod tests;
