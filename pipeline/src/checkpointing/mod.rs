//! Checkpoints of a training run: preparing the directory, writing a
//! checkpoint with all workers together, and resuming from the newest valid one.
//!
//! **Writing** is collective: every worker calls [`Checkpointer::write`]
//! after the same training step, and three rounds of a
//! [`Collective`](tiderec_operators::collective::Collective) channel order the work:
//! 1. worker 0 creates `DIR/.tmp-ckpt-<step>-<pid>`, decides whether the
//!    checkpoint is whole or a delta, and sends both to every worker (or the
//!    error); every worker then copies its state out of the trainer (the
//!    snapshot: whole, or its rows changed since the previous checkpoint) and
//!    hands it to a background thread that writes its `shard-<k>.safetensors`
//!    there (in one pass, hashed, fsynced);
//! 2. once every worker's thread is done, every worker sends worker 0 the
//!    file's size and checksum and its dense-optimizer slice (or its error:
//!    a failed write, or a snapshot that failed, for which no thread started);
//! 3. worker 0, now knowing every shard file is on disk, writes
//!    `dense.safetensors` and `manifest.json`, renames the directory to
//!    `ckpt-<step>`, fsyncs `DIR` and prunes to `--keep-checkpoints` (on a
//!    background thread too), and then sends the outcome to every worker.
//!
//! Training goes on while the threads write: [`Checkpointer::poll`], called
//! after every step, asks all workers in one round whether the current stage
//! is done everywhere and only then takes the next round, so no worker ever
//! waits for a disk. With `--checkpoint-sync` (`CheckpointOptions::sync`),
//! `write` instead returns only once the checkpoint is durable; the files are
//! the same byte for byte.
//!
//! Invariants:
//! * **Consistent cut.** The snapshot is taken synchronously between two
//!   steps, and no update of the next step can reach a worker before it sends
//!   its gradients; the [`Position`] (step, data position, Kafka offsets) is
//!   of that same step. What the threads write is that copy, never live state.
//! * **At most one checkpoint in flight.** `write` first waits for the
//!   previous one to be durable.
//! * **Deltas follow a durable checkpoint of this run.** A delta's parent is
//!   the previous checkpoint this run wrote (durable before the delta begins),
//!   and every worker's changes count from that checkpoint's snapshot. The first
//!   checkpoint of a run, the first after any restore, the one after
//!   `--checkpoint-deltas` deltas, the one after deltas whose rows (shard
//!   files) pass `--checkpoint-delta-share` of the last whole checkpoint's, and
//!   one that rewrites the step of the chain's newest link (an improving
//!   evaluation after the step's checkpoint) are whole: a delta's parent is
//!   always of an earlier step, never the directory the delta replaces.
//! * **Durable before announced.** [`Checkpointer::take_durable`] hands out a
//!   checkpoint's position only after round 3 reported the rename; the online
//!   trainer commits Kafka offsets to the consumer group only then.
//! * **Nothing lost at exit.** [`Checkpointer::finish`] waits for the write in
//!   flight; runs call it at their end and after a SIGINT/SIGTERM stop.
//! * **Errors surface.** A thread's error (or panic), and a snapshot's, comes
//!   back from the next `poll`, `write` or `finish` on every worker in the
//!   same round, so all of them stop together with the same message naming
//!   the step, the worker and (for a file) the path; worker 0 removes a failed
//!   checkpoint's temporary directory once no worker writes into it, and the
//!   checkpoints already written are left as they are; nothing waits forever.
//!
//! In a multi-process run each process writes its own workers' shards into
//! `DIR`, so `DIR` must be the same directory for every process (one
//! machine, or a file system they share); process 0 writes the manifest only
//! after every worker has reported its shard durable.
//!
//! **One run per directory.** Before anything else, every process of a run
//! locks its own lock file in `DIR` for the whole run ([`lock_dir`], see
//! [`crate::dir_lock`]): a second run on `DIR` is refused at start, naming
//! the run that holds it, instead of pruning the first one's temporary
//! directory and replacing its checkpoints.
//!
//! **Resuming**: each process reads the newest valid checkpoint once
//! ([`load_for_resume`], skipping damaged ones with a warning; a newer one it
//! cannot judge, of a newer format version or unreadable for another reason
//! than damage, is an error naming it, since the run's first checkpoint would
//! prune it; a checkpoint left as `.old-ckpt-<step>-<pid>` by an interrupted
//! replacement is first renamed back to `ckpt-<step>`) and every
//! worker restores its own rows and dense slice from it
//! ([`Checkpointer::restore`]); the workers then agree, in one round, that
//! all of them restored the same step.

mod commit;
mod job;
mod writer;

pub use writer::Checkpointer;

use crate::dir_lock::DirLock;
use crate::error::CheckpointAction;
use crate::feature_pipeline::FeaturePipeline;
use crate::PipelineError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tiderec_operators::optim::DenseOptimizerState;
use tiderec_operators::train::TrainerConfig;
use tiderec_sinks::checkpoint::layout::list_checkpoints;
use tiderec_sinks::checkpoint::{self, Checkpoint, TrainingProgress};

/// Where and how often to write checkpoints.
#[derive(Clone, Debug)]
pub struct CheckpointOptions {
    /// The directory holding `ckpt-<step>` directories.
    pub dir: PathBuf,
    /// Write one every this many global steps (besides the end of every epoch and of the run).
    pub every: Option<u64>,
    /// Checkpoints kept (with every checkpoint their chains need).
    pub keep: usize,
    /// Deltas at most between two whole checkpoints (0: every checkpoint whole).
    pub deltas: u64,
    /// A whole checkpoint once the deltas' shard files since the last one pass this share of its shard files' bytes.
    pub delta_share: f64,
    /// Write every checkpoint before training goes on (`--checkpoint-sync`);
    /// otherwise files are written in the background.
    pub sync: bool,
    /// The run's feature pipeline, written into every manifest.
    pub pipeline: Option<crate::feature_pipeline::FeaturePipeline>,
    /// The `--data` files the run reads, written into every manifest's data position.
    pub inputs: Vec<tiderec_sinks::checkpoint::InputFile>,
    /// How the epochs after the first read them (see [`DataCheck::shuffle`]).
    pub shuffle: Option<String>,
}

/// Where training stands, as recorded in a manifest.
#[derive(Clone, Debug, Default)]
pub struct Position {
    /// Global training steps taken.
    pub step: u64,
    /// Epochs completed.
    pub epoch: u64,
    /// Global steps taken in the current epoch.
    pub steps_in_epoch: u64,
    /// Training samples seen.
    pub samples: u64,
    /// Running statistics.
    pub progress: TrainingProgress,
    /// `topic/partition` → next offset of a Kafka source (empty for files).
    pub kafka_offsets: std::collections::BTreeMap<String, i64>,
    /// `topic/partition` → fingerprint of the record before the next offset (hex).
    pub kafka_last_records: std::collections::BTreeMap<String, String>,
    /// Dead-letter file → its durable length at this position (a Kafka source).
    pub dead_letter_bytes: std::collections::BTreeMap<String, u64>,
}

/// What a worker reports after writing its shard file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShardWritten {
    /// File name in the checkpoint.
    pub name: String,
    /// Its size and checksum.
    pub entry: checkpoint::FileEntry,
    /// The worker's dense-optimizer slice (sent to worker 0 only).
    pub dense: Option<DenseOptimizerState>,
}

/// The messages of the checkpoint protocol (see the module docs).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Note {
    /// Whether a worker's part of the current stage is done (polls while training goes on).
    Ready(bool),
    /// Round 1, worker 0's temporary directory and, for a delta, its place in the chain.
    Begin(Result<(PathBuf, Option<checkpoint::DeltaLink>), String>),
    /// Round 2, a worker's shard file.
    Written(Result<ShardWritten, String>),
    /// Round 3, worker 0's outcome: the checkpoint's path and its shard files' bytes.
    Committed(Result<(PathBuf, u64), String>),
    /// After restoring: the step restored (`None`: started fresh).
    Restored(Result<Option<u64>, String>),
}

/// Locks the checkpoint directory `dir` for process `process` of `processes` running
/// `command` (`tiderec train`, `tiderec online`), creating it if missing. Held until the
/// returned lock is dropped; another run's lock is [`LockError::Held`](crate::dir_lock::LockError::Held).
pub fn lock_dir(dir: &Path, process: usize, processes: usize, command: &str) -> Result<DirLock, PipelineError> {
    create_dir(dir)?;
    let holder = match processes {
        1 => command.to_string(),
        n => format!("{command} process {process} of {n}"),
    };
    Ok(DirLock::acquire_for_process(dir, process, processes, &holder)?)
}

/// Creates the checkpoint directory `dir` if missing.
fn create_dir(dir: &Path) -> Result<(), PipelineError> {
    std::fs::create_dir_all(dir)
        .map_err(|e| PipelineError::config("checkpoint_dir", format!("cannot create {}: {e}", dir.display())))
}

/// Makes sure `dir` exists and is writable before any work starts. A fresh
/// run (no `--resume`) refuses a directory that already holds checkpoints,
/// whose newer steps would shadow its own.
pub fn prepare_dir(dir: &Path, resume: bool) -> Result<(), PipelineError> {
    let key = "checkpoint_dir";
    create_dir(dir)?;
    let probe = dir.join(format!(".tmp-ckpt-probe-{}", std::process::id()));
    std::fs::write(&probe, b"")
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|e| PipelineError::config(key, format!("cannot write in {}: {e}", dir.display())))?;
    if !resume {
        let existing = list_checkpoints(dir)?;
        if let Some((_, newest)) = existing.last() {
            return Err(PipelineError::config(
                key,
                format!(
                    "{} already holds {} checkpoint(s) (newest {}): pass --resume to continue from them, or use \
                     another directory",
                    dir.display(),
                    existing.len(),
                    newest.display()
                ),
            ));
        }
    }
    Ok(())
}

/// The newest valid checkpoint in `dir` for a run with `config`, `seed`, `batch_size` and
/// feature `pipeline`: damaged ones are skipped with a warning on stderr; none at all is a
/// warning too (the run starts fresh); one written with another configuration or another
/// pipeline is an error naming every difference; one that records no pipeline (an older
/// checkpoint) is resumed with a warning that the data could not be checked.
pub fn load_for_resume(
    dir: &Path,
    config: &TrainerConfig,
    batch_size: u64,
    pipeline: &FeaturePipeline,
    data: &DataCheck,
) -> Result<Option<Checkpoint>, PipelineError> {
    // A replacement that a crash interrupted left its checkpoint under `.old-ckpt-…`.
    for note in checkpoint::write::restore_replaced(dir) {
        eprintln!("warning: {note}");
    }
    let search = checkpoint::find_latest(dir)?;
    // The run's first checkpoint prunes every later step: refuse rather than remove one
    // that may be valid (a newer build's, or unreadable for now).
    let unjudged: Vec<&checkpoint::Skipped> = search.skipped.iter().filter(|s| !s.reason.is_damage()).collect();
    if let Some(first) = unjudged.first() {
        let list: Vec<String> = unjudged.iter().map(|s| format!("{} ({})", s.path.display(), s.reason)).collect();
        return Err(PipelineError::checkpoint(
            CheckpointAction::Restore,
            Some(first.path.clone()),
            format!(
                "--resume would go back past {} newer checkpoint(s) that this build cannot judge, and the run's \
                 first checkpoint would remove them: {}; resume with the build that wrote them, fix what keeps \
                 them from being read, or move them out of {}",
                unjudged.len(),
                list.join("; "),
                dir.display()
            ),
        ));
    }
    for s in &search.skipped {
        eprintln!("warning: skipping checkpoint {}: {}", s.path.display(), s.reason);
    }
    let Some(found) = search.found else {
        eprintln!("warning: --resume: no valid checkpoint in {}; starting from scratch", dir.display());
        return Ok(None);
    };
    let mut found = found;
    upgrade_model_kind(&mut found.manifest.config, &mut found.manifest.config_hash);
    found.manifest.check_compatible(
        &found.path,
        &tiderec_sinks::checkpoint::manifest::recorded_config(config),
        config.seed,
        batch_size,
    )?;
    match FeaturePipeline::from_manifest(found.manifest.pipeline.as_ref(), &found.path)? {
        Some(recorded) => {
            let differences = recorded.differences(pipeline, "run");
            if !differences.is_empty() {
                return Err(tiderec_sinks::SinkError::Incompatible {
                    path: found.path.display().to_string(),
                    differences: differences.join("; "),
                }
                .into());
            }
        }
        None => eprintln!(
            "warning: --resume: {} records no feature pipeline (an older checkpoint); the data's format, spec \
             and hashing cannot be checked against it",
            found.path.display()
        ),
    }
    check_inputs(&mut found, data)?;
    Ok(Some(found))
}

/// What a resume checks of the data: the run's `--data` files, and whether other
/// data is allowed (`--new-data`).
#[derive(Clone, Debug, Default)]
pub struct DataCheck {
    /// The files the run reads (empty: generated data or Kafka, nothing to compare).
    pub inputs: Vec<tiderec_sinks::checkpoint::InputFile>,
    /// Keep the model, start the data over.
    pub new_data: bool,
    /// How the epochs after the first read the files
    /// ([`crate::settings::DataSettings::epoch_order`]; `None` without files).
    pub shuffle: Option<String>,
    /// The run's workers in all processes (`--workers` × `--processes`).
    pub workers: usize,
    /// Each worker reads its own part of the data by position (files, Parquet), so a
    /// position inside an epoch is one only the writer's worker count can continue;
    /// indexed samples (generated, derived up front) make the same global batches for
    /// every count.
    pub split_by_workers: bool,
}

/// Refuses a resume on other files than the checkpoint's (see
/// [`tiderec_sinks::checkpoint::inputs`]), or with `--new-data` moves its data
/// position back to the start of the data.
fn check_inputs(found: &mut Checkpoint, data: &DataCheck) -> Result<(), PipelineError> {
    let position = &mut found.manifest.data_position;
    if data.new_data {
        eprintln!(
            "--new-data: keeping the model of {} (step {}); reading the data from its start",
            found.path.display(),
            found.manifest.step
        );
        (position.epoch, position.global_steps_in_epoch) = (0, 0);
        return Ok(());
    }
    if position.inputs.is_empty() {
        if !data.inputs.is_empty() && found.manifest.step > 0 {
            eprintln!(
                "warning: --resume: {} records no data files (an older checkpoint); that the data is the same \
                 cannot be checked",
                found.path.display()
            );
        }
        return check_worker_count(found, data);
    }
    let differences = tiderec_sinks::checkpoint::input_differences(&position.inputs, &data.inputs);
    if !differences.is_empty() {
        return Err(PipelineError::OtherData {
            checkpoint: found.path.display().to_string(),
            epoch: position.epoch,
            steps_in_epoch: position.global_steps_in_epoch,
            differences,
        });
    }
    check_worker_count(found, data)?;
    check_epoch_order(found, data)
}

/// Refuses a resume inside an epoch of data split between the workers by position
/// ([`DataCheck::split_by_workers`]) with another worker count than the checkpoint's
/// run: each worker would skip the steps in its own part of the data, not in the parts
/// the writer's workers read, so records would be left out and others trained twice.
/// At an epoch boundary any count reads the epoch whole.
fn check_worker_count(found: &Checkpoint, data: &DataCheck) -> Result<(), PipelineError> {
    let position = &found.manifest.data_position;
    let then = found.manifest.data_workers();
    if !data.split_by_workers || position.global_steps_in_epoch == 0 || then == data.workers {
        return Ok(());
    }
    Err(PipelineError::config(
        "workers",
        format!(
            "{} stands {} steps into epoch {}, which {then} worker(s) in all read, each its own part of the data; \
             {} worker(s) would skip other records than they read, leaving some out and training others twice: \
             resume with {then} worker(s) in all (--workers × --processes), or with --new-data to keep the model \
             and read the data from its start",
            found.path.display(),
            position.global_steps_in_epoch,
            position.epoch,
            data.workers
        ),
    ))
}

/// Refuses a resume inside an epoch after the first that would read the rest of the epoch
/// in another order than the checkpoint's run (another `--no-shuffle` or
/// `--shuffle-block-bytes`): the resumed run would see other batches than the interrupted
/// one.
fn check_epoch_order(found: &Checkpoint, data: &DataCheck) -> Result<(), PipelineError> {
    let position = &found.manifest.data_position;
    let (Some(then), Some(now)) = (&position.shuffle, &data.shuffle) else { return Ok(()) };
    if position.epoch == 0 || then == now {
        return Ok(());
    }
    Err(PipelineError::config(
        "no_shuffle",
        format!(
            "{} stands in epoch {}, which its run read {then}; this run would read the rest of it {now}: \
             resume with the checkpoint's --no-shuffle and --shuffle-block-bytes (or --new-data to start the data over)",
            found.path.display(),
            position.epoch
        ),
    ))
}

/// Checkpoints written before each model of the FM family was recorded under
/// its own kind say `"kind": "fm"` for LR, DeepFM and Wide & Deep too: their
/// kind is rewritten to today's (the shape decides it), and the hash with it
/// when it was the hash of the old form, so they still resume.
fn upgrade_model_kind(config: &mut serde_json::Value, hash: &mut String) {
    let Some(model) = config.get("model") else { return };
    if model.get("kind").and_then(|k| k.as_str()) != Some("fm") {
        return;
    }
    let Ok(parsed) = serde_json::from_value::<tiderec_operators::nn::ModelConfig>(model.clone()) else { return };
    if parsed.name() == "fm" {
        return;
    }
    let hashed = *hash == tiderec_sinks::checkpoint::manifest::config_hash(config);
    config["model"]["kind"] = parsed.name().into();
    if hashed {
        *hash = tiderec_sinks::checkpoint::manifest::config_hash(config);
    }
}

#[cfg(test)]
mod tests {
    use super::upgrade_model_kind;
    use tiderec_sinks::checkpoint::manifest::config_hash;

    /// An old DeepFM checkpoint's `"kind": "fm"` becomes `"deepfm"` with a matching
    /// hash; a real FM and a hash that was not the old form's are left alone.
    #[test]
    fn old_fm_family_kinds_are_upgraded() {
        let model = |deep: &[usize]| {
            serde_json::json!({"model": {"kind": "fm", "num_dense": 13, "num_sparse": 26, "dim": 8, "deep": deep},
                               "table_sizes": [10]})
        };
        let mut config = model(&[16]);
        let mut hash = config_hash(&config);
        upgrade_model_kind(&mut config, &mut hash);
        assert_eq!(config["model"]["kind"], "deepfm");
        assert_eq!(hash, config_hash(&config));
        let mut fm = model(&[]);
        let mut hash = config_hash(&fm);
        let before = (fm.clone(), hash.clone());
        upgrade_model_kind(&mut fm, &mut hash);
        assert_eq!((fm, hash), before);
        let mut config = model(&[16]);
        let mut hash = "not the hash".to_string();
        upgrade_model_kind(&mut config, &mut hash);
        assert_eq!((config["model"]["kind"].as_str(), hash.as_str()), (Some("deepfm"), "not the hash"));
    }
}
