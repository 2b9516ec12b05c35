//! Where records come from and how malformed ones are handled.
//!
//! [`RecordPolicy`] is its own struct because the scoring commands (`eval`, `predict`) read
//! records under the same four settings without any of training's: they flatten it into
//! their flags through [`OverDefaults`](super::OverDefaults), so its defaults and checks are
//! declared here once.

use crate::PipelineError;
use clap::Args;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use tiderec_operators::bad_record::BadRecordPolicy;

/// The training and evaluation data, the feature layout read from it, and the policy
/// for malformed records.
#[derive(Clone, Debug, PartialEq, Args, Serialize, Deserialize)]
#[serde(default)]
pub struct DataSettings {
    /// `synthetic`, `synthetic-behavior`, or FORMAT:PATH[,PATH…] (files or directories) with FORMAT
    /// criteo, avazu, csv (with --spec), taobao-ad, taobao-behavior, amazon-dien or parquet (`tiderec convert` output).
    #[arg(long = "data", id = "data", required = false, value_name = "SOURCE")]
    #[serde(rename = "data")]
    pub source: String,
    /// Held-out data, same format as --data.
    #[arg(long)]
    pub eval: Option<String>,
    /// Feature spec of `csv:` data: `preset:NAME` (criteo, avazu, elm, elm_y_long, elm_dien, taobao_ad; see
    /// `tiderec spec show NAME`) or a TOML file.
    #[arg(long)]
    pub spec: Option<String>,
    /// Fraction held out for evaluation when --eval is not given (synthetic: fraction of --samples).
    #[arg(long, required = false, value_name = "F")]
    pub eval_fraction: f64,
    /// Synthetic training samples per epoch.
    #[arg(long, required = false, value_name = "N")]
    pub samples: u64,
    /// Rows per embedding table (every table), unless --table-sizes is given.
    #[arg(long, required = false, value_name = "N")]
    pub buckets: u64,
    /// Rows of each embedding table, one entry per sparse field, e.g. 1000,50000,…
    #[arg(long, value_delimiter = ',', value_name = "N,N,…")]
    pub table_sizes: Option<Vec<u64>>,
    /// Longest behaviour history kept per sample (sequence data; the most recent events).
    #[arg(long, required = false, value_name = "N")]
    pub max_len: usize,
    /// Seed of feature hashing (default: the --seed value); recorded in checkpoints.
    #[arg(long, value_name = "SEED")]
    pub hash_seed: Option<u64>,
    /// Malformed records: skip or fail, the dead-letter file, the budget, the longest line.
    #[command(flatten)]
    #[serde(flatten)]
    pub records: RecordPolicy,
}

/// How malformed records are handled while reading (training, evaluation, conversion and
/// scoring alike).
#[derive(Clone, Debug, PartialEq, Args, Serialize, Deserialize)]
#[serde(default)]
pub struct RecordPolicy {
    /// On a malformed record: skip (count it and write it to the dead-letter file) or fail.
    #[arg(long, required = false, value_name = "skip|fail", value_parser = super::parse::<BadRecordPolicy>)]
    pub on_bad_record: BadRecordPolicy,
    /// Dead-letter file for malformed records.
    #[arg(long, required = false, value_name = "FILE")]
    pub dead_letters: PathBuf,
    /// Fail when more than this fraction of the records read (training and evaluation each) is malformed.
    #[arg(long, required = false, value_name = "F")]
    pub max_bad_fraction: f64,
    /// Longest accepted input line in bytes.
    #[arg(long, required = false, value_name = "BYTES")]
    pub max_line_bytes: usize,
}

impl Default for RecordPolicy {
    fn default() -> Self {
        RecordPolicy {
            on_bad_record: BadRecordPolicy::Skip,
            dead_letters: PathBuf::from("tiderec-dead-letters.tsv"),
            max_bad_fraction: 0.01,
            max_line_bytes: tiderec_sources::criteo::DEFAULT_MAX_LINE_BYTES,
        }
    }
}

impl RecordPolicy {
    /// Refuses a budget outside `[0, 1]` (NaN included) and a line limit under 64 bytes,
    /// naming the setting.
    pub fn validate(&self) -> Result<(), PipelineError> {
        if !(0.0..=1.0).contains(&self.max_bad_fraction) {
            return Err(PipelineError::config(
                "max_bad_fraction",
                format!("must be in [0, 1], got {}", self.max_bad_fraction),
            ));
        }
        if self.max_line_bytes < 64 {
            return Err(PipelineError::config("max_line_bytes", "must be at least 64"));
        }
        Ok(())
    }
}

impl Default for DataSettings {
    fn default() -> Self {
        DataSettings {
            source: "synthetic".into(),
            eval: None,
            spec: None,
            eval_fraction: 0.1,
            samples: 300_000,
            buckets: 100_000,
            table_sizes: None,
            max_len: 20,
            hash_seed: None,
            records: RecordPolicy::default(),
        }
    }
}
