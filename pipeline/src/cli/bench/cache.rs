//! `tiderec bench cache`: the tiered store against the plain hash store, and
//! a bounded-memory run over a growing id space.
//!
//! **Hit ratio and speed.** One owner's work per step on the synthetic Criteo
//! stream (Zipf(1.1) ranks over the Kaggle cardinalities, 26 tables): the
//! step's distinct ids per table are looked up, then each gets one row update
//! (row-wise Adagrad), then the store's maintenance runs. The id stream is
//! generated and de-duplicated before timing. For each hot-tier size the
//! tiered store and the plain dynamic store (the tiered store's own cold tier
//! alone) replay the same steps: `warmup` steps untimed (the tiered store
//! makes its first plan at their end), then the rest timed, three times each in
//! alternation, best pass kept. Both stores end with bit-identical rows (the
//! bench checks it), so the comparison is of speed only.
//!
//! **Growing id space** (`--growing N`). `N` records of 26 fields stream
//! through one dynamic store with a row budget: the 1,000 head ranks of each
//! field keep their ids, tail ranks get new ids every 10,000 records, so the
//! number of distinct ids grows without bound. Rows held and resident memory
//! (`/proc/self/statm`) are sampled as the stream goes.

use super::dlrm::power_law_rank;
use serde::Serialize;
use std::time::Instant;
use tiderec::PipelineError;
use tiderec_operators::features::mix64;
use tiderec_operators::optim::{OptimizerParams, SparseOptimizerKind};
use tiderec_operators::rng::unit_f64;
use tiderec_operators::store::{EmbeddingStore, Store, StoreConfig, StoreKind, StoreParams, StoreStats};
use tiderec_operators::Batch;
use tiderec_sources::synthetic::{SyntheticConfig, SyntheticCriteo, KAGGLE_CARDINALITIES, NUM_DENSE, NUM_SPARSE};

/// Settings of the hit-ratio comparison.
#[derive(Clone, Debug, Serialize)]
pub struct CacheBench {
    /// Hot-tier sizes to compare (rows).
    pub hot_sizes: Vec<usize>,
    /// Samples per step.
    pub batch_size: usize,
    /// Steps replayed (the first `warmup` untimed).
    pub steps: usize,
    /// Untimed steps before the first plan.
    pub warmup: usize,
    /// Embedding dimension.
    pub dim: usize,
    /// Seed of the stream.
    pub seed: u64,
}

/// One hot-tier size.
#[derive(Clone, Debug, Serialize)]
pub struct CacheRow {
    /// Hot-tier rows.
    pub hot_rows: usize,
    /// Hot-tier bytes (values + optimizer state).
    pub hot_bytes: usize,
    /// Fraction of the timed lookups served by the hot tier.
    pub hot_hit_ratio: f64,
    /// Tiered store: samples per second.
    pub tiered_samples_per_sec: f64,
    /// Plain hash store: samples per second.
    pub hash_samples_per_sec: f64,
    /// Tiered store: lookups + updates per second.
    pub tiered_ops_per_sec: f64,
    /// Plain hash store: lookups + updates per second.
    pub hash_ops_per_sec: f64,
    /// Tiered / hash samples per second.
    pub speedup: f64,
}

/// The comparison's result.
#[derive(Clone, Debug, Serialize)]
pub struct CacheBenchResult {
    /// Its settings.
    pub bench: CacheBench,
    /// Rows held at the end.
    pub rows: u64,
    /// Lookups + updates per timed pass.
    pub ops_per_pass: u64,
    /// One entry per hot-tier size.
    pub sizes: Vec<CacheRow>,
}

/// One sample of the growing run.
#[derive(Clone, Debug, Serialize)]
pub struct GrowPoint {
    /// Records streamed so far.
    pub records: u64,
    /// Rows ever admitted (≈ distinct ids seen).
    pub admitted: u64,
    /// Rows held now.
    pub rows: u64,
    /// Rows evicted so far.
    pub evicted: u64,
    /// Resident memory of the process, MiB.
    pub rss_mib: f64,
}

/// The growing run's result.
#[derive(Clone, Debug, Serialize)]
pub struct GrowResult {
    /// Records streamed.
    pub records: u64,
    /// The row budget (`None`: unbounded).
    pub max_rows: Option<u64>,
    /// Embedding dimension.
    pub dim: usize,
    /// Resident memory before the store existed, MiB.
    pub rss_start_mib: f64,
    /// The curve.
    pub points: Vec<GrowPoint>,
    /// Records per second.
    pub records_per_sec: f64,
}

/// Per step, per table: distinct ids in first-seen order.
type Steps = Vec<Vec<Vec<u64>>>;

fn distinct_ids(batch: &Batch, seen: &mut rustc_hash::FxHashSet<u64>) -> Vec<Vec<u64>> {
    batch
        .sparse
        .iter()
        .map(|f| {
            seen.clear();
            f.ids.iter().copied().filter(|&id| seen.insert(id)).collect()
        })
        .collect()
}

fn store_params(table_sizes: &[u64], dim: usize) -> StoreParams<'_> {
    StoreParams {
        worker: 0,
        workers: 1,
        dim,
        table_sizes,
        seed: 7,
        optimizer: SparseOptimizerKind::RowwiseAdagrad,
        hp: OptimizerParams { initial_accumulator: 1e-6, ..OptimizerParams::with_lr(0.01) },
    }
}

/// Replays `steps` on `store`: lookups, one update per distinct row, maintenance. Returns lookups + updates.
fn replay(store: &mut Store, steps: &[Vec<Vec<u64>>], first_step: u64, rows: &mut Vec<f32>) -> u64 {
    let d = store.dim();
    let mut ops = 0u64;
    for (s, tables) in steps.iter().enumerate() {
        rows.clear();
        for (t, ids) in tables.iter().enumerate() {
            store.gather(t, ids, rows);
        }
        let mut off = 0;
        for (t, ids) in tables.iter().enumerate() {
            for &id in ids {
                // A cheap deterministic gradient derived from the row itself.
                let g: [f32; 64] = std::array::from_fn(|c| if c < d { rows[off + c] * 0.01 + 1e-3 } else { 0.0 });
                store.apply(t, id, &g[..d]);
                off += d;
            }
            ops += 2 * ids.len() as u64;
        }
        store.end_step(first_step + s as u64 + 1);
    }
    ops
}

/// Runs the tiered-vs-hash comparison.
pub fn run_cache(bench: &CacheBench) -> Result<CacheBenchResult, PipelineError> {
    if bench.dim == 0 || bench.dim > 64 {
        return Err(PipelineError::config("dim", "must be between 1 and 64"));
    }
    if bench.warmup == 0 || bench.warmup >= bench.steps {
        return Err(PipelineError::config("warmup", "must be at least 1 and below --steps"));
    }
    if bench.hot_sizes.is_empty() || bench.hot_sizes.contains(&0) {
        return Err(PipelineError::config("hot_rows", "give one or more positive hot-tier sizes"));
    }
    let generator = SyntheticCriteo::new(SyntheticConfig::kaggle_like(bench.seed, u64::MAX))?;
    let table_sizes: Vec<u64> = KAGGLE_CARDINALITIES.to_vec();
    let mut batch = Batch::new(NUM_DENSE, NUM_SPARSE);
    let mut seen = rustc_hash::FxHashSet::default();
    let steps: Steps = (0..bench.steps)
        .map(|s| {
            batch.clear();
            let start = (s * bench.batch_size) as u64;
            generator.fill(start..start + bench.batch_size as u64, &mut batch);
            distinct_ids(&batch, &mut seen)
        })
        .collect();
    let (warm, timed) = steps.split_at(bench.warmup);
    let mut rows_buf = Vec::new();
    let mut sizes = Vec::new();
    let mut held = 0;
    let mut ops_per_pass = 0;
    for &k in &bench.hot_sizes {
        let config = |kind| StoreConfig {
            kind,
            hot_rows: k,
            warmup: bench.warmup as u64,
            flush_every: u64::MAX / 2,
            ..StoreConfig::default()
        };
        let p = store_params(&table_sizes, bench.dim);
        let mut best = [f64::INFINITY; 2];
        let mut hits = (0, 0);
        for round in 0..3 {
            for (i, kind) in [StoreKind::Tiered, StoreKind::Dynamic].into_iter().enumerate() {
                let mut store = Store::new(&config(kind), &p)?;
                replay(&mut store, warm, 0, &mut rows_buf);
                let before = store.stats();
                let t0 = Instant::now();
                ops_per_pass = replay(&mut store, timed, bench.warmup as u64, &mut rows_buf);
                best[i] = best[i].min(t0.elapsed().as_secs_f64());
                if kind == StoreKind::Tiered && round == 0 {
                    let after = store.stats();
                    hits = (after.hot_hits - before.hot_hits, after.lookups - before.lookups);
                }
                held = store.num_rows() as u64;
            }
        }
        let samples = (timed.len() * bench.batch_size) as f64;
        let row = CacheRow {
            hot_rows: k,
            hot_bytes: k * (bench.dim + 1) * 4,
            hot_hit_ratio: hits.0 as f64 / hits.1.max(1) as f64,
            tiered_samples_per_sec: samples / best[0],
            hash_samples_per_sec: samples / best[1],
            tiered_ops_per_sec: ops_per_pass as f64 / best[0],
            hash_ops_per_sec: ops_per_pass as f64 / best[1],
            speedup: best[1] / best[0],
        };
        sizes.push(row);
    }
    // The two stores hold the same model (values never depend on placement).
    let p = store_params(&table_sizes, bench.dim);
    let k = bench.hot_sizes[0];
    let mut a = Store::new(
        &StoreConfig { kind: StoreKind::Tiered, hot_rows: k, warmup: 2, flush_every: 3, ..StoreConfig::default() },
        &p,
    )?;
    let mut b = Store::new(&StoreConfig { kind: StoreKind::Dynamic, ..StoreConfig::default() }, &p)?;
    let check = &steps[..steps.len().min(12)];
    replay(&mut a, check, 0, &mut rows_buf);
    replay(&mut b, check, 0, &mut rows_buf);
    // Rows, optimizer slots and counts; not `hot`, which records where the tiered store keeps a row.
    let model = |s: &Store, t: usize| {
        let r = s.export_table(t);
        (r.ids, r.rows, r.state, r.counts)
    };
    if (0..NUM_SPARSE).any(|t| model(&a, t) != model(&b, t)) {
        return Err(PipelineError::dataflow(
            tiderec::error::DataflowFailure::Incomplete,
            "the tiered store's rows differ from the hash store's",
        ));
    }
    Ok(CacheBenchResult { bench: bench.clone(), rows: held, ops_per_pass, sizes })
}

/// Resident memory of this process in MiB (0 where `/proc` is unavailable).
pub fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        .map_or(0.0, |pages| pages as f64 * 4096.0 / (1024.0 * 1024.0))
}

/// Streams `records` records with a growing id space through a dynamic store.
pub fn run_growing(
    records: u64,
    max_rows: Option<u64>,
    dim: usize,
    batch_size: usize,
    points: usize,
) -> Result<GrowResult, PipelineError> {
    const HEAD: u64 = 1000;
    const WINDOW: u64 = 10_000;
    if dim == 0 || dim > 64 {
        return Err(PipelineError::config("dim", "must be between 1 and 64"));
    }
    if batch_size == 0 {
        return Err(PipelineError::config("batch_size", "must be positive"));
    }
    let rss_start = rss_mib();
    let table_sizes = vec![u64::MAX / 2; NUM_SPARSE];
    let config = StoreConfig { kind: StoreKind::Dynamic, max_rows, flush_every: 10, ..StoreConfig::default() };
    let mut store = Store::new(&config, &store_params(&table_sizes, dim))?;
    let steps = records.div_ceil(batch_size as u64);
    let every = (steps / points.max(1) as u64).max(1);
    let mut curve = Vec::new();
    let mut tables: Vec<Vec<u64>> = vec![Vec::new(); NUM_SPARSE];
    let mut seen = rustc_hash::FxHashSet::default();
    let mut rows = Vec::new();
    let t0 = Instant::now();
    for s in 0..steps {
        let start = s * batch_size as u64;
        let end = (start + batch_size as u64).min(records);
        for (t, ids) in tables.iter_mut().enumerate() {
            ids.clear();
            seen.clear();
            let n = KAGGLE_CARDINALITIES[t];
            for i in start..end {
                let rank = power_law_rank(n, 1.1, unit_f64(11, t as u64, i, 0));
                let id = if rank <= HEAD { rank } else { mix64(rank ^ mix64(i / WINDOW)) >> 2 };
                if seen.insert(id) {
                    ids.push(id);
                }
            }
        }
        replay(&mut store, std::slice::from_ref(&tables), s, &mut rows);
        if (s + 1) % every == 0 || s + 1 == steps {
            let st: StoreStats = store.stats();
            curve.push(GrowPoint {
                records: end,
                admitted: st.admissions,
                rows: store.num_rows() as u64,
                evicted: st.evictions,
                rss_mib: rss_mib(),
            });
        }
    }
    Ok(GrowResult {
        records,
        max_rows,
        dim,
        rss_start_mib: rss_start,
        points: curve,
        records_per_sec: records as f64 / t0.elapsed().as_secs_f64(),
    })
}
