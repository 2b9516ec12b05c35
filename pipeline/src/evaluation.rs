//! Evaluations during training: ranking them, early stopping, and keeping the
//! best model.
//!
//! A run with an evaluation split evaluates at the end of every epoch, every
//! `--eval-every` global steps, and at its end (once per step: an evaluation
//! of the same step is not repeated). Worker 0 alone holds the predictions,
//! so it sends its figures to every worker ([`share`]) and every worker feeds
//! the same [`Evaluation`] to its own [`Tracker`]: all of them take the same
//! decisions after the same step, whatever the worker count.
//!
//! Invariants:
//! * The best evaluation is the first one with the highest AUC (or lowest log
//!   loss, `--best-metric logloss`); an undefined figure never improves.
//! * With `--early-stop P`, training stops after the `P`-th evaluation in a
//!   row that did not improve; the model is then set back to the best
//!   evaluation's ([`BestKeeper`]), so the final metrics, `params_l2` and the
//!   final checkpoint link are the best step's.
//! * The tracker's state is its history, which checkpoints record
//!   ([`TrainingProgress::evaluations`](tiderec_sinks::checkpoint::TrainingProgress));
//!   a resumed run rebuilds the same state from it.

use crate::error::{CheckpointAction, DataflowFailure};
use crate::settings::BestMetric;
use crate::PipelineError;
use std::path::Path;
use std::sync::{Arc, Mutex};
use tiderec_operators::collective::Collective;
use tiderec_operators::metrics::EvalSummary;
use tiderec_operators::snapshot::WorkerSnapshot;
use tiderec_operators::train::Trainer;
use tiderec_sinks::checkpoint::{self, Checkpoint};
use tiderec_sinks::metrics::Evaluation;
use timely::worker::Worker;

/// What one evaluation decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// It is the best so far.
    pub improved: bool,
    /// Early stopping ends training now.
    pub stop: bool,
}

/// The evaluations so far and the early-stopping state they imply.
#[derive(Clone, Debug)]
pub struct Tracker {
    metric: BestMetric,
    patience: Option<u64>,
    history: Vec<Evaluation>,
    best: Option<usize>,
}

impl Tracker {
    /// A tracker that continues from `history` (empty for a fresh run).
    pub fn new(metric: BestMetric, patience: Option<u64>, history: &[Evaluation]) -> Self {
        let mut t = Tracker { metric, patience, history: Vec::new(), best: None };
        for e in history {
            t.record(e.clone());
        }
        t
    }

    fn figure(&self, e: &Evaluation) -> Option<f64> {
        let v = match self.metric {
            BestMetric::Auc => e.auc,
            BestMetric::Logloss => e.logloss.map(|l| -l),
        };
        v.filter(|x| x.is_finite())
    }

    /// Adds an evaluation and says whether it improved and whether to stop.
    pub fn record(&mut self, e: Evaluation) -> Verdict {
        let best = self.best.and_then(|b| self.figure(&self.history[b]));
        let improved = match (self.figure(&e), best) {
            (Some(v), Some(b)) => v > b,
            (Some(_), None) => true,
            (None, _) => false,
        };
        self.history.push(e);
        if improved {
            self.best = Some(self.history.len() - 1);
        }
        Verdict { improved, stop: self.stopped() }
    }

    /// Evaluations since the best one (all of them when none was best).
    pub fn since_best(&self) -> u64 {
        (self.history.len() - self.best.map_or(0, |b| b + 1)) as u64
    }

    /// The evaluations, in order.
    pub fn history(&self) -> &[Evaluation] {
        &self.history
    }

    /// The best evaluation.
    pub fn best(&self) -> Option<&Evaluation> {
        self.best.map(|b| &self.history[b])
    }

    /// The latest evaluation.
    pub fn last(&self) -> Option<&Evaluation> {
        self.history.last()
    }

    /// True when early stopping has ended training: `patience` evaluations have passed since
    /// the best one (also read by a resumed run of a stopped one). Never before a best:
    /// there is nothing to go back to, and an undefined figure (one class only) is no
    /// reason to stop.
    pub fn stopped(&self) -> bool {
        self.best.is_some() && self.patience.is_some_and(|p| self.since_best() >= p)
    }
}

/// The line printed for an evaluation.
pub fn describe(e: &Evaluation, verdict: Verdict, tracker: &Tracker) -> String {
    let f = |v: Option<f64>| v.map_or("n/a".to_string(), |x| format!("{x:.4}"));
    let note = if verdict.improved {
        "best so far".to_string()
    } else {
        let best = tracker.best().map_or("none".into(), |b| format!("step {}", b.step));
        format!("{} without improvement (best: {best})", tracker.since_best())
    };
    let gauc = e.gauc.map_or(String::new(), |g| format!(" GAUC {g:.4}"));
    format!(
        "eval at step {} ({} epoch{} done): AUC {} logloss {} NE {} PR-AUC {}{gauc} ({} samples) — {note}",
        e.step,
        e.epoch,
        if e.epoch == 1 { "" } else { "s" },
        f(e.auc),
        f(e.logloss),
        f(e.ne),
        f(e.pr_auc),
        e.samples
    )
}

/// Worker 0's evaluation figures, sent to every worker.
pub type Shared = EvalSummary;

/// Sends worker 0's `summary` (ignored on the others) to every worker and returns it as
/// the evaluation of `step` after `epoch` epochs. Collective.
pub fn share(
    collective: &mut Collective<Shared>,
    worker: &mut Worker,
    summary: Option<EvalSummary>,
    step: u64,
    epoch: u64,
) -> Evaluation {
    let figures = collective.all_gather(worker, summary.unwrap_or_default()).swap_remove(0);
    Evaluation::of(step, epoch, &figures)
}

/// Keeps the best model of an early-stopping run for [`BestKeeper::restore`]: in memory
/// (every local worker's snapshot, one process) or, with checkpoints, on disk as the
/// checkpoint `DIR/best` names.
pub struct BestKeeper {
    /// Each local worker's snapshot of the best step (memory mode).
    parts: Mutex<Vec<Option<WorkerSnapshot>>>,
    /// The checkpoint `DIR/best` names, read once per process (disk mode).
    loaded: Mutex<Option<Arc<Checkpoint>>>,
    /// Local workers that have not restored yet (the last one releases the memory).
    pending: std::sync::atomic::AtomicUsize,
}

impl BestKeeper {
    /// A keeper for `local` workers.
    pub fn new(local: usize) -> Self {
        BestKeeper {
            parts: Mutex::new(vec![None; local]),
            loaded: Mutex::new(None),
            pending: std::sync::atomic::AtomicUsize::new(local),
        }
    }

    /// Keeps local worker `k`'s copy of the current (best) state (memory mode).
    pub fn keep(&self, k: usize, trainer: &Trainer) -> Result<(), PipelineError> {
        let snapshot = trainer.snapshot()?;
        if let Ok(mut parts) = self.parts.lock() {
            parts[k] = Some(snapshot);
        }
        Ok(())
    }

    /// Sets `trainer` back to the best state: from the snapshots kept (every local worker
    /// kept its own before any worker gets here: they all took the collective steps since),
    /// or from the checkpoint `dir/best` names. Not collective.
    pub fn restore(&self, trainer: &mut Trainer, dir: Option<&Path>) -> Result<(), PipelineError> {
        let outcome = match dir {
            None => {
                let parts = self
                    .parts
                    .lock()
                    .map_err(|_| PipelineError::dataflow(DataflowFailure::Panicked, "a worker panicked"))?;
                let parts: Option<Vec<WorkerSnapshot>> = parts.iter().cloned().collect();
                let parts = parts
                    .ok_or_else(|| PipelineError::dataflow(DataflowFailure::Incomplete, "no best model was kept"))?;
                trainer.restore(&parts).map_err(PipelineError::from)
            }
            Some(dir) => self.load(dir).and_then(|c| {
                trainer.restore(&c.parts).map_err(|e| PipelineError::Checkpoint {
                    action: CheckpointAction::Restore,
                    path: Some(c.path.clone()),
                    step: Some(c.manifest.step),
                    worker: None,
                    reason: "the best model does not fit the trainer".into(),
                    source: Some(e.into()),
                })
            }),
        };
        if self.pending.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
            if let Ok(mut p) = self.parts.lock() {
                p.iter_mut().for_each(|x| *x = None);
            }
            if let Ok(mut l) = self.loaded.lock() {
                *l = None;
            }
        }
        outcome
    }

    fn load(&self, dir: &Path) -> Result<Arc<Checkpoint>, PipelineError> {
        let mut slot =
            self.loaded.lock().map_err(|_| PipelineError::dataflow(DataflowFailure::Panicked, "a worker panicked"))?;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let link = dir.join(checkpoint::layout::BEST_LINK);
        let step = checkpoint::layout::best_step(dir).ok_or_else(|| {
            PipelineError::checkpoint(
                CheckpointAction::Restore,
                Some(link.clone()),
                "it does not name a checkpoint of the best step",
            )
        })?;
        let c = checkpoint::load::load(&link, step).map_err(|e| PipelineError::Checkpoint {
            action: CheckpointAction::Restore,
            path: Some(link.clone()),
            step: Some(step),
            worker: None,
            reason: "the best model cannot be loaded".into(),
            source: Some(e.into()),
        })?;
        let c = Arc::new(c);
        *slot = Some(c.clone());
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(step: u64, auc: f64, logloss: f64) -> Evaluation {
        Evaluation { step, epoch: step / 10, auc: Some(auc), logloss: Some(logloss), samples: 5, ..Default::default() }
    }

    #[test]
    fn patience_counts_evaluations_since_the_best() {
        let mut t = Tracker::new(BestMetric::Auc, Some(2), &[]);
        assert_eq!(t.record(at(10, 0.70, 0.5)), Verdict { improved: true, stop: false });
        assert_eq!(t.record(at(20, 0.72, 0.6)), Verdict { improved: true, stop: false });
        assert_eq!(t.record(at(30, 0.72, 0.4)), Verdict { improved: false, stop: false }, "a tie is no improvement");
        assert_eq!(t.record(at(40, 0.71, 0.4)), Verdict { improved: false, stop: true });
        assert_eq!(t.best().unwrap().step, 20);
        assert!(t.stopped());
        // The same history by log loss: the 30th step's 0.4 is best.
        let mut l = Tracker::new(BestMetric::Logloss, Some(2), &t.history()[..3]);
        assert_eq!(l.best().unwrap().step, 30);
        assert_eq!(l.record(at(40, 0.71, 0.4)), Verdict { improved: false, stop: false });
        // Rebuilt from a history, the state is the same as recorded one by one.
        let again = Tracker::new(BestMetric::Auc, Some(2), t.history());
        assert_eq!((again.best().unwrap().step, again.since_best(), again.stopped()), (20, 2, true));
    }

    #[test]
    fn an_undefined_figure_never_improves() {
        let mut t = Tracker::new(BestMetric::Auc, Some(1), &[]);
        let none = |step| Evaluation { step, auc: None, ..at(step, 0.0, 0.0) };
        // Without a best there is nothing to go back to: no stop, however many.
        assert_eq!(t.record(none(5)), Verdict { improved: false, stop: false });
        assert_eq!(t.record(none(6)), Verdict { improved: false, stop: false });
        assert!(t.best().is_none() && !t.stopped());
        assert!(t.record(at(10, 0.5, 0.7)).improved);
        assert_eq!(t.record(none(15)), Verdict { improved: false, stop: true });
        assert!(t.stopped());
        let mut no_patience = Tracker::new(BestMetric::Auc, None, &[]);
        no_patience.record(at(10, 0.7, 0.5));
        assert!(!no_patience.record(at(20, 0.6, 0.5)).stop && !no_patience.stopped());
    }
}
