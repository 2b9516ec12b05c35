//! The exchange cost model: bytes per sample of each strategy, from measured ids.
//!
//! The planner replays sample micro-batches (each with the worker that would
//! hold it) through the trainer's wire format and counts the bytes each
//! table would send with each strategy, exactly as the trainer counts them:
//!
//! * `rows`: per distinct id of a micro-batch owned by another worker, the
//!   id (4 bytes, 8 for tables beyond 2³² rows), its row and its row gradient (`4·e` bytes each);
//! * `replicated`: the top `fraction` of each table's ids by frequency are
//!   replicas; a micro-batch's distinct replicated ids each send their
//!   gradient with a 4-byte index to the `W − 1` other workers; the rest as `rows`;
//! * `partial`: per distinct remote id its id, per sample with a
//!   remote id a 2-byte index (4 bytes beyond 65,536 ids; plus a 4-byte
//!   weight for weighted fields), a presence bitmap per sample; plus, once
//!   per sample and remote owner as soon as any table is partial, the
//!   partial result and its gradient (`2·4·width` bytes; with a deep part the
//!   width includes the first layer's units, so a wide first layer rarely pays).
//!
//! For reference the planner also estimates `rows` without the per-batch
//! de-duplication (every occurrence of a remote id sends its id, row and
//! gradient), the baseline against which replicating hot rows is usually
//! measured: de-duplication already removes the repeated traffic of hot ids.
//!
//! The choice: per table the cheaper of `rows` and `replicated`; then the
//! one-hot tables (no sampled bag holds two ids) where `partial` is cheaper still go partial if their total saving
//! exceeds the fixed per-sample cost of the partial results.

use super::TableExchange;
use crate::batch::Batch;
use crate::nn::FmPartial;
use crate::routing::shard_of;
use rustc_hash::{FxHashMap, FxHashSet};
use serde::Serialize;

/// What the planner measures on.
#[derive(Clone, Debug)]
pub struct PlanInput<'a> {
    /// Workers.
    pub workers: usize,
    /// Embedding row width.
    pub row_width: usize,
    /// Rows per table.
    pub table_sizes: &'a [u64],
    /// The model's partial form, if it has one.
    pub partial: Option<FmPartial>,
    /// Fraction of each table's rows to replicate (0: no replication).
    pub replicate_fraction: f64,
    /// Sample micro-batches with the worker that holds each.
    pub batches: &'a [(usize, Batch)],
}

/// Estimated bytes per sample of one table under each strategy.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TableCost {
    /// With `rows`.
    pub rows: f64,
    /// With `rows` if ids were not de-duplicated per micro-batch (reference only; the trainer always de-duplicates).
    pub rows_without_dedup: f64,
    /// With the hottest rows replicated (the rest `rows`).
    pub replicated: f64,
    /// With `partial`, excluding the shared per-sample cost of the partial results.
    pub partial: Option<f64>,
    /// Share of the table's lookups that hit a replicated row.
    pub replicated_hit_ratio: f64,
    /// Distinct ids per sample within a micro-batch.
    pub distinct_per_sample: f64,
}

/// The planner's choice with its estimates.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ExchangePlan {
    /// Per sparse field.
    pub tables: Vec<TableExchange>,
    /// Per table, the replicated ids.
    pub replicated: Vec<Vec<u64>>,
    /// Per table, the most frequent ids that replication would hold (chosen or not).
    #[serde(skip)]
    pub hot_candidates: Vec<Vec<u64>>,
    /// Per table, the estimated costs.
    pub costs: Vec<TableCost>,
    /// Shared per-sample cost of the partial results when any table is partial.
    pub partial_fixed: f64,
    /// Estimated bytes per sample of the choice.
    pub estimated: f64,
    /// Estimated bytes per sample with `rows` everywhere.
    pub estimated_rows: f64,
    /// Estimated bytes per sample with `rows` everywhere and no per-batch de-duplication (reference only).
    pub estimated_rows_without_dedup: f64,
}

impl ExchangePlan {
    /// The estimated bytes per sample of the current choice (`tables`,
    /// `replicated`): recomputed after a choice is changed by hand.
    pub fn estimate_choice(&self) -> f64 {
        let mut total = 0.0;
        let mut any_partial = false;
        for (t, c) in self.costs.iter().enumerate() {
            total += match self.tables.get(t).copied().unwrap_or_default() {
                TableExchange::Partial => {
                    any_partial = true;
                    c.partial.unwrap_or(c.rows)
                }
                TableExchange::Rows if !self.replicated[t].is_empty() => c.replicated,
                TableExchange::Rows => c.rows,
            };
        }
        total + if any_partial { self.partial_fixed } else { 0.0 }
    }

    /// A table of the estimates, one line per table, for printing at start.
    pub fn describe(&self) -> String {
        let mut s = String::from("table  rows B/s  replicated B/s (hit)  partial B/s  choice\n");
        for (t, c) in self.costs.iter().enumerate() {
            let choice = match self.tables.get(t).copied().unwrap_or_default() {
                TableExchange::Partial => "partial".to_string(),
                TableExchange::Rows if !self.replicated[t].is_empty() => {
                    format!("rows + {} replicated", self.replicated[t].len())
                }
                TableExchange::Rows => "rows".to_string(),
            };
            let partial = c.partial.map_or("-".to_string(), |p| format!("{p:.1}"));
            s.push_str(&format!(
                "{t:>5}  {:>8.1}  {:>10.1} ({:>4.1}%)  {partial:>11}  {choice}\n",
                c.rows,
                c.replicated,
                100.0 * c.replicated_hit_ratio
            ));
        }
        s.push_str(&format!(
            "estimated bytes/sample: {:.1} (rows everywhere: {:.1}, without de-duplicating ids per batch {:.1}; \
             partial results' shared cost {:.1})",
            self.estimated, self.estimated_rows, self.estimated_rows_without_dedup, self.partial_fixed
        ));
        s
    }
}

/// Measures every table under every strategy and picks the cheapest combination.
pub fn plan_exchange(input: &PlanInput<'_>) -> ExchangePlan {
    let (w, e) = (input.workers, input.row_width as f64);
    let tables = input.table_sizes.len();
    let samples: usize = input.batches.iter().map(|(_, b)| b.len()).sum();
    let per = 1.0 / samples.max(1) as f64;
    // The hot set: the most frequent ids of each table in the sample.
    let mut counts: Vec<FxHashMap<u64, u64>> = vec![FxHashMap::default(); tables];
    let mut multi_hot = vec![false; tables];
    for (_, batch) in input.batches {
        for (t, field) in batch.sparse.iter().enumerate().take(tables) {
            for &id in &field.ids {
                *counts[t].entry(id).or_default() += 1;
            }
            // A partial field must be one-hot (the trainer refuses longer bags).
            multi_hot[t] |= field.offsets.windows(2).any(|w| w[1] - w[0] > 1);
        }
    }
    let replicated: Vec<Vec<u64>> = counts
        .iter()
        .enumerate()
        .map(|(t, c)| {
            let k = (input.replicate_fraction * input.table_sizes[t] as f64).ceil() as usize;
            let mut ranked: Vec<(u64, u64)> = c.iter().map(|(&id, &n)| (id, n)).collect();
            ranked.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            ranked.truncate(k);
            let mut ids: Vec<u64> = ranked.into_iter().map(|(id, _)| id).collect();
            ids.sort_unstable();
            ids
        })
        .collect();
    let hot: Vec<FxHashSet<u64>> = replicated.iter().map(|ids| ids.iter().copied().collect()).collect();
    let mut costs = vec![TableCost::default(); tables];
    let mut hits = vec![0u64; tables];
    let mut lookups = vec![0u64; tables];
    let mut seen = FxHashSet::default();
    let id_bytes = if super::narrow_ids(input.table_sizes) { 4.0 } else { 8.0 };
    for (home, batch) in input.batches {
        // Positions of ids are two bytes while a field sends at most 65,536 ids to an owner.
        let index_bytes = if batch.len() <= 1 << 16 { 2.0 } else { 4.0 };
        for (t, field) in batch.sparse.iter().enumerate().take(tables) {
            seen.clear();
            let (mut rows, mut repl, mut partial) = (0.0, 0.0, 0.0);
            for &id in &field.ids {
                lookups[t] += 1;
                let is_hot = hot[t].contains(&id);
                hits[t] += is_hot as u64;
                let remote = shard_of(t, id, w) != *home;
                if remote {
                    partial += index_bytes + if field.weights.is_some() { 4.0 } else { 0.0 };
                    costs[t].rows_without_dedup += id_bytes + 8.0 * e;
                }
                if !seen.insert(id) {
                    continue;
                }
                costs[t].distinct_per_sample += 1.0;
                if remote {
                    rows += id_bytes + 8.0 * e;
                    partial += id_bytes;
                }
                if is_hot {
                    repl += (4.0 + 4.0 * e) * (w - 1) as f64;
                } else if remote {
                    repl += id_bytes + 8.0 * e;
                }
            }
            // A presence bitmap per remote owner.
            partial += (w - 1) as f64 * (batch.len().div_ceil(64) * 8) as f64;
            costs[t].rows += rows;
            costs[t].replicated += repl;
            costs[t].partial = Some(costs[t].partial.unwrap_or(0.0) + partial);
        }
    }
    for (t, c) in costs.iter_mut().enumerate() {
        c.rows *= per;
        c.rows_without_dedup *= per;
        c.replicated *= per;
        c.distinct_per_sample *= per;
        c.partial = if input.partial.is_some() && !multi_hot[t] { c.partial.map(|p| p * per) } else { None };
        c.replicated_hit_ratio = hits[t] as f64 / lookups[t].max(1) as f64;
    }
    let partial_fixed = input.partial.map_or(0.0, |p| 2.0 * 4.0 * p.width() as f64 * (w - 1) as f64);
    let mut plan = ExchangePlan {
        tables: vec![TableExchange::Rows; tables],
        replicated: vec![Vec::new(); tables],
        partial_fixed,
        estimated_rows: costs.iter().map(|c| c.rows).sum(),
        estimated_rows_without_dedup: costs.iter().map(|c| c.rows_without_dedup).sum(),
        ..Default::default()
    };
    let mut best = Vec::with_capacity(tables);
    for (t, c) in costs.iter().enumerate() {
        if input.replicate_fraction > 0.0 && c.replicated < c.rows {
            plan.replicated[t] = replicated[t].clone();
            best.push(c.replicated);
        } else {
            best.push(c.rows);
        }
    }
    let saving: f64 = costs.iter().zip(&best).filter_map(|(c, &b)| c.partial.map(|p| (b - p).max(0.0))).sum();
    if saving > partial_fixed {
        for (t, c) in costs.iter().enumerate() {
            if c.partial.is_some_and(|p| p < best[t]) {
                plan.tables[t] = TableExchange::Partial;
                plan.replicated[t].clear();
                best[t] = c.partial.unwrap();
            }
        }
        plan.estimated = best.iter().sum::<f64>() + partial_fixed;
    } else {
        plan.estimated = best.iter().sum();
    }
    plan.costs = costs;
    plan.hot_candidates = replicated;
    plan
}
