//! Online training over a stream of batches, with a callback after every step.
//!
//! `Trainer::train_online` trains on each batch an iterator yields, one
//! synchronous step per batch, and calls back after every step with the step's
//! global statistics and, on worker 0, the predictions the model made for the
//! step's samples *before* it trained on them (prequential evaluation: every
//! prediction is of a sample the model had not seen). The callback is where a
//! program logs, exports metrics, checkpoints or decides to stop.
//!
//! See [`Trainer::train_online`] for when a run ends and what every worker sees.

use super::{StepKind, StepStats, Trainer};
use crate::batch::Batch;
use crate::metrics::EvalSet;
use crate::{DataflowError, OperatorError};
use std::ops::ControlFlow;
use timely::worker::Worker;

/// What the callback of [`Trainer::train_online`] sees after each step.
#[derive(Debug)]
pub struct OnlineStep<'a> {
    /// Steps taken in this call, this one included (1 for the first).
    pub step: u64,
    /// The step's statistics, summed over all workers (the same on every worker).
    pub stats: &'a StepStats,
    /// The step's predictions, made before its update, with their labels: the whole
    /// global batch on worker 0, empty on the other workers.
    pub predictions: &'a EvalSet,
}

/// The outcome of [`Trainer::train_online`], the same on every worker.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OnlineSummary {
    /// Steps taken, the final empty one excluded.
    pub steps: u64,
    /// Samples trained on, over all workers.
    pub samples: u64,
    /// Σ BCE loss of the samples trained on, each computed before its step's update.
    pub loss_sum: f64,
    /// Whether a callback asked to stop before the input ran out.
    pub stopped: bool,
}

impl Trainer {
    /// Trains on `batches` (this worker's micro-batches, in order), one synchronous step
    /// each, calling `on_step` after every step. Every worker must call it, with its own
    /// batches.
    ///
    /// Guarantees:
    /// * Every worker runs the same steps. A worker whose iterator is exhausted
    ///   takes part with empty batches; the run ends after the first step whose
    ///   global batch is empty (every worker's input is exhausted).
    /// * A callback that returns [`ControlFlow::Break`] on any worker ends the run
    ///   on every worker: the request travels with the next step, which every
    ///   worker still takes with its next batch (and calls back for, ignoring the
    ///   answer); no worker takes another one.
    /// * The callback sees the same [`StepStats`] on every worker (sums over all
    ///   workers); the predictions arrive on worker 0 only, every worker's samples in
    ///   worker order.
    /// * A failed worker, or a step that found a non-finite loss, gradient or
    ///   parameter ([`StepStats::non_finite`]), ends the run with an error on every
    ///   worker: training never continues on a ruined model.
    ///
    /// Errors: a batch that does not fit the model (this worker's error; every other worker
    /// sees a failed worker), a failed worker, or a non-finite step.
    pub fn train_online<I, F>(
        &mut self,
        worker: &mut Worker,
        batches: I,
        mut on_step: F,
    ) -> Result<OnlineSummary, OperatorError>
    where
        I: IntoIterator<Item = Batch>,
        F: FnMut(&OnlineStep<'_>) -> ControlFlow<()>,
    {
        let (score, stop) = (self.score_train, self.stop_requested);
        self.score_train = true;
        let result = self.online_steps(worker, batches.into_iter().fuse(), &mut on_step);
        self.score_train = score;
        self.stop_requested = stop;
        result
    }

    fn online_steps(
        &mut self,
        worker: &mut Worker,
        mut batches: impl Iterator<Item = Batch>,
        on_step: &mut impl FnMut(&OnlineStep<'_>) -> ControlFlow<()>,
    ) -> Result<OnlineSummary, OperatorError> {
        let mut summary = OnlineSummary::default();
        loop {
            let batch = batches.next().unwrap_or_else(|| self.empty_batch());
            let stats = self.step(worker, StepKind::Train, batch)?;
            if stats.failed_workers > 0 {
                return Err(DataflowError::StepFailed {
                    step: summary.steps + 1,
                    failed_workers: stats.failed_workers,
                }
                .into());
            }
            if stats.non_finite > 0 {
                return Err(DataflowError::NonFinite { step: summary.steps + 1 }.into());
            }
            let predictions = self.take_eval();
            let stopped = stats.stop_requests > 0;
            if stats.samples == 0 {
                summary.stopped = stopped;
                return Ok(summary);
            }
            summary.steps += 1;
            summary.samples += stats.samples;
            summary.loss_sum += stats.loss_sum;
            let flow = on_step(&OnlineStep { step: summary.steps, stats: &stats, predictions: &predictions });
            if stopped {
                summary.stopped = true;
                return Ok(summary);
            }
            if flow.is_break() {
                self.stop_requested = true;
            }
        }
    }
}
