//! The files a `train` or `online` run reads and writes besides its checkpoints,
//! as [`Named`] paths for [`crate::paths::check_outputs`], and the check that its
//! summary files replace no existing file unasked ([`check_replaced`]).
//!
//! Kept apart from [`crate::paths`], which depends on nothing else of the crate,
//! so that the error type can name the checker's errors without a module cycle.

use crate::paths::{check_new_in_place, data_dirs, data_files, spec_files, tree_files, Named, PathError};
use crate::TrainSettings;
use std::path::Path;

/// The files a `train` or `online` run with `settings` reads: `--config` (when given), the
/// data, the evaluation data, the spec and its vocabularies, the hosts file, and the
/// checkpoint directory when resuming.
pub fn train_inputs(settings: &TrainSettings, config: Option<&Path>) -> Result<Vec<Named>, PathError> {
    let mut inputs: Vec<Named> = config.map(|c| Named::new("--config", c)).into_iter().collect();
    inputs.extend(data_files("--data", &settings.data.source)?);
    if let Some(eval) = &settings.data.eval {
        inputs.extend(data_files("--eval", eval)?);
    }
    if let Some(spec) = &settings.data.spec {
        inputs.extend(spec_files(spec));
    }
    if let Some(hosts) = &settings.cluster.hosts {
        inputs.push(Named::new("--hosts", hosts));
    }
    if let (true, Some(dir)) = (settings.checkpoints.resume, &settings.checkpoints.checkpoint_dir) {
        inputs.extend(tree_files("--checkpoint-dir", dir)?);
    }
    Ok(inputs)
}

/// The directories a `train` run reads as data (`--data`, `--eval`): no output may go
/// into one ([`crate::paths::check_outside`]).
pub fn train_data_dirs(settings: &TrainSettings) -> Vec<Named> {
    let mut dirs = data_dirs("--data", &settings.data.source);
    if let Some(eval) = &settings.data.eval {
        dirs.extend(data_dirs("--eval", eval));
    }
    dirs
}

/// The files a `train` or `online` run with `settings` writes besides checkpoints: this
/// process's dead letters, the metrics JSON and the metrics log.
pub fn train_outputs(settings: &TrainSettings) -> Vec<Named> {
    let mut outputs = vec![Named::new("--dead-letters", crate::run::dead_letters_path(settings))];
    if let Some(p) = &settings.run.metrics_json {
        outputs.push(Named::new("--metrics-json", p));
    }
    if let Some(p) = &settings.run.metrics_log {
        outputs.push(Named::new("--metrics-log", p));
    }
    outputs
}

/// Refuses an existing `--metrics-json`, `--metrics-log` (and `summary`, `online`'s
/// `--summary-json`) unless `overwrite` (`--overwrite`) or `--resume`: a resumed run
/// continues the run that wrote them, replaces its summary and appends to its log.
pub fn check_replaced(settings: &TrainSettings, summary: Option<Named>, overwrite: bool) -> Result<(), PathError> {
    let replace = overwrite || settings.checkpoints.resume;
    let metrics = settings.run.metrics_json.as_ref().map(|p| Named::new("--metrics-json", p));
    let log = settings.run.metrics_log.as_ref().map(|p| Named::new("--metrics-log", p));
    // The metrics JSON and the summary go to a device directly, the log always.
    for output in metrics.into_iter().chain(log).chain(summary) {
        check_new_in_place(&output, replace)?;
    }
    Ok(())
}
