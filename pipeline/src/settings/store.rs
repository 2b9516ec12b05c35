//! The embedding store.

use super::range::ranged;
use clap::Args;
use serde::{Deserialize, Serialize};
use tiderec_operators::store::{FrequencySource, StoreConfig, StoreKind};

/// Which store holds the embedding rows, and its admission, eviction and hot-tier policy.
#[derive(Clone, Debug, PartialEq, Args, Serialize, Deserialize)]
#[serde(default)]
pub struct StoreSettings {
    /// Embedding store: fixed (dense tables), dynamic (hash table with admission and eviction)
    /// or tiered (frequency-aware hot tier over a hash-table cold tier).
    #[arg(long = "store", id = "store", required = false, value_name = "fixed|dynamic|tiered", value_parser = super::parse::<StoreKind>)]
    #[serde(rename = "store")]
    pub kind: StoreKind,
    /// Row budget per worker of a dynamic / tiered store: least frequently used rows beyond it are
    /// evicted every --flush-every steps.
    #[arg(long, value_name = "N", value_parser = max_rows::RANGE)]
    #[serde(deserialize_with = "max_rows::deserialize")]
    pub max_rows: Option<u64>,
    /// Admit an id into a dynamic / tiered store once seen in N training steps (≤ 1: at once).
    #[arg(long, required = false, value_name = "N", value_parser = admit_count::RANGE)]
    #[serde(deserialize_with = "admit_count::deserialize")]
    pub admit_count: u32,
    /// Admit an unseen id with probability P per sighting (seeded, deterministic).
    #[arg(long, value_name = "P", value_parser = admit_prob::RANGE)]
    #[serde(deserialize_with = "admit_prob::deserialize")]
    pub admit_prob: Option<f64>,
    /// Evict rows not updated for N training steps.
    #[arg(long, value_name = "N", value_parser = ttl_steps::RANGE)]
    #[serde(deserialize_with = "ttl_steps::deserialize")]
    pub ttl_steps: Option<u64>,
    /// Hot-tier rows per worker of the tiered store.
    #[arg(long, required = false, value_name = "K", value_parser = hot_rows::RANGE)]
    #[serde(deserialize_with = "hot_rows::deserialize")]
    pub hot_rows: usize,
    /// Training steps of frequency counting before the first hot-tier plan.
    #[arg(long, required = false, value_name = "N", value_parser = warmup::RANGE)]
    #[serde(deserialize_with = "warmup::deserialize")]
    pub warmup: u64,
    /// Store maintenance interval in training steps (eviction, hot-tier re-planning).
    #[arg(long, required = false, value_name = "N", value_parser = flush_every::RANGE)]
    #[serde(deserialize_with = "flush_every::deserialize")]
    pub flush_every: u64,
    /// Frequencies of the tiered store's hot plan: exact (per-row counts), sketch
    /// (count-min sketch) or differential (differential-dataflow count over the id stream).
    #[arg(long, required = false, value_name = "exact|sketch|differential", value_parser = super::parse::<FrequencySource>)]
    pub freq_source: FrequencySource,
    /// With --freq-source differential: count only the last N training steps.
    #[arg(long, value_name = "N", value_parser = freq_window::RANGE)]
    #[serde(deserialize_with = "freq_window::deserialize")]
    pub freq_window: Option<u64>,
}

// The ranges of the numeric settings above, one per setting.
ranged!(max_rows: u64, closed(1, MAX_ROWS));
ranged!(admit_count: u32, closed(0, 1_000_000));
ranged!(admit_prob: f64, above(0.0, 1.0));
ranged!(ttl_steps: u64, closed(1, MAX_STEPS));
ranged!(hot_rows: usize, closed(0, u32::MAX as usize / 2));
ranged!(warmup: u64, closed(0, MAX_STEPS));
ranged!(flush_every: u64, closed(1, MAX_STEPS));
ranged!(freq_window: u64, closed(1, MAX_STEPS));

impl Default for StoreSettings {
    fn default() -> Self {
        let store = StoreConfig::default();
        StoreSettings {
            kind: StoreKind::Fixed,
            max_rows: None,
            admit_count: 0,
            admit_prob: None,
            ttl_steps: None,
            hot_rows: store.hot_rows,
            warmup: store.warmup,
            flush_every: store.flush_every,
            freq_source: FrequencySource::Exact,
            freq_window: None,
        }
    }
}
