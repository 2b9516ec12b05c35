//! `tiderec eval`: the labeled records of a file scored with a checkpoint's model
//! (the path `tiderec predict` takes, with the checkpoint's feature pipeline), the
//! probabilities reduced to the evaluation metrics over all of them.

use super::{pass, ScoreOptions};
use crate::PipelineError;
use serde::Serialize;
use tiderec_operators::metrics::{EvalSet, EvalSummary};
use tiderec_sinks::dead_letters::SharedDeadLetters;

/// What `eval` measured.
#[derive(Clone, Debug, Serialize)]
pub struct EvalReport {
    /// Step of the checkpoint.
    pub step: u64,
    /// Records scored.
    pub samples: u64,
    /// Exact AUC (`None` with one class only).
    pub auc: Option<f64>,
    /// Mean log loss (`None` without records).
    pub logloss: Option<f64>,
    /// Accuracy at 0.5 (`None` without records).
    pub accuracy: Option<f64>,
    /// Normalized entropy: log loss over the entropy of the records' CTR (`None` with one
    /// class only).
    pub ne: Option<f64>,
    /// Mean probability over observed CTR (`None` without positives).
    pub calibration: Option<f64>,
    /// PR-AUC: average precision (`None` without positives).
    pub pr_auc: Option<f64>,
    /// Per-user AUC weighted by impressions (`None` when the checkpoint's pipeline names no
    /// user column, or no user has both classes).
    pub gauc: Option<f64>,
    /// Malformed records skipped.
    pub bad_records: u64,
}

/// Scores the labeled records of `options.data` with the checkpoint's model. With
/// [`ScoreOptions::own_dead_letters`], a pass that dead-letters nothing removes the
/// dead-letter file an earlier pass left, so the file lists the last pass's records or is
/// absent.
pub fn eval(options: &ScoreOptions) -> Result<EvalReport, PipelineError> {
    let options = ScoreOptions { labeled: true, ..options.clone() };
    let mut all = EvalSet::default();
    let sink = SharedDeadLetters::file(options.records.dead_letters.clone());
    let summary = pass(&options, crate::budget::Split::Eval, &sink, |b| {
        all.extend_from(&EvalSet { probs: b.probs.to_vec(), labels: b.labels.to_vec(), groups: b.groups.to_vec() });
        Ok(())
    })?;
    if options.own_dead_letters {
        sink.lock().remove_unwritten()?;
    }
    let m: EvalSummary = all.summary();
    Ok(EvalReport {
        step: summary.step,
        samples: summary.records,
        auc: m.auc,
        logloss: m.logloss,
        accuracy: m.accuracy,
        ne: m.ne,
        calibration: m.calibration,
        pr_auc: m.pr_auc,
        gauc: m.gauc,
        bad_records: summary.bad_records,
    })
}
