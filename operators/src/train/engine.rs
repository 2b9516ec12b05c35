//! Step engines: a worker that trains alone computes whole steps somewhere
//! else — a GPU holding its rows, pooling, model and optimizers
//! (`tiderec_gpu::resident`) — while the trainer keeps its host state as a
//! mirror for what reads parameters on the host.
//!
//! ## Invariants
//!
//! * **One worker.** An engine owns every row, so it trains only a trainer of
//!   one worker in all ([`Trainer::with_engine`] refuses more).
//! * **The engine holds the model; the host mirrors it on demand.** Training
//!   and evaluation steps run on the engine only; the host's rows, dense
//!   parameters and optimizer state (the owner and the dense replica, as a
//!   one-worker trainer keeps them) are brought up to date from the engine
//!   before anything reads them: a report step, [`Trainer::dense_params`], a
//!   snapshot. A restore sets the host state and hands it to the engine
//!   ([`StepEngine::load`]). So checkpoints do not depend on the engine that
//!   wrote them.
//! * **Only what changed comes back.** Bringing the mirror up to date reads
//!   from the engine the rows its training steps changed since the last such
//!   read or [`StepEngine::load`], with the whole dense state
//!   ([`StepEngine::save_changed`]; the engine keeps that list where its rows
//!   are, so a step pays nothing on the host for it), and overwrites those
//!   rows of the mirror; every other row already holds the engine's value. So
//!   the read costs the rows trained since, not the tables.
//! * **Delta checkpoints as without an engine.** The host notes the rows each
//!   read of the engine lists ([`super::changed_rows`]): since a checkpoint
//!   reads first, those are the rows trained since the last checkpoint; a
//!   checkpoint snapshot with a parent keeps those rows of the mirror, so
//!   [`Trainer::checkpoint_mark`] and [`Trainer::checkpoint_snapshot`] behave
//!   as on a trainer without one.
//! * **The same step.** An engine's training step is the one-worker step of
//!   this module: its loss sum before the update, no update on a non-finite
//!   loss, row and dense updates scaled by `1 / batch`.
//! * **Preparing the next batch changes no step.** A training or evaluation
//!   step may be handed the batch that probably comes next
//!   ([`Trainer::step_then_prepare`]), which the engine prepares while the
//!   step runs; a step on an equal batch starts from that, any other batch is
//!   prepared as without it.

use super::changed_rows::ChangedRows;
use super::{clock, StepKind, StepStats, Trainer};
use crate::batch::Batch;
use crate::metrics::EvalSet;
use crate::nn::loss::{bce_with_logits_sum, sigmoid};
use crate::snapshot::WorkerSnapshot;
use crate::OperatorError;

/// What one training step of an engine reports.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineStep {
    /// Σ BCE loss over the batch before the update, in fp64.
    pub loss_sum: f64,
    /// The loss, a row gradient or an updated dense parameter was not finite
    /// (with a non-finite loss nothing was updated).
    pub non_finite: bool,
}

/// What a training step asks (at most once) for the batch to prepare for the next step
/// (see [`StepEngine::train_then_prepare`]).
pub type NextBatch<'a> = &'a mut dyn FnMut() -> Option<Batch>;

/// A worker's whole training step computed in one place (see the module docs).
/// Errors are the backend's description of a failure, naming its device.
pub trait StepEngine {
    /// Trains one step on `batch` (not empty); with `keep_logits` the logits
    /// made before the update are kept for [`logits`](Self::logits).
    fn train(&mut self, batch: &Batch, keep_logits: bool) -> Result<EngineStep, String>;
    /// Trains one step on `batch` as [`train`](Self::train) does (`keep` as its
    /// `keep_logits`) and, while that step runs, asks `next` (at most once) for the batch
    /// the next step is likely to be given, and prepares it (a GPU builds and uploads
    /// it). A later step (training or evaluation) on an equal batch starts from what was
    /// prepared; a step on any other batch prepares its own as `train` does, and what
    /// was prepared is dropped. A batch that cannot be prepared is left to the step
    /// that takes it, which reports why. The same steps as `train` on each batch. By
    /// default `train`, without calling `next`.
    fn train_then_prepare(&mut self, batch: &Batch, keep: bool, next: NextBatch<'_>) -> Result<EngineStep, String> {
        let _ = next;
        self.train(batch, keep)
    }
    /// The logits of `batch` under the current parameters, kept for [`logits`](Self::logits).
    fn predict(&mut self, batch: &Batch) -> Result<(), String>;
    /// [`predict`](Self::predict), and while the engine computes the logits, asks
    /// `next` (at most once) for the batch the next step is likely to be given and
    /// prepares it, as [`train_then_prepare`](Self::train_then_prepare) does. An
    /// evaluation step on a batch the step before prepared starts from it. The same
    /// logits as `predict`. By default `predict`, without calling `next`.
    fn predict_then_prepare(&mut self, batch: &Batch, next: NextBatch<'_>) -> Result<(), String> {
        let _ = next;
        self.predict(batch)
    }
    /// The logits of the last `predict`, or of the last `train` that kept them.
    fn logits(&self) -> &[f32];
    /// The whole state (every row, the dense parameters and optimizer state,
    /// the training steps) as the part of a one-worker checkpoint.
    fn save(&mut self) -> Result<WorkerSnapshot, String>;
    /// The state as [`save`](Self::save) gives it, but listing only the rows
    /// training steps may have changed since the last `save_changed` or
    /// [`load`](Self::load) (every row a step updated, each with its values and
    /// optimizer state; `updated_only` set), with the dense parameters and
    /// optimizer state and the training steps whole. By default `save`, which
    /// lists every row.
    fn save_changed(&mut self) -> Result<WorkerSnapshot, String> {
        self.save()
    }
    /// Continues from the part of a one-worker checkpoint (rows it does not
    /// list, when it lists updated rows only, start as the seed makes them).
    fn load(&mut self, part: &WorkerSnapshot) -> Result<(), String>;
}

/// A trainer's engine, whether the host mirror is older than it, and the
/// rows its training changed since the last checkpoint snapshot.
pub(super) struct Engine {
    engine: Box<dyn StepEngine>,
    host_stale: bool,
    changed: ChangedRows,
}

impl Engine {
    /// `engine` for tables of `table_sizes` rows.
    pub(super) fn new(engine: Box<dyn StepEngine>, table_sizes: &[u64]) -> Self {
        Engine { engine, host_stale: false, changed: ChangedRows::new(table_sizes) }
    }

    /// The step of the checkpoint a delta could follow (see [`ChangedRows::marked`]).
    pub(super) fn marked(&self) -> Option<u64> {
        self.changed.marked()
    }

    /// `whole`, this trainer's whole snapshot taken now, as the next
    /// checkpoint's part: reduced to the delta since `parent` when one is
    /// given; changes count from it on.
    pub(super) fn checkpoint_part(
        &mut self,
        mut whole: WorkerSnapshot,
        parent: Option<u64>,
    ) -> Result<WorkerSnapshot, OperatorError> {
        if let Some(p) = parent {
            self.changed.delta(&mut whole, p)?;
        }
        self.changed.mark(Some(whole.step));
        Ok(whole)
    }
}

impl Trainer {
    /// One step on the engine: a training or evaluation step computed there,
    /// a report step on the host mirror brought up to date.
    pub(super) fn engine_step(
        &mut self,
        worker: &mut timely::worker::Worker,
        kind: StepKind,
        batch: Batch,
        next: NextBatch<'_>,
    ) -> Result<StepStats, OperatorError> {
        if kind == StepKind::Report {
            self.sync_host()?;
            let stats = self.run_dataflow(worker, kind, batch);
            return self.dataflow_result(kind, stats);
        }
        let clock = self.shared.clock.clone();
        let score = self.score_train;
        let me = worker.index();
        let device = |message: String| OperatorError::Device { worker: me, message };
        let mut stats = StepStats {
            samples: batch.len() as u64,
            bad_records: self.bad_records,
            stop_requests: self.stop_requested as u64,
            ..StepStats::default()
        };
        let Some(cell) = &self.engine else {
            return Err(OperatorError::config("engine", "this trainer has no step engine"));
        };
        let mut guard = cell.borrow_mut();
        let state: &mut Engine = &mut guard;
        let eval = clock::timed_step(&clock, || -> Result<bool, OperatorError> {
            if batch.is_empty() {
                return Ok(false);
            }
            let engine = &mut state.engine;
            if kind == StepKind::Train {
                let step = engine.train_then_prepare(&batch, score, next).map_err(device)?;
                state.host_stale = true;
                stats.loss_sum = step.loss_sum;
                stats.non_finite = step.non_finite as u64;
                Ok(score)
            } else {
                engine.predict_then_prepare(&batch, next).map_err(device)?;
                stats.loss_sum = bce_with_logits_sum(engine.logits(), &batch.labels);
                Ok(true)
            }
        })?;
        if eval {
            let set = EvalSet {
                probs: state.engine.logits().iter().map(|&x| sigmoid(x)).collect(),
                labels: batch.labels.clone(),
                groups: batch.groups.clone(),
            };
            self.shared.eval.borrow_mut().extend_from(&set);
        }
        drop(guard);
        self.engine_steps += 1;
        Ok(stats)
    }

    /// Brings the host mirror up to date from the engine, if it is older:
    /// the rows trained since the last time and the whole dense state.
    pub(super) fn sync_host(&self) -> Result<(), OperatorError> {
        let Some(cell) = &self.engine else { return Ok(()) };
        let mut state = cell.borrow_mut();
        if !state.host_stale {
            return Ok(());
        }
        let part = state.engine.save_changed().map_err(|message| OperatorError::Device { worker: 0, message })?;
        let mut dense = self.shared.dense.borrow_mut();
        let mut owner = self.shared.owner.borrow_mut();
        let writer = (self.config.seed, &self.config.table_sizes[..]);
        owner.patch(&mut dense, &part, writer, self.config.dense_optimizer)?;
        state.changed.note(&part);
        state.host_stale = false;
        Ok(())
    }

    /// Hands the host state to the engine (after a restore).
    pub(super) fn load_engine(&mut self) -> Result<(), OperatorError> {
        let Some(cell) = &self.engine else { return Ok(()) };
        let mut state = cell.borrow_mut();
        let part = {
            let dense = self.shared.dense.borrow();
            let owner = self.shared.owner.borrow();
            owner.snapshot(&dense, self.train_steps, (self.config.seed, &self.config.table_sizes))
        };
        state.engine.load(&part).map_err(|message| OperatorError::Device { worker: 0, message })?;
        state.host_stale = false;
        state.changed.mark(None);
        Ok(())
    }
}
