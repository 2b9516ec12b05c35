//! Worker 0's last part of writing a checkpoint, once every shard file is
//! durable: `dense.safetensors`, `manifest.json`, the rename to
//! `ckpt-<step>`, the `best` link when the manifest records this step as the
//! best evaluated one, and pruning to `--keep-checkpoints`.
//!
//! Invariant: once the rename made `ckpt-<step>` durable, the checkpoint counts
//! as written; what fails after it (the `best` link, removing the directory it
//! replaced, pruning) is a warning on stderr, never the checkpoint's error.
//!
//! Everything it needs is owned ([`Commit`]), so it runs on a background
//! thread as well as on the worker's own.

use super::{CheckpointOptions, Position, ShardWritten};
use std::collections::BTreeMap;
use std::path::PathBuf;
use tiderec_operators::optim::DenseOptimizerState;
use tiderec_sinks::checkpoint::{self, write, DataPosition, Manifest};

/// What identifies a run in its manifests.
#[derive(Clone, Debug)]
pub(super) struct RunIdentity {
    /// The trainer configuration ([`tiderec_sinks::checkpoint::manifest::recorded_config`]).
    pub config: serde_json::Value,
    pub seed: u64,
    pub batch_size: u64,
}

/// Everything worker 0 needs to finish the checkpoint of `position.step`.
pub(super) struct Commit {
    pub options: CheckpointOptions,
    pub identity: RunIdentity,
    /// The temporary directory holding every shard file.
    pub tmp: PathBuf,
    /// The dense parameters at the step (the same on every worker).
    pub params: Vec<f32>,
    /// Every worker's shard, in worker order.
    pub shards: Vec<ShardWritten>,
    pub position: Position,
    /// `Some` for a delta.
    pub delta: Option<checkpoint::DeltaLink>,
    /// The shards list only updated rows (see [`checkpoint::Manifest::updated_only`]).
    pub updated_only: bool,
}

impl Commit {
    /// Writes the dense file and the manifest, renames, prunes; returns the
    /// checkpoint's path and its shard files' bytes. On error the temporary directory is removed.
    pub(super) fn run(self) -> Result<(PathBuf, u64), String> {
        let tmp = self.tmp.clone();
        let outcome = self.write();
        if outcome.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        outcome
    }

    fn write(self) -> Result<(PathBuf, u64), String> {
        let Commit { options, identity, tmp, params, shards, position, delta, updated_only } = self;
        let workers = shards.len();
        let mut files = BTreeMap::new();
        let mut slices = Vec::with_capacity(workers);
        for s in shards {
            files.insert(s.name, s.entry);
            slices.push(s.dense.ok_or("a worker sent no dense-optimizer slice")?);
        }
        let refs: Vec<&DenseOptimizerState> = slices.iter().collect();
        let dense = DenseOptimizerState::concat(&refs, params.len()).map_err(|e| e.to_string())?;
        let (name, entry) = write::write_dense(&tmp, position.step, &params, &dense).map_err(|e| e.to_string())?;
        files.insert(name, entry);
        let manifest = Manifest {
            format_version: checkpoint::FORMAT_VERSION,
            step: position.step,
            epoch: position.epoch,
            steps_in_epoch: position.steps_in_epoch,
            samples: position.samples,
            seed: identity.seed,
            batch_size: identity.batch_size,
            workers,
            config_hash: checkpoint::config_hash(&identity.config),
            config: identity.config,
            pipeline: options.pipeline.as_ref().map(|p| p.to_value()),
            data_position: DataPosition {
                epoch: position.epoch,
                global_steps_in_epoch: position.steps_in_epoch,
                workers: Some(workers),
                kafka_offsets: position.kafka_offsets,
                kafka_last_records: position.kafka_last_records,
                inputs: options.inputs.clone(),
                shuffle: options.shuffle.clone(),
                dead_letter_bytes: position.dead_letter_bytes,
            },
            progress: position.progress,
            files,
            delta,
            updated_only,
        };
        // The rows' bytes: what a chain adds to reading its whole checkpoint (the dense
        // file is whole in every link).
        let bytes = manifest.files.iter().filter(|(name, _)| name.starts_with("shard-")).map(|(_, f)| f.bytes).sum();
        let best = manifest.progress.best_step == Some(manifest.step);
        let (path, mut warnings) = write::commit(&options.dir, &tmp, &manifest).map_err(|e| e.to_string())?;
        // From here the checkpoint is durable under its name: what fails now is a warning,
        // so the run goes on and counts the checkpoint as written.
        if best {
            if let Err(e) = write::mark_best(&options.dir, manifest.step) {
                warnings.push(format!(
                    "{} is the best evaluated checkpoint, but {} could not be pointed at it: {e}",
                    path.display(),
                    options.dir.join(tiderec_sinks::checkpoint::layout::BEST_LINK).display()
                ));
            }
        }
        warnings.extend(write::prune(&options.dir, position.step, options.keep));
        for warning in warnings {
            eprintln!("warning: {warning}");
        }
        Ok((path, bytes))
    }
}
