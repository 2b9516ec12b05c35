//! `tiderec bench exchange`: bytes exchanged per sample and samples/s of each
//! exchange strategy, in one run, on the real multi-worker training path.
//!
//! The samples are read or generated once, before timing: `zipf` is the
//! synthetic Criteo-shaped stream with Zipf(`exponent`) ranks over the Kaggle
//! cardinalities (26 tables, at most `rows` rows each), `criteo:PATH` a real
//! Criteo file (every line, replayed in order and cycled). Every strategy
//! trains the same model from the same seed on the same global batches:
//!
//! * `rows`: rows out, row gradients back (the baseline);
//! * `partial`: every field as DES partial results (FM sums, and for DeepFM
//!   the first layer's share: `fm_width + deep[0]` values per sample and remote owner);
//! * `replicated`: the most frequent `replicate` fraction of each table's ids
//!   (counted on the planning steps) held by every worker;
//! * `auto`: the planner's per-table choice ([`plan_exchange`]).
//!
//! Bytes are what the trainer counts on the wire between workers (ids, rows,
//! partial results, gradients, dense slices); `vs_rows` is the strategy's
//! bytes per sample over `rows`'. The dense parameters' traffic is the same for
//! every strategy (each worker sends every other worker its slice of the
//! gradient and of the updated parameters: `2 · 4 · n · (W − 1)` bytes per step
//! for `n` dense parameters); what remains is the embeddings' traffic, reported
//! on its own (`embedding_bytes_per_sample`, `embedding_vs_rows`). Each strategy's final parameter norm is
//! compared with `rows`' (`l2_rel_diff`): the strategies train the same model.
//!
//! With `processes > 1` the same workers are split over that many processes
//! on 127.0.0.1 ([`super::processes`]), so the messages are serialized and
//! cross sockets; bytes and times are gathered from every worker.

use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tiderec::cluster::ProcessRole;
use tiderec::data::{micro_batch, WorkerData};
use tiderec::error::DataflowFailure;
use tiderec::settings::ModelKind;
use tiderec::PipelineError;
use tiderec_operators::collective::Collective;
use tiderec_operators::exchange::{plan_exchange, ExchangeConfig, ExchangePlan, PlanInput, TableExchange};
use tiderec_operators::nn::{DlrmConfig, FmConfig, ModelConfig};
use tiderec_operators::optim::{DenseOptimizerKind, OptimizerParams, SparseOptimizerKind};
use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
use tiderec_operators::Batch;
use tiderec_sources::criteo::CriteoFeatures;
use tiderec_sources::synthetic::{SyntheticConfig, SyntheticCriteo, NUM_DENSE, NUM_SPARSE};

/// Where the samples come from.
#[derive(Clone, Debug, Serialize)]
pub enum ExchangeData {
    /// The synthetic Criteo-shaped stream with this Zipf exponent.
    Zipf(f64),
    /// A real Criteo TSV file.
    Criteo(PathBuf),
}

/// Settings of the benchmark.
#[derive(Clone, Debug)]
pub struct ExchangeBench {
    /// `fm`, `deepfm`, `wdl` or `dlrm`.
    pub model: String,
    /// Hidden widths of the deep part of `deepfm` and `wdl`.
    pub deep: Vec<usize>,
    /// The samples.
    pub data: ExchangeData,
    /// Global batch size.
    pub batch_size: usize,
    /// Workers in all (threads × processes).
    pub workers: usize,
    /// This process's place when the workers are split over processes.
    pub role: ProcessRole,
    /// Untimed steps per strategy.
    pub warmup: u64,
    /// Timed steps per strategy.
    pub steps: u64,
    /// Largest table (Criteo ids are hashed into this many rows).
    pub rows: u64,
    /// Embedding dimension.
    pub dim: usize,
    /// Fraction of each table's rows to replicate.
    pub replicate: f64,
    /// Steps the planner counts ids on (the first steps of the data).
    pub plan_steps: u64,
    /// Seed.
    pub seed: u64,
}

/// One strategy's measurement.
#[derive(Clone, Debug, Serialize)]
pub struct StrategyResult {
    /// `rows`, `partial`, `replicated` or `auto`.
    pub strategy: String,
    /// Bytes sent between workers per trained sample.
    pub bytes_per_sample: f64,
    /// This strategy's bytes per sample over `rows`'.
    pub vs_rows: f64,
    /// Bytes per sample beyond the dense parameters' slices (ids, rows, partial results, their gradients).
    pub embedding_bytes_per_sample: f64,
    /// Those over `rows`'.
    pub embedding_vs_rows: f64,
    /// The planner's estimate of the embedding bytes per sample (dense traffic excluded).
    pub estimated_embedding_bytes_per_sample: f64,
    /// Training samples per second over the timed steps.
    pub samples_per_sec: f64,
    /// Relative difference of the final parameter L2 norm from `rows`'.
    pub l2_rel_diff: f64,
    /// Replicated rows over all tables.
    pub replicated_rows: usize,
    /// Fields travelling as partial results.
    pub partial_fields: usize,
}

/// The benchmark's report.
#[derive(Clone, Debug, Serialize)]
pub struct ExchangeBenchResult {
    /// The model.
    pub model: String,
    /// The samples.
    pub data: String,
    /// Global batch size.
    pub batch_size: usize,
    /// Workers in all.
    pub workers: usize,
    /// Processes the workers were split over.
    pub processes: usize,
    /// Timed steps per strategy.
    pub steps: u64,
    /// Bytes per sample of the dense parameters' slices (gradients and updated values), the same in every strategy.
    pub dense_bytes_per_sample: f64,
    /// The strategies measured.
    pub strategies: Vec<StrategyResult>,
    /// Why a strategy was not measured.
    pub skipped: Vec<String>,
    /// The planner's per-table estimates and choice (`auto`).
    pub plan: ExchangePlan,
}

impl ExchangeBenchResult {
    /// The report as text: one line per strategy, then the planner's table.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "exchange bench: {} on {}, global batch {}, {} workers in {} process(es), {} timed steps per strategy\n",
            self.model, self.data, self.batch_size, self.workers, self.processes, self.steps
        );
        s.push_str(&format!("dense slices: {:.1} bytes/sample in every strategy\n", self.dense_bytes_per_sample));
        s.push_str(
            "strategy      bytes/sample  vs rows  embedding B/s  vs rows  est. embedding B/s  samples/s  params_l2 rel. diff\n",
        );
        for r in &self.strategies {
            s.push_str(&format!(
                "{:<12} {:>13.1} {:>7.1}% {:>14.1} {:>7.1}% {:>19.1} {:>10.0}  {:.1e}\n",
                r.strategy,
                r.bytes_per_sample,
                100.0 * r.vs_rows,
                r.embedding_bytes_per_sample,
                100.0 * r.embedding_vs_rows,
                r.estimated_embedding_bytes_per_sample,
                r.samples_per_sec,
                r.l2_rel_diff
            ));
        }
        let naive = self.plan.estimated_rows_without_dedup;
        if naive > 0.0 {
            s.push_str(&format!(
                "reference: rows without de-duplicating ids per batch (planner's estimate) {naive:.1} embedding B/s; \
                 against it {}\n",
                self.strategies
                    .iter()
                    .map(|r| format!("{} {:+.1}%", r.strategy, 100.0 * (r.embedding_bytes_per_sample / naive - 1.0)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for k in &self.skipped {
            s.push_str(&format!("skipped {k}\n"));
        }
        s.push_str("planner (per table, estimated embedding bytes per sample):\n");
        s.push_str(&self.plan.describe());
        s
    }
}

fn model_config(name: &str, dim: usize, deep: &[usize]) -> Result<ModelConfig, PipelineError> {
    let fm_with = |deep: Vec<usize>, fm: bool| {
        ModelConfig::Fm(FmConfig { num_dense: NUM_DENSE, num_sparse: NUM_SPARSE, dim, deep, fm, wide_only: 0 })
    };
    let fm = |deep: Vec<usize>| fm_with(deep, true);
    let kind: ModelKind = name.parse()?;
    Ok(match kind {
        ModelKind::Fm => fm(vec![]),
        ModelKind::DeepFm | ModelKind::Wdl if deep.is_empty() || deep.contains(&0) => {
            return Err(PipelineError::config("deep", format!("{name} needs positive hidden widths, e.g. 400,400")))
        }
        ModelKind::DeepFm => fm(deep.to_vec()),
        ModelKind::Wdl => fm_with(deep.to_vec(), false),
        ModelKind::Dlrm => ModelConfig::Dlrm(DlrmConfig { dim, ..DlrmConfig::kaggle() }),
        other => {
            return Err(PipelineError::config(
                "model",
                format!("unknown model `{other}` for bench exchange (fm, deepfm, wdl, dlrm)"),
            ))
        }
    })
}

/// Every sample of the data, in order, and the table sizes.
fn load(bench: &ExchangeBench, samples: usize) -> Result<(Batch, Vec<u64>), PipelineError> {
    match &bench.data {
        ExchangeData::Zipf(exponent) => {
            let config =
                SyntheticConfig { zipf_exponent: *exponent, ..SyntheticConfig::kaggle_like(bench.seed, bench.rows) };
            let sizes = config.table_sizes.clone();
            let g = SyntheticCriteo::new(config)?;
            let mut all = Batch::new(NUM_DENSE, NUM_SPARSE);
            g.fill(0..samples as u64, &mut all);
            Ok((all, sizes))
        }
        ExchangeData::Criteo(path) => {
            let sizes = vec![bench.rows; NUM_SPARSE];
            let options = tiderec::data::CriteoOptions {
                seed: bench.seed,
                shuffle_seed: bench.seed,
                shuffle: None,
                spec: None,
                features: CriteoFeatures { table_sizes: sizes.clone(), seed: bench.seed },
                max_len: 0,
                max_line_bytes: tiderec_sources::criteo::DEFAULT_MAX_LINE_BYTES,
                policy: tiderec_operators::bad_record::BadRecordPolicy::Skip,
            };
            let mut reader = WorkerData::criteo(std::slice::from_ref(path), (0.0, 1.0), &options, 65_536, 0, 1, None)?;
            let (mut all, mut chunk) = (Batch::new(NUM_DENSE, NUM_SPARSE), Batch::new(NUM_DENSE, NUM_SPARSE));
            while reader.next_micro_batch(&mut chunk)? > 0 {
                all.extend_from(&chunk);
            }
            if all.len() < bench.batch_size {
                return Err(PipelineError::config(
                    "data",
                    format!(
                        "{} holds {} samples, fewer than one batch of {}",
                        path.display(),
                        all.len(),
                        bench.batch_size
                    ),
                ));
            }
            Ok((all, sizes))
        }
    }
}

/// Worker `worker`'s micro-batch of global step `step` (samples cycle through `all`).
fn micro(all: &Batch, batch: usize, step: u64, worker: usize, workers: usize) -> Batch {
    let mut b = Batch::new(all.num_dense, all.sparse.len());
    let start = step as usize * batch + batch * worker / workers;
    for i in start..start + micro_batch(batch, worker, workers) {
        b.push_from(all, i % all.len());
    }
    b
}

/// Runs every strategy and reports bytes per sample and samples/s.
pub fn run_exchange(bench: &ExchangeBench) -> Result<ExchangeBenchResult, PipelineError> {
    if bench.workers < 2 {
        return Err(PipelineError::config("workers", "an exchange needs at least 2 workers"));
    }
    if bench.batch_size < bench.workers {
        return Err(PipelineError::config("batch_size", "must be at least the number of workers"));
    }
    let processes = bench.role.processes.max(1);
    if !bench.workers.is_multiple_of(processes) {
        return Err(PipelineError::config(
            "workers",
            format!("{} workers do not split evenly over {processes} processes", bench.workers),
        ));
    }
    if !(0.0..1.0).contains(&bench.replicate) {
        return Err(PipelineError::config("replicate", format!("must be in [0, 1), got {}", bench.replicate)));
    }
    let model = model_config(&bench.model, bench.dim, &bench.deep)?;
    let total_steps = bench.warmup + bench.steps;
    let needed = (total_steps.max(bench.plan_steps) as usize) * bench.batch_size;
    let (all, table_sizes) = load(bench, needed)?;
    let all = Arc::new(all);
    // The planner sees the first steps' micro-batches, each with its home worker.
    let planning: Vec<(usize, Batch)> = (0..bench.plan_steps)
        .flat_map(|s| (0..bench.workers).map(move |w| (s, w)))
        .map(|(s, w)| (w, micro(&all, bench.batch_size, s, w, bench.workers)))
        .collect();
    let plan = plan_exchange(&PlanInput {
        workers: bench.workers,
        row_width: model.embedding_dim(),
        table_sizes: &table_sizes,
        partial: model.partial(),
        replicate_fraction: bench.replicate,
        batches: &planning,
    });
    let mut strategies: Vec<(String, ExchangeConfig, f64)> =
        vec![("rows".into(), ExchangeConfig::default(), plan.estimated_rows)];
    let mut skipped = Vec::new();
    match model.partial() {
        Some(_) => {
            let est = plan.costs.iter().filter_map(|c| c.partial).sum::<f64>() + plan.partial_fixed;
            let tables = vec![TableExchange::Partial; NUM_SPARSE];
            strategies.push(("partial".into(), ExchangeConfig { tables, replicated: vec![] }, est));
        }
        None => skipped.push(format!("partial: `{}` has no partial form", model.name())),
    }
    if bench.replicate > 0.0 {
        let est = plan.costs.iter().map(|c| c.replicated).sum();
        let replicated = plan.hot_candidates.clone();
        strategies.push(("replicated".into(), ExchangeConfig { tables: vec![], replicated }, est));
    }
    let auto = ExchangeConfig { tables: plan.tables.clone(), replicated: plan.replicated.clone() };
    strategies.push(("auto".into(), auto, plan.estimated));

    let dense_params = model.build::<f32>(bench.seed)?.params().len();
    let dense_bytes_per_sample = (2 * 4 * dense_params * (bench.workers - 1)) as f64 / bench.batch_size as f64;
    let mut results: Vec<StrategyResult> = Vec::new();
    let mut rows_l2 = None;
    for (name, exchange, estimated) in strategies {
        let config = TrainerConfig {
            model: model.clone(),
            table_sizes: table_sizes.clone(),
            seed: bench.seed,
            dense_optimizer: DenseOptimizerKind::Adam,
            dense_hp: OptimizerParams::with_lr(0.001),
            sparse_optimizer: SparseOptimizerKind::RowwiseAdagrad,
            sparse_hp: OptimizerParams::with_lr(0.05),
            sequence_tables: vec![],
            store: Default::default(),
            exchange: exchange.clone(),
        };
        let (secs, bytes, l2) = train(bench, config, all.clone())?;
        let samples = bench.steps * bench.batch_size as u64;
        let bytes_per_sample = bytes as f64 / samples as f64;
        let base_l2: f64 = *rows_l2.get_or_insert(l2);
        let embedding_bytes_per_sample = bytes_per_sample - dense_bytes_per_sample;
        results.push(StrategyResult {
            strategy: name,
            bytes_per_sample,
            vs_rows: results.first().map_or(1.0, |r| bytes_per_sample / r.bytes_per_sample),
            embedding_bytes_per_sample,
            embedding_vs_rows: results
                .first()
                .map_or(1.0, |r| embedding_bytes_per_sample / r.embedding_bytes_per_sample),
            estimated_embedding_bytes_per_sample: estimated,
            samples_per_sec: samples as f64 / secs,
            l2_rel_diff: (l2 - base_l2).abs() / base_l2.abs().max(1e-30),
            replicated_rows: exchange.replicated_rows(),
            partial_fields: exchange.tables.iter().filter(|&&t| t == TableExchange::Partial).count(),
        });
    }
    Ok(ExchangeBenchResult {
        model: model.name().to_string(),
        data: match &bench.data {
            ExchangeData::Zipf(e) => format!("zipf({e}) synthetic, tables ≤ {} rows", bench.rows),
            ExchangeData::Criteo(p) => {
                format!("criteo:{} ({} samples, {} rows per table)", p.display(), all.len(), bench.rows)
            }
        },
        batch_size: bench.batch_size,
        workers: bench.workers,
        processes,
        steps: bench.steps,
        dense_bytes_per_sample,
        strategies: results,
        skipped,
        plan,
    })
}

/// Trains one strategy; returns (timed seconds, bytes sent in the timed steps
/// by all workers, final parameter norm), the same in every process.
fn train(bench: &ExchangeBench, config: TrainerConfig, all: Arc<Batch>) -> Result<(f64, u64, f64), PipelineError> {
    let (batch, warmup, steps) = (bench.batch_size, bench.warmup, bench.steps);
    let threads = bench.workers / bench.role.processes.max(1);
    let guards = timely::execute(bench.role.timely_config(threads), move |worker| {
        let (me, w) = (worker.index(), worker.peers());
        let batches: Vec<Batch> = (0..warmup + steps).map(|s| micro(&all, batch, s, me, w)).collect();
        let mut trainer = Trainer::new(worker, &config)?;
        let mut totals = Collective::<(f64, u64)>::new(worker);
        let mut batches = batches.into_iter();
        for b in batches.by_ref().take(warmup as usize) {
            trainer.step(worker, StepKind::Train, b)?;
        }
        let before = trainer.bytes_sent();
        let start = Instant::now();
        for b in batches {
            trainer.step(worker, StepKind::Train, b)?;
        }
        let secs = start.elapsed().as_secs_f64();
        let bytes = trainer.bytes_sent() - before;
        let l2 = trainer.params_l2(worker)?;
        let all = totals.all_gather(worker, (secs, bytes));
        let secs = all.iter().map(|a| a.0).fold(0.0, f64::max);
        Ok::<_, PipelineError>((secs, all.iter().map(|a| a.1).sum::<u64>(), l2))
    })
    .map_err(|e| PipelineError::dataflow(DataflowFailure::Start, "cannot start timely workers").with_source(e))?;
    let mut result = (0.0, 0, 0.0);
    for r in guards.join() {
        result = r.map_err(|panic| {
            PipelineError::dataflow(DataflowFailure::Panicked, "a worker panicked").with_source(panic)
        })??;
    }
    Ok(result)
}
