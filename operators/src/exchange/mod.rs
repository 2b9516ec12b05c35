//! How embeddings travel between workers: per-table exchange strategies.
//!
//! The trainer (see [`crate::train`]) always de-duplicates a micro-batch's
//! ids per table before they leave home and packs every table bound for one
//! owner into a single request and a single reply (all tables share the row
//! width and are looked up in one pass); ids travel in four bytes when every
//! table has at most 2³² rows ([`WireIds`]). On top of that, each sparse field chooses one of:
//!
//! * [`TableExchange::Rows`]: the owner returns the rows, the home returns
//!   the rows' gradients (DLRM's model-parallel embeddings).
//! * [`TableExchange::Partial`]: the owner returns, per sample, its share of
//!   the model's partial result (DES: for LR/FM `[Σ(w − ½‖v‖²), Σv]`, see
//!   [`crate::nn::FmPartial`]; DeepFM and Wide & Deep add their first
//!   layer's share `Σ W_f·v_f`, see [`crate::nn::FirstLayer`]); the home
//!   returns the partial result's gradient, and the owner turns it into row
//!   gradients (and its share of the first layer's weight gradient, which
//!   joins its dense gradient). No row and no row gradient crosses the
//!   network. Needs a model with a partial form and at most one id per
//!   sample in the field.
//!
//! Independently, [`ExchangeConfig::replicated`] names hot rows that every
//! worker holds a replica of ([`Replicas`]): their lookups are local and their
//! gradients are all-reduced every step (each worker sends its summed
//! gradient of the hot rows it touched to every other worker, and every worker
//! applies the same sum in worker order), so replicas never diverge and no
//! step sees a stale row. The owner's copy in the store is kept equal, so
//! checkpoints and parameter norms are unchanged.
//!
//! Every strategy computes the same model as `rows` up to the reassociation of
//! float sums; [`plan_exchange`] estimates each strategy's bytes from measured id
//! frequencies and picks the cheapest per table.

mod partial;
mod plan;
mod replicas;
mod wire;

pub use partial::{accumulate_slot, slot_row_grads, IdIndex, PartialLookup, PartialSlot};
pub use plan::{plan_exchange, ExchangePlan, PlanInput, TableCost};
pub use replicas::Replicas;
pub use wire::{narrow_ids, WireIds};

use crate::nn::ModelConfig;
use crate::store::{StoreConfig, StoreKind};
use crate::OperatorError;
use serde::{Deserialize, Serialize};

/// How one sparse field's embeddings travel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TableExchange {
    /// Owners return rows; homes return row gradients.
    #[default]
    Rows,
    /// Owners return per-sample partial results (DES); homes return their gradients.
    Partial,
}

impl std::str::FromStr for TableExchange {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "rows" => Ok(TableExchange::Rows),
            "partial" => Ok(TableExchange::Partial),
            other => Err(format!("unknown exchange `{other}` (expected rows or partial)")),
        }
    }
}

impl std::fmt::Display for TableExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TableExchange::Rows => "rows",
            TableExchange::Partial => "partial",
        })
    }
}

/// The exchange of every table (the default: rows everywhere, nothing replicated).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExchangeConfig {
    /// Per sparse field; empty means `rows` for every field.
    #[serde(default)]
    pub tables: Vec<TableExchange>,
    /// Per table, the ids every worker holds a replica of; empty means none.
    #[serde(default)]
    pub replicated: Vec<Vec<u64>>,
}

impl ExchangeConfig {
    /// The exchange of sparse field `f`.
    #[inline]
    pub fn table(&self, f: usize) -> TableExchange {
        self.tables.get(f).copied().unwrap_or_default()
    }

    /// Whether any field travels as partial results.
    pub fn any_partial(&self) -> bool {
        self.tables.contains(&TableExchange::Partial)
    }

    /// Replicated rows over all tables.
    pub fn replicated_rows(&self) -> usize {
        self.replicated.iter().map(Vec::len).sum()
    }

    /// Checks the exchange against the model, the tables and the store; errors name the key.
    pub fn validate(&self, model: &ModelConfig, table_sizes: &[u64], store: &StoreConfig) -> Result<(), OperatorError> {
        let f = model.num_sparse();
        if !self.tables.is_empty() && self.tables.len() != f {
            return Err(OperatorError::config(
                "exchange.tables",
                format!("{} entries for {f} sparse fields", self.tables.len()),
            ));
        }
        if self.any_partial() && model.partial().is_none() {
            return Err(OperatorError::config(
                "exchange.tables",
                format!(
                    "`partial` needs a model whose logit depends on the rows through per-sample sums \
                     (lr, fm, deepfm or wdl without feature crosses); `{}` has none",
                    model.name()
                ),
            ));
        }
        if self.replicated.is_empty() {
            return Ok(());
        }
        if self.replicated.len() != table_sizes.len() {
            return Err(OperatorError::config(
                "exchange.replicated",
                format!("{} id lists for {} tables", self.replicated.len(), table_sizes.len()),
            ));
        }
        if self.replicated_rows() > 0 && store.kind != StoreKind::Fixed {
            return Err(OperatorError::config(
                "exchange.replicated",
                format!("hot-row replication needs the fixed store, not `{:?}`", store.kind).to_lowercase(),
            ));
        }
        for (t, ids) in self.replicated.iter().enumerate() {
            if let Some(&id) = ids.iter().find(|&&id| id >= table_sizes[t]) {
                return Err(OperatorError::config(
                    "exchange.replicated",
                    format!("id {id} is outside table {t} of {} rows", table_sizes[t]),
                ));
            }
            if !ids.is_empty() && self.table(t) == TableExchange::Partial && t < f {
                return Err(OperatorError::config(
                    "exchange.replicated",
                    format!(
                        "table {t} travels as partial results; its rows never move, so replicating them saves nothing"
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
