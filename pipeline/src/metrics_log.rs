//! The JSON-lines metrics log of `train` and `online` (`--metrics-log`), read
//! back by `tiderec plot`: one [`MetricsRecord`] per line, flushed as it is
//! written, so a reader sees every complete line of a run still in progress.
//! The same records go to TensorBoard (`--tensorboard`, [`crate::tensorboard`]).
//!
//! The `window_*` figures are the prequential window's (`online`) or the
//! latest evaluation's of the held-out split (`train`). Fields added later
//! default to `null`, so older logs still read.

use crate::error::DataflowFailure;
use crate::settings::RunSettings;
use crate::tensorboard::EventFile;
use crate::PipelineError;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use tiderec_operators::metrics::EvalSummary;

/// One line of the JSON-lines metrics log.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsRecord {
    /// Seconds since the run started.
    pub time_s: f64,
    /// Global training steps so far.
    pub step: u64,
    /// Training samples so far.
    pub samples: u64,
    /// Training throughput since the run started.
    pub samples_per_sec: f64,
    /// Mean training loss of the recent steps.
    pub loss: f64,
    /// Prequential AUC over the window (null with one class only).
    pub window_auc: Option<f64>,
    /// Prequential log loss over the window.
    pub window_logloss: Option<f64>,
    /// Normalized entropy over the window (null with one class only).
    #[serde(default)]
    pub window_ne: Option<f64>,
    /// Mean prediction over observed CTR in the window (null without positives).
    #[serde(default)]
    pub window_calibration: Option<f64>,
    /// PR-AUC (average precision) over the window (null without positives).
    #[serde(default)]
    pub window_pr_auc: Option<f64>,
    /// GAUC over the window (null without a user column, or no user with both classes).
    #[serde(default)]
    pub window_gauc: Option<f64>,
    /// Records behind the end of the partitions this process owns.
    pub lag: i64,
    /// Seconds since the last checkpoint (null before the first).
    pub checkpoint_age_s: Option<f64>,
    /// Malformed records skipped so far.
    pub bad_records: u64,
    /// `train`: the epoch the step belongs to (0-based); `null` in `online`.
    #[serde(default)]
    pub epoch: Option<u64>,
    /// `train`: the step of the evaluation whose figures the `window_*` fields hold (`null`
    /// before the first, and in `online`, whose window is prequential).
    #[serde(default)]
    pub evaluated_step: Option<u64>,
    /// `train`: the step of the best evaluation so far by `--best-metric`.
    #[serde(default)]
    pub best_step: Option<u64>,
}

impl MetricsRecord {
    /// Sets the `window_*` figures from `figures` (all `None` without).
    pub fn set_window(&mut self, figures: Option<&EvalSummary>) {
        let f = |get: fn(&EvalSummary) -> Option<f64>| figures.and_then(get);
        self.window_auc = f(|s| s.auc);
        self.window_logloss = f(|s| s.logloss);
        self.window_ne = f(|s| s.ne);
        self.window_calibration = f(|s| s.calibration);
        self.window_pr_auc = f(|s| s.pr_auc);
        self.window_gauc = f(|s| s.gauc);
    }
}

/// Where the reports go: JSON lines appended to a file (`--metrics-log`), TensorBoard
/// scalars (`--tensorboard`), or both.
pub struct MetricsLog {
    file: Option<(std::io::BufWriter<std::fs::File>, PathBuf)>,
    /// The event file, and whether the reports are `online`'s (prequential window, lag).
    events: Option<(EventFile, bool)>,
}

impl MetricsLog {
    /// Creates (truncates) `path`, or appends to it when `append`.
    pub fn create(path: &Path, append: bool) -> Result<Self, PipelineError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(append)
            .write(true)
            .truncate(!append)
            .open(path)
            .map_err(|e| PipelineError::config("metrics_log", format!("cannot open {}: {e}", path.display())))?;
        Ok(MetricsLog { file: Some((std::io::BufWriter::new(file), path.to_path_buf())), events: None })
    }

    /// The reports of a run with `settings`, or `None` when it asks for none: the metrics
    /// log appended to when `append` (a resumed run), a new TensorBoard event file.
    pub fn for_run(settings: &RunSettings, append: bool, online: bool) -> Result<Option<Self>, PipelineError> {
        let mut log = match &settings.metrics_log {
            Some(path) => Self::create(path, append)?,
            None => MetricsLog { file: None, events: None },
        };
        if let Some(dir) = &settings.tensorboard {
            log.events = Some((EventFile::create(dir)?, online));
        }
        Ok((log.file.is_some() || log.events.is_some()).then_some(log))
    }

    /// Writes one record as a line and flushes it, and as an event of scalars.
    pub fn write(&mut self, r: &MetricsRecord) -> Result<(), PipelineError> {
        if let Some((file, path)) = &mut self.file {
            let error = |path: &Path| format!("cannot write the metrics log {}", path.display());
            let line = serde_json::to_string(r)
                .map_err(|e| PipelineError::dataflow(DataflowFailure::Output, error(path)).with_source(e))?;
            writeln!(file, "{line}")
                .and_then(|_| file.flush())
                .map_err(|e| PipelineError::dataflow(DataflowFailure::Output, error(path)).with_source(e))?;
        }
        if let Some((events, online)) = &mut self.events {
            events.scalars(r.step, &scalars(r, *online))?;
        }
        Ok(())
    }
}

/// The TensorBoard scalars of a record: `train/…`, `eval/…` (train's latest evaluation) or
/// `window/…` (online's prequential window), and `online/…`; figures that are `null` are
/// left out.
fn scalars(r: &MetricsRecord, online: bool) -> Vec<(&'static str, f64)> {
    let mut out = vec![
        ("train/loss", r.loss),
        ("train/samples_per_sec", r.samples_per_sec),
        ("train/samples", r.samples as f64),
        ("train/bad_records", r.bad_records as f64),
    ];
    let figures = [r.window_auc, r.window_logloss, r.window_ne, r.window_calibration, r.window_pr_auc, r.window_gauc];
    let tags = if online {
        ["window/auc", "window/logloss", "window/ne", "window/calibration", "window/pr_auc", "window/gauc"]
    } else {
        ["eval/auc", "eval/logloss", "eval/ne", "eval/calibration", "eval/pr_auc", "eval/gauc"]
    };
    out.extend(tags.into_iter().zip(figures).filter_map(|(tag, v)| Some((tag, v?))));
    if online {
        out.push(("online/lag", r.lag as f64));
        out.extend(r.checkpoint_age_s.map(|a| ("online/checkpoint_age_s", a)));
    }
    out
}

/// Reads a JSON-lines metrics log; a malformed line is an error naming its number.
pub fn read_log(path: &Path) -> Result<Vec<MetricsRecord>, PipelineError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| PipelineError::config("metrics", format!("cannot read {}: {e}", path.display())))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| PipelineError::config("metrics", format!("{}:{}: {e}", path.display(), i + 1)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_round_trip_and_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let mut log = MetricsLog::create(&path, false).unwrap();
        let r = MetricsRecord { step: 1, samples: 10, window_auc: None, loss: 0.5, ..Default::default() };
        log.write(&r).unwrap();
        log.write(&MetricsRecord { step: 2, ..r.clone() }).unwrap();
        let back = read_log(&path).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0], r);
        // A line written before the NE, calibration, PR-AUC and GAUC fields existed.
        let old = r#"{"time_s":1.0,"step":3,"samples":30,"samples_per_sec":30.0,"loss":0.5,"window_auc":0.7,"window_logloss":0.4,"lag":0,"checkpoint_age_s":null,"bad_records":0}"#;
        std::fs::write(&path, format!("{old}\n")).unwrap();
        let back = read_log(&path).unwrap();
        assert_eq!((back[0].window_auc, back[0].window_ne, back[0].window_gauc), (Some(0.7), None, None));
        std::fs::write(&path, "{\"step\": 1}\nnot json\n").unwrap();
        let e = read_log(&path).unwrap_err().to_string();
        assert!(e.contains(":1:") || e.contains(":2:"), "{e}");
    }
}
