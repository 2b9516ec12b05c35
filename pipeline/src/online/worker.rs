//! The online trainer's workers (see the [module docs](super)).
//!
//! Before every step each worker fills its partitions with the step's records and then
//! votes ([`Vote`]); the step runs only when no worker stops or failed. A worker whose
//! reader fails (a partition that no longer holds its checkpointed offset under
//! `--on-offset-reset fail`, a broker unreachable past `--broker-timeout`) may be the
//! only one to know: the others wait for records, and on a quiet partition would wait
//! for ever. Invariant: such a worker reports its error to its process
//! ([`crate::cluster::failure::Failure::report`]) *before* it votes, and a worker
//! waiting for records stops waiting once its process holds a worker's error or has
//! recorded another process as lost. So its process's other workers stop waiting at
//! once and vote, every worker ends, and the process ends with that error (naming the
//! partition); the other processes learn of it from the heartbeats
//! ([`crate::cluster::liveness`]) and end naming the process. A run never hangs on a
//! failed reader.
//!
//! A `--start latest` run with a checkpoint directory votes once more before the first
//! step, with where its partitions without a checkpointed offset start (a worker whose
//! partitions failed to open votes its failure in that round); global worker 0 records
//! them ([`super::start`]) before its first step's vote, so no step runs before the record
//! is durable.
//!
//! Dead letters: each process writes its own file (`--dead-letters`, suffixed
//! `.p<process>` when the run has several processes). Every checkpoint records in
//! `dead_letter_bytes` the durable length of each dead-letter file of its lineage (the run
//! that wrote it and the runs it resumed from), keyed by [`file_key`]: the file's absolute
//! path on the machine, the symbolic links, `.` and `..` of its directory resolved, so
//! `dead.tsv`, `./dead.tsv` and `$PWD/dead.tsv` are one file. A relative `--dead-letters`
//! is taken from each process's working directory: a run resumed from another directory
//! writes another file, and the one the checkpoint lists stays one of the lineage's. On
//! resume ([`open_dead_letters`]), with the entries of the resumed checkpoint:
//!
//! * a file this run writes that the checkpoint lists is cut back to its recorded length
//!   and continued (records after the checkpoint's offsets are read again and appended);
//! * every other listed file found on this machine is cut back to its recorded length and
//!   not written; its entry is carried into every checkpoint this run writes, so that a
//!   later run writing it again continues it;
//! * a listed file shorter than recorded is left as it is, with a warning naming it (lines
//!   of it were lost); a listed file is never truncated below its entry, and no file is
//!   removed;
//! * a file this run writes that the checkpoint does not list (nor, its entries being
//!   carried, any checkpoint of the lineage) is started afresh at its first record.
//!
//! Invariant: after any sequence of kills and resumes from checkpoints, with any process
//! counts and any spelling of `--dead-letters`, once the last run has ended the union of
//! the dead-letter files holds each malformed record it read exactly once, as an
//! undisturbed run's file does. (A killed run's files may also hold records after its last
//! checkpoint until a resume cuts them. `--new-data` starts the dead letters afresh and
//! carries no entry. Files are cut on the machines the resumed run's processes run on; a
//! run that found no checkpoint to resume from starts afresh and lists no earlier file.)

use super::prequential::PrequentialWindow;
use super::start::{self, StartRecord};
use super::{OnlineSettings, OnlineSummary, RecordFormat};
use crate::budget::{self, Split, Tally};
use crate::checkpointing::{CheckpointOptions, Checkpointer, Position};
use crate::cluster::{lost_peer, Cluster};
use crate::config::Resolved;
use crate::error::DataflowFailure;
use crate::feature_pipeline::FeaturePipeline;
use crate::live_metrics::LiveMetrics;
use crate::metrics_log::{MetricsLog, MetricsRecord};
use crate::progress::Progress;
use crate::run::{checkpoint_setup, dead_letters_path, lock_checkpoint_dir, restore_shared, trainer_config};
use crate::PipelineError;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiderec_operators::bad_record::{BadRecord, BadRecordCounts, BadRecordPolicy, DeadLetterSink, ReasonCounts};
use tiderec_operators::collective::Collective;
use tiderec_operators::format::LineFormat;
use tiderec_operators::train::{StepKind, StepStats, Trainer, TrainerConfig};
use tiderec_operators::Batch;
use tiderec_sinks::checkpoint::{Checkpoint, DataPosition, Manifest, TrainingProgress};
use tiderec_sinks::dead_letters::SharedDeadLetters;
use tiderec_sources::criteo::{CriteoFeatures, CriteoFormat};
use tiderec_sources::json::CriteoJsonFormat;
use tiderec_sources::kafka::consumer::{check_options, topic_partitions, Fill, PartitionReader, StartAt};
use tiderec_sources::kafka::reset::{fingerprint_hex, parse_fingerprint, Resume};
use tiderec_sources::kafka::{offset_key, partition_owner, step_quotas, KafkaEndpoint};
use tiderec_sources::SourceError;

/// Steps over which the running training loss is averaged.
const LOSS_WINDOW: usize = 100;

/// What every worker says before a step; the step runs only if nobody stops.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Vote {
    /// SIGINT/SIGTERM arrived.
    stop: bool,
    /// Every partition of this worker reached its end (`--until-end`).
    at_end: bool,
    /// This worker's reader failed, with the message.
    failed: Option<String>,
    /// Worker 0: the checkpoint interval in seconds has passed.
    checkpoint: bool,
    /// The vote before the first step of a run that records its start ([`record_start`]):
    /// where this worker's partitions without a checkpointed offset start.
    started: Vec<(i32, i64)>,
}

/// A `--start latest` run with a checkpoint directory: where its start is recorded, and the
/// recorded offsets that apply to it (see [`super::start`]).
struct LatestStart {
    /// The checkpoint directory.
    dir: PathBuf,
    /// The step of the checkpoint the run resumed (`None`: none).
    after_step: Option<u64>,
    /// Partition → the offset a start before this run recorded (empty: none applies).
    recorded: BTreeMap<i32, i64>,
}

struct Shared {
    settings: OnlineSettings,
    resolved: Resolved,
    trainer: TrainerConfig,
    endpoint: KafkaEndpoint,
    partitions: usize,
    quotas: Vec<usize>,
    checkpoint: Option<CheckpointOptions>,
    resume: Mutex<Option<Arc<Checkpoint>>>,
    resume_pending: AtomicUsize,
    stop: Arc<AtomicBool>,
    metrics: Arc<LiveMetrics>,
    dead_letters: DeadLetters,
    /// This process in its cluster (the last finished step, for a lost-peer error).
    cluster: Cluster,
    /// `--start latest` with a checkpoint directory: the recorded start.
    latest: Option<LatestStart>,
    /// The checkpoint directory holds a recorded start, to be removed once a checkpoint
    /// of this run is durable (worker 0).
    start_recorded: AtomicBool,
}

pub(super) fn online(settings: &OnlineSettings) -> Result<Option<OnlineSummary>, PipelineError> {
    settings.validate_stream()?;
    // A `--kafka-option` that would change what the reader depends on is refused before
    // anything else (naming the property).
    check_options(&settings.kafka_options)?;
    let s = &settings.train;
    let resolved = s.resolve(settings.data())?;
    // Held until the run returns: no other run writes the checkpoint directory meanwhile.
    let _lock = lock_checkpoint_dir(s, "tiderec online")?;
    crate::memory::check(s, &resolved)?;
    let exchange = crate::exchange_plan::exchange_without_data(&resolved).ok_or_else(|| {
        PipelineError::config(
            "exchange",
            format!(
                "`{}` (or a replicated table in exchange_tables) plans from the first batches of a file; \
                 online training takes rows or partial",
                s.exchange.strategy
            ),
        )
    })?;
    let endpoint = KafkaEndpoint {
        brokers: settings.brokers.clone(),
        topic: settings.topic.clone(),
        broker_timeout: settings.broker_timeout(),
        options: settings.kafka_options.clone(),
    };
    let partitions = topic_partitions(&endpoint)?;
    let workers_total = s.cluster.workers * s.cluster.processes;
    if s.run.batch_size < partitions {
        return Err(PipelineError::config(
            "batch_size",
            format!(
                "{} is smaller than the topic's {partitions} partitions (each step takes records from every partition)",
                s.run.batch_size
            ),
        ));
    }
    let quotas = step_quotas(s.run.batch_size, partitions);
    // A partition is paused at --max-buffered records and a step waits for its quota: a
    // quota above the cap would wait for ever.
    let largest = quotas.iter().copied().max().unwrap_or(0);
    if settings.max_buffered < largest {
        return Err(PipelineError::config(
            "max_buffered",
            format!(
                "{} is below the {largest} records each step takes from a partition (--batch-size {} over {partitions} \
                 partitions): raise --max-buffered or lower --batch-size",
                settings.max_buffered, s.run.batch_size
            ),
        ));
    }
    let mut trainer = trainer_config(s, &resolved);
    // A stream has no length: a decay's horizon is --lr-decay-steps (or --steps).
    crate::hygiene::apply_schedule(crate::hygiene::lr_schedule(s, s.run.steps)?, &mut trainer);
    trainer.exchange = exchange;
    let data = crate::checkpointing::DataCheck { new_data: s.checkpoints.new_data, ..Default::default() };
    let (checkpoint, resume) = checkpoint_setup(s, &resolved, &trainer, data)?;
    if let Some(found) = &resume {
        check_topic(found, &settings.topic, s.checkpoints.new_data)?;
    }
    let (latest, start_recorded) = recorded_start(settings, checkpoint.as_ref(), resume.as_ref(), partitions)?;
    let stop = crate::stop::stop_flag()?;
    // Every process keeps the figures (the lag report reads them); process 0 may serve them.
    let metrics = crate::live_metrics::start(s.run.metrics_addr.as_deref(), s.cluster.process)?
        .unwrap_or_else(|| Arc::new(LiveMetrics::new()));
    if s.cluster.process == 0 && s.run.progress != crate::progress::ProgressMode::None {
        eprintln!(
            "tiderec online: topic {} on {} ({partitions} partitions, {} records per partition per step), {workers_total} worker(s)",
            settings.topic,
            settings.brokers,
            quotas.iter().min().copied().unwrap_or(0)
        );
    }
    crate::device::Devices::for_workers(&s.cluster.device, s.cluster.workers)?.preflight(&trainer)?;
    // Under --new-data the dead letters start afresh, as the data does.
    let dead_letters = open_dead_letters(s, resume.as_ref().filter(|_| !s.checkpoints.new_data))?;
    let shared = Arc::new(Shared {
        settings: settings.clone(),
        resolved: resolved.clone(),
        trainer,
        endpoint,
        partitions,
        quotas,
        checkpoint,
        resume: Mutex::new(resume.map(Arc::new)),
        resume_pending: AtomicUsize::new(s.cluster.workers),
        stop,
        metrics,
        dead_letters,
        cluster: Cluster::new(s, &resolved),
        latest,
        start_recorded: AtomicBool::new(start_recorded),
    });
    let ctx = shared.clone();
    let guards = crate::cluster::start(
        &shared.cluster,
        || settings.fingerprint(&resolved, partitions),
        move |worker| worker_main(worker, &ctx),
    )?;
    let outcome = crate::cluster::join(&shared.cluster, guards);
    shared.dead_letters.sink.lock().finish()?;
    let mut summary = outcome?;
    if let Some(s) = summary.as_mut() {
        s.workers = workers_total;
    }
    Ok(summary)
}

/// Refuses to resume a model trained on other topics (its checkpoint holds offsets of
/// them and none of `topic`) unless `--new-data` asks for it. (A model trained on files
/// is refused before, as other data, unless `--new-data` is given.)
fn check_topic(found: &Checkpoint, topic: &str, new_data: bool) -> Result<(), PipelineError> {
    let offsets = &found.manifest.data_position.kafka_offsets;
    let ours = offsets.keys().any(|k| k.rsplit_once('/').is_some_and(|(t, _)| t == topic));
    if new_data || ours || offsets.is_empty() {
        return Ok(());
    }
    let mut topics: Vec<&str> = offsets.keys().filter_map(|k| k.rsplit_once('/').map(|(t, _)| t)).collect();
    topics.dedup();
    Err(PipelineError::config(
        "topic",
        format!(
            "{} was trained on topic {} and holds no offsets of `{topic}`: resume on the topic it was \
             trained on, or give --new-data to keep its model and read `{topic}` from --start",
            found.path.display(),
            topics.join(", ")
        ),
    ))
}

/// The recorded start of a run with a checkpoint directory ([`super::start`]): under
/// `--start latest`, the offsets recorded by an earlier start that apply to this run (one
/// line on stderr says so; a record of another topic or of lost partitions is an error);
/// and whether the directory holds a record to remove once a checkpoint is durable.
/// `--start earliest` ignores a record, with a warning where it would have applied.
fn recorded_start(
    settings: &OnlineSettings,
    checkpoint: Option<&CheckpointOptions>,
    resume: Option<&Checkpoint>,
    partitions: usize,
) -> Result<(Option<LatestStart>, bool), PipelineError> {
    let Some(dir) = checkpoint.map(|c| c.dir.clone()) else { return Ok((None, false)) };
    let found = start::load(&dir)?;
    let after_step = resume.map(|c| c.manifest.step);
    let process0 = settings.train.cluster.process == 0;
    if settings.start != "latest" {
        let ours = found.as_ref().is_some_and(|r| r.after_step == after_step && r.topic == settings.topic);
        if ours && process0 {
            eprintln!(
                "warning: {} records where a `--start latest` run began; --start {} reads the partitions without a \
                 checkpointed offset from their oldest records instead",
                start::path(&dir).display(),
                settings.start
            );
        }
        return Ok((None, found.is_some()));
    }
    let recorded = match &found {
        Some(r) => start::applicable(r, &dir, &settings.topic, partitions, after_step)?.cloned().unwrap_or_default(),
        None => BTreeMap::new(),
    };
    if !recorded.is_empty() && process0 {
        eprintln!("{}", start::resumed_line(&dir, &recorded));
    }
    Ok((Some(LatestStart { dir, after_step, recorded }), found.is_some()))
}

/// This process's dead-letter file, its key in the checkpoints, and the entries of the
/// lineage's other dead-letter files (see the module docs).
struct DeadLetters {
    /// This process's file.
    sink: SharedDeadLetters,
    /// This process's file in `dead_letter_bytes`: its [`file_key`].
    key: String,
    /// The resumed checkpoint's entries of the files no process of this run writes,
    /// written into every checkpoint of this run.
    carried: BTreeMap<String, u64>,
}

/// A dead-letter file's key in a checkpoint's `dead_letter_bytes`: its absolute path on
/// this machine (a relative `path` is taken from the working directory), with the symbolic
/// links, `.` and `..` of its directory resolved, and its name as given. Where the
/// directory does not exist, `.` and `..` are resolved lexically. Idempotent: the key of a
/// key is itself, so a key a checkpoint recorded and the path it names give the same key
/// (as does a relative path an older checkpoint recorded, taken from the working
/// directory).
fn file_key(path: &Path) -> String {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let resolved = match (absolute.parent(), absolute.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir).ok().map(|dir| dir.join(name)),
        _ => None,
    };
    resolved.unwrap_or_else(|| lexically_normal(&absolute)).display().to_string()
}

/// `path` without its `.` components and with each `..` removing the component before it.
fn lexically_normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push(c);
                }
            }
            _ => out.push(c),
        }
    }
    out
}

/// The dead-letter files of every process of this run, by [`file_key`].
fn files_of_run(s: &crate::settings::TrainSettings) -> BTreeSet<String> {
    (0..s.cluster.processes.max(1))
        .map(|process| {
            let mut of_process = s.clone();
            of_process.cluster.process = process;
            file_key(&dead_letters_path(&of_process))
        })
        .collect()
}

/// This process's dead letters in a run resuming `resume` (`None`: a fresh run, or one
/// under `--new-data`): its own file continued where the checkpoint counted it (the
/// records dead-lettered before its offsets kept, those after them, read again, cut), or
/// started afresh at the first bad record where the checkpoint lists none; and every other
/// file the checkpoint lists, found on this machine, cut back to its count and carried
/// into this run's checkpoints (see the module docs). Every process cuts the files no
/// process of the run writes (cutting to the same length twice changes nothing); only its
/// own of the run's files.
fn open_dead_letters(
    s: &crate::settings::TrainSettings,
    resume: Option<&Checkpoint>,
) -> Result<DeadLetters, PipelineError> {
    let path = dead_letters_path(s);
    let key = file_key(&path);
    let sink = SharedDeadLetters::file(&path);
    let mut listed: BTreeMap<String, u64> = BTreeMap::new();
    for (file, &len) in resume.map(|c| &c.manifest.data_position.dead_letter_bytes).into_iter().flatten() {
        listed.insert(file_key(Path::new(file)), len);
    }
    if let Some(&kept) = listed.get(&key) {
        if let Some(warning) = sink.lock().continue_at(kept)? {
            eprintln!("warning: {warning}");
        }
    }
    let written = files_of_run(s);
    listed.retain(|file, _| !written.contains(file));
    for (file, &kept) in &listed {
        if let Some(warning) = cut_back(Path::new(file), kept)? {
            eprintln!("warning: {warning}");
        }
    }
    Ok(DeadLetters { sink, key, carried: listed })
}

/// Cuts the dead-letter file at `path`, which no process of this run writes, back to the
/// `kept` bytes a checkpoint counted (the records after them are read again, and
/// dead-lettered again in this run's files). A file shorter than `kept` is left as it is,
/// and one missing is not created: the returned warning names it. Only a regular file is
/// cut (not a device or a pipe).
fn cut_back(path: &Path, kept: u64) -> Result<Option<String>, PipelineError> {
    let named = |source| tiderec_sinks::SinkError::Io { path: path.display().to_string(), source };
    let found = match std::fs::metadata(path) {
        Ok(m) if m.is_file() => m.len(),
        Ok(_) => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((kept > 0).then(|| {
                format!(
                    "the checkpoint counts {kept} bytes of the dead-letter file {}, which is not on this machine \
                     (written on another one, or removed): its records are not in this machine's dead-letter files",
                    path.display()
                )
            }));
        }
        Err(e) => return Err(named(e).into()),
    };
    if found < kept {
        return Ok(Some(format!(
            "the dead-letter file {} holds {found} bytes, the checkpoint counted {kept}: lines of it were lost since; \
             it is left as it is",
            path.display()
        )));
    }
    if found > kept {
        let cut = std::fs::OpenOptions::new().write(true).open(path).and_then(|f| {
            f.set_len(kept)?;
            f.sync_all()
        });
        cut.map_err(named)?;
    }
    Ok(None)
}

fn record_format(settings: &OnlineSettings, resolved: &Resolved) -> Result<Box<dyn LineFormat>, PipelineError> {
    let features =
        CriteoFeatures { table_sizes: resolved.data_table_sizes().to_vec(), seed: settings.train.hash_seed() };
    Ok(match settings.format {
        RecordFormat::Criteo => Box::new(CriteoFormat::new(features)?),
        RecordFormat::Json => Box::new(CriteoJsonFormat::new(features)?),
        RecordFormat::Csv => FeaturePipeline::of_run(&settings.train, resolved)
            .line_format(true)?
            .ok_or_else(|| PipelineError::config("format", "csv records need a feature spec"))?,
    })
}

/// One worker's online run: opens its partitions, trains on the stream, and ends with the
/// last checkpoint and the report (worker 0 returns the summary). Collective.
fn worker_main(worker: &mut timely::worker::Worker, ctx: &Shared) -> Result<Option<OnlineSummary>, PipelineError> {
    let mut run = OnlineRun::open(worker, ctx)?;
    run.train(worker)?;
    run.finish(worker)
}

/// This worker's partitions, where each starts, and the record format.
struct Opened {
    reader: PartitionReader,
    format: Box<dyn LineFormat>,
    /// `(partition, offset)` of the partitions without a checkpointed offset, which start
    /// as `--start` says (or where a recorded start says).
    started: Vec<(i32, i64)>,
}

/// Opens this worker's partitions, starting where the checkpoint of a resumed run
/// (`resumed`) left them, the others where a recorded `--start latest` says, or else at
/// `--start`; and the record format. A failure is this worker's failed vote, so that the
/// others stop too.
fn open_partitions(
    worker: &mut timely::worker::Worker,
    ctx: &Shared,
    votes: &mut Collective<Vote>,
    resumed: Option<&Manifest>,
) -> Result<Opened, PipelineError> {
    let (me, peers) = (worker.index(), worker.peers());
    let os = &ctx.settings;
    // This worker's partitions, starting where the checkpoint says.
    // `--new-data` keeps the model and reads the topic from --start.
    let start_offsets =
        resumed.filter(|_| !os.train.checkpoints.new_data).map(|m| m.data_position.clone()).unwrap_or_default();
    let mine: Vec<i32> = (0..ctx.partitions as i32).filter(|&p| partition_owner(p, peers) == me).collect();
    let topic = &ctx.endpoint.topic;
    let none_of_topic = start_offsets.kafka_offsets.keys().all(|k| !k.starts_with(&format!("{topic}/")));
    if me == 0 && resumed.is_some() && none_of_topic {
        match os.train.checkpoints.new_data {
            true => eprintln!("--new-data: the partitions of topic {topic} start at --start {}", os.start),
            false => eprintln!(
                "warning: the checkpoint holds no offsets of topic {topic}; its partitions start at --start {}",
                os.start
            ),
        }
    }
    let start_at = if os.start == "latest" { StartAt::Latest } else { StartAt::Earliest };
    // A recorded start is a position like a checkpoint's, checked against the broker alike
    // (no record before it is known).
    let recorded = |p: i32| ctx.latest.as_ref()?.recorded.get(&p).map(|&next| Resume { next, last_record: None });
    let opened = PartitionReader::open(
        &ctx.endpoint,
        &os.group,
        &mine,
        |p| resume_of(&start_offsets, topic, p).or_else(|| recorded(p)),
        start_at,
        os.on_offset_reset,
        os.until_end,
        os.max_buffered,
    );
    let format = record_format(os, &ctx.resolved);
    match (opened, format) {
        (Ok(reader), Ok(format)) => {
            let checkpointed = |p: i32| resume_of(&start_offsets, topic, p).is_some();
            let started = reader.offsets().into_iter().filter(|&(p, _)| !checkpointed(p)).collect();
            Ok(Opened { reader, format, started })
        }
        (Err(e), _) => Err(fail_and_vote(worker, ctx, votes, e.into())),
        (_, Err(e)) => Err(fail_and_vote(worker, ctx, votes, e)),
    }
}

/// Gathers where every worker's partitions without a checkpointed offset start and, on
/// global worker 0, records them in the checkpoint directory when they are not the
/// recorded start already ([`super::start`]): before any worker can vote for the first
/// step, so no record is trained before the file is durable. A worker whose partitions
/// failed to open votes its failure in this round instead. Collective (in a `--start
/// latest` run with a checkpoint directory).
fn record_start(
    worker: &mut timely::worker::Worker,
    ctx: &Shared,
    votes: &mut Collective<Vote>,
    started: Vec<(i32, i64)>,
) -> Result<(), PipelineError> {
    let all = votes.all_gather(worker, Vote { started, ..Vote::default() });
    if let Some(e) = failed_vote(&all) {
        return Err(e);
    }
    let Some(latest) = ctx.latest.as_ref().filter(|_| worker.index() == 0) else { return Ok(()) };
    let offsets: BTreeMap<i32, i64> = all.into_iter().flat_map(|v| v.started).collect();
    if offsets.is_empty() || offsets == latest.recorded {
        return Ok(());
    }
    let cluster = &ctx.settings.train.cluster;
    let record = StartRecord::new(
        &ctx.endpoint.topic,
        ctx.partitions,
        latest.after_step,
        (cluster.processes, cluster.workers),
        offsets,
    );
    match start::write(&latest.dir, &record) {
        Ok(()) => {
            ctx.start_recorded.store(true, Ordering::Release);
            Ok(())
        }
        Err(e) => Err(fail_and_vote(worker, ctx, votes, e)),
    }
}

/// The error of a worker that learns from the gathered votes `all` that another worker
/// failed, naming it and its error; `None` when none did.
fn failed_vote(all: &[Vote]) -> Option<PipelineError> {
    let (k, e) = all.iter().enumerate().find_map(|(k, v)| v.failed.as_ref().map(|e| (k, e)))?;
    Some(PipelineError::Dataflow {
        failure: DataflowFailure::PeerFailed,
        worker: Some(k),
        reason: "another worker failed".into(),
        source: Some(e.clone().into()),
    })
}

/// This worker's own `error`, which the other workers would learn of only from its vote:
/// reported to the process first, so that the workers waiting for records stop waiting
/// ([`peer_failed`]) and vote too, and the heartbeats tell the other processes; then
/// gathered as this worker's failed vote. Returns what the worker ends with (the process
/// ends with `error`). Collective.
fn fail_and_vote(
    worker: &mut timely::worker::Worker,
    ctx: &Shared,
    votes: &mut Collective<Vote>,
    error: PipelineError,
) -> PipelineError {
    let message = error.to_string();
    report_own(worker.index(), ctx, error);
    votes.all_gather(worker, Vote { failed: Some(message), ..Vote::default() });
    PipelineError::dataflow(DataflowFailure::PeerFailed, "this worker's error is the process's")
}

/// Keeps worker `me`'s own `error` as its process's ([`crate::cluster::failure`]), at once.
fn report_own(me: usize, ctx: &Shared, error: PipelineError) {
    ctx.cluster.failure.report(me, error);
}

/// Whether a worker of this process failed with an error of its own, or another process
/// was recorded as lost: a worker waiting for records then stops waiting.
fn peer_failed(ctx: &Shared) -> bool {
    ctx.cluster.failure.failed() || lost_peer::lost().is_some()
}

/// The number of records each step takes from a partition.
fn quota_of(ctx: &Shared) -> impl Fn(i32) -> usize + Copy + '_ {
    move |p: i32| ctx.quotas[p as usize]
}

/// One worker's online run: its trainer, its partitions, and the running state of the stream.
struct OnlineRun<'a> {
    ctx: &'a Shared,
    /// This worker's index.
    me: usize,
    trainer: Trainer,
    checkpointer: Checkpointer,
    votes: Collective<Vote>,
    offsets_channel: Collective<Cut>,
    /// The step of the checkpoint the run resumed from.
    resumed_from_step: Option<u64>,
    reader: PartitionReader,
    format: Box<dyn LineFormat>,
    dead_letters: SharedDeadLetters,
    steps: u64,
    samples: u64,
    loss_total: f64,
    /// The last [`LOSS_WINDOW`] steps' loss sums and samples.
    loss_window: VecDeque<(f64, u64)>,
    samples_at_start: u64,
    bad: BadRecordCounts,
    /// The prequential window (worker 0).
    window: PrequentialWindow,
    progress: Progress,
    log: Option<MetricsLog>,
    start: Instant,
    last_report: Instant,
    last_checkpoint: Option<Instant>,
    batch: Batch,
    stopped_by_signal: bool,
    steps_reported: u64,
    samples_reported: u64,
    /// A step was taken since the last report.
    unreported: bool,
    /// The malformed records over all workers as of the last step.
    /// Malformed records since this run started, over every worker, by reason.
    bad_global: ReasonCounts,
    /// What the bad-record budget counts from: the samples before the data it judges
    /// (those of other data, after `--new-data`), and the malformed records of this data
    /// before this run (from the resumed checkpoint).
    budget_from: (u64, ReasonCounts),
}

impl<'a> OnlineRun<'a> {
    /// Sets up this worker's run: its trainer, checkpointer and collectives, the restored
    /// checkpoint, its partitions and record format, the counts a resumed run goes on from,
    /// the progress display and the metrics log. Collective.
    fn open(worker: &mut timely::worker::Worker, ctx: &'a Shared) -> Result<Self, PipelineError> {
        let me = worker.index();
        let os = &ctx.settings;
        let s = &os.train;
        let devices = crate::device::Devices::for_workers(&s.cluster.device, s.cluster.workers)?;
        let mut trainer = devices.trainer(worker, &ctx.trainer, s.cluster.workers, s.model.precision)?;
        trainer.set_score_training(me == 0);
        let mut checkpointer = Checkpointer::new(worker, ctx.checkpoint.clone(), &ctx.trainer, s.run.batch_size as u64);
        let mut votes: Collective<Vote> = Collective::new(worker);
        let offsets_channel: Collective<Cut> = Collective::new(worker);
        let resumed = restore_shared(worker, &mut trainer, &mut checkpointer, &ctx.resume, &ctx.resume_pending)?
            .map(|c| c.manifest.clone());
        let resumed_manifest = resumed.clone();
        let Opened { reader, format, started } = open_partitions(worker, ctx, &mut votes, resumed.as_ref())?;
        if ctx.latest.is_some() {
            record_start(worker, ctx, &mut votes, started)?;
        }
        let dead_letters = ctx.dead_letters.sink.clone();

        let (mut steps, mut samples, mut loss_total) = (0u64, 0u64, 0.0f64);
        let mut loss_window: VecDeque<(f64, u64)> = VecDeque::with_capacity(LOSS_WINDOW);
        if let Some(m) = &resumed {
            (steps, samples, loss_total) = (m.step, m.samples, m.progress.loss_total);
            let keep_from = m.progress.loss_window.len().saturating_sub(LOSS_WINDOW);
            loss_window.extend(&m.progress.loss_window[keep_from..]);
        }
        let progress = if me == 0 { Progress::new(s.run.progress, None) } else { Progress::None };
        let log = match (me, s.cluster.process) {
            (0, 0) => MetricsLog::for_run(&s.run, resumed.as_ref().map(|m| m.step), s.checkpoints.resume, true)?,
            _ => None,
        };
        let batch = Batch::with_sequences(ctx.resolved.shape.0, ctx.resolved.shape.1, format.num_sequences());
        Ok(OnlineRun {
            ctx,
            me,
            trainer,
            checkpointer,
            votes,
            offsets_channel,
            resumed_from_step: resumed.map(|m| m.step),
            reader,
            format,
            dead_letters,
            steps,
            samples,
            loss_total,
            loss_window,
            samples_at_start: samples,
            bad: BadRecordCounts::default(),
            window: PrequentialWindow::new(os.window),
            progress,
            log,
            start: Instant::now(),
            last_report: Instant::now() - Duration::from_secs(3600),
            last_checkpoint: None,
            batch,
            stopped_by_signal: false,
            steps_reported: steps,
            samples_reported: samples,
            unreported: false,
            bad_global: ReasonCounts::default(),
            budget_from: budget_from(resumed_manifest.as_ref(), s.checkpoints.new_data),
        })
    }

    /// The stream's steps, until `--steps`, a stop signal or (with `--until-end`) the end of
    /// every partition. Collective.
    fn train(&mut self, worker: &mut timely::worker::Worker) -> Result<(), PipelineError> {
        let s = &self.ctx.settings.train;
        loop {
            if s.run.steps.is_some_and(|max| self.steps >= max) {
                break;
            }
            self.report_if_due()?;
            let Some(all) = self.vote(worker)? else { break };
            self.read_step(worker)?;
            self.step(worker, &all)?;
        }
        Ok(())
    }

    /// Reports the last step when one is due and not reported yet: the partitions' lag, and
    /// worker 0's metrics.
    fn report_if_due(&mut self) -> Result<(), PipelineError> {
        let ctx = self.ctx;
        // Report every `report_seconds`, and at once when the stream runs dry (so the
        // metrics show the last step while the trainer waits for records).
        let due = self.last_report.elapsed() >= Duration::from_secs_f64(ctx.settings.report_seconds);
        // (Waiting for records anyway, the report costs no training time.)
        let idle = !self.reader.is_ready(quota_of(ctx));
        if self.unreported && (due || idle) {
            self.last_report = Instant::now();
            for (p, lag) in self.reader.lag() {
                ctx.metrics.set_lag(&ctx.endpoint.topic, p, lag);
            }
            if self.me == 0 {
                self.report()?;
            }
        }
        Ok(())
    }

    /// Worker 0's report of the last step: the live metrics, the metrics log and the progress
    /// line.
    fn report(&mut self) -> Result<(), PipelineError> {
        let ctx = self.ctx;
        let (steps, samples) = (self.steps, self.samples);
        let mut r = MetricsRecord {
            time_s: self.start.elapsed().as_secs_f64(),
            step: steps,
            samples,
            samples_per_sec: (samples - self.samples_at_start) as f64 / self.start.elapsed().as_secs_f64().max(1e-9),
            loss: mean_loss(&self.loss_window),
            lag: ctx.metrics.total_lag(),
            checkpoint_age_s: self.last_checkpoint.map(|t| t.elapsed().as_secs_f64()),
            bad_records: self.bad_global.iter().sum(),
            ..Default::default()
        };
        r.set_window(Some(&self.window.summary()));
        ctx.metrics.record(&r, steps - self.steps_reported, samples - self.samples_reported);
        (self.steps_reported, self.samples_reported) = (steps, samples);
        if let Some(log) = self.log.as_mut() {
            log.write(&r)?;
        }
        let f = |v: Option<f64>| v.map_or("n/a".into(), |a| format!("{a:.4}"));
        self.progress.advance(
            steps,
            &format!(
                "{samples} samples  loss {:.4}  window AUC {}  logloss {}  NE {}  lag {}  {:.0} samples/s",
                r.loss,
                f(r.window_auc),
                f(r.window_logloss),
                f(r.window_ne),
                r.lag,
                r.samples_per_sec
            ),
        );
        Ok(())
    }

    /// Fills this worker's partitions for the next step and gathers every worker's vote:
    /// every vote when the step runs, `None` when the stream ends here (a stop signal, or
    /// every partition at its end under `--until-end`), an error when a reader failed.
    /// Collective.
    fn vote(&mut self, worker: &mut timely::worker::Worker) -> Result<Option<Vec<Vote>>, PipelineError> {
        let ctx = self.ctx;
        let os = &ctx.settings;
        // Waits for records until a signal, or a worker's failure the step would not tell.
        let filled = self.reader.fill(quota_of(ctx), || ctx.stop.load(Ordering::Relaxed) || peer_failed(ctx));
        let due_by_time = self.me == 0
            && os
                .checkpoint_seconds
                .is_some_and(|t| self.last_checkpoint.unwrap_or(self.start).elapsed() >= Duration::from_secs_f64(t));
        let stopped = matches!(filled, Ok(Fill::Stopped));
        let (failed, own_error) = match filled {
            // This worker's own error goes to the process before the vote (see the module docs).
            Err(e) => {
                let message = e.to_string();
                report_own(self.me, ctx, e.into());
                (Some(message), true)
            }
            Ok(Fill::Stopped) if peer_failed(ctx) => {
                (Some("stopped waiting for records: another worker failed".into()), false)
            }
            Ok(_) => (None, false),
        };
        let vote = Vote {
            stop: ctx.stop.load(Ordering::Relaxed) || stopped,
            at_end: os.until_end && self.reader.at_end(),
            failed,
            checkpoint: due_by_time,
            started: Vec::new(),
        };
        let all = self.votes.all_gather(worker, vote);
        if own_error {
            return Err(PipelineError::dataflow(DataflowFailure::PeerFailed, "this worker's error is the process's"));
        }
        if let Some(e) = failed_vote(&all) {
            return Err(e);
        }
        if all.iter().any(|v| v.stop) {
            self.stopped_by_signal = true;
            return Ok(None);
        }
        if os.until_end && all.iter().all(|v| v.at_end) {
            return Ok(None);
        }
        Ok(Some(all))
    }

    /// Parses the step's records into the micro-batch. A malformed record is counted and
    /// written to the dead letters; under `fail` (or when the dead letters cannot be written)
    /// it fails this worker's step, so that the others stop too.
    fn read_step(&mut self, worker: &mut timely::worker::Worker) -> Result<(), PipelineError> {
        let ctx = self.ctx;
        let topic = &ctx.endpoint.topic;
        // The step's micro-batch: this worker's quota of every partition it owns.
        self.batch.clear();
        let mut fatal = None;
        for (p, offset, payload) in self.reader.step_records(quota_of(ctx)) {
            if let Err((reason, field)) = self.format.parse(payload, &mut self.batch) {
                self.bad.add(reason);
                let record = BadRecord {
                    source: format!("kafka:{topic}/{p}"),
                    line: offset as u64,
                    byte_offset: offset as u64,
                    reason,
                    field,
                    raw: payload.iter().take(4096).copied().collect(),
                };
                if ctx.resolved.policy == BadRecordPolicy::Fail {
                    fatal = Some(record);
                    break;
                }
                if let Err(e) = self.dead_letters.write(&record) {
                    fatal.get_or_insert(record);
                    eprintln!("error: cannot write the dead-letter file: {e}");
                    break;
                }
            }
        }
        if let Some(record) = fatal {
            self.trainer.step_failed(worker);
            return Err(SourceError::BadRecord(record).into());
        }
        Ok(())
    }

    /// The training step on the micro-batch, its counts and its prequential figures, then a
    /// checkpoint when due (every `--checkpoint-every` steps, or when a worker's vote says)
    /// and the commit of a durable one. Collective.
    fn step(&mut self, worker: &mut timely::worker::Worker, all: &[Vote]) -> Result<(), PipelineError> {
        let ctx = self.ctx;
        self.trainer.set_bad_records(self.bad.to_array());
        let taken =
            crate::run::take_for_model(&mut self.batch, &ctx.trainer, &ctx.resolved, ctx.settings.train.hash_seed());
        let stats = self.trainer.step(worker, StepKind::Train, taken)?;
        if stats.failed_workers > 0 {
            return Err(crate::run::peer_failed(stats.failed_workers));
        }
        if stats.non_finite > 0 {
            // Nothing past the ruined step is committed: only the checkpoint in flight (of an
            // earlier step) may still become durable, with its own offsets.
            let e = crate::run::diverged(worker, &mut self.checkpointer, self.steps + 1, &stats);
            commit_durable(self.me, &mut self.checkpointer, &self.reader, ctx);
            return Err(e);
        }
        self.reader.consume_step(quota_of(ctx));
        self.steps += 1;
        ctx.cluster.finished_step(self.steps);
        self.samples += stats.samples;
        self.loss_total += stats.loss_sum;
        if self.loss_window.len() == LOSS_WINDOW {
            self.loss_window.pop_front();
        }
        self.loss_window.push_back((stats.loss_sum, stats.samples));
        if self.me == 0 {
            self.window.extend(&self.trainer.take_eval());
        }
        self.checkpointer.poll(worker)?;
        self.bad_global = stats.bad_records;
        if self.checkpointer.due_every(self.steps) || all.iter().any(|v| v.checkpoint) {
            if let Err(e) = self.check_budget() {
                // The write in flight (of an earlier step, within the budget then) stays.
                self.checkpointer.finish(worker)?;
                commit_durable(self.me, &mut self.checkpointer, &self.reader, ctx);
                return Err(e);
            }
            self.checkpoint(worker)?;
            self.last_checkpoint = Some(Instant::now());
        }
        commit_durable(worker.index(), &mut self.checkpointer, &self.reader, ctx);
        self.unreported = true;
        Ok(())
    }

    /// Malformed records of the data the budget judges, over every worker: before this
    /// run and since it started.
    fn bad_so_far(&self) -> ReasonCounts {
        std::array::from_fn(|i| self.budget_from.1[i] + self.bad_global[i])
    }

    /// Holds the records of the topic read so far, across resumes (as an uninterrupted
    /// run would count them), to the bad-record budget (`--max-bad-fraction`), as a file
    /// run's training input is held to it ([`budget::check`]); nothing read yet has
    /// nothing to judge. The counts are global, so every worker reaches the same verdict
    /// after the same step.
    fn check_budget(&self) -> Result<(), PipelineError> {
        let s = &self.ctx.settings.train;
        let tally = Tally { good: self.samples - self.budget_from.0, bad: self.bad_so_far() };
        if tally.good == 0 && tally.bad_total() == 0 {
            return Ok(());
        }
        let input = format!("kafka:{}", self.ctx.endpoint.topic);
        budget::check(Split::Train, &input, tally, s.data.records.max_bad_fraction, &dead_letters_path(s))
    }

    /// Begins a checkpoint of the current step with every partition's offsets
    /// ([`write_checkpoint`]). Collective.
    fn checkpoint(&mut self, worker: &mut timely::worker::Worker) -> Result<(), PipelineError> {
        let bad = self.bad_so_far();
        write_checkpoint(
            worker,
            &mut self.checkpointer,
            &mut self.offsets_channel,
            &self.trainer,
            (&self.reader, &self.ctx.dead_letters),
            position_at((self.steps, self.samples, self.budget_from.0), self.loss_total, &self.loss_window, &bad),
        )
    }

    /// The end of the run: the last checkpoint, durable and committed, the dead letters, and
    /// the report step with every partition's offsets; worker 0 returns the summary.
    /// Collective.
    fn finish(mut self, worker: &mut timely::worker::Worker) -> Result<Option<OnlineSummary>, PipelineError> {
        let train_seconds = self.start.elapsed().as_secs_f64();
        // A mostly malformed topic fails the run before its last checkpoint; the write in
        // flight (of an earlier step, within the budget then) still becomes durable.
        if let Err(e) = self.check_budget() {
            self.checkpointer.finish(worker)?;
            commit_durable(self.me, &mut self.checkpointer, &self.reader, self.ctx);
            return Err(e);
        }
        if self.checkpointer.due_at_boundary(self.steps) {
            self.checkpoint(worker)?;
        }
        // The write in flight is durable before the run ends (also after a signal).
        self.checkpointer.finish(worker)?;
        commit_durable(self.me, &mut self.checkpointer, &self.reader, self.ctx);
        self.progress.finish();
        self.dead_letters.flush().map_err(|e| {
            PipelineError::dataflow(DataflowFailure::Output, "cannot write the dead-letter file").with_source(e)
        })?;
        self.trainer.set_bad_records(self.bad.to_array());
        let m = &self.ctx.trainer.model;
        let empty = Batch::with_sequences(m.num_dense(), m.num_sparse(), m.num_sequences());
        let report = self.trainer.step(worker, StepKind::Report, empty)?;
        let offsets: BTreeMap<String, i64> = self
            .offsets_channel
            .all_gather(worker, (self.reader.offset_entries(), Ok((String::new(), 0))))
            .into_iter()
            .flat_map(|(entries, _)| entries)
            .map(|(key, offset, _)| (key, offset))
            .collect();
        if self.me != 0 {
            return Ok(None);
        }
        Ok(Some(self.summary(&report, offsets, worker.peers(), train_seconds)))
    }

    /// Worker 0's summary of the run, with the figures of the report step (`report`) and the
    /// partitions' `offsets`; it notes a stop by signal and the duplicates dropped.
    fn summary(
        &self,
        report: &StepStats,
        offsets: BTreeMap<String, i64>,
        workers: usize,
        train_seconds: f64,
    ) -> OnlineSummary {
        let s = &self.ctx.settings.train;
        let (steps, samples) = (self.steps, self.samples);
        if self.stopped_by_signal && s.run.progress != crate::progress::ProgressMode::None {
            eprintln!("stopped by signal after step {steps}; offsets saved in the checkpoint");
        }
        let stats = self.reader.stats();
        if stats.duplicates_dropped > 0 && s.run.progress != crate::progress::ProgressMode::None {
            eprintln!("dropped {} records the broker sent twice (reconnects)", stats.duplicates_dropped);
        }
        let final_window = self.window.summary();
        OnlineSummary {
            steps,
            samples,
            samples_this_run: samples - self.samples_at_start,
            resumed_from_step: self.resumed_from_step,
            stopped_by_signal: self.stopped_by_signal,
            window_auc: final_window.auc,
            window_logloss: final_window.logloss,
            window_ne: final_window.ne,
            window_calibration: final_window.calibration,
            window_pr_auc: final_window.pr_auc,
            window_gauc: final_window.gauc,
            samples_per_sec: (samples - self.samples_at_start) as f64 / train_seconds.max(1e-9),
            bad_records: report.bad_records.iter().sum(),
            checkpoints_written: self.checkpointer.written,
            offsets,
            params_l2: report.sum_squares.sqrt(),
            workers,
            train_seconds,
        }
    }
}

fn mean_loss(window: &VecDeque<(f64, u64)>) -> f64 {
    let (l, n) = window.iter().fold((0.0, 0u64), |a, b| (a.0 + b.0, a.1 + b.1));
    l / n.max(1) as f64
}

/// Where training stands after `steps` steps (the offsets are added when writing).
fn position_at(
    (steps, samples, samples_before_data): (u64, u64, u64),
    loss_total: f64,
    loss_window: &VecDeque<(f64, u64)>,
    bad: &ReasonCounts,
) -> Position {
    Position {
        step: steps,
        epoch: 0,
        steps_in_epoch: steps,
        samples,
        progress: TrainingProgress {
            loss_total,
            loss_window: loss_window.iter().copied().collect(),
            // Over every worker, across resumes: what the bad-record budget goes on from.
            bad_records_before_epoch: bad.to_vec(),
            samples_before_data,
            ..Default::default()
        },
        kafka_offsets: BTreeMap::new(),
        kafka_last_records: BTreeMap::new(),
        dead_letter_bytes: BTreeMap::new(),
    }
}

/// Where the bad-record budget counts from in a run resuming `resumed` (see
/// `OnlineRun::budget_from`): this data's malformed records before it, or under
/// `--new-data` nothing, and the samples of the other data.
fn budget_from(resumed: Option<&Manifest>, new_data: bool) -> (u64, ReasonCounts) {
    let Some(m) = resumed else { return (0, ReasonCounts::default()) };
    if new_data {
        return (m.samples, ReasonCounts::default());
    }
    let mut bad = ReasonCounts::default();
    for (b, &n) in bad.iter_mut().zip(&m.progress.bad_records_before_epoch) {
        *b = n;
    }
    (m.progress.samples_before_data.min(m.samples), bad)
}

/// A partition's manifest key, next offset and the fingerprint of the record before it.
type OffsetEntry = (String, i64, Option<u64>);

/// What a worker contributes to a checkpoint's position: its partitions' entries, and
/// its process's dead-letter file (its [`file_key`]) with the file's durable length, or
/// why that failed.
type Cut = (Vec<OffsetEntry>, Result<(String, u64), String>);

/// Where the checkpoint's `position` left partition `p` of `topic`.
fn resume_of(position: &DataPosition, topic: &str, p: i32) -> Option<Resume> {
    let key = offset_key(topic, p);
    let next = *position.kafka_offsets.get(&key)?;
    let last_record = position.kafka_last_records.get(&key).and_then(|h| parse_fingerprint(h));
    Some(Resume { next, last_record })
}

/// Begins a checkpoint of this step with every partition's next offset and the length of
/// every dead-letter file of the lineage: those of this run's processes, and those carried
/// from the resumed checkpoint (written in the background; see [`commit_durable`]).
/// Collective.
fn write_checkpoint(
    worker: &mut timely::worker::Worker,
    checkpointer: &mut Checkpointer,
    offsets_channel: &mut Collective<Cut>,
    trainer: &Trainer,
    (reader, dead_letters): (&PartitionReader, &DeadLetters),
    mut position: Position,
) -> Result<(), PipelineError> {
    // Every record of this step was read (and dead-lettered) before the step, and no
    // worker reads the next one before this gather: the lengths are those at the cut.
    let dead = {
        let mut file = dead_letters.sink.lock();
        file.durable_len().map(|len| (dead_letters.key.clone(), len)).map_err(|e| e.to_string())
    };
    // The lineage's files no process of this run writes keep their entries.
    position.dead_letter_bytes.extend(dead_letters.carried.iter().map(|(file, &len)| (file.clone(), len)));
    // A failure on any process fails every worker here, before the collective write.
    let mut failed = None;
    for (entries, dead) in offsets_channel.all_gather(worker, (reader.offset_entries(), dead)) {
        for (key, offset, last) in entries {
            if let Some(fp) = last {
                position.kafka_last_records.insert(key.clone(), fingerprint_hex(fp));
            }
            position.kafka_offsets.insert(key, offset);
        }
        match dead {
            Ok((file, len)) => _ = position.dead_letter_bytes.insert(file, len),
            Err(e) => failed = Some(e),
        }
    }
    if let Some(e) = failed {
        return Err(PipelineError::dataflow(
            DataflowFailure::Output,
            format!("cannot write the dead-letter file: {e}"),
        ));
    }
    checkpointer.write(worker, trainer, &position)
}

/// Once a checkpoint is durable, commits the offsets it holds for this
/// worker's partitions to the consumer group (for monitoring tools; the
/// checkpoint is what a restart reads) and records its age.
fn commit_durable(me: usize, checkpointer: &mut Checkpointer, reader: &PartitionReader, ctx: &Shared) {
    let Some(position) = checkpointer.take_durable() else { return };
    if me == 0 {
        ctx.metrics.checkpointed();
        // The checkpoint's offsets are the lineage's now (see `super::start`).
        if ctx.start_recorded.swap(false, Ordering::AcqRel) {
            if let Some(c) = &ctx.checkpoint {
                start::remove(&c.dir);
            }
        }
    }
    let topic = &ctx.endpoint.topic;
    let offsets: Vec<(i32, i64)> = reader
        .offsets()
        .into_iter()
        .filter_map(|(p, _)| position.kafka_offsets.get(&offset_key(topic, p)).map(|&o| (p, o)))
        .collect();
    if offsets.is_empty() {
        return;
    }
    if let Err(e) = reader.commit(&offsets) {
        eprintln!("warning: {e} (monitoring only; the checkpoint holds the offsets)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every spelling of one file has one key: relative or absolute, with `.`, `..` or a
    /// symbolic link in its directory, and a key is its own key; where the directory does
    /// not exist, `.` and `..` are resolved lexically.
    #[test]
    fn a_file_has_one_key_whatever_its_spelling() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::fs::canonicalize(tmp.path()).unwrap();
        std::fs::create_dir(dir.join("sub")).unwrap();
        let key = file_key(&dir.join("dead.tsv"));
        assert_eq!(key, dir.join("dead.tsv").display().to_string());
        for spelled in [dir.join(".").join("dead.tsv"), dir.join("sub").join("..").join("dead.tsv")] {
            assert_eq!(file_key(&spelled), key, "{}", spelled.display());
        }
        assert_eq!(file_key(Path::new(&key)), key);
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&dir, dir.join("sub").join("link")).unwrap();
            assert_eq!(file_key(&dir.join("sub").join("link").join("dead.tsv")), key);
        }
        let missing = dir.join("missing").join(".").join("..").join("dead.tsv");
        assert_eq!(file_key(&missing), key);
        let cwd = std::env::current_dir().unwrap();
        for relative in ["dead.tsv", "./dead.tsv"] {
            assert_eq!(file_key(Path::new(relative)), file_key(&cwd.join("dead.tsv")), "{relative}");
        }
        assert_ne!(file_key(&dir.join("dead.tsv.p0")), key);
    }

    /// A listed file no process writes is cut back to the checkpoint's count; one shorter,
    /// or missing, is left as it is (a missing one not created) with a warning naming it.
    #[test]
    fn a_file_of_the_lineage_is_cut_back_never_below_its_count() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dead.tsv.p1");
        std::fs::write(&path, "kept 1\nkept 2\nread again\n").unwrap();
        assert_eq!(cut_back(&path, 14).unwrap(), None);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "kept 1\nkept 2\n");
        assert_eq!(cut_back(&path, 14).unwrap(), None, "cutting again changes nothing");
        let warning = cut_back(&path, 100).unwrap().expect("a warning");
        assert!(warning.contains("dead.tsv.p1") && warning.contains("lost"), "{warning}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "kept 1\nkept 2\n", "left as it is");
        let missing = dir.path().join("dead.tsv.p2");
        let warning = cut_back(&missing, 7).unwrap().expect("a warning");
        assert!(warning.contains("dead.tsv.p2"), "{warning}");
        assert_eq!(cut_back(&missing, 0).unwrap(), None);
        assert!(!missing.exists());
    }
}
