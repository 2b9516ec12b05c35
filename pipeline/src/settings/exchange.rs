//! How embeddings travel between workers.

use super::range::ranged;
use crate::PipelineError;
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
    #[arg(long, required = false, value_name = "F", value_parser = replicate::RANGE)]
    #[serde(deserialize_with = "replicate::deserialize")]
    pub replicate: f64,
    /// Global batches the exchange planner counts ids on.
    #[arg(long, required = false, value_name = "N", value_parser = plan_steps::RANGE)]
    #[serde(deserialize_with = "plan_steps::deserialize")]
    pub plan_steps: u64,
}

// The ranges of the numeric settings above, one per setting.
ranged!(replicate: f64, below(0.0, 1.0));
ranged!(plan_steps: u64, closed(1, 1_000_000));

impl Default for ExchangeSettings {
    fn default() -> Self {
        ExchangeSettings { strategy: ExchangeChoice::Rows, tables: Vec::new(), replicate: 0.01, plan_steps: 4 }
    }
}

/// The `exchange` setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExchangeChoice {
    /// Rows everywhere.
    Rows,
    /// Every field as DES partial results.
    Partial,
    /// The hottest rows of every table replicated.
    Replicated,
    /// The cost model's choice per table.
    Auto,
}

impl std::str::FromStr for ExchangeChoice {
    type Err = PipelineError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "rows" => ExchangeChoice::Rows,
            "partial" => ExchangeChoice::Partial,
            "replicated" => ExchangeChoice::Replicated,
            "auto" => ExchangeChoice::Auto,
            other => {
                return Err(PipelineError::config(
                    "exchange",
                    format!("`{other}` is not rows, partial, replicated or auto"),
                ))
            }
        })
    }
}

impl std::fmt::Display for ExchangeChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ExchangeChoice::Rows => "rows",
            ExchangeChoice::Partial => "partial",
            ExchangeChoice::Replicated => "replicated",
            ExchangeChoice::Auto => "auto",
        })
    }
}
