//! Checkpoints of a training run: preparing the directory, writing a
//! checkpoint with all workers together, and resuming from the newest valid one.
//!
//! **Writing** is collective: every worker calls [`Checkpointer::write`]
//! after the same training step, and three rounds of a [`Collective`]
//! channel order the work:
//! 1. worker 0 creates `DIR/.tmp-ckpt-<step>-<pid>` and sends its path to
//!    every worker (or the error);
//! 2. every worker writes its `shard-<k>.safetensors` there (written in one
//!    pass, hashed, fsynced) and sends worker 0 the file's size and checksum
//!    and its dense-optimizer slice (or its error);
//! 3. worker 0, now knowing every shard file is on disk, writes
//!    `dense.safetensors` and `manifest.json`, renames the directory to
//!    `ckpt-<step>`, fsyncs `DIR`, prunes to `--keep-checkpoints`, and sends
//!    the outcome to every worker.
//!
//! Every worker returns the same result from the same round, so an error on
//! any worker (unwritable directory, full disk) stops all of them together,
//! with a message naming the path; nothing waits forever. The state written
//! is a consistent cut: each worker snapshots between two steps, and no
//! update of the next step can reach a worker before it sends its gradients.
//! In a multi-process run each process writes its own workers' shards into
//! `DIR`, so `DIR` must be the same directory for every process (one
//! machine, or a file system they share); process 0 writes the manifest only
//! after every worker has reported its shard durable.
//!
//! **Resuming**: each process reads the newest valid checkpoint once
//! ([`load_for_resume`], skipping damaged ones with a warning) and every
//! worker restores its own rows and dense slice from it
//! ([`Checkpointer::restore`]); the workers then agree, in one round, that
//! all of them restored the same step.

use crate::PipelineError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;
use tiderec_operators::collective::Collective;
use tiderec_operators::optim::DenseOptimizerState;
use tiderec_operators::train::{Trainer, TrainerConfig};
use tiderec_sinks::checkpoint::layout::list_checkpoints;
use tiderec_sinks::checkpoint::{self, write, Checkpoint, DataPosition, Manifest, TrainingProgress};
use timely::worker::Worker;

/// Where and how often to write checkpoints.
#[derive(Clone, Debug)]
pub struct CheckpointOptions {
    /// The directory holding `ckpt-<step>` directories.
    pub dir: PathBuf,
    /// Write one every this many global steps (besides the end of every epoch and of the run).
    pub every: Option<u64>,
    /// Checkpoints kept.
    pub keep: usize,
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
    /// Round 1, worker 0's temporary directory.
    Begin(Result<PathBuf, String>),
    /// Round 2, a worker's shard file.
    Written(Result<ShardWritten, String>),
    /// Round 3, worker 0's outcome: the checkpoint's path.
    Committed(Result<PathBuf, String>),
    /// After restoring: the step restored (`None`: started fresh).
    Restored(Result<Option<u64>, String>),
}

/// The configuration recorded in (and compared with) manifests: the trainer
/// configuration without the seed (which the manifest holds separately) and
/// without the store settings when they are the default.
pub fn manifest_config(config: &TrainerConfig) -> serde_json::Value {
    // Through text, so f32 hyper-parameters read `0.001`, not their f64 widening.
    let text = serde_json::to_string(config).unwrap_or_default();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    if let Some(map) = v.as_object_mut() {
        map.remove("seed");
        // How embeddings travel between workers does not change the model: a
        // run may resume with another exchange strategy.
        map.remove("exchange");
        // The default (fixed) store is left out, so checkpoints written before
        // stores existed still match.
        if config.store == tiderec_operators::store::StoreConfig::default() {
            map.remove("store");
        }
    }
    v
}

/// Makes sure `dir` exists and is writable before any work starts. A fresh
/// run (no `--resume`) refuses a directory that already holds checkpoints,
/// whose newer steps would shadow its own.
pub fn prepare_dir(dir: &Path, resume: bool) -> Result<(), PipelineError> {
    let key = "checkpoint_dir";
    std::fs::create_dir_all(dir)
        .map_err(|e| PipelineError::config(key, format!("cannot create {}: {e}", dir.display())))?;
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

/// The newest valid checkpoint in `dir` for a run with `config`, `seed` and
/// `batch_size`: damaged ones are skipped with a warning on stderr; none at
/// all is a warning too (the run starts fresh); one written with another
/// configuration is an error naming every difference.
pub fn load_for_resume(
    dir: &Path,
    config: &TrainerConfig,
    batch_size: u64,
) -> Result<Option<Checkpoint>, PipelineError> {
    let search = checkpoint::find_latest(dir)?;
    for s in &search.skipped {
        eprintln!("warning: skipping checkpoint {}: {}", s.path.display(), s.reason);
    }
    let Some(found) = search.found else {
        eprintln!("warning: --resume: no valid checkpoint in {}; starting from scratch", dir.display());
        return Ok(None);
    };
    found.manifest.check_compatible(&found.path, &manifest_config(config), config.seed, batch_size)?;
    Ok(Some(found))
}

/// One worker's side of checkpointing.
pub struct Checkpointer {
    collective: Collective<Note>,
    options: Option<CheckpointOptions>,
    config: serde_json::Value,
    seed: u64,
    batch_size: u64,
    /// Step of the last checkpoint written or restored.
    last_step: Option<u64>,
    /// Checkpoints written by this run.
    pub written: u64,
    /// Wall time spent writing them (this worker's view, waits included).
    pub seconds: f64,
}

fn fail(step: u64, reason: impl std::fmt::Display) -> PipelineError {
    PipelineError::Checkpoint(format!("writing the checkpoint of step {step} failed: {reason}"))
}

impl Checkpointer {
    /// Builds this worker's side; every worker must build it at the same point (it adds a dataflow).
    pub fn new(
        worker: &mut Worker,
        options: Option<CheckpointOptions>,
        config: &TrainerConfig,
        batch_size: u64,
    ) -> Self {
        Checkpointer {
            collective: Collective::new(worker),
            options,
            config: manifest_config(config),
            seed: config.seed,
            batch_size,
            last_step: None,
            written: 0,
            seconds: 0.0,
        }
    }

    /// True when checkpoints are written at all.
    pub fn enabled(&self) -> bool {
        self.options.is_some()
    }

    /// True when `--checkpoint-every` asks for a checkpoint after global step `step`.
    pub fn due_every(&self, step: u64) -> bool {
        self.options.as_ref().and_then(|o| o.every).is_some_and(|n| n > 0 && step.is_multiple_of(n))
    }

    /// True when checkpointing is on and no checkpoint of `step` exists yet
    /// (end of an epoch or of the run).
    pub fn due_at_boundary(&self, step: u64) -> bool {
        self.enabled() && self.last_step != Some(step)
    }

    /// Restores `checkpoint` (this process's copy) into `trainer`, then checks
    /// with every worker that all restored the same step. Collective.
    pub fn restore(
        &mut self,
        worker: &mut Worker,
        trainer: &mut Trainer,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<Option<u64>, PipelineError> {
        let mine = match checkpoint {
            Some(c) => trainer
                .restore(&c.parts)
                .map(|_| Some(c.manifest.step))
                .map_err(|e| format!("{}: {e}", c.path.display())),
            None => Ok(None),
        };
        let all = self.collective.all_gather(worker, Note::Restored(mine));
        let mut steps = Vec::with_capacity(all.len());
        for (k, note) in all.into_iter().enumerate() {
            match note {
                Note::Restored(Ok(s)) => steps.push(s),
                Note::Restored(Err(e)) => return Err(PipelineError::Checkpoint(format!("worker {k}: {e}"))),
                other => return Err(PipelineError::Checkpoint(format!("worker {k} is out of step: {other:?}"))),
            }
        }
        if steps.iter().any(|s| *s != steps[0]) {
            return Err(PipelineError::Checkpoint(format!(
                "the processes found different checkpoints (steps by worker: {steps:?}); is --checkpoint-dir the \
                 same directory for every process?"
            )));
        }
        self.last_step = steps[0];
        Ok(steps[0])
    }

    /// Writes the checkpoint of `position` with every other worker (see the module docs).
    pub fn write(&mut self, worker: &mut Worker, trainer: &Trainer, position: &Position) -> Result<(), PipelineError> {
        let Some(options) = self.options.clone() else { return Ok(()) };
        let start = Instant::now();
        let me = worker.index();
        let step = position.step;
        // Round 1: the temporary directory.
        let begin = if me == 0 {
            write::create_temp(&options.dir, step).map_err(|e| e.to_string())
        } else {
            Err(String::new())
        };
        let tmp = match self.collective.exchange(worker, |_| Note::Begin(begin.clone())).swap_remove(0) {
            Note::Begin(Ok(p)) => p,
            Note::Begin(Err(e)) => return Err(fail(step, e)),
            other => return Err(fail(step, format!("worker 0 is out of step: {other:?}"))),
        };
        // Round 2: every worker's shard file.
        let snapshot = trainer.snapshot();
        let written = write::write_shard(&tmp, &snapshot).map_err(|e| e.to_string());
        let notes = self.collective.exchange(worker, |to| {
            Note::Written(written.clone().map(|(name, entry)| ShardWritten {
                name,
                entry,
                dense: (to == 0).then(|| snapshot.dense_optimizer.clone()),
            }))
        });
        let mut shards = Vec::with_capacity(notes.len());
        let mut first_error = None;
        for (k, note) in notes.into_iter().enumerate() {
            match note {
                Note::Written(Ok(w)) => shards.push(w),
                Note::Written(Err(e)) => {
                    first_error.get_or_insert(format!("worker {k}: {e}"));
                }
                other => {
                    first_error.get_or_insert(format!("worker {k} is out of step: {other:?}"));
                }
            }
        }
        if let Some(e) = first_error {
            if me == 0 {
                let _ = std::fs::remove_dir_all(&tmp);
            }
            return Err(fail(step, e));
        }
        // Round 3: worker 0 commits.
        let committed = if me == 0 {
            let outcome = self.commit(&options, &tmp, &snapshot.dense_params, shards, position);
            if outcome.is_err() {
                let _ = std::fs::remove_dir_all(&tmp);
            }
            outcome
        } else {
            Ok(PathBuf::new())
        };
        drop(snapshot);
        match self.collective.exchange(worker, |_| Note::Committed(committed.clone())).swap_remove(0) {
            Note::Committed(Ok(_)) => {}
            Note::Committed(Err(e)) => return Err(fail(step, e)),
            other => return Err(fail(step, format!("worker 0 is out of step: {other:?}"))),
        }
        self.last_step = Some(step);
        self.written += 1;
        self.seconds += start.elapsed().as_secs_f64();
        Ok(())
    }

    /// Worker 0: the dense file, the manifest, the rename, pruning.
    fn commit(
        &self,
        options: &CheckpointOptions,
        tmp: &Path,
        params: &[f32],
        shards: Vec<ShardWritten>,
        position: &Position,
    ) -> Result<PathBuf, String> {
        let workers = shards.len();
        let mut files = std::collections::BTreeMap::new();
        let mut slices = Vec::with_capacity(workers);
        for s in shards {
            files.insert(s.name, s.entry);
            slices.push(s.dense.ok_or("a worker sent no dense-optimizer slice")?);
        }
        let refs: Vec<&DenseOptimizerState> = slices.iter().collect();
        let dense = DenseOptimizerState::concat(&refs, params.len()).map_err(|e| e.to_string())?;
        let (name, entry) = write::write_dense(tmp, position.step, params, &dense).map_err(|e| e.to_string())?;
        files.insert(name, entry);
        let manifest = Manifest {
            format_version: checkpoint::FORMAT_VERSION,
            step: position.step,
            epoch: position.epoch,
            steps_in_epoch: position.steps_in_epoch,
            samples: position.samples,
            seed: self.seed,
            batch_size: self.batch_size,
            workers,
            config_hash: checkpoint::config_hash(&self.config),
            config: self.config.clone(),
            data_position: DataPosition {
                epoch: position.epoch,
                global_steps_in_epoch: position.steps_in_epoch,
                kafka_offsets: position.kafka_offsets.clone(),
            },
            progress: position.progress.clone(),
            files,
        };
        let path = write::commit(&options.dir, tmp, &manifest).map_err(|e| e.to_string())?;
        for warning in write::prune(&options.dir, position.step, options.keep) {
            eprintln!("warning: {warning}");
        }
        Ok(path)
    }
}
