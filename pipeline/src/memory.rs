//! What a run will allocate, estimated before anything is allocated, and the
//! check against what the machine has.
//!
//! Sizes come from flags and from data (`--buckets`, `table_sizes`, `--dim`,
//! the tables a Parquet file's schema declares), so every product here is
//! checked: a size that does not fit in 64 bits is an error naming it, never
//! a wrapped allocation.
//!
//! The estimate covers, per process (all its worker threads):
//!
//! * **tables**: each worker's share of every embedding table, `⌈rows/W⌉ × row
//!   width × 4` bytes (fixed store), or its `--max-rows` budget (dynamic and
//!   tiered stores; the tables' share when there is no budget), plus the
//!   replicated hot rows of `--exchange replicated`/`auto`;
//! * **optimizer**: the row optimizer's state per row and the fixed store's
//!   per-row slot index;
//! * **dense**: every worker's replica of the dense model, its gradients and
//!   its slice of the dense optimizer state;
//! * **buffers**: one micro-batch's pooled rows, their gradients and the MLP
//!   activations (an approximation).
//!
//! `--early-stop` without `--checkpoint-dir` keeps a copy of the best model in
//! memory ([`crate::evaluation::BestKeeper`]): rows, their optimizer state and
//! the dense part count twice.
//!
//! It does not cover message queues between workers, reader buffers (with
//! `--read-ahead`, one more raw micro-batch per worker reading ahead), the
//! evaluation predictions gathered on worker 0, checkpoint snapshots written
//! in the background (a copy of the worker's rows while one is in flight) or
//! the allocator's slack.

use crate::config::{ExchangeChoice, Resolved, TableOverride};
use crate::error::ResourceError;
use crate::{PipelineError, TrainSettings};
use tiderec_operators::nn::ModelConfig;
use tiderec_operators::optim::DenseOptimizerKind;
use tiderec_operators::store::StoreKind;

pub use crate::settings::MemoryLimit;

/// Bytes one process will hold, by part.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryEstimate {
    /// Worker threads in this process.
    pub workers: u64,
    /// Embedding rows (and replicated hot rows).
    pub tables: u64,
    /// Row optimizer state and the per-row slot index.
    pub optimizer: u64,
    /// Dense model replicas, gradients and dense optimizer state.
    pub dense: u64,
    /// Per-step buffers of one micro-batch (approximate).
    pub buffers: u64,
}

impl MemoryEstimate {
    /// All parts.
    pub fn total(&self) -> u64 {
        self.tables.saturating_add(self.optimizer).saturating_add(self.dense).saturating_add(self.buffers)
    }

    /// The one-line report printed at start, e.g. `memory: ~1.23 GiB per process (…); available 22.9 GiB`.
    pub fn describe(&self, available: Option<(u64, &str)>) -> String {
        let avail = match available {
            Some((b, from)) => format!("available {} ({from})", gib(b)),
            None => "available: unknown".into(),
        };
        format!(
            "memory: ~{} per process ({} worker(s): tables {}, optimizer {}, dense {}, buffers {}); {avail}",
            gib(self.total()),
            self.workers,
            gib(self.tables),
            gib(self.optimizer),
            gib(self.dense),
            gib(self.buffers)
        )
    }
}

/// `bytes` in GiB with two decimals.
pub(crate) fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// A size overflow, naming what was being sized.
fn overflow(what: impl std::fmt::Display) -> PipelineError {
    PipelineError::Resources(ResourceError::Overflow { what: what.to_string() })
}

/// `a × b`, or an overflow error naming `what`.
fn mul(a: u64, b: u64, what: &dyn Fn() -> String) -> Result<u64, PipelineError> {
    a.checked_mul(b).ok_or_else(|| overflow(what()))
}

/// `a + b`, or an overflow error naming `what`.
fn add(a: u64, b: u64, what: &dyn Fn() -> String) -> Result<u64, PipelineError> {
    a.checked_add(b).ok_or_else(|| overflow(what()))
}

/// Parameters of an MLP over `widths` (weights and biases), checked.
fn mlp_params(widths: &[usize], what: &str) -> Result<u64, PipelineError> {
    let mut n = 0u64;
    for w in widths.windows(2) {
        let (i, o) = (w[0] as u64, w[1] as u64);
        let layer = mul(i, o, &|| format!("{what}: a {i} × {o} layer"))?;
        n = add(n, add(layer, o, &|| what.to_string())?, &|| what.to_string())?;
    }
    Ok(n)
}

/// Dense parameters of `model`, computed from its shape without building it (checked).
pub fn dense_params(model: &ModelConfig) -> Result<u64, PipelineError> {
    match model {
        ModelConfig::Dlrm(c) => {
            let n = c.num_sparse as u64 + 1;
            let pairs = if c.self_interaction { n * (n + 1) / 2 } else { n * (n - 1) / 2 };
            let mut bottom = vec![c.num_dense];
            bottom.extend(&c.bottom);
            let mut top = vec![usize::try_from(c.dim as u64 + pairs).map_err(|_| overflow("the interaction"))?];
            top.extend(&c.top);
            add(mlp_params(&bottom, "bottom")?, mlp_params(&top, "top")?, &|| "the dense model".into())
        }
        ModelConfig::Fm(c) => {
            let linear = 1 + c.num_dense as u64;
            if c.deep.is_empty() {
                return Ok(linear);
            }
            let input = mul((c.num_sparse - c.wide_only) as u64, c.dim as u64, &|| "the deep part's input".into())?;
            let mut widths = vec![usize::try_from(input + c.num_dense as u64).map_err(|_| overflow("deep input"))?];
            widths.extend(&c.deep);
            widths.push(1);
            add(linear, mlp_params(&widths, "deep")?, &|| "the dense model".into())
        }
        ModelConfig::Dien(c) => {
            let e = mul(c.num_sequences as u64, c.dim as u64, &|| "the interest width".into())?;
            let (gru, attention) = match c.interest {
                tiderec_operators::nn::Interest::GruAttention => {
                    let gru = mul(mul(3, e, &|| "the GRU".into())?, e + e + 2, &|| "the GRU".into())?;
                    (gru, mul(e, e, &|| "the attention".into())?)
                }
                tiderec_operators::nn::Interest::SumPooling => (0, 0),
            };
            let fields = mul(c.num_sparse as u64, c.dim as u64, &|| "the MLP input".into())?;
            let input = c.num_dense as u64 + fields + 2 * e;
            let mut widths = vec![usize::try_from(input).map_err(|_| overflow("the MLP input"))?];
            widths.extend(&c.mlp);
            widths.push(1);
            add(gru + attention, mlp_params(&widths, "mlp")?, &|| "the dense model".into())
        }
        // The command line never builds one; its parameters are its program's.
        ModelConfig::Custom(_) => Ok(0),
    }
}

/// Activations per sample of the model's layers (the sum of their widths; a GRU's per time step).
fn activation_width(model: &ModelConfig) -> u64 {
    let sum = |w: &[usize]| w.iter().map(|&x| x as u64).fold(0u64, u64::saturating_add);
    match model {
        ModelConfig::Dlrm(c) => sum(&c.bottom).saturating_add(sum(&c.top)),
        ModelConfig::Fm(c) => sum(&c.deep),
        ModelConfig::Dien(c) => {
            let e = (c.num_sequences as u64).saturating_mul(c.dim as u64);
            // Gates, candidate and state per step of the GRU, then the MLP.
            sum(&c.mlp).saturating_add(e.saturating_mul(5).saturating_mul(c.max_len as u64))
        }
        ModelConfig::Custom(_) => 0,
    }
}

/// The estimate for `settings` as resolved (see the [module docs](self) for what it covers).
pub fn estimate(settings: &TrainSettings, resolved: &Resolved) -> Result<MemoryEstimate, PipelineError> {
    let local = settings.cluster.workers as u64;
    let total_workers = mul(local, settings.cluster.processes as u64, &|| "workers × processes".into())?;
    let model = &resolved.model;
    let width = model.embedding_dim() as u64;
    let state = resolved.sparse_optimizer.state_width(model.embedding_dim()) as u64;
    let store = &resolved.store;
    // Rows one worker holds, summed over tables, and those replicated on every worker.
    let mut rows = 0u64;
    let mut replicated = 0u64;
    let replicate_all = matches!(resolved.exchange, ExchangeChoice::Replicated | ExchangeChoice::Auto);
    for (t, &n) in resolved.table_sizes.iter().enumerate() {
        rows = add(rows, n.div_ceil(total_workers), &|| format!("table {t} ({n} rows)"))?;
        let forced = resolved.exchange_overrides.iter().any(|&(u, o)| u == t && o == TableOverride::Replicated);
        if replicate_all || forced {
            replicated = replicated.saturating_add((n as f64 * settings.exchange.replicate).ceil() as u64);
        }
    }
    let held = match (store.kind, store.max_rows) {
        (StoreKind::Fixed, _) | (_, None) => rows,
        (_, Some(budget)) => rows.min(budget),
    };
    let per_row = |n: u64, w: u64, what: &str| mul(n, mul(w, 4, &|| what.to_string())?, &|| what.to_string());
    let largest = resolved.table_sizes.iter().copied().max().unwrap_or(0);
    let tables_what = format!(
        "the embedding tables ({} tables of up to {largest} rows × row width {width}: --buckets, table_sizes, \
         the Parquet schema's table_size, --dim)",
        resolved.table_sizes.len()
    );
    let table_bytes = per_row(add(held, replicated, &|| "rows".into())?, width, &tables_what)?;
    // The fixed store's slot index is one u32 per local row; hash stores pay about as much per key.
    let index = if store.kind == StoreKind::Fixed { 1 } else { 4 };
    let optimizer_bytes = per_row(add(held, replicated, &|| "rows".into())?, state + index, "optimizer state")?;
    let params = dense_params(model)?;
    let slots = match resolved.optimizer {
        DenseOptimizerKind::Sgd => 0,
        DenseOptimizerKind::Adagrad => 1,
        DenseOptimizerKind::Adam => 2,
    };
    // Parameters and gradients on every worker, optimizer state for each worker's slice.
    let dense = add(
        mul(params, 2 * local, &|| "dense replicas".into())?,
        params.div_ceil(total_workers) * slots * local,
        &|| "dense".into(),
    )?;
    let dense_bytes = mul(dense, 4, &|| "dense".into())?;
    let micro = settings.run.batch_size.max(settings.run.eval_batch_size).div_ceil(total_workers as usize) as u64;
    let fields = model.num_sparse() as u64 + model.num_sequences() as u64 * model.max_sequence_len() as u64;
    // Gathered rows, pooled rows and their gradients, the MLP's activations and their gradients.
    let per_sample = add(
        mul(mul(fields, width, &|| "batch rows".into())?, 4, &|| "batch rows".into())?,
        mul(activation_width(model), 2, &|| "activations".into())?,
        &|| "buffers".into(),
    )?;
    let buffers = mul(mul(micro, per_sample, &|| "batch buffers".into())?, 4 * local, &|| "batch buffers".into())?;
    // The in-memory copy of the best model of an early-stopping run without checkpoints.
    let copies = if settings.run.early_stop.is_some() && settings.checkpoints.checkpoint_dir.is_none() { 2 } else { 1 };
    Ok(MemoryEstimate {
        workers: local,
        tables: mul(table_bytes, local * copies, &|| "tables".into())?,
        optimizer: mul(optimizer_bytes, local * copies, &|| "optimizer state".into())?,
        dense: mul(dense_bytes, copies, &|| "dense".into())?,
        buffers,
    })
}

/// Memory available to this process: `MemAvailable` from `/proc/meminfo`, or the cgroup's
/// remaining limit if lower; `None` where neither can be read (other systems).
pub fn available() -> Option<(u64, &'static str)> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib.saturating_mul(1024))
    });
    let cgroup = (|| {
        let max: u64 = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok()?.trim().parse().ok()?;
        let current: u64 = std::fs::read_to_string("/sys/fs/cgroup/memory.current").ok()?.trim().parse().ok()?;
        Some(max.saturating_sub(current))
    })();
    match (meminfo, cgroup) {
        (Some(m), Some(c)) if c < m => Some((c, "cgroup memory.max")),
        (Some(m), _) => Some((m, "MemAvailable")),
        (None, Some(c)) => Some((c, "cgroup memory.max")),
        (None, None) => None,
    }
}

/// Estimates the run, prints the estimate (process 0, unless `progress` is `none`) and refuses
/// a run whose estimate exceeds the limit of `max_memory`.
pub fn check(settings: &TrainSettings, resolved: &Resolved) -> Result<MemoryEstimate, PipelineError> {
    let limit = settings.run.max_memory;
    let estimate = estimate(settings, resolved)?;
    let available = match limit {
        MemoryLimit::Unlimited => None,
        MemoryLimit::Bytes(b) => Some((b, "--max-memory")),
        MemoryLimit::Auto => available(),
    };
    let fits = available.is_none_or(|(bytes, _)| estimate.total() <= bytes);
    if fits && settings.cluster.process == 0 && settings.run.progress != crate::progress::ProgressMode::None {
        eprintln!("{}", estimate.describe(available));
    }
    match available {
        Some((bytes, from)) if !fits => Err(PipelineError::Resources(ResourceError::Memory {
            needed: estimate.total(),
            available: bytes,
            limit: from,
            estimate: estimate.describe(Some((bytes, from))),
        })),
        _ => Ok(estimate),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::ModelKind;

    #[test]
    fn memory_limits_parse() {
        assert_eq!("auto".parse::<MemoryLimit>().unwrap(), MemoryLimit::Auto);
        assert_eq!("unlimited".parse::<MemoryLimit>().unwrap(), MemoryLimit::Unlimited);
        assert_eq!("4096".parse::<MemoryLimit>().unwrap(), MemoryLimit::Bytes(4096));
        assert_eq!("512M".parse::<MemoryLimit>().unwrap(), MemoryLimit::Bytes(512 << 20));
        assert_eq!("8GiB".parse::<MemoryLimit>().unwrap(), MemoryLimit::Bytes(8 << 30));
        assert_eq!("1.5G".parse::<MemoryLimit>().unwrap(), MemoryLimit::Bytes(3 << 29));
        for bad in ["", "lots", "8X", "-1G", "0", "1e40"] {
            let e = bad.parse::<MemoryLimit>().unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("size such as 8G"), "{bad}: {e}");
        }
    }

    #[test]
    fn dense_params_match_the_built_models() {
        for model in [ModelKind::Dlrm, ModelKind::Lr, ModelKind::Fm, ModelKind::DeepFm, ModelKind::Wdl] {
            for self_interaction in [false, true] {
                let s = {
                    let mut s = TrainSettings::default();
                    s.model.kind = model;
                    s.model.self_interaction = self_interaction;
                    s
                };
                let config = s.model_config().unwrap();
                let built = config.build::<f32>(1).unwrap().params().len() as u64;
                assert_eq!(dense_params(&config).unwrap(), built, "{model}");
            }
        }
        for model in [ModelKind::Dien, ModelKind::DienSum] {
            let s = {
                let mut s = TrainSettings::default();
                s.data.source = "synthetic-behavior".into();
                s.model.kind = model;
                s
            };
            let config = s.validate().unwrap().model;
            let built = config.build::<f32>(1).unwrap().params().len() as u64;
            assert_eq!(dense_params(&config).unwrap(), built, "{model}");
        }
    }

    #[test]
    fn the_estimate_counts_the_tables_and_overflow_is_an_error() {
        let s = {
            let mut s = TrainSettings::default();
            s.data.source = "criteo:Cargo.toml".into();
            s.data.buckets = 1_000_000;
            s.cluster.workers = 2;
            s
        };
        let e = estimate(&s, &s.validate().unwrap()).unwrap();
        // 26 tables of 10⁶ rows × dim 16 × 4 bytes, split over 2 workers, both in this process.
        assert_eq!(e.tables, 26 * 1_000_000 * 16 * 4);
        // Row-wise Adagrad: one accumulator per row, plus the u32 slot index.
        assert_eq!(e.optimizer, 26 * 1_000_000 * 2 * 4);
        assert!(e.describe(Some((1 << 30, "MemAvailable"))).starts_with("memory: ~"));
        // Early stopping without checkpoints keeps a second copy of the model in memory.
        let es = {
            let mut s = s.clone();
            s.run.early_stop = Some(2);
            s
        };
        let c = estimate(&es, &es.validate().unwrap()).unwrap();
        assert_eq!(
            (c.tables, c.optimizer, c.dense, c.buffers),
            (2 * e.tables, 2 * e.optimizer, 2 * e.dense, e.buffers)
        );
        let on_disk = {
            let mut s = es;
            s.checkpoints.checkpoint_dir = Some("ck".into());
            s
        };
        assert_eq!(estimate(&on_disk, &on_disk.validate().unwrap()).unwrap(), e);
        let s = {
            let mut s = s;
            s.data.buckets = 1 << 60;
            s
        };
        let err = estimate(&s, &s.validate().unwrap()).unwrap_err().to_string();
        assert!(err.contains("does not fit in 64 bits") && err.contains("--buckets"), "{err}");
        let s = {
            let mut s = s;
            s.data.buckets = 1 << 30;
            s.run.max_memory = MemoryLimit::Bytes(1 << 30);
            s
        };
        let err = check(&s, &s.validate().unwrap()).unwrap_err().to_string();
        assert!(err.contains("--max-memory") && err.contains("tables"), "{err}");
    }
}
