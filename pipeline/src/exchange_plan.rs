//! The run's exchange strategy (`--exchange`), chosen before training.
//!
//! `rows` and `partial` need no data. `replicated` and `auto` count ids on
//! the first `plan_steps` global batches of the training data, read the same
//! way by every process (one reader over the start of the training split),
//! so every worker builds the same plan; each batch is cut into the workers'
//! micro-batches as training will cut it. The plan is printed at start.
//!
//! `exchange_tables` then forces single tables (`rows`, `partial`,
//! `replicated`); a forced `replicated` needs the planner's hot ids, so it
//! plans even under `rows` or `partial`.

use crate::config::{ExchangeChoice, Resolved, TableOverride};
use crate::data::{micro_batch, CriteoOptions, IndexedSamples, WorkerData};
use crate::{PipelineError, TrainSettings};
use tiderec_operators::exchange::{plan_exchange, ExchangeConfig, ExchangePlan, PlanInput, TableExchange};
use tiderec_operators::Batch;

/// Where the planner reads its sample batches.
pub struct PlanSource<'a> {
    /// Indexed samples (synthetic or derived), if the data is indexed.
    pub generator: Option<&'a IndexedSamples>,
    /// The training range of the indexed samples.
    pub train_range: std::ops::Range<u64>,
    /// How record files are read.
    pub criteo: &'a CriteoOptions,
    /// The training span of each file.
    pub span: (f64, f64),
}

/// The exchange configuration for the run, with the plan it came from (`replicated`, `auto`).
pub fn resolve_exchange(
    settings: &TrainSettings,
    resolved: &Resolved,
    source: &PlanSource<'_>,
) -> Result<(ExchangeConfig, Option<ExchangePlan>), PipelineError> {
    let fields = resolved.model.num_sparse();
    if let Some(config) = exchange_without_data(resolved) {
        return Ok((config, None));
    }
    let workers = settings.cluster.workers * settings.cluster.processes;
    let batches = sample_batches(settings, resolved, source, workers)?;
    let plan = plan_exchange(&PlanInput {
        workers,
        row_width: resolved.model.embedding_dim(),
        table_sizes: &resolved.table_sizes,
        partial: resolved.model.partial().filter(|_| resolved.model.num_sequences() == 0),
        replicate_fraction: settings.exchange.replicate,
        batches: &batches,
    });
    let mut plan = plan;
    if resolved.exchange == ExchangeChoice::Replicated {
        // Forced: every table replicates its hot candidates, whatever the estimate.
        plan.tables = vec![TableExchange::Rows; fields];
        plan.replicated = plan.hot_candidates.clone();
    }
    if resolved.exchange == ExchangeChoice::Rows || resolved.exchange == ExchangeChoice::Partial {
        // Planned only for a forced `replicated` table: the base choice as given.
        plan.tables = exchange_choice(resolved).tables;
        plan.replicated = vec![Vec::new(); resolved.table_sizes.len()];
    }
    for &(t, o) in &resolved.exchange_overrides {
        plan.tables[t] = o.exchange();
        plan.replicated[t] = if o == TableOverride::Replicated { plan.hot_candidates[t].clone() } else { Vec::new() };
    }
    plan.estimated = plan.estimate_choice();
    let config = ExchangeConfig { tables: plan.tables.clone(), replicated: plan.replicated.clone() };
    // Replication needs the fixed store; `auto` falls back to rows for those tables otherwise.
    let config = if resolved.store.kind != tiderec_operators::store::StoreKind::Fixed {
        ExchangeConfig { replicated: vec![], ..config }
    } else {
        config
    };
    Ok((config, Some(plan)))
}

/// The exchange of `rows` and `partial` with their per-table overrides, which
/// need no data; `None` for the planned ones (and for a forced `replicated` table).
pub fn exchange_without_data(resolved: &Resolved) -> Option<ExchangeConfig> {
    let planned = matches!(resolved.exchange, ExchangeChoice::Replicated | ExchangeChoice::Auto)
        || resolved.exchange_overrides.iter().any(|&(_, o)| o == TableOverride::Replicated);
    if planned {
        return None;
    }
    let mut config = exchange_choice(resolved);
    for &(t, o) in &resolved.exchange_overrides {
        config.tables[t] = o.exchange();
    }
    Some(config)
}

/// `rows` or `partial` for every field, before overrides.
fn exchange_choice(resolved: &Resolved) -> ExchangeConfig {
    let all = if resolved.exchange == ExchangeChoice::Partial { TableExchange::Partial } else { TableExchange::Rows };
    ExchangeConfig { tables: vec![all; resolved.model.num_sparse()], replicated: vec![] }
}

/// The first `plan_steps` global batches, each cut into `(home, micro-batch)` pairs.
fn sample_batches(
    settings: &TrainSettings,
    resolved: &Resolved,
    source: &PlanSource<'_>,
    workers: usize,
) -> Result<Vec<(usize, Batch)>, PipelineError> {
    let batch = settings.run.batch_size;
    let (num_dense, num_sparse, num_seq) = (resolved.shape.0, resolved.shape.1, resolved.model.num_sequences());
    let mut globals = Vec::new();
    match source.generator {
        Some(g) => {
            for s in 0..settings.exchange.plan_steps {
                let start = source.train_range.start + s * batch as u64;
                let end = (start + batch as u64).min(source.train_range.end);
                if start >= end {
                    break;
                }
                let mut b = Batch::with_sequences(num_dense, num_sparse, num_seq);
                g.fill(start..end, &mut b);
                globals.push(b);
            }
        }
        None => {
            let mut reader = WorkerData::for_spec(&resolved.data, None, source.span, source.criteo, batch, 0, 1, None)?;
            for _ in 0..settings.exchange.plan_steps {
                let mut b = Batch::with_sequences(num_dense, num_sparse, num_seq);
                if reader.next_micro_batch(&mut b)? == 0 {
                    break;
                }
                globals.push(b);
            }
        }
    }
    let mut out = Vec::new();
    for g in &globals {
        let mut start = 0;
        for w in 0..workers {
            let n = micro_batch(g.len(), w, workers);
            let mut b = Batch::with_sequences(g.num_dense, g.sparse.len(), g.sequences.len());
            for i in start..start + n {
                b.push_from(g, i);
            }
            start += n;
            out.push((w, b));
        }
    }
    Ok(out)
}
