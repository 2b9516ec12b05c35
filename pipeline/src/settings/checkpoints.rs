//! Checkpoints: where, how often, how many, and resuming from them.

use super::range::ranged;
use clap::Args;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// When checkpoints are written and whether the run continues from one.
#[derive(Clone, Debug, PartialEq, Args, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckpointSettings {
    /// Write checkpoints (`ckpt-<step>` directories) here: at the end of every epoch and of the run, and every
    /// --checkpoint-every steps.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Also write a checkpoint every N global training steps.
    #[arg(long, value_name = "N", value_parser = checkpoint_every::RANGE)]
    #[serde(deserialize_with = "checkpoint_every::deserialize")]
    pub checkpoint_every: Option<u64>,
    /// Checkpoints to keep in --checkpoint-dir (older ones are removed).
    #[arg(long, required = false, value_name = "K", value_parser = keep_checkpoints::RANGE)]
    #[serde(deserialize_with = "keep_checkpoints::deserialize")]
    pub keep_checkpoints: usize,
    /// Between two whole checkpoints write up to N deltas, which hold only the embedding rows changed since
    /// the previous checkpoint (and the whole dense model); 0 writes every checkpoint whole. A delta is read
    /// with its chain back to the whole checkpoint.
    #[arg(long, required = false, value_name = "N", value_parser = checkpoint_deltas::RANGE)]
    #[serde(deserialize_with = "checkpoint_deltas::deserialize")]
    pub checkpoint_deltas: u64,
    /// Write a whole checkpoint instead of a delta once the rows of the deltas since the last whole one
    /// (their shard files) hold more than this share of its rows' bytes.
    #[arg(long, required = false, value_name = "SHARE", value_parser = checkpoint_delta_share::RANGE)]
    #[serde(deserialize_with = "checkpoint_delta_share::deserialize")]
    pub checkpoint_delta_share: f64,
    /// Write each checkpoint before training goes on (otherwise files are written by background threads
    /// while training continues; the checkpoints are the same byte for byte).
    #[arg(long, required = false, num_args = 0..=1, default_missing_value = "true", require_equals = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub checkpoint_sync: bool,
    /// Continue from the newest valid checkpoint in --checkpoint-dir (starts fresh, with a warning, if none).
    #[arg(long, required = false, num_args = 0..=1, default_missing_value = "true", require_equals = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub resume: bool,
    /// With --resume: keep the checkpoint's model but read --data from its start (epoch 0), or online
    /// the topic from --start, for data other than the checkpoint was trained on (without it such a
    /// resume is refused).
    #[arg(long, required = false, num_args = 0..=1, default_missing_value = "true", require_equals = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub new_data: bool,
}

// The ranges of the numeric settings above, one per setting.
ranged!(checkpoint_every: u64, closed(1, MAX_STEPS));
ranged!(keep_checkpoints: usize, closed(1, 1_000_000));
ranged!(checkpoint_deltas: u64, closed(0, 1_000_000));
ranged!(checkpoint_delta_share: f64, closed(0.0, 1000.0));

impl Default for CheckpointSettings {
    fn default() -> Self {
        CheckpointSettings {
            checkpoint_dir: None,
            checkpoint_every: None,
            keep_checkpoints: 3,
            checkpoint_deltas: 16,
            checkpoint_delta_share: 1.0,
            checkpoint_sync: false,
            resume: false,
            new_data: false,
        }
    }
}
