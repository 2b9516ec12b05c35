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

use crate::budget::{self, Split, Tally};
use crate::checkpointing::{self, CheckpointOptions, Checkpointer, DataCheck, Position};
use crate::cluster::{fingerprint, Cluster};
use crate::config::{DataSpec, Resolved};
use crate::data::{CriteoOptions, IndexedSamples, WorkerData, SYNTHETIC_EVAL_BASE};
use crate::error::{DataflowFailure, Divergence};
use crate::evaluation::{self, BestKeeper, Tracker, Verdict};
use crate::exchange_plan::{resolve_exchange, PlanSource};
use crate::feature_pipeline::FeaturePipeline;
use crate::live_metrics::LiveMetrics;
use crate::metrics_log::{MetricsLog, MetricsRecord};
use crate::progress::{Progress, Unit};
use crate::settings::BestMetric;
use crate::{PipelineError, TrainSettings};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tiderec_operators::bad_record::{BadRecordCounts, DeadLetterSink, ReasonCounts};
use tiderec_operators::behavior::SampleConfig;
use tiderec_operators::collective::Collective;
use tiderec_operators::features::cross::append_crosses;
use tiderec_operators::metrics::{auc, EvalSummary};
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
/// [`evaluation_point`], after every evaluation).
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
    let rows: u64 = resolved.table_sizes.iter().sum();
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
            let (table, bad) = behavior_table(paths, settings, &resolved, &dead_letter_sink)?;
            derived_bad = bad;
            Some(IndexedSamples::Table(Arc::new(table)))
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
            Some(settings.run.steps.map_or(per_epoch * settings.run.epochs, |s| s.min(per_epoch * settings.run.epochs)))
        }
        None => settings.run.steps,
    };
    // Parquet files know their rows: the bar counts samples and shows an ETA.
    let total_samples = match &resolved.data {
        DataSpec::Parquet(p) => {
            let all = p.0.rows_in_span(if holdout { (0.0, split) } else { (0.0, 1.0) }) * settings.run.epochs;
            Some(settings.run.steps.map_or(all, |s| all.min(s * settings.run.batch_size as u64)))
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
    let (checkpoint, resume) = checkpoint_setup(settings, &resolved, &trainer, data_check(settings)?)?;
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
    let print = fingerprint::of_train(settings, &resolved);
    let guards = crate::cluster::start(&context.cluster, &print, move |worker| worker_main(worker, &ctx))?;
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
/// its manifests and a resume's comparison (generated data has none).
fn data_check(settings: &TrainSettings) -> Result<DataCheck, PipelineError> {
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
    Ok(DataCheck { inputs, new_data: settings.checkpoints.new_data, shuffle })
}

/// Takes the records of `batch` (leaving it empty, of the same shape) as the model reads
/// them: models without sequences train on the other fields of sequence data, and the
/// crosses of the run are appended.
pub(crate) fn take_for_model(batch: &mut Batch, config: &TrainerConfig, resolved: &Resolved, hash_seed: u64) -> Batch {
    let empty = Batch::with_sequences(batch.num_dense, batch.sparse.len(), batch.sequences.len());
    let mut taken = std::mem::replace(batch, empty);
    taken.sequences.truncate(config.model.num_sequences());
    if !resolved.crosses.is_empty() {
        append_crosses(&mut taken, &resolved.crosses, hash_seed, resolved.cross_buckets());
    }
    taken
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

/// Reads a Taobao behaviour log and derives its DIEN samples (the differential operator) as one table.
pub(crate) fn behavior_table(
    paths: &[std::path::PathBuf],
    settings: &TrainSettings,
    resolved: &Resolved,
    sink: &SharedDeadLetters,
) -> Result<(Batch, BadRecordCounts), PipelineError> {
    let mut sink = sink.clone();
    let (events, bad) = taobao::read_user_behavior(paths, resolved.policy, Some(&mut sink))?;
    if settings.run.progress != crate::progress::ProgressMode::None && settings.cluster.process == 0 {
        eprintln!("deriving DIEN samples from {} behaviour events (differential dataflow)", events.len());
    }
    let config = SampleConfig { max_len: settings.data.max_len, groups: 64, seed: settings.run.seed };
    let samples = taobao::derive_samples(&events, config);
    Ok((taobao::samples_to_batch(&samples, resolved.data_table_sizes(), settings.hash_seed()), bad))
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

/// Runs one collective step; a data error turns into a failed step that stops every worker.
#[allow(clippy::too_many_arguments)]
fn step_with(
    trainer: &mut Trainer,
    worker: &mut timely::worker::Worker,
    kind: StepKind,
    data: &mut WorkerData,
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
            trainer.step(worker, kind, taken)?
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
) -> TrainingProgress {
    TrainingProgress {
        loss_total,
        loss_window: window.iter().copied().collect(),
        bad_records_before_epoch: bad.to_vec(),
        evaluations: tracker.history().to_vec(),
        best_step: tracker.best().map(|b| b.step),
    }
}

/// One worker's run: sets it up, trains, ends the run and takes part in its report (worker 0
/// returns the summary). Collective.
fn worker_main(worker: &mut timely::worker::Worker, ctx: &Context) -> Result<Option<RunSummary>, PipelineError> {
    let mut run = TrainRun::open(worker, ctx)?;
    run.train(worker)?;
    run.end_of_run(worker)?;
    let train_seconds = run.start.elapsed().as_secs_f64() - run.evals.seconds;
    run.progress.finish();
    run.restore_best()?;
    run.report(worker, train_seconds)
}

/// Opens this worker's part of the training data (shuffled as set); a failure to open it
/// fails this worker's first step, so that the others stop too.
fn open_train_data(
    worker: &mut timely::worker::Worker,
    trainer: &mut Trainer,
    ctx: &Context,
) -> Result<WorkerData, PipelineError> {
    let opened = WorkerData::for_spec(
        &ctx.resolved.data,
        ctx.generator.as_ref().map(|g| (g, ctx.train_range.clone())),
        ctx.train_span,
        &ctx.criteo,
        ctx.settings.run.batch_size,
        worker.index(),
        worker.peers(),
        dead_letters(ctx),
    );
    match opened {
        Ok(d) => Ok(d.with_shuffle(ctx.criteo.shuffle)),
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
    // run starts from the counts before its epoch instead (they include the derived ones).
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
    data: &mut WorkerData,
    batch: &mut Batch,
    epoch: u64,
    steps_in_epoch: u64,
) -> Result<(), PipelineError> {
    for _ in 0..epoch {
        data.rewind();
    }
    if let Err(e) = data.skip_steps(steps_in_epoch, batch) {
        trainer.step_failed(worker);
        return Err(e);
    }
    Ok(())
}

/// Where the epoch loop goes after a training step.
enum Flow {
    /// On to the next step of the epoch.
    Next,
    /// To the end of the epoch (no worker had data left).
    EndOfEpoch,
    /// Out of the epochs (an early stop or a stop signal).
    Stop,
}

/// One worker's training run: its trainer, its data, and the running state of the epochs.
struct TrainRun<'a> {
    ctx: &'a Context,
    /// This worker's index.
    me: usize,
    trainer: Trainer,
    checkpointer: Checkpointer,
    /// The manifest of the checkpoint the run resumed from.
    resumed: Option<Manifest>,
    train_data: WorkerData,
    progress: Progress,
    batch: Batch,
    /// The malformed records counted before the first step ([`derived_bad`]).
    derived_bad: BadRecordCounts,
    steps: u64,
    samples: u64,
    epochs: u64,
    loss_total: f64,
    reports: Reports,
    last_checkpoint: Option<Instant>,
    /// The last [`LOSS_WINDOW`] training steps' loss sums and samples.
    window: VecDeque<(f64, u64)>,
    steps_in_epoch: u64,
    bad_before_epoch: ReasonCounts,
    samples_at_start: u64,
    /// Malformed training records over all workers, as of the last training step.
    train_bad_global: ReasonCounts,
    dead_letters_file: std::path::PathBuf,
    /// The run evaluates during training (it has an eval split).
    has_eval: bool,
    evals: Evals,
    stopped_early: Option<u64>,
    bytes_at_end: u64,
    interrupted: bool,
    start: Instant,
}

impl<'a> TrainRun<'a> {
    /// Sets up this worker's run: its trainer and checkpointer, the restored checkpoint, the
    /// training data at the run's position, the progress display, the reports and the
    /// evaluations. Collective.
    fn open(worker: &mut timely::worker::Worker, ctx: &'a Context) -> Result<Self, PipelineError> {
        let me = worker.index();
        let s = &ctx.settings;
        let devices = crate::device::Devices::for_workers(&s.cluster.device, s.cluster.workers)?;
        let mut trainer = devices.trainer(worker, &ctx.trainer, s.cluster.workers, s.model.precision)?;
        let mut checkpointer = Checkpointer::new(worker, ctx.checkpoint.clone(), &ctx.trainer, s.run.batch_size as u64);
        // Before anything else collective: every worker restores, then all agree on the step.
        let resumed = restore(worker, &mut trainer, &mut checkpointer, ctx)?.map(|c| c.manifest.clone());
        let mut train_data = open_train_data(worker, &mut trainer, ctx)?;
        let progress = progress_display(me, ctx);
        let mut batch = ctx.new_batch();
        let derived_bad = derived_bad(me, resumed.as_ref(), ctx);
        let (mut steps, mut samples, mut epochs, mut loss_total) = (0u64, 0u64, 0u64, 0.0f64);
        let reports = match me {
            0 => {
                let log = MetricsLog::for_run(&s.run, resumed.is_some(), false)?;
                Reports::new(log, ctx.live.clone())
            }
            _ => Reports::new(None, None),
        };
        let mut window: VecDeque<(f64, u64)> = VecDeque::with_capacity(LOSS_WINDOW);
        let mut steps_in_epoch = 0u64;
        let bad_before_epoch = derived_bad.to_array();
        if let Some(m) = &resumed {
            (steps, samples, epochs, loss_total) = (m.step, m.samples, m.data_position.epoch, m.progress.loss_total);
            let keep_from = m.progress.loss_window.len().saturating_sub(LOSS_WINDOW);
            window.extend(&m.progress.loss_window[keep_from..]);
            steps_in_epoch = m.data_position.global_steps_in_epoch;
            skip_to_position(worker, &mut trainer, &mut train_data, &mut batch, epochs, steps_in_epoch)?;
        }
        ctx.cluster.finished_step(steps);
        let dead_letters_file = dead_letters_path(s);
        // Evaluations during training (see `crate::evaluation`): every worker takes the same decisions.
        let has_eval = ctx.resolved.eval.is_some() || s.data.eval_fraction > 0.0;
        let history = resumed.as_ref().map_or(&[][..], |m| &m.progress.evaluations[..]);
        let evals = Evals::new(worker, ctx, has_eval, history);
        Ok(TrainRun {
            ctx,
            me,
            trainer,
            checkpointer,
            train_data,
            progress,
            batch,
            derived_bad,
            steps,
            samples,
            epochs,
            loss_total,
            reports,
            last_checkpoint: None,
            window,
            steps_in_epoch,
            bad_before_epoch,
            samples_at_start: samples,
            train_bad_global: ReasonCounts::default(),
            dead_letters_file,
            has_eval,
            stopped_early: evals.tracker.stopped().then_some(steps),
            evals,
            bytes_at_end: 0,
            interrupted: false,
            start: Instant::now(),
            resumed,
        })
    }

    /// The epochs: training steps with their checkpoints and evaluations, and the end of each
    /// epoch, until the last epoch, `--steps`, an early stop or a stop signal. Collective.
    fn train(&mut self, worker: &mut timely::worker::Worker) -> Result<(), PipelineError> {
        let s = &self.ctx.settings;
        'epochs: while self.epochs < s.run.epochs && self.stopped_early.is_none() {
            loop {
                if s.run.steps.is_some_and(|max| self.steps >= max) {
                    break 'epochs;
                }
                match self.step(worker)? {
                    Flow::Next => {}
                    Flow::EndOfEpoch => break,
                    Flow::Stop => break 'epochs,
                }
            }
            self.end_epoch(worker)?;
            if self.interrupted || self.stopped_early.is_some() {
                break;
            }
        }
        Ok(())
    }

    /// One training step and what follows it: its counts, its reports, the checkpoints, and
    /// an evaluation when one is due. Collective.
    fn step(&mut self, worker: &mut timely::worker::Worker) -> Result<Flow, PipelineError> {
        let Some(stats) = self.train_step(worker)? else { return Ok(Flow::EndOfEpoch) };
        self.count(&stats);
        if self.me == 0 {
            self.report_step(&stats)?;
        }
        self.poll_checkpoints(worker)?;
        let s = &self.ctx.settings;
        let mut verdict = Verdict { improved: false, stop: false };
        if self.has_eval && !self.interrupted && s.run.eval_every.is_some_and(|n| self.steps.is_multiple_of(n)) {
            verdict = self.evaluation(worker)?;
        }
        // An improvement is checkpointed at once (replacing a checkpoint of this step
        // written before the evaluation), so `DIR/best` can name it.
        if self.checkpointer.due_every(self.steps) || (verdict.improved && self.checkpointer.enabled()) {
            self.checkpoint(worker)?;
        }
        if verdict.stop {
            self.stopped_early = Some(self.steps);
            return Ok(Flow::Stop);
        }
        if self.interrupted {
            return Ok(Flow::Stop);
        }
        Ok(Flow::Next)
    }

    /// Runs a training step on this worker's next micro-batch and takes in the step's global
    /// figures: `None` when no worker had data left (the end of the epoch), an error when the
    /// step diverged. Collective.
    fn train_step(&mut self, worker: &mut timely::worker::Worker) -> Result<Option<StepStats>, PipelineError> {
        let ctx = self.ctx;
        let stats = step_with(
            &mut self.trainer,
            worker,
            StepKind::Train,
            &mut self.train_data,
            &mut self.batch,
            &self.derived_bad,
            &ctx.resolved,
            ctx.settings.hash_seed(),
            &ctx.stop,
        )?;
        self.train_bad_global = stats.bad_records;
        if stats.non_finite > 0 {
            return Err(diverged(worker, &mut self.checkpointer, self.steps + 1, &stats));
        }
        self.interrupted |= stats.stop_requests > 0;
        if let Some(from) = self.evals.bytes_from.take() {
            self.evals.bytes += stats.bytes_sent.saturating_sub(from);
        }
        if stats.samples == 0 {
            // Every worker's counts after the whole epoch (the empty step read to its end).
            self.bad_before_epoch = stats.bad_records;
            return Ok(None);
        }
        Ok(Some(stats))
    }

    /// Counts a training step in: the step, its samples, its loss and the bytes sent.
    fn count(&mut self, stats: &StepStats) {
        self.steps += 1;
        self.steps_in_epoch += 1;
        self.ctx.cluster.finished_step(self.steps);
        self.samples += stats.samples;
        self.loss_total += stats.loss_sum;
        self.bytes_at_end = stats.bytes_sent - self.evals.bytes;
        if self.window.len() == LOSS_WINDOW {
            self.window.pop_front();
        }
        self.window.push_back((stats.loss_sum, stats.samples));
    }

    /// Worker 0's progress display and reports of a training step.
    fn report_step(&mut self, stats: &StepStats) -> Result<(), PipelineError> {
        let (l, n) = self.window.iter().fold((0.0, 0u64), |a, b| (a.0 + b.0, a.1 + b.1));
        let trained = self.samples - self.samples_at_start;
        let rate = trained as f64 / (self.start.elapsed().as_secs_f64() - self.evals.seconds);
        self.progress.update(
            self.steps,
            self.samples,
            l / n.max(1) as f64,
            rate,
            stats.bytes_sent as f64 / trained.max(1) as f64,
            stats.bad_records.iter().sum(),
        );
        if !self.reports.is_empty() {
            let last = self.evals.tracker.last();
            let mut record = MetricsRecord {
                time_s: self.start.elapsed().as_secs_f64(),
                step: self.steps,
                samples: self.samples,
                samples_per_sec: rate,
                loss: l / n.max(1) as f64,
                lag: 0,
                checkpoint_age_s: self.last_checkpoint.map(|t| t.elapsed().as_secs_f64()),
                bad_records: stats.bad_records.iter().sum(),
                epoch: Some(self.epochs),
                evaluated_step: last.map(|e| e.step),
                best_step: self.evals.tracker.best().map(|e| e.step),
                ..Default::default()
            };
            record.set_window(last.map(Evaluation::summary).as_ref());
            self.reports.step(record, stats.samples, last.map(|e| e.step))?;
        }
        Ok(())
    }

    /// Lets the checkpoint in flight go on; worker 0 notes one that became durable.
    fn poll_checkpoints(&mut self, worker: &mut timely::worker::Worker) -> Result<(), PipelineError> {
        self.checkpointer.poll(worker)?;
        if self.checkpointer.take_durable().is_some() && self.me == 0 {
            self.last_checkpoint = Some(Instant::now());
            if let Some(live) = &self.ctx.live {
                live.checkpointed();
            }
        }
        Ok(())
    }

    /// Evaluates the model after the current step ([`evaluation_point`]); an evaluation cut
    /// short by a stop signal marks the run interrupted and gives the verdict of no change.
    /// Collective.
    fn evaluation(&mut self, worker: &mut timely::worker::Worker) -> Result<Verdict, PipelineError> {
        let (ctx, progress) = (self.ctx, &self.progress);
        match evaluation_point(
            &mut self.evals,
            &mut self.trainer,
            worker,
            ctx,
            &mut self.batch,
            progress,
            self.steps,
            self.epochs,
        )? {
            Some(v) => Ok(v),
            None => {
                self.interrupted = true;
                Ok(Verdict { improved: false, stop: false })
            }
        }
    }

    /// Writes a checkpoint of the run's current position. Collective.
    fn checkpoint(&mut self, worker: &mut timely::worker::Worker) -> Result<(), PipelineError> {
        let at = Position {
            step: self.steps,
            epoch: self.epochs,
            steps_in_epoch: self.steps_in_epoch,
            samples: self.samples,
            progress: training_progress(self.loss_total, &self.window, &self.bad_before_epoch, &self.evals.tracker),
            ..Default::default()
        };
        self.checkpointer.write(worker, &self.trainer, &at)
    }

    /// Holds the training input to the bad-record budget as of the last training step (not
    /// with `--steps 0`).
    fn check_train(&self) -> Result<(), PipelineError> {
        let s = &self.ctx.settings;
        match s.run.steps {
            Some(0) => Ok(()),
            _ => budget::check(
                Split::Train,
                &s.data.source,
                Tally { good: self.samples, bad: self.train_bad_global },
                s.data.records.max_bad_fraction,
                &self.dead_letters_file,
            ),
        }
    }

    /// The end of an epoch: the bad-record check, the rewind of the data, the epoch's
    /// evaluation (unless one of this step exists) and its checkpoint. Collective.
    fn end_epoch(&mut self, worker: &mut timely::worker::Worker) -> Result<(), PipelineError> {
        // Before the epoch's checkpoint: a mostly malformed input stops the run here.
        self.check_train()?;
        self.epochs += 1;
        self.steps_in_epoch = 0;
        self.train_data.rewind();
        let mut verdict = Verdict { improved: false, stop: false };
        if self.has_eval && !self.interrupted && self.evals.tracker.last().map(|e| e.step) != Some(self.steps) {
            verdict = self.evaluation(worker)?;
        }
        if self.checkpointer.due_at_boundary(self.steps) || (verdict.improved && self.checkpointer.enabled()) {
            self.checkpoint(worker)?;
        }
        if verdict.stop {
            self.stopped_early = Some(self.steps);
        }
        Ok(())
    }

    /// The end of training: the bad-record check, the run's last evaluation, its last report
    /// and checkpoint, and the wait for the checkpoints in flight. Collective.
    fn end_of_run(&mut self, worker: &mut timely::worker::Worker) -> Result<(), PipelineError> {
        self.check_train()?;
        // The end of the run (`--steps`, mid-epoch): its evaluation, unless one of this step exists.
        if self.has_eval
            && !self.interrupted
            && self.stopped_early.is_none()
            && self.evals.tracker.last().map(|e| e.step) != Some(self.steps)
        {
            let verdict = self.evaluation(worker)?;
            if verdict.stop {
                self.stopped_early = Some(self.steps);
            }
        }
        self.reports.finish(self.evals.tracker.last(), self.evals.tracker.best().map(|e| e.step))?;
        // The end of the run is a checkpoint too, unless one of this step exists; an early stop
        // goes back to the best step's model instead, whose checkpoint `DIR/best` names.
        if self.stopped_early.is_none() && self.checkpointer.due_at_boundary(self.steps) {
            self.checkpoint(worker)?;
        }
        self.checkpointer.finish(worker)
    }

    /// After an early stop: goes back to the best step's model, which worker 0 names.
    fn restore_best(&mut self) -> Result<(), PipelineError> {
        let Some(at) = self.stopped_early else { return Ok(()) };
        let (ctx, s) = (self.ctx, &self.ctx.settings);
        let dir = ctx.checkpoint.as_ref().map(|c| c.dir.as_path());
        ctx.best.restore(&mut self.trainer, dir)?;
        if self.me == 0 {
            let best = self.evals.tracker.best();
            eprintln!(
                "early stopping: {} evaluations without improvement; stopped after step {at}; the model is that of \
                 step {} (epoch {}, {} {}){}",
                self.evals.tracker.since_best(),
                best.map_or(0, |b| b.step),
                best.map_or(0, |b| b.epoch),
                s.run.best_metric,
                best.and_then(|b| if s.run.best_metric == BestMetric::Auc { b.auc } else { b.logloss })
                    .map_or("n/a".into(), |v| format!("{v:.4}")),
                dir.map_or(String::new(), |d| format!(", checkpoint {}", d.join("best").display())),
            );
        }
        Ok(())
    }

    /// The run's report step, which sums every worker's malformed records and parameters;
    /// worker 0 returns the run's summary. Collective.
    fn report(
        mut self,
        worker: &mut timely::worker::Worker,
        train_seconds: f64,
    ) -> Result<Option<RunSummary>, PipelineError> {
        let ctx = self.ctx;
        let mut train_bad = self.train_data.bad_counts();
        train_bad.merge(&self.derived_bad);
        self.train_data.flush()?;
        let mut all_bad = train_bad;
        all_bad.merge(&self.evals.bad);
        self.trainer.set_bad_records(all_bad.to_array());
        let m = &ctx.trainer.model;
        let report = self.trainer.step(
            worker,
            StepKind::Report,
            Batch::with_sequences(m.num_dense(), m.num_sparse(), m.num_sequences()),
        )?;
        ctx.store_stats.lock().unwrap_or_else(|e| e.into_inner()).add(&self.trainer.store_stats());
        if self.me != 0 {
            return Ok(None);
        }
        Ok(Some(self.summary(&report, worker.peers(), train_seconds)))
    }

    /// Worker 0's summary of the run, with the figures of the report step (`report`).
    fn summary(&self, report: &StepStats, workers: usize, train_seconds: f64) -> RunSummary {
        let tracker = &self.evals.tracker;
        let (steps, samples) = (self.steps, self.samples);
        // The final figures: the best evaluation's after an early stop, else the evaluation of
        // the last step (none when a signal cut the run short).
        let last = tracker.last().filter(|e| e.step == steps && !self.interrupted);
        let last = if self.stopped_early.is_some() { tracker.best() } else { last };
        let has_eval_samples = last.is_some_and(|e| e.samples > 0);
        let final_eval = last.filter(|_| has_eval_samples);
        let (l, n) = self.window.iter().fold((0.0, 0u64), |a, b| (a.0 + b.0, a.1 + b.1));
        let bad = BadRecordCounts::from_array(report.bad_records);
        let checkpointer = &self.checkpointer;
        RunSummary {
            auc: final_eval.map(|e| e.auc.unwrap_or(f64::NAN)),
            logloss: final_eval.and_then(|e| e.logloss),
            accuracy: final_eval.and_then(|e| e.accuracy),
            ne: final_eval.and_then(|e| e.ne),
            calibration: final_eval.and_then(|e| e.calibration),
            pr_auc: final_eval.and_then(|e| e.pr_auc),
            gauc: final_eval.and_then(|e| e.gauc),
            train_loss: l / n.max(1) as f64,
            train_loss_mean: self.loss_total / samples.max(1) as f64,
            samples,
            steps,
            samples_per_sec: (samples - self.samples_at_start) as f64 / train_seconds.max(1e-9),
            workers,
            bad_records: bad.total(),
            bad_records_by_reason: bad.by_reason,
            params_l2: report.sum_squares.sqrt(),
            teacher_auc: None,
            bytes_per_sample: self.bytes_at_end as f64 / (samples - self.samples_at_start).max(1) as f64,
            eval_samples: final_eval.map_or(0, |e| e.samples),
            epochs: self.epochs,
            train_seconds,
            dense_params: self.trainer.num_dense_params() as u64,
            embedding_rows: self.ctx.resolved.table_sizes.iter().sum(),
            checkpoints_written: checkpointer.written,
            checkpoint_seconds: checkpointer.seconds,
            checkpoint_write_seconds: checkpointer.write_seconds,
            checkpoint_overlap_steps: checkpointer.overlap_steps,
            resumed_from_step: self.resumed.as_ref().map(|m| m.step),
            interrupted_at_step: self.interrupted.then_some(steps),
            store: StoreStats::default(),
            config: serde_json::Value::Null,
            evaluations: tracker.history().to_vec(),
            best_step: tracker.best().map(|b| b.step),
            early_stopped_at_step: self.stopped_early,
        }
    }
}

/// One worker's evaluation state during training.
struct Evals {
    tracker: Tracker,
    /// Sends worker 0's figures to every worker (built when the run has an eval split).
    share: Option<Collective<evaluation::Shared>>,
    /// Print every evaluation (a run with more than its final one).
    verbose: bool,
    /// Evaluations run by this process (only the first writes dead letters).
    runs: u64,
    /// This worker's malformed eval records (the latest evaluation's; each reads the same split).
    bad: BadRecordCounts,
    /// Seconds spent evaluating during training (not counted as training time).
    seconds: f64,
    /// Bytes exchanged by evaluation steps (not counted per training sample).
    bytes: u64,
    /// The global byte count before the latest evaluation, until the next training step reports its own.
    bytes_from: Option<u64>,
    /// This worker's index among the process's workers.
    local: usize,
}

impl Evals {
    /// This worker's evaluation state, going on from a resumed run's `history`; it shares the
    /// figures when the run `has_eval` (builds the collective then).
    fn new(worker: &mut timely::worker::Worker, ctx: &Context, has_eval: bool, history: &[Evaluation]) -> Self {
        let s = &ctx.settings;
        Evals {
            tracker: Tracker::new(s.run.best_metric, s.run.early_stop, history),
            share: has_eval.then(|| Collective::new(worker)),
            verbose: s.run.epochs > 1 || s.run.eval_every.is_some() || s.run.early_stop.is_some(),
            runs: 0,
            bad: BadRecordCounts::default(),
            seconds: 0.0,
            bytes: 0,
            bytes_from: None,
            local: worker.index() - s.cluster.process * s.cluster.workers,
        }
    }
}

/// Evaluates the model after global step `step` (`epoch` epochs completed), shares the
/// figures, records them and keeps the model when it is the best so far (early stopping
/// without checkpoints). `None` when a stop signal cut the evaluation short. Collective.
#[allow(clippy::too_many_arguments)]
fn evaluation_point(
    evals: &mut Evals,
    trainer: &mut Trainer,
    worker: &mut timely::worker::Worker,
    ctx: &Context,
    batch: &mut Batch,
    progress: &Progress,
    step: u64,
    epoch: u64,
) -> Result<Option<Verdict>, PipelineError> {
    let began = Instant::now();
    let outcome = evaluate(trainer, worker, ctx, batch, evals.runs == 0)?;
    evals.runs += 1;
    evals.seconds += began.elapsed().as_secs_f64();
    let Some((summary, bad, bytes_before)) = outcome else { return Ok(None) };
    evals.bad = bad;
    evals.bytes_from = Some(bytes_before);
    let share = evals.share.as_mut().expect("built when the run has an eval split");
    let e = evaluation::share(share, worker, summary, step, epoch);
    if let Some(live) = ctx.live.as_ref().filter(|_| worker.index() == 0) {
        live.set_window(Some(&e.summary()));
    }
    let verdict = evals.tracker.record(e.clone());
    if verdict.improved && ctx.settings.run.early_stop.is_some() && ctx.checkpoint.is_none() {
        ctx.best.keep(evals.local, trainer)?;
    }
    if worker.index() == 0 && evals.verbose {
        let line = evaluation::describe(&e, verdict, &evals.tracker);
        match progress {
            Progress::None => eprintln!("{line}"),
            _ => progress.println(&line),
        }
    }
    Ok(Some(verdict))
}

/// Runs the evaluation steps over the held-out split (its dead letters written when
/// `dead_letters`). Returns worker 0's summary (`None` on the others or without eval
/// samples), this worker's malformed eval records and the global byte count before the
/// first evaluation step; `None` when a stop signal cut it short. Collective.
fn evaluate(
    trainer: &mut Trainer,
    worker: &mut timely::worker::Worker,
    ctx: &Context,
    batch: &mut Batch,
    dead_letters: bool,
) -> Result<Option<(Option<EvalSummary>, BadRecordCounts, u64)>, PipelineError> {
    let s = &ctx.settings;
    let eval_spec = ctx.resolved.eval.as_ref().unwrap_or(&ctx.resolved.data);
    let sink = if dead_letters { self::dead_letters(ctx) } else { None };
    let opened = WorkerData::for_spec(
        eval_spec,
        ctx.generator.as_ref().map(|g| (g, ctx.eval_range.clone())),
        ctx.eval_span,
        &ctx.criteo,
        s.run.eval_batch_size,
        worker.index(),
        worker.peers(),
        sink,
    );
    let mut eval_data = match opened {
        Ok(d) => d,
        Err(e) => {
            trainer.step_failed(worker);
            return Err(e);
        }
    };
    // Eval steps carry the eval reader's counts only, so their sum is the split's own.
    let mut tally = Tally::default();
    let mut bytes_before = None;
    loop {
        let stats = step_with(
            trainer,
            worker,
            StepKind::Eval,
            &mut eval_data,
            batch,
            &BadRecordCounts::default(),
            &ctx.resolved,
            s.hash_seed(),
            &ctx.stop,
        )?;
        bytes_before.get_or_insert(stats.bytes_sent);
        if stats.stop_requests > 0 {
            // A partial evaluation would report a misleading AUC.
            trainer.take_eval();
            return Ok(None);
        }
        tally.bad = stats.bad_records;
        if stats.samples == 0 {
            break;
        }
        tally.good += stats.samples;
    }
    let bad = eval_data.bad_counts();
    eval_data.flush()?;
    // Separate eval data must yield samples; a held-out part is only held to the budget.
    let input = match &s.data.eval {
        Some(e) => e.clone(),
        None => format!("{} (held-out part)", s.data.source),
    };
    if s.data.eval.is_some() || tally.good + tally.bad_total() > 0 {
        budget::check(Split::Eval, &input, tally, s.data.records.max_bad_fraction, &dead_letters_path(s))?;
    }
    let eval = trainer.take_eval();
    let summary = (!eval.probs.is_empty()).then(|| eval.summary());
    Ok(Some((summary, bad, bytes_before.unwrap_or(0))))
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
