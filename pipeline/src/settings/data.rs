//! Where records come from and how malformed ones are handled.
//!
//! [`RecordPolicy`] is its own struct because the scoring commands (`eval`, `predict`) read
//! records under the same four settings without any of training's: they flatten it into
//! their flags through [`OverDefaults`](super::OverDefaults), so its defaults and checks are
//! declared here once.

use super::range::ranged;
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
    #[arg(long, value_name = "SOURCE")]
    pub eval: Option<String>,
    /// Feature spec of `csv:` data: `preset:NAME` (criteo, avazu, elm, elm_y_long, elm_dien, taobao_ad; see
    /// `tiderec spec show NAME`) or a TOML file.
    #[arg(long, value_name = "preset:NAME|FILE")]
    pub spec: Option<String>,
    /// Fraction held out for evaluation when --eval is not given (synthetic: fraction of --samples).
    #[arg(long, required = false, value_name = "F", value_parser = eval_fraction::RANGE)]
    #[serde(deserialize_with = "eval_fraction::deserialize")]
    pub eval_fraction: f64,
    /// Read the training data in the same order in every epoch. Otherwise every epoch after the first reads
    /// each worker's share of line files (and of their Parquet conversions) in blocks of --shuffle-block-bytes
    /// in an order drawn from --seed and the epoch, and other Parquet files' row groups in such an order; the
    /// held-out data is never shuffled.
    #[arg(long, required = false, num_args = 0..=1, default_missing_value = "true", require_equals = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub no_shuffle: bool,
    /// Bytes of the blocks that shuffled epochs cut each worker's share of every line file into (a line
    /// belongs to the block its first byte lies in). Default: a 64th of the worker's share, within
    /// 64 KiB (some 250 Criteo lines) and 16 MiB (some 65,000).
    #[arg(long, value_name = "BYTES", value_parser = shuffle_block_bytes::RANGE)]
    #[serde(deserialize_with = "shuffle_block_bytes::deserialize")]
    pub shuffle_block_bytes: Option<u64>,
    /// Whether a thread of each worker reads its next micro-batch while the current step runs (the same
    /// batches, bad-record counts and dead letters as reading it when the step starts): on, off, or auto
    /// (GPU workers, and CPU workers when the process has more cores than CPU workers).
    #[arg(long, required = false, value_name = "auto|on|off", value_parser = super::parse::<ReadAheadMode>)]
    pub read_ahead: ReadAheadMode,
    /// Synthetic training samples per epoch.
    #[arg(long, required = false, value_name = "N", value_parser = samples::RANGE)]
    #[serde(deserialize_with = "samples::deserialize")]
    pub samples: u64,
    /// Rows per embedding table (every table), unless --table-sizes is given.
    #[arg(long, required = false, value_name = "N", value_parser = buckets::RANGE)]
    #[serde(deserialize_with = "buckets::deserialize")]
    pub buckets: u64,
    /// Rows of each embedding table, one entry per sparse field, e.g. 1000,50000,…
    #[arg(long, value_delimiter = ',', value_name = "N,N,…", value_parser = table_sizes::RANGE)]
    #[serde(deserialize_with = "table_sizes::deserialize")]
    pub table_sizes: Option<Vec<u64>>,
    /// Longest behaviour history or id list kept per sample (the most recent events); refused for
    /// data with neither (synthetic, criteo, avazu, a spec without lists).
    #[arg(long, required = false, value_name = "N", value_parser = max_len::RANGE)]
    #[serde(deserialize_with = "max_len::deserialize")]
    pub max_len: usize,
    /// Seed of feature hashing (default 42, whatever --seed is); recorded in checkpoints.
    #[arg(long, value_name = "SEED", value_parser = hash_seed::RANGE)]
    #[serde(deserialize_with = "hash_seed::deserialize")]
    pub hash_seed: Option<u64>,
    /// Malformed records: skip or fail, the dead-letter file, the budget, the longest line.
    #[command(flatten)]
    #[serde(flatten)]
    pub records: RecordPolicy,
}

super::named::named_setting! {
    /// Whether workers read their next micro-batch while a step runs (`--read-ahead`).
    pub enum ReadAheadMode for "read_ahead" {
        /// GPU workers read ahead; CPU workers when the process has more cores than CPU
        /// workers (otherwise the reading thread would take a core from a step the
        /// other workers wait for).
        Auto = "auto",
        /// Every worker reads ahead.
        On = "on",
        /// Every worker reads its micro-batch when its step starts.
        Off = "off",
    }
}

/// Rows per embedding table when neither `table_sizes` nor a spec's field says otherwise
/// (also the default of `tiderec spec show` and `spec check`, which resolve specs as runs do).
pub const DEFAULT_BUCKETS: u64 = 100_000;

/// The longest history or list kept per sample by default (runs and `tiderec spec`).
pub const DEFAULT_MAX_LEN: usize = 20;

/// The seed of feature hashing when `hash_seed` is not set: the same for every `--seed`, so
/// runs with different seeds (and a Parquet file converted under any seed) share their features.
pub const DEFAULT_HASH_SEED: u64 = 42;

/// The most samples a synthetic stream gives: its evaluation split starts there
/// ([`SYNTHETIC_EVAL_BASE`](crate::data::SYNTHETIC_EVAL_BASE)), so the two never overlap.
pub const MAX_SAMPLES: u64 = 1 << 40;

// The ranges of the numeric settings above, one per setting.
ranged!(eval_fraction: f64, below(0.0, 1.0));
ranged!(shuffle_block_bytes: u64, closed(4096, 1 << 40));
ranged!(samples: u64, closed(1, MAX_SAMPLES));
ranged!(buckets: u64, closed(1, MAX_ROWS));
ranged!(table_sizes: u64, closed(1, MAX_ROWS));
ranged!(max_len: usize, closed(1, 1 << 20));
ranged!(hash_seed: u64, closed(0, u64::MAX));

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
    #[arg(long, required = false, value_name = "F", value_parser = max_bad_fraction::RANGE)]
    #[serde(deserialize_with = "max_bad_fraction::deserialize")]
    pub max_bad_fraction: f64,
    /// Longest accepted input line in bytes.
    #[arg(long, required = false, value_name = "BYTES", value_parser = max_line_bytes::RANGE)]
    #[serde(deserialize_with = "max_line_bytes::deserialize")]
    pub max_line_bytes: usize,
}

// The ranges of the numeric settings above, one per setting.
ranged!(max_bad_fraction: f64, closed(0.0, 1.0));
ranged!(max_line_bytes: usize, closed(64, 1 << 30));

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

impl DataSettings {
    /// How the epochs after the first read the files, in words recorded in checkpoints:
    /// `in file order`, `in blocks of 65536 bytes` or `in blocks of the default size`.
    pub fn epoch_order(&self) -> String {
        match (self.no_shuffle, self.shuffle_block_bytes) {
            (true, _) => "in file order".into(),
            (false, Some(bytes)) => format!("in blocks of {bytes} bytes"),
            (false, None) => "in blocks of the default size".into(),
        }
    }
}

impl RecordPolicy {
    /// Checks both numbers against their ranges (for a policy built in code; flags and files
    /// are checked as they are read), naming the setting.
    pub fn validate(&self) -> Result<(), PipelineError> {
        max_bad_fraction::RANGE.check(self.max_bad_fraction)?;
        max_line_bytes::RANGE.check(self.max_line_bytes)?;
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
            no_shuffle: false,
            shuffle_block_bytes: None,
            read_ahead: ReadAheadMode::Auto,
            samples: 300_000,
            buckets: DEFAULT_BUCKETS,
            table_sizes: None,
            max_len: DEFAULT_MAX_LEN,
            hash_seed: None,
            records: RecordPolicy::default(),
        }
    }
}
