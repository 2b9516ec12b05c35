//! The JSON-lines metrics log of `train` and `online` (`--metrics-log`), read
//! back by `tiderec plot`: one [`MetricsRecord`] per line, flushed as it is
//! written, so a reader sees every complete line of a run still in progress.
//! The same records go to TensorBoard (`--tensorboard`, [`crate::tensorboard`]).
//!
//! The `window_*` figures are the prequential window's (`online`) or the
//! latest evaluation's of the held-out split (`train`). Fields added later
//! default to `null`, so older logs still read.
//!
//! Invariant: the steps of a log's records increase strictly, across resumes too. A run
//! resumed from the checkpoint of step `S` first cuts the log to the records of steps
//! `≤ S` (what the interrupted run wrote after its checkpoint is done again, and written
//! again, by the resumed run), rewriting it whole beside itself and renaming it over
//! itself, then appends ([`MetricsLog::for_run`]). A line that is not a record is kept
//! where it stands, with a warning; a log that is not a regular file (`/dev/null`) is
//! only appended to.

use crate::error::DataflowFailure;
use crate::settings::RunSettings;
use crate::tensorboard::EventFile;
use crate::PipelineError;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use tiderec_operators::metrics::EvalSummary;
use tiderec_sinks::checkpoint::write::sync_parent;

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

    /// Opens `path` to continue the log of a run resumed from the checkpoint of step
    /// `step`: the records of later steps are removed first ([`cut_after`]), then the
    /// resumed run's records are appended.
    pub fn resume(path: &Path, step: u64) -> Result<Self, PipelineError> {
        let cut = cut_after(path, step)?;
        if cut.dropped > 0 {
            eprintln!(
                "metrics log {}: removed {} record(s) after step {step}, which the resumed run writes again",
                path.display(),
                cut.dropped
            );
        }
        for line in &cut.not_records {
            eprintln!("warning: metrics log {}:{line} is not a record; kept as it is", path.display());
        }
        Self::create(path, true)
    }

    /// The reports of a run with `settings`, or `None` when it asks for none: a new
    /// TensorBoard event file (the events of earlier runs after `resumed_step` removed first,
    /// [`EventFile::resume`]), and the metrics log, created, or continued when the run
    /// resumes the checkpoint of step `resumed_step` ([`MetricsLog::resume`]), or appended
    /// to as it is when `resume` (`--resume`) found no checkpoint.
    pub fn for_run(
        settings: &RunSettings,
        resumed_step: Option<u64>,
        resume: bool,
        online: bool,
    ) -> Result<Option<Self>, PipelineError> {
        let mut log = match (&settings.metrics_log, resumed_step) {
            (Some(path), Some(step)) => Self::resume(path, step)?,
            (Some(path), None) => Self::create(path, resume)?,
            (None, _) => MetricsLog { file: None, events: None },
        };
        if let Some(dir) = &settings.tensorboard {
            let events = match resumed_step {
                Some(step) => EventFile::resume(dir, step)?,
                None => EventFile::create(dir)?,
            };
            log.events = Some((events, online));
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

/// What [`cut_after`] did to a log.
#[derive(Debug, Default, PartialEq)]
pub struct Cut {
    /// Records removed (their step was after the cut).
    pub dropped: u64,
    /// The 1-based numbers of the non-blank lines that are not records, kept where they stand.
    pub not_records: Vec<u64>,
}

/// Removes from the metrics log at `path` the records of steps after `step`, keeping
/// every other line (records of steps `≤ step`, lines that are not records, blank lines)
/// as it is, in order. The log is rewritten only when a record goes: whole, into a
/// temporary file beside it that is synced and renamed over it (its directory synced
/// too), so an interrupt or a full disk leaves the log as it was. A missing log, or one
/// that is not a regular file (`/dev/null`, a pipe), is left alone.
pub fn cut_after(path: &Path, step: u64) -> Result<Cut, PipelineError> {
    let error = |what: &str, p: &Path, e: std::io::Error| {
        PipelineError::config("metrics_log", format!("cannot {what} {}: {e}", p.display()))
    };
    // The file a link names is the one rewritten: the link stays.
    let path = match std::fs::canonicalize(path) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Cut::default()),
        Err(e) => return Err(error("read", path, e)),
    };
    let meta = std::fs::metadata(&path).map_err(|e| error("read", &path, e))?;
    if !meta.is_file() {
        return Ok(Cut::default());
    }
    // Read first: a log with nothing to drop is left as it is (no copy, nothing created beside it).
    if let Some(cut) = nothing_after(&path, step).map_err(|e| error("read", &path, e))? {
        return Ok(cut);
    }
    let mut reader = std::io::BufReader::new(std::fs::File::open(&path).map_err(|e| error("read", &path, e))?);
    let tmp = tiderec_sinks::temp::temp_beside(&path);
    let rewritten = (|| -> Result<Cut, PipelineError> {
        let file = std::fs::File::create(&tmp).map_err(|e| error("create", &tmp, e))?;
        let mut out = std::io::BufWriter::new(file);
        let (mut cut, mut line, mut number) = (Cut::default(), Vec::new(), 0u64);
        loop {
            line.clear();
            if reader.read_until(b'\n', &mut line).map_err(|e| error("read", &path, e))? == 0 {
                break;
            }
            number += 1;
            if !line.trim_ascii().is_empty() {
                match serde_json::from_slice::<MetricsRecord>(&line) {
                    Ok(r) if r.step > step => {
                        cut.dropped += 1;
                        continue;
                    }
                    Ok(_) => {}
                    Err(_) => cut.not_records.push(number),
                }
            }
            out.write_all(&line).map_err(|e| error("write", &tmp, e))?;
            // A last line cut short (a killed writer) ends its line in the rewrite: appends start anew.
            if !line.ends_with(b"\n") {
                out.write_all(b"\n").map_err(|e| error("write", &tmp, e))?;
            }
        }
        if cut.dropped > 0 {
            let file = out.into_inner().map_err(|e| error("write", &tmp, e.into_error()))?;
            file.set_permissions(meta.permissions()).map_err(|e| error("write", &tmp, e))?;
            file.sync_all().map_err(|e| error("write", &tmp, e))?;
            std::fs::rename(&tmp, &path).map_err(|e| error("replace", &path, e))?;
        }
        Ok(cut)
    })();
    match rewritten {
        Ok(cut) if cut.dropped > 0 => {
            sync_parent(&path)?;
            Ok(cut)
        }
        other => {
            let _ = std::fs::remove_file(&tmp);
            other
        }
    }
}

/// The log at `path` read without changing it: `Some` (its lines that are not
/// records) when no record is after `step`, `None` when one is.
fn nothing_after(path: &Path, step: u64) -> std::io::Result<Option<Cut>> {
    let mut reader = std::io::BufReader::new(std::fs::File::open(path)?);
    let (mut cut, mut line, mut number) = (Cut::default(), Vec::new(), 0u64);
    while reader.read_until(b'\n', &mut line)? > 0 {
        number += 1;
        if !line.trim_ascii().is_empty() {
            match serde_json::from_slice::<MetricsRecord>(&line) {
                Ok(r) if r.step > step => return Ok(None),
                Ok(_) => {}
                Err(_) => cut.not_records.push(number),
            }
        }
        line.clear();
    }
    Ok(Some(cut))
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

    fn line(step: u64) -> String {
        serde_json::to_string(&MetricsRecord { step, loss: 0.5, ..Default::default() }).unwrap()
    }

    fn steps(path: &Path) -> Vec<u64> {
        read_log(path).unwrap().iter().map(|r| r.step).collect()
    }

    #[test]
    fn a_resumed_log_keeps_the_records_up_to_its_checkpoint_then_appends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        // The interrupted run logged steps 1 to 8; its checkpoint is of step 5.
        let old: String = [1, 3, 5, 6, 8].map(|s| line(s) + "\n").concat();
        std::fs::write(&path, &old).unwrap();
        let mut log = MetricsLog::resume(&path, 5).unwrap();
        for step in [6, 7, 9] {
            log.write(&MetricsRecord { step, ..Default::default() }).unwrap();
        }
        drop(log);
        assert_eq!(steps(&path), [1, 3, 5, 6, 7, 9]);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(&[1, 3, 5].map(|s| line(s) + "\n").concat()), "kept as written:\n{text}");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["m.jsonl"], "no temporary file left");
    }

    #[test]
    fn cutting_keeps_lines_that_are_not_records_and_rewrites_only_to_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        // A line that is not a record, a blank one and a last line cut short by a kill.
        let text = format!("{}\nnot json\n\n{}\n{}\n{{\"time_s\":1.0,\"st", line(1), line(4), line(7));
        std::fs::write(&path, &text).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        }
        // Nothing after step 7: the file is not touched (not even its last line).
        assert_eq!(cut_after(&path, 7).unwrap(), Cut { dropped: 0, not_records: vec![2, 6] });
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        let cut = cut_after(&path, 4).unwrap();
        assert_eq!(cut, Cut { dropped: 1, not_records: vec![2, 6] });
        let want = format!("{}\nnot json\n\n{}\n{{\"time_s\":1.0,\"st\n", line(1), line(4));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), want);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640);
        }
        // No log yet, or a device: nothing to cut.
        assert_eq!(cut_after(&dir.path().join("missing.jsonl"), 0).unwrap(), Cut::default());
        #[cfg(unix)]
        assert_eq!(cut_after(Path::new("/dev/null"), 0).unwrap(), Cut::default());
    }

    #[cfg(unix)]
    #[test]
    fn cutting_a_linked_log_rewrites_the_file_and_keeps_the_link() {
        let dir = tempfile::tempdir().unwrap();
        let (file, link) = (dir.path().join("m.jsonl"), dir.path().join("link.jsonl"));
        std::fs::write(&file, [1, 2, 3].map(|s| line(s) + "\n").concat()).unwrap();
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(cut_after(&link, 1).unwrap().dropped, 2);
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(steps(&file), [1]);
    }

    #[test]
    fn for_run_cuts_only_a_resumed_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let settings = RunSettings { metrics_log: Some(path.clone()), ..RunSettings::default() };
        let old: String = [1, 5, 8].map(|s| line(s) + "\n").concat();
        // `--resume` without a checkpoint appends to the log as it is.
        std::fs::write(&path, &old).unwrap();
        drop(MetricsLog::for_run(&settings, None, true, false).unwrap());
        assert_eq!(steps(&path), [1, 5, 8]);
        drop(MetricsLog::for_run(&settings, Some(5), true, false).unwrap());
        assert_eq!(steps(&path), [1, 5]);
        drop(MetricsLog::for_run(&settings, None, false, false).unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "", "a new run starts a new log");
    }
}
