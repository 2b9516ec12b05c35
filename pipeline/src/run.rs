//! `tiderec train`: assembles the synchronous training dataflow on timely
//! workers (threads and processes), runs the epochs, evaluates, and returns
//! the run summary (on process 0).
//!
//! All workers execute the same sequence of collective steps: training steps
//! until a step in which no worker has data (end of epoch) or `steps` is
//! reached, then evaluation steps until a step with no eval data, then one
//! report step. A worker that fails (a bad record under `fail`, an unreadable
//! file) takes part in one more step flagged as failed, so every worker
//! stops after the same step instead of waiting forever. The bad-record
//! budget and the empty-input checks ([`crate::budget`]) read a step's global
//! counts, which every worker receives alike, so all of them fail after the
//! same step without such a round.
//!
//! In a cluster run the processes first check each other's settings and
//! connect within `--connect-timeout`, and a lost process stops the others
//! with an error naming it ([`crate::cluster`]).
//!
//! Two more ways out, decided from the step's global statistics, which every
//! worker receives alike (so all stop after the same step, without another
//! round of messages):
//! * **Divergence.** A training step whose loss, summed row gradients or
//!   updated dense parameters are not finite ([`StepStats::non_finite`]) ends
//!   the run with an error naming the step and the last durable checkpoint;
//!   the checkpoint in flight (of an earlier step) is let finish, and no
//!   checkpoint of the ruined state is written.
//! * **SIGINT/SIGTERM** ([`crate::stop`]). Every step carries each worker's
//!   stop flag; after a step in which any worker asked to stop, training
//!   ends as at `--steps`: the run's last checkpoint, no evaluation, the
//!   report and the metrics, exit 0.
//!
//! With `--checkpoint-dir`, all workers write a checkpoint together after
//! every `--checkpoint-every` steps, at the end of every epoch and at the end
//! of the run ([`crate::checkpointing`]). With `--resume`, every worker first
//! restores the newest valid checkpoint, the readers skip to its data
//! position (the epoch, then the global steps already taken in it), and the
//! step counter, the sample count and the running loss continue from it, so
//! the run ends where an uninterrupted one would.

use crate::checkpointing::{self, CheckpointOptions, Checkpointer, DataCheck};
use crate::cluster::{fingerprint, Cluster};
use crate::config::{DataSpec, Resolved};
use crate::data::{CriteoOptions, IndexedSamples, WorkerData, SYNTHETIC_EVAL_BASE};
use crate::device::Devices;
use crate::error::{DataflowFailure, Divergence};
use crate::evaluation::{BestKeeper, Tracker};
use crate::exchange_plan::{resolve_exchange, PlanSource};
use crate::feature_pipeline::FeaturePipeline;
use crate::live_metrics::LiveMetrics;
use crate::metrics_log::{MetricsLog, MetricsRecord};
use crate::progress::{Progress, Unit};
use crate::read_ahead::{reads_ahead, MicroBatches};
use crate::{PipelineError, TrainSettings};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tiderec_operators::bad_record::{BadRecordCounts, DeadLetterSink, ReasonCounts};
use tiderec_operators::behavior::SampleConfig;
use tiderec_operators::features::cross::append_crosses;
use tiderec_operators::metrics::auc;
use tiderec_operators::nn::ModelConfig;
use tiderec_operators::store::{StoreKind, StoreStats};
use tiderec_operators::train::{StepKind, StepStats, Trainer, TrainerConfig};
use tiderec_operators::Batch;
use tiderec_sinks::checkpoint::{Checkpoint, InputFile, Manifest, TrainingProgress};
use tiderec_sinks::dead_letters::SharedDeadLetters;
use tiderec_sinks::metrics::{Evaluation, RunSummary};
use tiderec_sources::synthetic::{SyntheticConfig, SyntheticCriteo};
use tiderec_sources::synthetic_behavior::{BehaviorConfig, SyntheticBehavior};
use tiderec_sources::taobao;

mod eval_steps;
mod train_run;

use train_run::TrainRun;

/// Steps over which the running training loss is averaged.
const LOSS_WINDOW: usize = 100;

struct Context {
    settings: TrainSettings,
    resolved: Resolved,
    trainer: TrainerConfig,
    generator: Option<IndexedSamples>,
    /// Sequence fields of the data (the model may read none of them).
    data_sequences: usize,
    train_range: std::ops::Range<u64>,
    eval_range: std::ops::Range<u64>,
    train_span: (f64, f64),
    eval_span: (f64, f64),
    criteo: CriteoOptions,
    dead_letters: SharedDeadLetters,
    total_steps: Option<u64>,
    /// Malformed records met while deriving the samples up front (counted once, on worker 0).
    derived_bad: BadRecordCounts,
    /// Good records of data derived up front (a behaviour log's events, not its samples):
    /// what the training budget holds `derived_bad` against.
    derived_records: Option<u64>,
    total_samples: Option<u64>,
    /// Where to write checkpoints.
    checkpoint: Option<CheckpointOptions>,
    /// The checkpoint to resume from, read once per process and dropped once every local worker restored it.
    resume: Mutex<Option<Arc<Checkpoint>>>,
    /// Local workers that have not restored `resume` yet.
    resume_pending: AtomicUsize,
    /// Embedding-store counters, added by every local worker when it finishes.
    store_stats: Mutex<StoreStats>,
    /// This process in its cluster (the last finished step, for a lost-peer error).
    cluster: Cluster,
    /// Set by SIGINT/SIGTERM ([`crate::stop`]).
    stop: Arc<AtomicBool>,
    /// The best model of an early-stopping run.
    best: BestKeeper,
    /// The Prometheus endpoint (`--metrics-addr`, process 0).
    live: Option<Arc<LiveMetrics>>,
}

/// The timely configuration for these settings.
pub fn timely_config(settings: &TrainSettings, resolved: &Resolved) -> timely::Config {
    let role = crate::cluster::ProcessRole {
        process: settings.cluster.process,
        processes: settings.cluster.processes,
        addresses: resolved.hosts.clone(),
    };
    role.timely_config(settings.cluster.workers)
}

/// The trainer configuration for these settings.
pub fn trainer_config(settings: &TrainSettings, resolved: &Resolved) -> TrainerConfig {
    // The library's builder: its defaults (accumulators, exchange) are the command line's.
    let mut config = TrainerConfig::builder(resolved.model.clone(), resolved.table_sizes.clone())
        .seed(settings.run.seed)
        .dense_optimizer(resolved.optimizer)
        .sparse_optimizer(resolved.sparse_optimizer)
        .lr(settings.dense_lr())
        .sparse_lr(settings.embedding_lr())
        .sequence_tables(resolved.sequence_tables.clone())
        .store(resolved.store.clone())
        .build_unchecked();
    crate::hygiene::apply_penalties(settings, &mut config);
    config
}

/// Worker 0's reports of `train`, with the latest evaluation's figures in the `window_*`
/// fields (the held-out split's, not a prequential window's): the `--metrics-log` lines (the
/// online trainer's [`MetricsRecord`]s), one about every second and one at the first step
/// after each evaluation; and the `--metrics-addr` endpoint, after every step (and, from
/// [`evaluation_point`](eval_steps::evaluation_point), after every evaluation).
struct Reports {
    log: Option<MetricsLog>,
    live: Option<Arc<LiveMetrics>>,
    last: std::time::Instant,
    evaluated: Option<u64>,
    /// The latest record offered and whether the log has it.
    latest: Option<(MetricsRecord, bool)>,
}

impl Reports {
    fn new(log: Option<MetricsLog>, live: Option<Arc<LiveMetrics>>) -> Self {
        Reports { log, live, last: std::time::Instant::now(), evaluated: None, latest: None }
    }

    /// True when nothing is reported (no log, no endpoint).
    fn is_empty(&self) -> bool {
        self.log.is_none() && self.live.is_none()
    }

    /// Reports a training step of `samples` samples; the log writes `record` when a second
    /// has passed, at the first step, or after a new evaluation.
    fn step(&mut self, record: MetricsRecord, samples: u64, evaluated: Option<u64>) -> Result<(), PipelineError> {
        if let Some(live) = &self.live {
            live.record(&record, 1, samples);
        }
        let due = record.step == 1 || self.last.elapsed().as_secs_f64() >= 1.0 || evaluated != self.evaluated;
        let written = match &mut self.log {
            Some(log) if due => {
                log.write(&record)?;
                self.last = std::time::Instant::now();
                self.evaluated = evaluated;
                true
            }
            _ => false,
        };
        self.latest = Some((record, written));
        Ok(())
    }

    /// The run's last report: the last step, with the last evaluation (`evaluation`) and the
    /// best one's step, logged unless written.
    fn finish(&mut self, evaluation: Option<&Evaluation>, best_step: Option<u64>) -> Result<(), PipelineError> {
        let Some((mut record, written)) = self.latest.take() else { return Ok(()) };
        record.set_window(evaluation.map(Evaluation::summary).as_ref());
        record.evaluated_step = evaluation.map(|e| e.step);
        record.best_step = best_step;
        if let Some(live) = &self.live {
            live.record(&record, 0, 0);
        }
        let evaluated = evaluation.map(|e| e.step);
        match &mut self.log {
            Some(log) if !written || evaluated != self.evaluated => log.write(&record),
            _ => Ok(()),
        }
    }
}

/// One line naming the model, its layers, its parameter counts and its tables.
pub fn model_summary(settings: &TrainSettings, resolved: &Resolved) -> Result<String, PipelineError> {
    let widths = |w: &[usize]| w.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("-");
    let shape = match resolved.model {
        ModelConfig::Dlrm(ref c) => format!("bottom {}-{}, top {}", c.num_dense, widths(&c.bottom), widths(&c.top)),
        _ if settings.model.kind.has_deep_part() => {
            format!("deep {}", widths(&settings.model.deep))
        }
        _ if settings.model.kind.is_dien() => {
            format!("mlp {}, histories up to {}", widths(&settings.model.mlp), settings.data.max_len)
        }
        _ => String::new(),
    };
    let dim = resolved.model.embedding_dim() as u64;
    let rows = resolved.table_sizes.iter().fold(0u64, |a, &b| a.saturating_add(b));
    Ok(format!(
        "model: {}{}{}; {} dense parameters; {} tables, {} rows x {} = {} embedding values; lr {} dense, {} rows",
        settings.model.kind,
        if shape.is_empty() { "" } else { " " },
        if shape.is_empty() { String::new() } else { format!("({shape})") },
        crate::memory::dense_params(&resolved.model)?,
        resolved.table_sizes.len(),
        rows,
        dim,
        rows.saturating_mul(dim),
        settings.dense_lr(),
        settings.embedding_lr()
    ))
}

/// Runs a whole training job and returns its summary; `None` on processes other than 0.
pub fn train(settings: &TrainSettings) -> Result<Option<RunSummary>, PipelineError> {
    let resolved = settings.validate()?;
    // Held until the run returns: no other run writes the checkpoint directory meanwhile.
    let _lock = lock_checkpoint_dir(settings, "tiderec train")?;
    if settings.cluster.process == 0 && settings.run.progress != crate::progress::ProgressMode::None {
        eprintln!("{}", model_summary(settings, &resolved)?);
    }
    crate::memory::check(settings, &resolved)?;
    let workers_total = settings.cluster.workers * settings.cluster.processes;
    let dead_letters_file = dead_letters_path(settings);
    let dead_letter_sink = SharedDeadLetters::file(dead_letters_file.clone());
    let mut derived_bad = BadRecordCounts::default();
    let mut derived_records = None;
    let generator = match &resolved.data {
        DataSpec::Synthetic => Some(IndexedSamples::Criteo(SyntheticCriteo::new(SyntheticConfig {
            seed: settings.run.seed,
            table_sizes: resolved.data_table_sizes().to_vec(),
            zipf_exponent: 1.1,
        })?)),
        DataSpec::SyntheticBehavior => Some(IndexedSamples::Behavior(SyntheticBehavior::new(
            BehaviorConfig::standard(settings.run.seed, settings.data.max_len),
        )?)),
        DataSpec::TaobaoBehavior(paths) => {
            let derived = behavior_table(paths, settings, &resolved, &dead_letter_sink)?;
            derived_bad = derived.bad;
            derived_records = Some(derived.records);
            Some(IndexedSamples::Table(Arc::new(derived.samples)))
        }
        _ => None,
    };
    // Index ranges of the indexed splits: a generator's train and eval streams are disjoint;
    // a derived table is split in time order (train on the past, evaluate on the future).
    let (train_range, eval_range) = match &generator {
        Some(IndexedSamples::Table(t)) => {
            let n = t.len() as u64;
            let n_train = (n as f64 * (1.0 - settings.data.eval_fraction)).round() as u64;
            (0..n_train, n_train..n)
        }
        _ => {
            let eval_samples = (settings.data.samples as f64 * settings.data.eval_fraction).round() as u64;
            (0..settings.data.samples, SYNTHETIC_EVAL_BASE..SYNTHETIC_EVAL_BASE + eval_samples)
        }
    };
    let holdout = resolved.eval.is_none() && settings.data.eval_fraction > 0.0;
    let split = 1.0 - settings.data.eval_fraction;
    let total_steps = match &generator {
        Some(_) => {
            let per_epoch = (train_range.end - train_range.start).div_ceil(settings.run.batch_size as u64);
            let all = per_epoch.saturating_mul(settings.run.epochs);
            Some(settings.run.steps.map_or(all, |s| s.min(all)))
        }
        None => settings.run.steps,
    };
    // Parquet files know their rows: the bar counts samples and shows an ETA.
    let total_samples = match &resolved.data {
        DataSpec::Parquet(p) => {
            let all =
                p.0.rows_in_span(if holdout { (0.0, split) } else { (0.0, 1.0) }).saturating_mul(settings.run.epochs);
            Some(settings.run.steps.map_or(all, |s| all.min(s.saturating_mul(settings.run.batch_size as u64))))
        }
        _ => None,
    };
    let criteo = CriteoOptions::for_run(&resolved, settings)?;
    let train_span = if holdout { (0.0, split) } else { (0.0, 1.0) };
    let mut trainer = trainer_config(settings, &resolved);
    crate::hygiene::apply_schedule(crate::hygiene::lr_schedule(settings, total_steps)?, &mut trainer);
    let source = PlanSource {
        generator: generator.as_ref(),
        train_range: train_range.clone(),
        criteo: &criteo,
        span: train_span,
    };
    let (exchange, plan) = resolve_exchange(settings, &resolved, &source)?;
    if let (Some(plan), 0) = (&plan, settings.cluster.process) {
        eprintln!("exchange plan ({}):\n{}", settings.exchange.strategy, plan.describe());
    }
    trainer.exchange = exchange;
    let devices = crate::device::Devices::for_workers(&settings.cluster.device, settings.cluster.workers)?;
    devices.preflight(&trainer)?;
    let (precision, kernels) = if !devices.any_cpu() {
        (settings.model.precision, crate::kernels::gpu_line(settings.model.precision))
    } else if settings.cluster.processes > 1 {
        // Every process must train in one precision: no process measures its own way out of bf16.
        let p = settings.model.precision;
        (p, crate::kernels::startup_line_for(&trainer.model, settings.run.batch_size, settings.cluster.workers, p))
    } else {
        crate::kernels::precision_for_run(
            &trainer.model,
            settings.run.batch_size,
            settings.cluster.workers,
            settings.model.precision,
        )
    };
    if settings.cluster.process == 0 && settings.run.progress != crate::progress::ProgressMode::None {
        eprintln!("{kernels}");
    }
    let adjusted;
    let settings = if precision == settings.model.precision {
        settings
    } else {
        eprintln!("warning: --precision bf16 is slower than fp32 on this CPU's bf16 kernel: training in fp32");
        let mut s = settings.clone();
        s.model.precision = precision;
        adjusted = s;
        &adjusted
    };
    let (checkpoint, resume) = checkpoint_setup(settings, &resolved, &trainer, data_check(settings, &resolved.data)?)?;
    let live = crate::live_metrics::start(settings.run.metrics_addr.as_deref(), settings.cluster.process)?;
    let context = Arc::new(Context {
        stop: crate::stop::stop_flag()?,
        trainer,
        checkpoint,
        resume: Mutex::new(resume.map(Arc::new)),
        resume_pending: AtomicUsize::new(settings.cluster.workers),
        store_stats: Mutex::new(StoreStats::default()),
        data_sequences: resolved.data.sequences(resolved.spec.as_ref()).map_or(0, |q| q.tables.len()),
        generator,
        train_range,
        eval_range,
        derived_bad,
        derived_records,
        train_span,
        eval_span: if holdout { (split, 1.0) } else { (0.0, 1.0) },
        criteo,
        dead_letters: dead_letter_sink,
        total_steps,
        total_samples,
        settings: settings.clone(),
        resolved: resolved.clone(),
        cluster: Cluster::new(settings, &resolved),
        best: BestKeeper::new(settings.cluster.workers),
        live,
    });
    let ctx = context.clone();
    let print = || fingerprint::of_train(settings, &resolved);
    let guards = crate::cluster::start(&context.cluster, print, move |worker| worker_main(worker, &ctx))?;
    let outcome = crate::cluster::join(&context.cluster, guards);
    context.dead_letters.lock().finish()?;
    let summary = outcome?;
    let Some(mut summary) = summary else { return Ok(None) };
    if let Some(step) = summary.interrupted_at_step {
        report_interrupted(settings, step);
    }
    summary.workers = workers_total;
    summary.store = *context.store_stats.lock().unwrap_or_else(|e| e.into_inner());
    if settings.cluster.processes == 1 && context.trainer.store.kind != StoreKind::Fixed {
        summary.embedding_rows = summary.store.hot_rows + summary.store.cold_rows;
    }
    if let Some(g) = context.generator.as_ref().filter(|g| g.has_teacher()) {
        if !context.eval_range.is_empty() {
            let mut b = context.new_batch();
            let probs: Vec<f32> = g.fill(context.eval_range.clone(), &mut b).into_iter().map(|p| p as f32).collect();
            summary.teacher_auc = auc(&probs, &b.labels);
        }
    }
    if let Some(path) = &settings.run.metrics_json {
        summary.config = serde_json::json!({
            "settings": settings,
            "dense_lr": settings.dense_lr(),
            "sparse_lr": settings.embedding_lr(),
            "model": context.trainer.model,
            "table_sizes": context.trainer.table_sizes,
        });
        summary.write_json(path)?;
    }
    if let Some(max) = settings.run.steps.filter(|&max| summary.steps < max && settings.cluster.process == 0) {
        if summary.interrupted_at_step.is_none() && summary.early_stopped_at_step.is_none() {
            eprintln!(
                "note: --steps {max} was not reached: the data ran out after {} steps ({} epoch(s), --epochs {}); \
                 raise --epochs to train longer",
                summary.steps, summary.epochs, settings.run.epochs
            );
        }
    }
    if summary.bad_records > 0 && settings.cluster.process == 0 {
        eprintln!("{} malformed records skipped; see {}", summary.bad_records, dead_letters_file.display());
    }
    Ok(Some(summary))
}

/// Tells the user where an interrupted run stopped and how to go on.
fn report_interrupted(settings: &TrainSettings, step: u64) {
    let how = match &settings.checkpoints.checkpoint_dir {
        Some(dir) => format!(
            "checkpoint {} is complete; run the same command with --resume to continue",
            dir.join(tiderec_sinks::checkpoint::layout::checkpoint_name(step)).display()
        ),
        None => "no checkpoint (no --checkpoint-dir): a new run starts from the beginning".into(),
    };
    eprintln!("interrupted by a signal: stopped after step {step}, evaluation skipped; {how}");
}

/// The error of a diverged run at global step `step` (every worker calls it after the same
/// step): lets the checkpoint in flight, of an earlier and finite state, become durable,
/// and names the last durable checkpoint. Collective.
pub(crate) fn diverged(
    worker: &mut timely::worker::Worker,
    checkpointer: &mut Checkpointer,
    step: u64,
    stats: &StepStats,
) -> PipelineError {
    if let Err(e) = checkpointer.finish(worker) {
        return e;
    }
    PipelineError::Diverged {
        step,
        cause: if stats.loss_sum.is_finite() { Divergence::Parameters } else { Divergence::Loss(stats.loss_sum) },
        last_checkpoint: checkpointer.last_durable(),
        checkpointing: checkpointer.enabled(),
    }
}

/// This process's dead-letter file: `--dead-letters`, suffixed `.p<process>` in a cluster run.
pub(crate) fn dead_letters_path(settings: &TrainSettings) -> std::path::PathBuf {
    if settings.cluster.processes > 1 {
        let mut p = settings.data.records.dead_letters.clone().into_os_string();
        p.push(format!(".p{}", settings.cluster.process));
        p.into()
    } else {
        settings.data.records.dead_letters.clone()
    }
}

/// Locks `--checkpoint-dir`, if set, for this process of the run
/// ([`checkpointing::lock_dir`]): before any work, so that a second run is refused before
/// it reads data or touches a checkpoint.
pub(crate) fn lock_checkpoint_dir(
    settings: &TrainSettings,
    command: &str,
) -> Result<Option<crate::dir_lock::DirLock>, PipelineError> {
    let Some(dir) = &settings.checkpoints.checkpoint_dir else { return Ok(None) };
    checkpointing::lock_dir(dir, settings.cluster.process, settings.cluster.processes, command).map(Some)
}

/// The `--data` files of a `train` run with a checkpoint directory, fingerprinted for
/// its manifests and a resume's comparison (generated data has none), and how `data` is
/// split between the run's workers.
fn data_check(settings: &TrainSettings, data: &DataSpec) -> Result<DataCheck, PipelineError> {
    let mut inputs = Vec::new();
    if settings.checkpoints.checkpoint_dir.is_some() {
        for named in crate::paths::data_files("--data", &settings.data.source)? {
            if !named.path.is_file() {
                continue;
            }
            let file = InputFile::of(&named.path).map_err(|source| PipelineError::InputUnreadable {
                flag: named.flag.clone(),
                path: named.path.display().to_string(),
                source,
            })?;
            inputs.push(file);
        }
    }
    let shuffle = (!inputs.is_empty()).then(|| settings.data.epoch_order());
    Ok(DataCheck {
        inputs,
        new_data: settings.checkpoints.new_data,
        shuffle,
        workers: settings.cluster.workers * settings.cluster.processes,
        split_by_workers: split_by_workers(data),
    })
}

/// Whether `data` is read by each worker from its own part by position (files and
/// Parquet), rather than as indexed samples every worker count batches alike.
fn split_by_workers(data: &DataSpec) -> bool {
    match data {
        DataSpec::Synthetic | DataSpec::SyntheticBehavior | DataSpec::TaobaoBehavior(_) => false,
        DataSpec::Criteo(_)
        | DataSpec::Avazu(_)
        | DataSpec::Csv(_)
        | DataSpec::AmazonDien(_)
        | DataSpec::TaobaoAd(_)
        | DataSpec::Parquet(_) => true,
    }
}

/// Takes the records of `batch` (leaving it empty, of the same shape) as the model reads
/// them: models without sequences train on the other fields of sequence data, and the
/// crosses of the run are appended.
pub(crate) fn take_for_model(batch: &mut Batch, config: &TrainerConfig, resolved: &Resolved, hash_seed: u64) -> Batch {
    let empty = Batch::with_sequences(batch.num_dense, batch.sparse.len(), batch.sequences.len());
    let taken = std::mem::replace(batch, empty);
    for_model(taken, config.model.num_sequences(), resolved, hash_seed)
}

/// `batch` as a model of `sequences` sequence fields reads it: the sequences it does not
/// read dropped, the run's crosses appended.
fn for_model(mut batch: Batch, sequences: usize, resolved: &Resolved, hash_seed: u64) -> Batch {
    batch.sequences.truncate(sequences);
    if !resolved.crosses.is_empty() {
        append_crosses(&mut batch, &resolved.crosses, hash_seed, resolved.cross_buckets());
    }
    batch
}

/// The checkpoint options of these settings and, with `--resume`, the checkpoint to resume
/// from (the directory is prepared either way).
pub(crate) fn checkpoint_setup(
    settings: &TrainSettings,
    resolved: &Resolved,
    trainer: &TrainerConfig,
    data: DataCheck,
) -> Result<(Option<CheckpointOptions>, Option<Checkpoint>), PipelineError> {
    let pipeline = FeaturePipeline::of_run(settings, resolved);
    let checkpoint = settings.checkpoints.checkpoint_dir.as_ref().map(|dir| CheckpointOptions {
        dir: dir.clone(),
        every: settings.checkpoints.checkpoint_every,
        keep: settings.checkpoints.keep_checkpoints,
        deltas: settings.checkpoints.checkpoint_deltas,
        delta_share: settings.checkpoints.checkpoint_delta_share,
        sync: settings.checkpoints.checkpoint_sync,
        pipeline: Some(pipeline.clone()),
        inputs: data.inputs.clone(),
        shuffle: data.shuffle.clone(),
    });
    let resume = match &checkpoint {
        Some(options) => {
            checkpointing::prepare_dir(&options.dir, settings.checkpoints.resume)?;
            if settings.checkpoints.resume {
                let batch = settings.run.batch_size as u64;
                checkpointing::load_for_resume(&options.dir, trainer, batch, &pipeline, &data)?
            } else {
                None
            }
        }
        None => None,
    };
    Ok((checkpoint, resume))
}

/// The error of a worker whose step found `failed` other workers failed (their own errors
/// are the ones [`crate::cluster::join`] reports).
pub(crate) fn peer_failed(failed: u64) -> PipelineError {
    PipelineError::dataflow(DataflowFailure::PeerFailed, format!("another worker failed ({failed} failed)"))
}

/// A behaviour log's derived samples, and what reading the log found.
pub(crate) struct DerivedTable {
    /// The DIEN samples, as one table.
    pub samples: Batch,
    /// The log's malformed lines.
    pub bad: BadRecordCounts,
    /// The log's good lines (its events). The bad-record budget compares `bad` with these,
    /// never with the samples: an event makes about two samples.
    pub records: u64,
}

/// Reads a Taobao behaviour log and derives its DIEN samples (the differential operator) as one table.
pub(crate) fn behavior_table(
    paths: &[std::path::PathBuf],
    settings: &TrainSettings,
    resolved: &Resolved,
    sink: &SharedDeadLetters,
) -> Result<DerivedTable, PipelineError> {
    let mut sink = sink.clone();
    let (events, bad) =
        taobao::read_user_behavior(paths, resolved.policy, settings.data.records.max_line_bytes, Some(&mut sink))?;
    if settings.run.progress != crate::progress::ProgressMode::None && settings.cluster.process == 0 {
        eprintln!("deriving DIEN samples from {} behaviour events (differential dataflow)", events.len());
    }
    let config = SampleConfig { max_len: settings.data.max_len, groups: 64, seed: settings.run.seed };
    let samples = taobao::derive_samples(&events, config);
    Ok(DerivedTable {
        samples: taobao::samples_to_batch(&samples, resolved.data_table_sizes(), settings.hash_seed()),
        bad,
        records: events.len() as u64,
    })
}

impl Context {
    /// An empty batch with the data's shape.
    fn new_batch(&self) -> Batch {
        let (dense, sparse) = self.resolved.shape;
        Batch::with_sequences(dense, sparse, self.data_sequences)
    }
}

fn dead_letters(ctx: &Context) -> Option<Box<dyn DeadLetterSink>> {
    Some(Box::new(ctx.dead_letters.clone()))
}

/// Whether worker `me` reads its micro-batches ahead on this machine, as `--read-ahead`
/// says ([`reads_ahead`]).
fn read_ahead(ctx: &Context, me: usize) -> bool {
    let s = &ctx.settings;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Devices::for_workers(&s.cluster.device, s.cluster.workers)
        .is_ok_and(|devices| reads_ahead(s.data.read_ahead, &devices, s.cluster.workers, me, cores))
}

/// Runs one collective step; a data error turns into a failed step that stops every worker.
#[allow(clippy::too_many_arguments)]
fn step_with(
    trainer: &mut Trainer,
    worker: &mut timely::worker::Worker,
    kind: StepKind,
    data: &mut MicroBatches,
    batch: &mut Batch,
    bad: &BadRecordCounts,
    resolved: &Resolved,
    hash_seed: u64,
    stop: &AtomicBool,
) -> Result<StepStats, PipelineError> {
    let read = data.next_micro_batch(batch);
    trainer.set_stop_requested(stop.load(Ordering::Relaxed));
    let mut counts = bad.clone();
    counts.merge(&data.bad_counts());
    trainer.set_bad_records(counts.to_array());
    let stats = match read {
        Ok(_) => {
            let taken = take_for_model(batch, trainer.config(), resolved, hash_seed);
            // A step engine prepares the micro-batch read ahead while it trains this one.
            let sequences = trainer.config().model.num_sequences();
            let next = || data.peek().map(|b| for_model(b.clone(), sequences, resolved, hash_seed));
            trainer.step_then_prepare(worker, kind, taken, next)?
        }
        Err(e) => {
            trainer.step_failed(worker);
            return Err(e);
        }
    };
    if stats.failed_workers > 0 {
        return Err(peer_failed(stats.failed_workers));
    }
    Ok(stats)
}

/// Restores this process's resume checkpoint (if any) on this worker, and releases the
/// checkpoint's memory once every local worker has. Collective.
fn restore(
    worker: &mut timely::worker::Worker,
    trainer: &mut Trainer,
    checkpointer: &mut Checkpointer,
    ctx: &Context,
) -> Result<Option<Arc<Checkpoint>>, PipelineError> {
    restore_shared(worker, trainer, checkpointer, &ctx.resume, &ctx.resume_pending)
}

/// Restores `slot`'s checkpoint (if any) on this worker; the last of the `pending` local
/// workers to do so empties the slot, releasing the checkpoint's memory. Collective.
pub(crate) fn restore_shared(
    worker: &mut timely::worker::Worker,
    trainer: &mut Trainer,
    checkpointer: &mut Checkpointer,
    slot: &Mutex<Option<Arc<Checkpoint>>>,
    pending: &AtomicUsize,
) -> Result<Option<Arc<Checkpoint>>, PipelineError> {
    let checkpoint =
        slot.lock().map_err(|_| PipelineError::dataflow(DataflowFailure::Panicked, "a worker panicked"))?.clone();
    let outcome = checkpointer.restore(worker, trainer, checkpoint.as_deref());
    if pending.fetch_sub(1, Ordering::AcqRel) == 1 {
        if let Ok(mut slot) = slot.lock() {
            *slot = None;
        }
    }
    outcome?;
    Ok(checkpoint)
}

/// The running statistics a checkpoint records.
fn training_progress(
    loss_total: f64,
    window: &VecDeque<(f64, u64)>,
    bad: &ReasonCounts,
    tracker: &Tracker,
    samples_before_data: u64,
) -> TrainingProgress {
    TrainingProgress {
        loss_total,
        loss_window: window.iter().copied().collect(),
        bad_records_before_epoch: bad.to_vec(),
        evaluations: tracker.history().to_vec(),
        best_step: tracker.best().map(|b| b.step),
        samples_before_data,
    }
}

/// One worker's run: sets it up, trains, ends the run and takes part in its report (worker 0
/// returns the summary). Collective.
fn worker_main(worker: &mut timely::worker::Worker, ctx: &Context) -> Result<Option<RunSummary>, PipelineError> {
    let mut run = TrainRun::open(worker, ctx)?;
    run.train(worker)?;
    run.end_of_run(worker)?;
    let train_seconds = run.train_seconds();
    run.finish_progress();
    run.restore_best()?;
    run.report(worker, train_seconds)
}

/// Opens this worker's part of the training data (shuffled as set); a failure to open it
/// fails this worker's first step, so that the others stop too.
fn open_train_data(
    worker: &mut timely::worker::Worker,
    trainer: &mut Trainer,
    ctx: &Context,
) -> Result<MicroBatches, PipelineError> {
    let (me, peers) = (worker.index(), worker.peers());
    let opened = MicroBatches::open(read_ahead(ctx, me), dead_letters(ctx), ctx.new_batch(), me, |sink| {
        let data = WorkerData::for_spec(
            &ctx.resolved.data,
            ctx.generator.as_ref().map(|g| (g, ctx.train_range.clone())),
            ctx.train_span,
            &ctx.criteo,
            ctx.settings.run.batch_size,
            me,
            peers,
            sink,
        );
        Ok(data?.with_shuffle(ctx.criteo.shuffle))
    });
    match opened {
        Ok(d) => Ok(d),
        Err(e) => {
            trainer.step_failed(worker);
            Err(e)
        }
    }
}

/// Worker `me`'s progress display: worker 0's counts samples when their total is known,
/// else steps; the other workers show none.
fn progress_display(me: usize, ctx: &Context) -> Progress {
    let s = &ctx.settings;
    match (me, ctx.total_samples) {
        (0, Some(total)) => Progress::with_unit(s.run.progress, Some(total), Unit::Samples),
        (0, None) => Progress::new(s.run.progress, ctx.total_steps),
        _ => Progress::None,
    }
}

/// The malformed records worker `me` counts before its first step.
fn derived_bad(me: usize, resumed: Option<&Manifest>, ctx: &Context) -> BadRecordCounts {
    // Records dropped while deriving samples up front are reported once, by worker 0; a resumed
    // run starts from the counts before its epoch instead (they include the derived ones),
    // unless it reads other data from its start (`--new-data`): then as a fresh run does.
    let resumed = resumed.filter(|_| !ctx.settings.checkpoints.new_data);
    match (me, resumed) {
        (0, Some(m)) => {
            let mut a = ReasonCounts::default();
            a.iter_mut().zip(&m.progress.bad_records_before_epoch).for_each(|(a, &b)| *a = b);
            BadRecordCounts::from_array(a)
        }
        (0, None) => ctx.derived_bad.clone(),
        _ => BadRecordCounts::default(),
    }
}

/// Moves a resumed run's training data to its checkpoint's data position: past `epoch`
/// epochs, then `steps_in_epoch` global steps into the next. A failure fails this worker's
/// next step, so that the others stop too.
fn skip_to_position(
    worker: &mut timely::worker::Worker,
    trainer: &mut Trainer,
    data: &mut MicroBatches,
    batch: &mut Batch,
    epoch: u64,
    steps_in_epoch: u64,
) -> Result<(), PipelineError> {
    let skipped = (0..epoch).try_for_each(|_| data.rewind()).and_then(|()| data.skip_steps(steps_in_epoch, batch));
    if let Err(e) = skipped {
        trainer.step_failed(worker);
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::ModelKind;

    /// The command line's trainer configuration is the library builder's with the same
    /// model and tables: the defaults are declared once.
    #[test]
    fn the_default_run_trains_the_builders_default_configuration() {
        for kind in [ModelKind::Dlrm, ModelKind::Lr, ModelKind::Fm, ModelKind::DeepFm, ModelKind::Wdl] {
            let mut settings = TrainSettings::default();
            settings.model.kind = kind;
            let resolved = settings.validate().unwrap();
            let cli = serde_json::to_value(trainer_config(&settings, &resolved)).unwrap();
            let built = TrainerConfig::builder(resolved.model.clone(), resolved.table_sizes.clone()).build().unwrap();
            assert_eq!(cli, serde_json::to_value(built).unwrap(), "{}", kind.name());
        }
    }
}
