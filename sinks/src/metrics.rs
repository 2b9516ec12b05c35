//! The run summary: one JSON object written at the end of a run.
//!
//! The file is written to a temporary name beside the target and renamed,
//! so a reader never sees a half-written summary.

use crate::SinkError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use tiderec_operators::metrics::EvalSummary;

/// Final metrics of a training run (the `--metrics-json` object).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// Exact AUC on the evaluation split (NaN → null when one class only or no eval data).
    pub auc: Option<f64>,
    /// Mean log loss on the evaluation split.
    pub logloss: Option<f64>,
    /// Accuracy at 0.5 on the evaluation split.
    pub accuracy: Option<f64>,
    /// Normalized entropy on the evaluation split (log loss over the entropy of its CTR;
    /// null with one class only).
    #[serde(default)]
    pub ne: Option<f64>,
    /// Calibration on the evaluation split: mean prediction over observed CTR (null
    /// without positives).
    #[serde(default)]
    pub calibration: Option<f64>,
    /// PR-AUC (average precision) on the evaluation split (null without positives).
    #[serde(default)]
    pub pr_auc: Option<f64>,
    /// GAUC on the evaluation split: per-user AUC weighted by impressions (null when the
    /// data names no user column or no user has both classes).
    #[serde(default)]
    pub gauc: Option<f64>,
    /// Mean training loss over the last steps (the running loss shown during training).
    pub train_loss: f64,
    /// Mean training loss over the whole run.
    pub train_loss_mean: f64,
    /// Training samples processed (all epochs, all workers).
    pub samples: u64,
    /// Training steps with at least one sample.
    pub steps: u64,
    /// Training samples per second of wall time spent training.
    pub samples_per_sec: f64,
    /// Number of timely workers over all processes.
    pub workers: usize,
    /// Malformed records skipped (all reasons).
    pub bad_records: u64,
    /// Malformed records by reason.
    pub bad_records_by_reason: BTreeMap<String, u64>,
    /// L2 norm of all parameters, dense and embedding, in f64.
    pub params_l2: f64,
    /// AUC of the hidden teacher on the evaluation split (synthetic data only).
    pub teacher_auc: Option<f64>,
    /// Bytes exchanged between workers per training sample.
    pub bytes_per_sample: f64,
    /// Evaluation samples.
    pub eval_samples: u64,
    /// Epochs completed.
    pub epochs: u64,
    /// Seconds spent training (excluding set-up and evaluation).
    pub train_seconds: f64,
    /// Dense parameter count.
    pub dense_params: u64,
    /// Embedding rows over all tables.
    pub embedding_rows: u64,
    /// Checkpoints written by this run.
    #[serde(default)]
    pub checkpoints_written: u64,
    /// Seconds training stood still for them: snapshots and waits for a
    /// write in flight (included in `train_seconds`).
    #[serde(default)]
    pub checkpoint_seconds: f64,
    /// Seconds from each checkpoint's snapshot to its being durable, summed
    /// (written in the background unless `--checkpoint-sync`).
    #[serde(default)]
    pub checkpoint_write_seconds: f64,
    /// Training steps taken while a checkpoint was being written.
    #[serde(default)]
    pub checkpoint_overlap_steps: u64,
    /// The step of the checkpoint this run resumed from (`null`: it started fresh).
    #[serde(default)]
    pub resumed_from_step: Option<u64>,
    /// The step after which a SIGINT/SIGTERM stopped the run (`null`: it ran to its end);
    /// an interrupted run skips evaluation.
    #[serde(default)]
    pub interrupted_at_step: Option<u64>,
    /// Embedding store counters summed over this process's workers (lookups and
    /// hits per tier, rows per tier, admissions, evictions).
    #[serde(default)]
    pub store: tiderec_operators::store::StoreStats,
    /// The run's resolved configuration: every setting, and the values the run derived
    /// from them (learning rates, table sizes, model shape), so the file says what produced it.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub config: serde_json::Value,
    /// Every evaluation of the held-out split, in order: each epoch's end, every
    /// `--eval-every` steps, and the run's end (empty without an eval split).
    #[serde(default)]
    pub evaluations: Vec<Evaluation>,
    /// The step of the best evaluation (`--best-metric`); `null` without evaluations.
    #[serde(default)]
    pub best_step: Option<u64>,
    /// The step after which `--early-stop` ended training (`null`: it did not); the
    /// model, `params_l2` and the eval metrics above are then the best step's.
    #[serde(default)]
    pub early_stopped_at_step: Option<u64>,
}

/// One evaluation of the held-out split.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Global training steps taken when it ran.
    pub step: u64,
    /// Epochs completed when it ran.
    pub epoch: u64,
    /// Exact AUC (`null` when undefined: one class only).
    pub auc: Option<f64>,
    /// Mean log loss.
    pub logloss: Option<f64>,
    /// Accuracy at 0.5.
    pub accuracy: Option<f64>,
    /// Normalized entropy (`null` with one class only).
    #[serde(default)]
    pub ne: Option<f64>,
    /// Mean prediction over observed CTR (`null` without positives).
    #[serde(default)]
    pub calibration: Option<f64>,
    /// PR-AUC: average precision (`null` without positives).
    #[serde(default)]
    pub pr_auc: Option<f64>,
    /// Per-user AUC weighted by impressions (`null` without a user column, or when no
    /// user has both classes).
    #[serde(default)]
    pub gauc: Option<f64>,
    /// Samples scored.
    pub samples: u64,
}

impl Evaluation {
    /// The evaluation of `summary` after `step` steps and `epoch` epochs.
    pub fn of(step: u64, epoch: u64, summary: &EvalSummary) -> Self {
        Evaluation {
            step,
            epoch,
            auc: summary.auc,
            logloss: summary.logloss,
            accuracy: summary.accuracy,
            ne: summary.ne,
            calibration: summary.calibration,
            pr_auc: summary.pr_auc,
            gauc: summary.gauc,
            samples: summary.samples,
        }
        .normalized()
    }

    /// Its figures as an [`EvalSummary`].
    pub fn summary(&self) -> EvalSummary {
        EvalSummary {
            auc: self.auc,
            logloss: self.logloss,
            accuracy: self.accuracy,
            ne: self.ne,
            calibration: self.calibration,
            pr_auc: self.pr_auc,
            gauc: self.gauc,
            samples: self.samples,
        }
    }

    /// Replaces non-finite metrics by `None` (JSON has no NaN).
    pub fn normalized(mut self) -> Self {
        for v in [
            &mut self.auc,
            &mut self.logloss,
            &mut self.accuracy,
            &mut self.ne,
            &mut self.calibration,
            &mut self.pr_auc,
            &mut self.gauc,
        ] {
            *v = finite(*v);
        }
        self
    }
}

fn finite(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite())
}

impl RunSummary {
    /// Replaces non-finite optional metrics by `None` (JSON has no NaN).
    pub fn normalized(mut self) -> Self {
        for v in [
            &mut self.auc,
            &mut self.logloss,
            &mut self.accuracy,
            &mut self.ne,
            &mut self.calibration,
            &mut self.pr_auc,
            &mut self.gauc,
            &mut self.teacher_auc,
        ] {
            *v = finite(*v);
        }
        self.evaluations = self.evaluations.into_iter().map(Evaluation::normalized).collect();
        self
    }

    /// Writes the summary as one pretty-printed JSON object to `path`: a file atomically,
    /// through a temporary file of this process's own beside it (`NAME.tmp-PID`, which no
    /// other file or run shares); a device or pipe (`/dev/stdout`) directly.
    pub fn write_json(&self, path: &Path) -> Result<(), SinkError> {
        let io = |source| SinkError::Io { path: path.display().to_string(), source };
        let json = serde_json::to_string_pretty(&self.clone().normalized()).expect("summary serialises");
        let text = json + "\n";
        if std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
            return std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|mut f| f.write_all(text.as_bytes()))
                .map_err(io);
        }
        let tmp = crate::temp::temp_beside(path);
        let written = std::fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
            .and_then(|()| std::fs::rename(&tmp, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temporary_file_of_its_own_and_devices_written_directly() {
        let dir = tempfile::tempdir().unwrap();
        // `results.txt`'s old temporary name was `results.json.tmp`: someone else's file.
        let theirs = dir.path().join("results.json.tmp");
        std::fs::write(&theirs, "keep me").unwrap();
        let path = dir.path().join("results.txt");
        let s = RunSummary { params_l2: 1.5, ..Default::default() };
        s.write_json(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&theirs).unwrap(), "keep me");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "no temporary file left: {names:?}");
        s.write_json(Path::new("/dev/null")).unwrap();
    }

    #[test]
    fn writes_valid_json_without_nan() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        let s = RunSummary { auc: Some(f64::NAN), params_l2: 3.5, workers: 2, ..Default::default() };
        s.write_json(&path).unwrap();
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert!(v["auc"].is_null());
        assert_eq!(v["params_l2"], 3.5);
        assert_eq!(v["workers"], 2);
    }

    #[test]
    fn evaluations_carry_every_metric_and_older_ones_read_without_the_newer() {
        let figures = EvalSummary {
            auc: Some(f64::NAN),
            ne: Some(0.9),
            pr_auc: Some(0.4),
            gauc: Some(0.6),
            samples: 7,
            ..Default::default()
        };
        let e = Evaluation::of(5, 1, &figures);
        assert_eq!((e.step, e.epoch, e.samples), (5, 1, 7));
        assert_eq!(e.auc, None, "NaN is no figure");
        assert_eq!(e.summary(), EvalSummary { auc: None, ..figures });
        // An evaluation recorded before NE, calibration, PR-AUC and GAUC existed (a checkpoint's).
        let old: Evaluation =
            serde_json::from_str(r#"{"step":3,"epoch":1,"auc":0.7,"logloss":0.5,"accuracy":0.8,"samples":10}"#)
                .unwrap();
        assert_eq!((old.auc, old.ne, old.calibration, old.pr_auc, old.gauc), (Some(0.7), None, None, None, None));
    }

    #[test]
    fn unwritable_path_names_it() {
        let e = RunSummary::default().write_json(Path::new("/nonexistent-dir/x.json")).unwrap_err();
        assert!(e.to_string().contains("/nonexistent-dir"), "{e}");
    }
}
