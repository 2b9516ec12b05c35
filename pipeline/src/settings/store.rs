//! The embedding store.

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
    #[arg(long, value_name = "N")]
    pub max_rows: Option<u64>,
    /// Admit an id into a dynamic / tiered store once seen in N training steps (≤ 1: at once).
    #[arg(long, required = false, value_name = "N")]
    pub admit_count: u32,
    /// Admit an unseen id with probability P per sighting (seeded, deterministic).
    #[arg(long, value_name = "P")]
    pub admit_prob: Option<f64>,
    /// Evict rows not updated for N training steps.
    #[arg(long, value_name = "N")]
    pub ttl_steps: Option<u64>,
    /// Hot-tier rows per worker of the tiered store.
    #[arg(long, required = false, value_name = "K")]
    pub hot_rows: usize,
    /// Training steps of frequency counting before the first hot-tier plan.
    #[arg(long, required = false, value_name = "N")]
    pub warmup: u64,
    /// Store maintenance interval in training steps (eviction, hot-tier re-planning).
    #[arg(long, required = false, value_name = "N")]
    pub flush_every: u64,
    /// Frequencies of the tiered store's hot plan: exact (per-row counts), sketch
    /// (count-min sketch) or differential (differential-dataflow count over the id stream).
    #[arg(long, required = false, value_name = "exact|sketch|differential", value_parser = super::parse::<FrequencySource>)]
    pub freq_source: FrequencySource,
    /// With --freq-source differential: count only the last N training steps.
    #[arg(long, value_name = "N")]
    pub freq_window: Option<u64>,
}

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
