//! `tiderec bench dlrm` and `tiderec bench model`: training throughput on
//! the real multi-worker path (timely exchanges included).
//!
//! 26 tables × 100,000 rows; every sample has one uniformly random id per
//! table and random dense values. `dlrm` is the Kaggle shape (dim 16, bottom
//! 13-512-256-64-16, top 512-256-1); `model` takes any `--model` with the
//! CLI's default shapes. Batches are generated before timing starts and
//! reused, so the figure measures training, not data generation.

use crate::run::timely_config;
use crate::{PipelineError, TrainSettings};
use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;
use tiderec_operators::features::mix64;
use tiderec_operators::nn::{DlrmConfig, ModelConfig};

/// The Kaggle DLRM shape of `tiderec bench dlrm`.
pub fn kaggle_dlrm() -> ModelConfig {
    ModelConfig::Dlrm(DlrmConfig::kaggle())
}
use tiderec_operators::optim::{DenseOptimizerKind, OptimizerParams, SparseOptimizerKind};
use tiderec_operators::rng::unit_f64;
use tiderec_operators::train::{StepKind, Trainer, TrainerConfig};
use tiderec_operators::Batch;

/// Settings of `tiderec bench dlrm`.
#[derive(Clone, Debug)]
pub struct DlrmBench {
    /// Global batch size.
    pub batch_size: usize,
    /// Worker threads.
    pub workers: usize,
    /// Untimed warm-up steps.
    pub warmup_steps: u64,
    /// Timed steps.
    pub steps: u64,
    /// Rows per table.
    pub rows: u64,
    /// Dense optimizer.
    pub optimizer: DenseOptimizerKind,
    /// The model (DLRM Kaggle shape for `bench dlrm`).
    pub model: ModelConfig,
}

/// Result of a training benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct DlrmBenchResult {
    /// The model (`dlrm`, `lr`, `fm`, `deepfm`).
    pub model: String,
    /// Training samples per second over the timed steps.
    pub samples_per_sec: f64,
    /// Mean milliseconds per step.
    pub ms_per_step: f64,
    /// Global batch size.
    pub batch_size: usize,
    /// Worker threads.
    pub workers: usize,
    /// Timed steps.
    pub steps: u64,
    /// Bytes exchanged between workers per sample.
    pub bytes_per_sample: f64,
}

/// A micro-batch of `n` samples with one random id per table, seeded by `seed`.
pub fn random_batch(n: usize, rows: u64, seed: u64) -> Batch {
    let mut b = Batch::new(13, 26);
    for i in 0..n as u64 {
        b.labels.push((unit_f64(seed, i, 0, 0) < 0.25) as u8 as f32);
        for j in 0..13 {
            b.dense.push((unit_f64(seed, i, 1, j) * 5.0) as f32);
        }
        for (t, f) in b.sparse.iter_mut().enumerate() {
            f.ids.push(mix64(seed ^ mix64(i * 31 + t as u64)) % rows);
            f.close_bag();
        }
    }
    b
}

/// Runs the benchmark on `workers` threads.
pub fn run_dlrm(bench: &DlrmBench) -> Result<DlrmBenchResult, PipelineError> {
    if bench.batch_size < bench.workers || bench.workers == 0 {
        return Err(PipelineError::config("batch_size", "must be at least the number of workers (and workers ≥ 1)"));
    }
    let settings = TrainSettings { workers: bench.workers, batch_size: bench.batch_size, ..TrainSettings::default() };
    let resolved = settings.validate()?;
    let config = TrainerConfig {
        model: bench.model.clone(),
        table_sizes: vec![bench.rows; 26],
        seed: 7,
        dense_optimizer: bench.optimizer,
        dense_hp: OptimizerParams::with_lr(0.01),
        sparse_optimizer: SparseOptimizerKind::RowwiseAdagrad,
        sparse_hp: OptimizerParams::with_lr(0.01),
    };
    let bench = Arc::new(bench.clone());
    let b2 = bench.clone();
    let guards = timely::execute(timely_config(&settings, &resolved), move |worker| {
        let bench = &b2;
        let (me, w) = (worker.index(), worker.peers());
        let micro = bench.batch_size * (me + 1) / w - bench.batch_size * me / w;
        let pool: Vec<Batch> = (0..8).map(|k| random_batch(micro, bench.rows, (me * 1000 + k) as u64)).collect();
        let mut trainer = Trainer::new(worker, &config)?;
        let run = |steps: u64, trainer: &mut Trainer, worker: &mut timely::worker::Worker| {
            let mut last = Default::default();
            for s in 0..steps {
                last = trainer.step(worker, StepKind::Train, pool[s as usize % pool.len()].clone())?;
            }
            Ok::<_, PipelineError>(last)
        };
        run(bench.warmup_steps, &mut trainer, worker)?;
        let before = trainer.bytes_sent();
        let start = Instant::now();
        let stats = run(bench.steps, &mut trainer, worker)?;
        let secs = start.elapsed().as_secs_f64();
        Ok::<_, PipelineError>((secs, stats, trainer.bytes_sent() - before))
    })
    .map_err(|e| PipelineError::Dataflow(e.to_string()))?;
    let mut secs = 0.0f64;
    let mut bytes = 0u64;
    for r in guards.join() {
        let (s, _stats, b) = r.map_err(PipelineError::Dataflow)??;
        secs = secs.max(s);
        bytes += b;
    }
    let samples = bench.steps * bench.batch_size as u64;
    Ok(DlrmBenchResult {
        model: bench.model.name().to_string(),
        samples_per_sec: samples as f64 / secs,
        ms_per_step: secs * 1e3 / bench.steps as f64,
        batch_size: bench.batch_size,
        workers: bench.workers,
        steps: bench.steps,
        bytes_per_sample: bytes as f64 / samples as f64,
    })
}

/// Result of `tiderec bench gru`: forward + backward of the split and the unsplit cell.
#[derive(Clone, Debug, Serialize)]
pub struct GruBenchResult {
    /// Sequences per batch.
    pub batch_size: usize,
    /// Time steps per sequence.
    pub steps: usize,
    /// Input width.
    pub input: usize,
    /// Hidden width.
    pub hidden: usize,
    /// Sequences per second, split cell (input projections hoisted into one GEMM).
    pub split_sequences_per_sec: f64,
    /// Sequences per second, unsplit cell (one GEMM over `[x_t, h]` per step).
    pub unsplit_sequences_per_sec: f64,
    /// `split / unsplit`.
    pub speedup: f64,
}

/// Times GRU forward + backward with the split and the unsplit cell on the same random inputs.
pub fn run_gru(batch: usize, steps: usize, input: usize, hidden: usize, seconds: f64) -> GruBenchResult {
    use tiderec_operators::nn::gru::{Gru, GruCache};
    let gru = Gru { input, hidden, offset: 0 };
    let mut params = vec![0.0f32; gru.num_params()];
    gru.init(&mut params, 1, 0);
    let x: Vec<f32> = (0..batch * steps * input).map(|i| unit_f64(2, i as u64, 0, 0) as f32 - 0.5).collect();
    // Lengths spread over 1..=steps, as in behaviour histories.
    let lengths: Vec<usize> = (0..batch).map(|b| 1 + (mix64(b as u64) % steps as u64) as usize).collect();
    let dstates: Vec<f32> = (0..steps * batch * hidden).map(|i| unit_f64(3, i as u64, 0, 0) as f32 - 0.5).collect();
    let mut grads = vec![0.0f32; params.len()];
    let mut dx = vec![0.0f32; x.len()];
    let mut cache = GruCache::default();
    let mut time = |split: bool| {
        let mut iterations = 0u64;
        let start = Instant::now();
        while iterations < 3 || start.elapsed().as_secs_f64() < seconds {
            if split {
                gru.forward(&params, &x, &lengths, batch, steps, &mut cache);
                gru.backward(&params, &x, &lengths, &cache, &dstates, &mut grads, &mut dx);
            } else {
                gru.forward_unsplit(&params, &x, &lengths, batch, steps, &mut cache);
                gru.backward_unsplit(&params, &x, &lengths, &cache, &dstates, &mut grads, &mut dx);
            }
            iterations += 1;
        }
        (iterations * batch as u64) as f64 / start.elapsed().as_secs_f64()
    };
    // Alternate to share any drift of the machine between the two.
    let (mut split, mut unsplit) = (0.0, 0.0);
    for _ in 0..2 {
        unsplit += time(false) / 2.0;
        split += time(true) / 2.0;
    }
    GruBenchResult {
        batch_size: batch,
        steps,
        input,
        hidden,
        split_sequences_per_sec: split,
        unsplit_sequences_per_sec: unsplit,
        speedup: split / unsplit,
    }
}
