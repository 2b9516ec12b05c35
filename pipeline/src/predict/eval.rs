//! `tiderec eval`: the labeled records of a file scored with a checkpoint's model
//! (the path `tiderec predict` takes, with the checkpoint's feature pipeline), the
//! probabilities reduced to AUC and log loss.

use super::{score, ScoreOptions};
use crate::PipelineError;
use serde::Serialize;
use tiderec_operators::metrics::{auc, logloss};

/// What `eval` measured.
#[derive(Clone, Debug, Serialize)]
pub struct EvalReport {
    /// Step of the checkpoint.
    pub step: u64,
    /// Records scored.
    pub samples: u64,
    /// Exact AUC (`None` with one class only).
    pub auc: Option<f64>,
    /// Mean log loss.
    pub logloss: f64,
    /// Malformed records skipped.
    pub bad_records: u64,
}

/// Scores the labeled records of `options.data` with the checkpoint's model.
pub fn eval(options: &ScoreOptions) -> Result<EvalReport, PipelineError> {
    let options = ScoreOptions { labeled: true, ..options.clone() };
    let (mut probs, mut labels) = (Vec::new(), Vec::new());
    let summary = score(&options, crate::budget::Split::Eval, |_, _, p, l| {
        probs.extend_from_slice(p);
        labels.extend_from_slice(l);
        Ok(())
    })?;
    Ok(EvalReport {
        step: summary.step,
        samples: summary.records,
        auc: auc(&probs, &labels),
        logloss: logloss(&probs, &labels),
        bad_records: summary.bad_records,
    })
}
