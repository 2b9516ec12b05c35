//! How embeddings travel between workers.

use crate::config::ExchangeChoice;
use clap::Args;
use serde::{Deserialize, Serialize};

/// The exchange strategy, per run and per table.
#[derive(Clone, Debug, PartialEq, Args, Serialize, Deserialize)]
#[serde(default)]
pub struct ExchangeSettings {
    /// How embeddings travel between workers: rows, partial (DES partial results; lr,
    /// fm, deepfm, wdl), replicated (each table's hottest --replicate fraction on every worker) or
    /// auto (the cost model's per-table choice from the first --plan-steps batches; printed at start).
    #[arg(long = "exchange", id = "exchange", required = false, value_name = "rows|partial|replicated|auto", value_parser = super::parse::<ExchangeChoice>)]
    #[serde(rename = "exchange")]
    pub strategy: ExchangeChoice,
    /// Per-table overrides applied after --exchange (and after auto's plan), e.g. 3=rows,7=replicated.
    #[arg(long = "exchange-table", id = "exchange_tables", value_delimiter = ',', value_name = "T=STRATEGY")]
    #[serde(rename = "exchange_tables")]
    pub tables: Vec<String>,
    /// Fraction of each table's rows to replicate (--exchange replicated / auto).
    #[arg(long, required = false, value_name = "F")]
    pub replicate: f64,
    /// Global batches the exchange planner counts ids on.
    #[arg(long, required = false, value_name = "N")]
    pub plan_steps: u64,
}

impl Default for ExchangeSettings {
    fn default() -> Self {
        ExchangeSettings { strategy: ExchangeChoice::Rows, tables: Vec::new(), replicate: 0.01, plan_steps: 4 }
    }
}
