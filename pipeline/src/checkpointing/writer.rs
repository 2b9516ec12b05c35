//! One worker's side of checkpointing: the collective protocol that writes a
//! checkpoint in the background while training goes on (see the
//! [module docs](super) for the rounds and the guarantees).

use super::commit::{Commit, RunIdentity};
use super::job::Job;
use super::{CheckpointOptions, Note, Position, ShardWritten};
use crate::error::CheckpointAction;
use crate::PipelineError;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tiderec_operators::collective::Collective;
use tiderec_operators::optim::DenseOptimizerState;
use tiderec_operators::snapshot::WorkerSnapshot;
use tiderec_operators::train::{Trainer, TrainerConfig};
use tiderec_sinks::checkpoint::manifest::recorded_config;
use tiderec_sinks::checkpoint::{write, Checkpoint, DeltaLink, FileEntry};
use timely::worker::Worker;

/// What a worker's shard job hands back: the file, and the dense parts of the
/// snapshot that worker 0 still needs.
struct ShardDone {
    name: String,
    updated_only: bool,
    entry: FileEntry,
    dense_optimizer: DenseOptimizerState,
    dense_params: Vec<f32>,
}

/// The chain this run's checkpoints extend: its whole checkpoint and the deltas since.
#[derive(Clone, Copy, Debug)]
struct Chain {
    /// The step of its whole checkpoint, and that checkpoint's shard files' bytes.
    base: (u64, u64),
    /// The step of its newest link.
    last: u64,
    /// Deltas written since the whole checkpoint, and their shard files' bytes.
    deltas: (u64, u64),
}

/// Where the checkpoint in flight stands.
enum Stage {
    /// Every worker writes its shard file.
    Shards(Job<ShardDone>),
    /// Worker 0 writes the dense file and the manifest, renames, prunes (`None` on other workers).
    Commit(Option<Job<(PathBuf, u64)>>),
}

/// A checkpoint begun and not yet durable.
struct InFlight {
    position: Position,
    /// `Some` for a delta.
    delta: Option<DeltaLink>,
    tmp: PathBuf,
    began: Instant,
    stage: Stage,
}

/// One worker's side of checkpointing.
pub struct Checkpointer {
    collective: Collective<Note>,
    options: Option<CheckpointOptions>,
    identity: RunIdentity,
    /// Step of the last checkpoint begun or restored.
    last_step: Option<u64>,
    in_flight: Option<InFlight>,
    /// The newest checkpoint that became durable and was not yet [taken](Self::take_durable).
    durable: Option<Position>,
    /// Step of the newest checkpoint known durable: written by this run or restored.
    last_durable: Option<u64>,
    /// The chain the next delta would extend (worker 0 only; `None` after a restore).
    chain: Option<Chain>,
    /// Checkpoints written (durable) by this run.
    pub written: u64,
    /// Seconds training stood still for checkpoints: snapshots, the
    /// protocol's rounds, and waits for a write still in flight.
    pub seconds: f64,
    /// Seconds from each checkpoint's snapshot to its being durable, summed.
    pub write_seconds: f64,
    /// Training steps taken while a checkpoint was being written.
    pub overlap_steps: u64,
}

/// Writing the checkpoint of `step` failed; `worker` reported it.
fn fail(step: u64, worker: usize, reason: impl Into<String>) -> PipelineError {
    PipelineError::Checkpoint {
        action: CheckpointAction::Write,
        path: None,
        step: Some(step),
        worker: Some(worker),
        reason: reason.into(),
        source: None,
    }
}

/// Worker `worker`'s note was not the one of this round.
fn out_of_step(action: CheckpointAction, step: Option<u64>, worker: usize, note: &Note) -> PipelineError {
    PipelineError::Checkpoint {
        action,
        path: None,
        step,
        worker: Some(worker),
        reason: format!("the worker is out of step: {note:?}"),
        source: None,
    }
}

/// Starts worker `me`'s background write of `snapshot`, its shard file of the checkpoint
/// of `step`, into `tmp`.
fn shard_job(tmp: &Path, step: u64, me: usize, snapshot: WorkerSnapshot) -> Job<ShardDone> {
    let tmp = tmp.to_path_buf();
    Job::spawn(&format!("ckpt-{step}-w{me}"), move || {
        let (name, entry) = write::write_shard(&tmp, &snapshot).map_err(|e| e.to_string())?;
        Ok(ShardDone {
            name,
            updated_only: snapshot.updated_only,
            entry,
            dense_optimizer: snapshot.dense_optimizer,
            dense_params: snapshot.dense_params,
        })
    })
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
            identity: RunIdentity { config: recorded_config(config), seed: config.seed, batch_size },
            last_step: None,
            in_flight: None,
            durable: None,
            last_durable: None,
            chain: None,
            written: 0,
            seconds: 0.0,
            write_seconds: 0.0,
            overlap_steps: 0,
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

    /// True when checkpointing is on and no checkpoint of `step` exists or is
    /// being written (end of an epoch or of the run).
    pub fn due_at_boundary(&self, step: u64) -> bool {
        self.enabled() && self.last_step != Some(step)
    }

    /// The newest durable checkpoint of this run (written or restored), as `DIR/ckpt-<step>`.
    pub fn last_durable(&self) -> Option<PathBuf> {
        let dir = &self.options.as_ref()?.dir;
        self.last_durable.map(|step| dir.join(tiderec_sinks::checkpoint::layout::checkpoint_name(step)))
    }

    /// True while a checkpoint is being written.
    pub fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// The position of the newest checkpoint that became durable since the
    /// last call (its Kafka offsets may now be committed to the group).
    pub fn take_durable(&mut self) -> Option<Position> {
        self.durable.take()
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
                Note::Restored(Err(e)) => {
                    return Err(PipelineError::Checkpoint {
                        action: CheckpointAction::Restore,
                        // The reason names the checkpoint that worker read.
                        path: None,
                        step: None,
                        worker: Some(k),
                        reason: e,
                        source: None,
                    });
                }
                other => return Err(out_of_step(CheckpointAction::Restore, None, k, &other)),
            }
        }
        if steps.iter().any(|s| *s != steps[0]) {
            return Err(PipelineError::checkpoint(
                CheckpointAction::Restore,
                None,
                format!(
                    "the processes found different checkpoints (steps by worker: {steps:?}); is --checkpoint-dir \
                     the same directory for every process?"
                ),
            ));
        }
        self.last_step = steps[0];
        self.last_durable = steps[0];
        self.chain = None;
        Ok(steps[0])
    }

    /// Begins the checkpoint of `position` with every other worker: waits for
    /// the one still in flight (if any), snapshots `trainer` and hands the
    /// files to background threads. With `--checkpoint-sync` it returns only
    /// once the checkpoint is durable. Collective.
    pub fn write(&mut self, worker: &mut Worker, trainer: &Trainer, position: &Position) -> Result<(), PipelineError> {
        let Some(options) = self.options.clone() else { return Ok(()) };
        let start = Instant::now();
        let outcome = self.begin(worker, trainer, position, &options).and_then(|_| {
            if options.sync {
                self.advance(worker, true)
            } else {
                Ok(())
            }
        });
        self.seconds += start.elapsed().as_secs_f64();
        outcome
    }

    /// Called once after every training step: moves the checkpoint in flight
    /// on when every worker's part of it is done, never waiting for a write.
    /// A write's error comes back here. Collective while a checkpoint is in
    /// flight (every worker knows that it is).
    pub fn poll(&mut self, worker: &mut Worker) -> Result<(), PipelineError> {
        if self.in_flight.is_none() {
            return Ok(());
        }
        let start = Instant::now();
        self.overlap_steps += 1;
        let outcome = self.advance(worker, false);
        self.seconds += start.elapsed().as_secs_f64();
        outcome
    }

    /// Waits until the checkpoint in flight (if any) is durable: before the
    /// end of a run, and before exiting on a signal. Collective.
    pub fn finish(&mut self, worker: &mut Worker) -> Result<(), PipelineError> {
        if self.in_flight.is_none() {
            return Ok(());
        }
        let start = Instant::now();
        let outcome = self.advance(worker, true);
        self.seconds += start.elapsed().as_secs_f64();
        outcome
    }

    /// Round 1 (worker 0's temporary directory), the snapshot, and the shard job.
    ///
    /// A snapshot that fails is this worker's shard error: it travels in round 2
    /// like a failed write, so every worker abandons the checkpoint in the same
    /// round with the same error, and worker 0 removes the temporary directory
    /// only once no shard job writes into it any more.
    fn begin(
        &mut self,
        worker: &mut Worker,
        trainer: &Trainer,
        position: &Position,
        options: &CheckpointOptions,
    ) -> Result<(), PipelineError> {
        // At most one checkpoint in flight.
        self.advance(worker, true)?;
        let step = position.step;
        let begin = if worker.index() == 0 {
            let delta = self.next_delta(trainer, options, step);
            write::create_temp(&options.dir, step).map(|tmp| (tmp, delta)).map_err(|e| e.to_string())
        } else {
            Err(String::new())
        };
        let (tmp, delta) = match self.collective.exchange(worker, |_| Note::Begin(begin.clone())).swap_remove(0) {
            Note::Begin(Ok(p)) => p,
            Note::Begin(Err(e)) => return Err(fail(step, 0, e)),
            other => return Err(out_of_step(CheckpointAction::Write, Some(step), 0, &other)),
        };
        // The cut: weights, optimizer state and (in `position`) offsets of this step.
        let job = match trainer.checkpoint_snapshot(delta.map(|d| d.parent)) {
            Ok(snapshot) => shard_job(&tmp, step, worker.index(), snapshot),
            Err(e) => Job::finished(Err(format!("the snapshot failed: {e}"))),
        };
        self.in_flight =
            Some(InFlight { position: position.clone(), delta, tmp, began: Instant::now(), stage: Stage::Shards(job) });
        self.last_step = Some(step);
        Ok(())
    }

    /// Worker 0's choice for the checkpoint of `step`: a delta extending this run's
    /// chain, or `None` for a whole one (see the module docs for when). A checkpoint
    /// that replaces the chain's newest link (the same step, written again after an
    /// evaluation) is whole: as a delta its parent would be the directory it replaces.
    fn next_delta(&self, trainer: &Trainer, options: &CheckpointOptions, step: u64) -> Option<DeltaLink> {
        let chain = self.chain?;
        if chain.last >= step {
            return None;
        }
        let (base, base_bytes) = chain.base;
        let (deltas, delta_bytes) = chain.deltas;
        let within = deltas < options.deltas && (delta_bytes as f64) <= options.delta_share * base_bytes as f64;
        (within && trainer.checkpoint_mark() == Some(chain.last)).then_some(DeltaLink { parent: chain.last, base })
    }

    /// One round: whether every worker's part of the current stage is done.
    fn all_ready(&mut self, worker: &mut Worker, mine: bool, step: u64) -> Result<bool, PipelineError> {
        let mut ready = true;
        for (k, note) in self.collective.all_gather(worker, Note::Ready(mine)).into_iter().enumerate() {
            match note {
                Note::Ready(r) => ready &= r,
                other => return Err(out_of_step(CheckpointAction::Write, Some(step), k, &other)),
            }
        }
        Ok(ready)
    }

    /// Moves the checkpoint in flight through its stages; with `block`,
    /// until it is durable, otherwise only through a stage every worker has
    /// finished (one round to find out).
    fn advance(&mut self, worker: &mut Worker, block: bool) -> Result<(), PipelineError> {
        while let Some(flight) = self.in_flight.take() {
            let step = flight.position.step;
            let mine = match &flight.stage {
                Stage::Shards(job) => job.is_done(),
                Stage::Commit(job) => job.as_ref().is_none_or(Job::is_done),
            };
            if !block && !self.all_ready(worker, mine, step)? {
                self.in_flight = Some(flight);
                return Ok(());
            }
            let InFlight { position, delta, tmp, began, stage } = flight;
            match stage {
                Stage::Shards(job) => {
                    let commit = self.gather_shards(worker, job, &position, delta, &tmp)?;
                    self.in_flight = Some(InFlight { position, delta, tmp, began, stage: Stage::Commit(commit) });
                    if !block {
                        return Ok(());
                    }
                }
                Stage::Commit(job) => {
                    // Round 3: worker 0's outcome.
                    let committed = job.map_or(Ok((PathBuf::new(), 0)), Job::wait);
                    match self.collective.exchange(worker, |_| Note::Committed(committed.clone())).swap_remove(0) {
                        Note::Committed(Ok((_, bytes))) => self.extend_chain(step, delta, bytes),
                        Note::Committed(Err(e)) => return Err(fail(step, 0, e)),
                        other => return Err(out_of_step(CheckpointAction::Write, Some(step), 0, &other)),
                    }
                    self.written += 1;
                    self.last_durable = Some(step);
                    self.write_seconds += began.elapsed().as_secs_f64();
                    self.durable = Some(position);
                }
            }
        }
        Ok(())
    }

    /// Records the durable checkpoint of `step` (`bytes` on disk) in the chain.
    fn extend_chain(&mut self, step: u64, delta: Option<DeltaLink>, bytes: u64) {
        self.chain = match (delta, self.chain) {
            (Some(_), Some(c)) => Some(Chain { last: step, deltas: (c.deltas.0 + 1, c.deltas.1 + bytes), ..c }),
            _ => Some(Chain { base: (step, bytes), last: step, deltas: (0, 0) }),
        };
    }

    /// Round 2: waits for this worker's shard file, tells every worker how it
    /// went (and worker 0 the dense-optimizer slice); worker 0 then starts
    /// the commit job, which it returns. Any worker's error (a failed write or
    /// snapshot) fails the checkpoint on every worker, the first one in worker
    /// order being the error of all; every shard job has ended by then, so
    /// worker 0 removes the temporary directory.
    fn gather_shards(
        &mut self,
        worker: &mut Worker,
        job: Job<ShardDone>,
        position: &Position,
        delta: Option<DeltaLink>,
        tmp: &Path,
    ) -> Result<Option<Job<(PathBuf, u64)>>, PipelineError> {
        let (me, step) = (worker.index(), position.step);
        let done = job.wait();
        let notes = self.collective.exchange(worker, |to| {
            Note::Written(match &done {
                Ok(d) => Ok(ShardWritten {
                    name: d.name.clone(),
                    entry: d.entry.clone(),
                    dense: (to == 0).then(|| d.dense_optimizer.clone()),
                }),
                Err(e) => Err(e.clone()),
            })
        });
        let mut shards = Vec::with_capacity(notes.len());
        let mut first_error = None;
        for (k, note) in notes.into_iter().enumerate() {
            match note {
                Note::Written(Ok(w)) => shards.push(w),
                Note::Written(Err(e)) => {
                    first_error.get_or_insert_with(|| fail(step, k, e));
                }
                other => {
                    first_error.get_or_insert_with(|| out_of_step(CheckpointAction::Write, Some(step), k, &other));
                }
            }
        }
        if let Some(e) = first_error {
            if me == 0 {
                let _ = std::fs::remove_dir_all(tmp);
            }
            return Err(e);
        }
        if me != 0 {
            return Ok(None);
        }
        let (Ok(d), Some(options)) = (done, self.options.clone()) else {
            return Err(fail(step, 0, "it lost its shard or its options"));
        };
        let commit = Commit {
            options,
            identity: self.identity.clone(),
            tmp: tmp.to_path_buf(),
            params: d.dense_params,
            shards,
            position: position.clone(),
            delta,
            updated_only: d.updated_only,
        };
        Ok(Some(Job::spawn(&format!("ckpt-{step}-commit"), move || commit.run())))
    }
}
