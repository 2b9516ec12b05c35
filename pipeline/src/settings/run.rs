//! The run's length, batches, seed, evaluation and reporting.

use super::range::ranged;
use crate::PipelineError;
use clap::Args;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use tiderec_operators::ConfigError;

/// How long the run trains, on what batches, when it evaluates and what it reports.
#[derive(Clone, Debug, PartialEq, Args, Serialize, Deserialize)]
#[serde(default)]
pub struct RunSettings {
    /// Passes over the training data.
    #[arg(long, required = false, value_name = "N", value_parser = epochs::RANGE)]
    #[serde(deserialize_with = "epochs::deserialize")]
    pub epochs: u64,
    /// Stop after this many training steps (or earlier, when --epochs passes over the data end first; the run then says so).
    #[arg(long, value_name = "N", value_parser = steps::RANGE)]
    #[serde(deserialize_with = "steps::deserialize")]
    pub steps: Option<u64>,
    /// Global batch size (union of all workers' micro-batches).
    #[arg(long, required = false, value_name = "N", value_parser = batch_size::RANGE)]
    #[serde(deserialize_with = "batch_size::deserialize")]
    pub batch_size: usize,
    /// Evaluation batch size.
    #[arg(long, required = false, value_name = "N", value_parser = eval_batch_size::RANGE)]
    #[serde(deserialize_with = "eval_batch_size::deserialize")]
    pub eval_batch_size: usize,
    /// Seed of data, initialisation and shuffles (not of feature hashing: --hash-seed).
    #[arg(long, required = false, value_name = "SEED", value_parser = seed::RANGE)]
    #[serde(deserialize_with = "seed::deserialize")]
    pub seed: u64,
    /// Also evaluate every N global training steps (an eval split is evaluated at every epoch's end anyway).
    #[arg(long, value_name = "N", value_parser = eval_every::RANGE)]
    #[serde(deserialize_with = "eval_every::deserialize")]
    pub eval_every: Option<u64>,
    /// Stop after PATIENCE evaluations in a row without improvement; the final model, metrics and
    /// `best` checkpoint are then the best evaluation's.
    #[arg(long, value_name = "PATIENCE", value_parser = early_stop::RANGE)]
    #[serde(deserialize_with = "early_stop::deserialize")]
    pub early_stop: Option<u64>,
    /// The figure that ranks evaluations: auc (higher is better) or logloss (lower is better).
    #[arg(long, required = false, value_name = "auc|logloss", value_parser = super::parse::<BestMetric>)]
    pub best_metric: BestMetric,
    /// Refuse to start when the memory estimate exceeds this per process: auto (what the system
    /// reports available), unlimited, or a size such as 8G.
    #[arg(long, required = false, value_name = "BYTES|auto|unlimited", value_parser = super::parse::<MemoryLimit>)]
    pub max_memory: MemoryLimit,
    /// Write the final summary as one JSON object here.
    #[arg(long, value_name = "FILE")]
    pub metrics_json: Option<PathBuf>,
    /// Append one JSON line of metrics per report to this file (input of `tiderec plot`): train
    /// about once a second and after every evaluation, online every --report-seconds.
    #[arg(long, value_name = "FILE")]
    pub metrics_log: Option<PathBuf>,
    /// Also write each of those reports as TensorBoard scalars, to a new event file in this
    /// directory (made if missing): loss, throughput, bad records, and the latest evaluation's
    /// (train) or the prequential window's (online) AUC, logloss, NE, calibration, PR-AUC and
    /// GAUC; online also the lag and the checkpoint age.
    #[arg(long, value_name = "DIR")]
    pub tensorboard: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (process 0; port 0: any free port, the
    /// address is printed): samples, steps, training loss, bad records, the window's AUC, log
    /// loss, NE, calibration, PR-AUC and GAUC (train: the latest evaluation's; online: the
    /// prequential window's), checkpoint age and, online, the lag of every partition.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// Progress display: auto (a bar on a terminal, lines otherwise), bar, lines or none.
    #[arg(long, required = false, value_name = "auto|bar|lines|none", value_parser = super::parse::<ProgressMode>)]
    pub progress: ProgressMode,
}

// The ranges of the numeric settings above, one per setting.
ranged!(epochs: u64, closed(1, 1_000_000));
ranged!(steps: u64, closed(0, MAX_STEPS));
ranged!(batch_size: usize, closed(1, MAX_BATCH));
ranged!(eval_batch_size: usize, closed(1, MAX_BATCH));
ranged!(seed: u64, closed(0, u64::MAX));
ranged!(eval_every: u64, closed(1, MAX_STEPS));
ranged!(early_stop: u64, closed(1, 1_000_000));

impl Default for RunSettings {
    fn default() -> Self {
        RunSettings {
            epochs: 1,
            steps: None,
            batch_size: 128,
            eval_batch_size: 4096,
            seed: tiderec_operators::train::DEFAULT_SEED,
            eval_every: None,
            early_stop: None,
            best_metric: BestMetric::Auc,
            max_memory: MemoryLimit::Auto,
            metrics_json: None,
            metrics_log: None,
            tensorboard: None,
            metrics_addr: None,
            progress: ProgressMode::Auto,
        }
    }
}

/// The `max_memory` setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum MemoryLimit {
    /// The memory the system reports available (`MemAvailable`, and a cgroup limit if lower);
    /// no check where neither can be read.
    #[default]
    Auto,
    /// No check.
    Unlimited,
    /// At most this many bytes per process.
    Bytes(u64),
}

impl std::str::FromStr for MemoryLimit {
    type Err = ConfigError;
    /// `auto`, `unlimited`, or a size: `8000000000`, `512M`, `8G`, `1.5GiB`, `2T` (binary units).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad =
            || ConfigError::new("max_memory", format!("`{s}` is not auto, unlimited or a size such as 8G or 512MiB"));
        match s.trim() {
            "auto" => return Ok(MemoryLimit::Auto),
            "unlimited" => return Ok(MemoryLimit::Unlimited),
            _ => {}
        }
        let t = s.trim();
        let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
        let (number, scale) = match t.char_indices().last() {
            Some((i, c)) if c.is_ascii_alphabetic() => {
                let shift = match c.to_ascii_uppercase() {
                    'K' => 10,
                    'M' => 20,
                    'G' => 30,
                    'T' => 40,
                    _ => return Err(bad()),
                };
                (&t[..i], (1u64 << shift) as f64)
            }
            _ => (t, 1.0),
        };
        let v: f64 = number.trim().parse().map_err(|_| bad())?;
        let bytes = v * scale;
        if !(bytes.is_finite() && bytes >= 1.0 && bytes < u64::MAX as f64) {
            return Err(bad());
        }
        Ok(MemoryLimit::Bytes(bytes as u64))
    }
}

impl std::fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MemoryLimit::Auto => f.write_str("auto"),
            MemoryLimit::Unlimited => f.write_str("unlimited"),
            MemoryLimit::Bytes(n) => write!(f, "{n}"),
        }
    }
}

impl TryFrom<String> for MemoryLimit {
    type Error = ConfigError;
    fn try_from(s: String) -> Result<Self, ConfigError> {
        s.parse()
    }
}

impl From<MemoryLimit> for String {
    fn from(m: MemoryLimit) -> String {
        m.to_string()
    }
}

/// The figure that ranks evaluations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BestMetric {
    /// Higher AUC is better.
    Auc,
    /// Lower log loss is better.
    Logloss,
}

impl std::str::FromStr for BestMetric {
    type Err = PipelineError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auc" => Ok(BestMetric::Auc),
            "logloss" => Ok(BestMetric::Logloss),
            other => Err(PipelineError::config("best_metric", format!("`{other}` is not auc or logloss"))),
        }
    }
}

impl std::fmt::Display for BestMetric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BestMetric::Auc => "auc",
            BestMetric::Logloss => "logloss",
        })
    }
}

super::named::named_setting! {
    /// How progress is shown (`--progress`).
    pub enum ProgressMode for "progress" {
        /// A bar on a terminal, lines otherwise.
        Auto = "auto",
        /// Always a bar.
        Bar = "bar",
        /// One line every few seconds.
        Lines = "lines",
        /// Silent.
        None = "none",
    }
}
