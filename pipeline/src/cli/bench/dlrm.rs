//! `tiderec bench dlrm` and `tiderec bench model`: training throughput on
//! the real multi-worker path (timely exchanges included).
//!
//! 26 tables × 100,000 rows; every sample has one uniformly random id per
//! table (`--zipf S`: Zipf(S)-skewed ids) and random dense values. `dlrm` is
//! the Kaggle shape (dim 16, bottom 13-512-256-64-16, top 512-256-1); `model`
//! takes any `--model` with the CLI's default shapes. Batches are generated
//! before timing starts and reused, so the figure measures training, not data
//! generation. Models over behaviour sequences (`dien`, `dien-sum`) train on
//! the synthetic behaviour stream instead (user, item and category tables,
//! histories of up to `max_len` events), and `dien` also times its GRU's split
//! cell against the unsplit one on the same shapes in the same run.

use super::gru::{run_gru, GruBenchResult};
use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;
use tiderec::error::DataflowFailure;
use tiderec::run::timely_config;
use tiderec::{PipelineError, TrainSettings};
use tiderec_gpu::resident::{GraphCounts, PhaseTimes};
use tiderec_operators::features::mix64;
use tiderec_operators::nn::{DlrmConfig, Interest, ModelConfig, Precision};
use tiderec_operators::optim::{DenseOptimizerKind, OptimizerParams, SparseOptimizerKind};
use tiderec_operators::rng::unit_f64;
use tiderec_operators::store::{StoreConfig, StoreKind};
use tiderec_operators::train::{StepKind, StepTimes, Trainer, TrainerConfig};
use tiderec_operators::Batch;
use tiderec_sources::synthetic_behavior::{BehaviorConfig, SyntheticBehavior, SEQUENCE_TABLES};

/// The Kaggle DLRM shape of `tiderec bench dlrm`.
pub fn kaggle_dlrm() -> ModelConfig {
    ModelConfig::Dlrm(DlrmConfig::kaggle())
}

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
    /// Compute device of each worker (the `device` setting: `cpu`, `cuda:N`, a list).
    pub device: String,
    /// Precision of the MLPs' products.
    pub precision: Precision,
    /// Run `workers` single-worker trainers side by side instead of one trainer
    /// of `workers` workers: nothing exchanged, no rendezvous, each worker's
    /// micro-batch and batches as in the synchronous run (the machine's ceiling
    /// for `workers` workers).
    pub independent: bool,
    /// One GPU worker keeps its rows, pooling and optimizers on the host (the
    /// path of a GPU worker among several) instead of on the device.
    pub host_rows: bool,
    /// A device-resident worker times each phase of its steps (waiting for the
    /// device after each, so the step itself is slower).
    pub phases: bool,
    /// The ids' skew: 0 for uniform ids, else a Zipf exponent ([`random_batch`]).
    pub zipf: f64,
    /// Train under the tiered store with this many hot rows per worker (see
    /// [`tiered_store`]) instead of the fixed table.
    pub hot_rows: Option<usize>,
}

/// The tiered store of a benchmark with `hot_rows` hot rows per worker: planned
/// during the warm-up (after at most 10 steps; rows updated in fewer than two
/// steps never qualify) and again every 50 steps, so the timed steps run on a
/// hot tier and pay for its re-plans.
pub fn tiered_store(hot_rows: usize, warmup_steps: u64) -> StoreConfig {
    StoreConfig {
        kind: StoreKind::Tiered,
        hot_rows,
        warmup: warmup_steps.clamp(2, 10),
        flush_every: 50,
        ..StoreConfig::default()
    }
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
    /// The ids' Zipf exponent (0: uniform).
    pub zipf: f64,
    /// Worker threads.
    pub workers: usize,
    /// Whether the workers were independent single-worker trainers (`--independent`).
    pub independent: bool,
    /// Precision of the MLPs' products (`fp32`, `bf16`).
    pub precision: String,
    /// The vector extensions the kernels may use, naming the `TIDEREC_MAX_ISA`
    /// cap when one is set (`avx2 fma (TIDEREC_MAX_ISA=avx2; off: avx512f …)`).
    pub cpu_features: String,
    /// Timed steps.
    pub steps: u64,
    /// Bytes exchanged between workers per sample.
    pub bytes_per_sample: f64,
    /// Per worker, in worker order: milliseconds per timed step inside the trainer
    /// (`total`) and inside each stage of the dataflow; `total` less the stages is the
    /// time outside them (waiting at rendezvous, moving messages, timely's scheduling).
    pub stage_ms: Vec<StepTimes>,
    /// Dense (model) parameters.
    pub dense_params: u64,
    /// Embedding parameters: rows of every table times the row width.
    pub embedding_params: u64,
    /// One GPU worker trained with its rows, pooling and optimizers on the device
    /// (`tiderec_gpu::resident`, driven directly); `stage_ms` then holds only
    /// the step's total.
    pub rows_on_device: bool,
    /// The GPU workers of a trainer kept the rows they own on their devices
    /// (`tiderec_gpu::device_shard`, or the tiered store's hot tier:
    /// `tiderec_gpu::device_hot_tier`); the pooling and the dense optimizer on the host.
    pub owned_rows_on_device: bool,
    /// The threads worker 0 may plan, pool and sum its rows' gradients on
    /// (`TIDEREC_HOST_THREADS`, by default a GPU worker's share of the cores, one
    /// for a CPU worker; a step of fewer than 16,384 ids takes fewer); absent
    /// for a device-resident worker, which does none of it on the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_threads: Option<usize>,
    /// The store: `fixed`, or `tiered` with `--hot-rows`.
    pub store: String,
    /// The tiered store's hot rows per worker.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hot_rows: Option<usize>,
    /// With `phases` on a device-resident worker: milliseconds per step in each phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase_ms: Option<PhaseTimes>,
    /// A device-resident worker with CUDA graphs on (the default): the graphs it
    /// captured and the steps (warm-up and timed) it ran as graphs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_graphs: Option<GraphCounts>,
    /// DIEN only: the GRU cell of this model's shape, split vs unsplit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gru: Option<GruBenchResult>,
}

/// A Zipf(`s`)-like rank in `1..=n` by inverting the continuous power law
/// (`s` = 1 is its limit, `n^u`).
pub fn power_law_rank(n: u64, s: f64, u: f64) -> u64 {
    let a = 1.0 - s;
    let x = if a.abs() < 1e-9 { (n as f64).powf(u) } else { (((n as f64).powf(a) - 1.0) * u + 1.0).powf(1.0 / a) };
    (x as u64).clamp(1, n)
}

/// A micro-batch of `n` samples with one random id per table, seeded by `seed`:
/// uniform over the `rows` when `zipf` is 0, else Zipf(`zipf`)-like (id 0 the
/// most frequent, as in real click logs, where a field's top values fill a
/// large share of the samples).
pub fn random_batch(n: usize, rows: u64, seed: u64, zipf: f64) -> Batch {
    let mut b = Batch::new(13, 26);
    for i in 0..n as u64 {
        b.labels.push((unit_f64(seed, i, 0, 0) < 0.25) as u8 as f32);
        for j in 0..13 {
            b.dense.push((unit_f64(seed, i, 1, j) * 5.0) as f32);
        }
        for (t, f) in b.sparse.iter_mut().enumerate() {
            let h = mix64(seed ^ mix64(i * 31 + t as u64));
            let id = if zipf == 0.0 {
                h % rows
            } else {
                power_law_rank(rows, zipf, (h >> 11) as f64 / (1u64 << 53) as f64) - 1
            };
            f.ids.push(id);
            f.close_bag();
        }
    }
    b
}

/// Runs the benchmark on `workers` threads: one synchronous trainer over
/// `workers` timely workers, or with [`DlrmBench::independent`] `workers`
/// single-worker trainers side by side.
pub fn run_dlrm(bench: &DlrmBench) -> Result<DlrmBenchResult, PipelineError> {
    if bench.batch_size < bench.workers || bench.workers == 0 {
        return Err(PipelineError::config("batch_size", "must be at least the number of workers (and workers ≥ 1)"));
    }
    if bench.independent && bench.device.contains(',') {
        return Err(PipelineError::config(
            "device",
            "independent trainers take one device for all of them (cpu or one cuda:N), not a list",
        ));
    }
    let setup = Arc::new(Setup::new(bench)?);
    let embedding_params = setup.config.table_sizes.iter().sum::<u64>() * setup.config.model.embedding_dim() as u64;
    let gpu_only = tiderec::device::Devices::parse(&bench.device).is_ok_and(|d| !d.any_cpu());
    if !gpu_only {
        bench.precision.check_cpu()?;
    }
    eprintln!(
        "{}",
        if gpu_only {
            tiderec::kernels::gpu_line(bench.precision)
        } else {
            tiderec::kernels::startup_line_for(&bench.model, bench.batch_size, bench.workers, bench.precision)
        }
    );
    let resident = resident_device(bench, &setup.config);
    let (mut phase_ms, mut cuda_graphs) = (None, None);
    let timed = if let Some(n) = resident {
        let (timed, phases, graphs) = timed_resident(bench, &setup, n)?;
        (phase_ms, cuda_graphs) = (phases, graphs);
        vec![timed]
    } else if bench.independent && bench.workers > 1 {
        independent_trainers(bench, &setup)?
    } else {
        timed_trainer(bench, setup.clone(), 0, None)?
    };
    let secs = timed.iter().map(|t| t.secs).fold(0.0f64, f64::max);
    let samples = bench.steps * bench.batch_size as u64;
    Ok(DlrmBenchResult {
        model: bench.model.name().to_string(),
        samples_per_sec: samples as f64 / secs,
        ms_per_step: secs * 1e3 / bench.steps as f64,
        batch_size: bench.batch_size,
        zipf: bench.zipf,
        workers: bench.workers,
        independent: bench.independent,
        precision: bench.precision.name().into(),
        cpu_features: tiderec_operators::nn::kernel_choice::cpu_features_line(),
        steps: bench.steps,
        bytes_per_sample: timed.iter().map(|t| t.bytes).sum::<u64>() as f64 / samples as f64,
        stage_ms: timed.iter().map(|t| t.stages).collect(),
        dense_params: timed.first().map_or(0, |t| t.dense_params),
        embedding_params,
        rows_on_device: resident.is_some(),
        owned_rows_on_device: resident.is_none() && setup.devices.owned_rows_on_device(&setup.config, bench.workers),
        host_threads: resident.is_none().then(|| setup.devices.host_threads(0, bench.workers)),
        store: setup.config.store.kind.to_string(),
        hot_rows: bench.hot_rows,
        phase_ms,
        cuda_graphs,
        gru: match &bench.model {
            ModelConfig::Dien(c) if c.interest == Interest::GruAttention => {
                let e = c.interest_dim();
                let micro = tiderec::data::micro_batch(bench.batch_size, 0, bench.workers);
                Some(run_gru(micro, c.max_len, e, e, 2.0))
            }
            _ => None,
        },
    })
}

/// The GPU of a run that trains on one device-resident worker: one worker on
/// one `cuda:N`, a model and configuration the device path takes, and rows
/// not asked to stay on the host.
fn resident_device(bench: &DlrmBench, config: &TrainerConfig) -> Option<usize> {
    let one_gpu = match tiderec::device::Devices::parse(&bench.device).ok()?.worker(0) {
        tiderec::device::WorkerDevice::Cuda(n) => Some(n),
        tiderec::device::WorkerDevice::Cpu => None,
    };
    let eligible =
        bench.workers == 1 && !bench.host_rows && tiderec_gpu::resident::ResidentWorker::supports(config).is_ok();
    one_gpu.filter(|_| eligible)
}

/// Trains the warm-up and timed steps of `bench` on one device-resident GPU
/// worker driven directly (no trainer around it), on the batches worker 0 of a
/// trainer would see; with `--phases` timing each phase; with CUDA graphs on
/// (the default; `TIDEREC_GPU_GRAPHS=off` turns them off) their counts.
fn timed_resident(
    bench: &DlrmBench,
    setup: &Setup,
    n: usize,
) -> Result<(Timed, Option<PhaseTimes>, Option<GraphCounts>), PipelineError> {
    let config = &setup.config;
    let fail = |e: tiderec_gpu::GpuError| PipelineError::config("device", format!("cuda:{n}: {e}"));
    let dev = tiderec_gpu::Device::open(n).and_then(|d| d.with_precision(bench.precision)).map_err(fail)?;
    let mut worker = tiderec_gpu::resident::ResidentWorker::new(&dev, config).map_err(fail)?;
    worker.set_hot_rows(tiderec::device::hot_rows()?).map_err(fail)?;
    let graphs = tiderec::device::graphs()?;
    worker.set_graphs(graphs);
    let pool = batch_pool(bench, setup.behavior.as_ref(), bench.batch_size, 0);
    // Untimed phases: the next batch is built and uploaded while the device runs the step before.
    let run = |worker: &mut tiderec_gpu::resident::ResidentWorker, steps: u64| {
        let batches = (0..steps as usize).map(|s| &pool[s % pool.len()]);
        let outcomes = if bench.phases {
            batches.map(|b| worker.train(b, false)).collect::<Result<Vec<_>, _>>()
        } else {
            worker.train_all(batches)
        }
        .map_err(fail)?;
        match outcomes.iter().position(|o| o.non_finite) {
            Some(s) => Err(PipelineError::config("device", format!("cuda:{n}: step {s} left a non-finite value"))),
            None => Ok(()),
        }
    };
    run(&mut worker, bench.warmup_steps)?;
    worker.time_phases(bench.phases);
    let started = Instant::now();
    run(&mut worker, bench.steps)?;
    let secs = started.elapsed().as_secs_f64();
    let stages = StepTimes { total: secs * 1e3 / bench.steps as f64, ..StepTimes::default() };
    let phases = bench.phases.then(|| worker.phase_ms().scaled(1.0 / bench.steps as f64));
    let dense_params = config.model.build::<f32>(config.seed)?.params().len() as u64;
    let counts = graphs.then(|| worker.graph_counts());
    Ok((Timed { secs, bytes: 0, dense_params, stages }, phases, counts))
}

/// The eight batches worker `me` of `bench` trains on in turn, `micro`
/// samples each: from the synthetic behaviour stream for a model over
/// sequences, else [`random_batch`]es.
fn batch_pool(bench: &DlrmBench, behavior: Option<&SyntheticBehavior>, micro: usize, me: usize) -> Vec<Batch> {
    (0..8u64)
        .map(|k| match behavior {
            Some(g) => {
                let mut b = Batch::with_sequences(0, 3, 2);
                let start = (me as u64 * 8 + k) * micro as u64;
                g.fill(start..start + micro as u64, &mut b);
                b
            }
            None => random_batch(micro, bench.rows, me as u64 * 1000 + k, bench.zipf),
        })
        .collect()
}

/// What every trainer of a benchmark shares, built and checked once: the
/// trainer's configuration (model, tables, optimizers), the synthetic
/// behaviour stream of models over sequences, and the devices.
struct Setup {
    config: TrainerConfig,
    behavior: Option<SyntheticBehavior>,
    devices: tiderec::device::Devices,
}

impl Setup {
    fn new(bench: &DlrmBench) -> Result<Self, PipelineError> {
        let behavior = match &bench.model {
            ModelConfig::Dien(c) => Some(SyntheticBehavior::new(BehaviorConfig::standard(7, c.max_len))?),
            _ => None,
        };
        let config = TrainerConfig {
            model: bench.model.clone(),
            table_sizes: behavior.as_ref().map_or_else(|| vec![bench.rows; 26], |g| g.config().table_sizes()),
            seed: 7,
            dense_optimizer: bench.optimizer,
            dense_hp: OptimizerParams::with_lr(0.01),
            sparse_optimizer: SparseOptimizerKind::RowwiseAdagrad,
            sparse_hp: OptimizerParams::with_lr(0.01),
            sequence_tables: if behavior.is_some() { SEQUENCE_TABLES.to_vec() } else { Vec::new() },
            store: bench.hot_rows.map_or_else(StoreConfig::default, |k| tiered_store(k, bench.warmup_steps)),
            exchange: Default::default(),
        };
        let mut devices = tiderec::device::Devices::for_workers(&bench.device, bench.workers)?;
        if bench.host_rows {
            devices = devices.keep_rows_on_host();
        }
        devices.preflight(&config)?;
        Ok(Setup { config, behavior, devices })
    }
}

/// One worker's timed steps.
struct Timed {
    /// Seconds of the timed steps.
    secs: f64,
    /// Bytes the worker sent during them.
    bytes: u64,
    /// Dense parameters of its model.
    dense_params: u64,
    /// Milliseconds per timed step, per stage.
    stages: StepTimes,
}

/// `bench.workers` single-worker trainers on as many threads, each on the
/// micro-batch worker `i` of one trainer would train and on that worker's
/// batches, their timed steps started together (each waits at a start line
/// after its warm-up): what the machine gives `W` workers that exchange nothing.
fn independent_trainers(bench: &DlrmBench, setup: &Arc<Setup>) -> Result<Vec<Timed>, PipelineError> {
    let start = Arc::new(StartLine::new(bench.workers));
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..bench.workers)
            .map(|i| {
                let one = DlrmBench {
                    batch_size: tiderec::data::micro_batch(bench.batch_size, i, bench.workers),
                    workers: 1,
                    independent: false,
                    ..bench.clone()
                };
                let start = start.clone();
                scope.spawn(move || {
                    let timed = timed_trainer(&one, setup.clone(), i, Some(start.clone()));
                    if timed.is_err() {
                        start.abandon();
                    }
                    timed
                })
            })
            .collect();
        let mut all = Vec::with_capacity(bench.workers);
        for h in handles {
            let timed = h.join().map_err(|_| {
                PipelineError::dataflow(DataflowFailure::Panicked, "an independent trainer's thread panicked")
            })??;
            all.extend(timed);
        }
        Ok(all)
    })
}

/// Where independent trainers wait for each other before their timed steps.
struct StartLine {
    /// Trainers arrived, and whether one failed (then nobody waits).
    state: std::sync::Mutex<(usize, bool)>,
    all_there: std::sync::Condvar,
    expected: usize,
}

impl StartLine {
    fn new(expected: usize) -> Self {
        StartLine { state: std::sync::Mutex::new((0, false)), all_there: std::sync::Condvar::new(), expected }
    }

    /// Waits until every trainer has arrived or one has failed (`false` then).
    fn arrive(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0 += 1;
        self.all_there.notify_all();
        while s.0 < self.expected && !s.1 {
            s = self.all_there.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        !s.1
    }

    /// A trainer failed: release the others.
    fn abandon(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).1 = true;
        self.all_there.notify_all();
    }
}

/// Trains `bench.warmup_steps` untimed then `bench.steps` timed steps on one
/// trainer of `bench.workers` timely workers; worker `w` trains on the batches
/// of worker `first + w` (so independent trainers see what the workers of one
/// trainer would). With `start`, every worker waits there after its warm-up.
fn timed_trainer(
    bench: &DlrmBench,
    setup: Arc<Setup>,
    first: usize,
    start: Option<Arc<StartLine>>,
) -> Result<Vec<Timed>, PipelineError> {
    let settings = {
        let mut s = TrainSettings::default();
        s.cluster.workers = bench.workers;
        s.run.batch_size = bench.batch_size;
        s.cluster.device = bench.device.clone();
        s.model.precision = bench.precision;
        s
    };
    let resolved = settings.validate()?;
    let workers = bench.workers;
    let bench = Arc::new(bench.clone());
    let guards = timely::execute(timely_config(&settings, &resolved), move |worker| {
        let Setup { config, behavior, devices } = &*setup;
        let (index, w) = (worker.index(), worker.peers());
        let me = first + index;
        let micro = tiderec::data::micro_batch(bench.batch_size, index, w);
        let pool = batch_pool(&bench, behavior.as_ref(), micro, me);
        let mut trainer = devices.trainer(worker, config, bench.workers, bench.precision)?;
        let run = |steps: u64, trainer: &mut Trainer, worker: &mut timely::worker::Worker| {
            for s in 0..steps {
                trainer.step(worker, StepKind::Train, pool[s as usize % pool.len()].clone())?;
            }
            Ok::<_, PipelineError>(())
        };
        run(bench.warmup_steps, &mut trainer, worker)?;
        if let Some(start) = &start {
            if !start.arrive() {
                return Err(PipelineError::dataflow(
                    DataflowFailure::PeerFailed,
                    "another independent trainer failed before the timed steps",
                ));
            }
        }
        let (before, clock) = (trainer.bytes_sent(), trainer.step_times());
        let started = Instant::now();
        run(bench.steps, &mut trainer, worker)?;
        let secs = started.elapsed().as_secs_f64();
        let stages = trainer.step_times().since(&clock).scaled(1e3 / bench.steps as f64);
        Ok::<_, PipelineError>(Timed {
            secs,
            bytes: trainer.bytes_sent() - before,
            dense_params: trainer.num_dense_params() as u64,
            stages,
        })
    })
    .map_err(|e| PipelineError::dataflow(DataflowFailure::Start, "cannot start timely workers").with_source(e))?;
    let mut timed = Vec::with_capacity(workers);
    for r in guards.join() {
        timed.push(r.map_err(|panic| {
            PipelineError::dataflow(DataflowFailure::Panicked, "a worker panicked").with_source(panic)
        })??);
    }
    Ok(timed)
}

#[cfg(test)]
mod tests {
    use super::{power_law_rank, random_batch, StartLine};
    use std::sync::Arc;
    use std::thread::JoinHandle;

    /// The largest share of the samples one id takes in any table of `b`.
    fn top_share(b: &tiderec_operators::Batch) -> f64 {
        let n = b.labels.len() as f64;
        b.sparse
            .iter()
            .map(|f| {
                let mut counts = std::collections::HashMap::new();
                f.ids.iter().for_each(|&id| *counts.entry(id).or_insert(0usize) += 1);
                *counts.values().max().unwrap() as f64 / n
            })
            .fold(0.0, f64::max)
    }

    #[test]
    fn zipf_ids_make_hot_rows_and_stay_in_the_table() {
        let rows = 100_000;
        let skewed = random_batch(16_384, rows, 3, 1.1);
        let uniform = random_batch(16_384, rows, 3, 0.0);
        for b in [&skewed, &uniform] {
            assert!(b.sparse.iter().all(|f| f.ids.iter().all(|&id| id < rows)), "every id inside its table");
        }
        // Zipf(1.1) over 100,000 ranks by the continuous inversion: rank 1 for
        // u < (1 - 2^-0.1) / (1 - 100,000^-0.1) = 0.098; uniform ids repeat a few times at most.
        let hot = top_share(&skewed);
        assert!((0.08..0.12).contains(&hot), "id 0 takes {hot:.3} of a skewed table");
        assert!(top_share(&uniform) < 0.001, "uniform ids: {}", top_share(&uniform));
        // The s = 1 limit is the power n^u, not a division by zero.
        assert_eq!(power_law_rank(100, 1.0, 0.0), 1);
        assert_eq!(power_law_rank(100, 1.0, 0.5), 10);
        assert_eq!(power_law_rank(100, 1.0, 1.0), 100);
    }

    /// `n` threads arriving at `line`, each returning what `arrive` said.
    fn arrivals(line: &Arc<StartLine>, n: usize) -> Vec<JoinHandle<bool>> {
        (0..n)
            .map(|_| {
                let line = line.clone();
                std::thread::spawn(move || line.arrive())
            })
            .collect()
    }

    #[test]
    fn the_start_line_waits_for_everyone_or_lets_go_on_a_failure() {
        let line = Arc::new(StartLine::new(3));
        let waiting = arrivals(&line, 2);
        assert!(arrivals(&line, 1).pop().unwrap().join().unwrap(), "all three arrived");
        for w in waiting {
            assert!(w.join().unwrap());
        }
        // One of three fails before arriving: the two that arrive are let go, told so.
        let line = Arc::new(StartLine::new(3));
        let waiting = arrivals(&line, 2);
        line.abandon();
        for w in waiting {
            assert!(!w.join().unwrap(), "a trainer that would wait forever is released with false");
        }
    }
}
