//! The `tiderec` command line.

mod cli;
#[cfg(test)]
mod documented_commands;

use anyhow::Context;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use clap::{Args, Parser, Subcommand};
use cli::bench::command::BenchCommand;
use std::path::PathBuf;
use tiderec::online::defaults as online_defaults;
use tiderec::online::ranges as online_ranges;
use tiderec::paths::{self, Named};
use tiderec::run_files;
use tiderec::settings::range::{self, Range};
use tiderec::settings::{ConvertFlags, TrainFlags};
use tiderec::TrainSettings;

/// The command line: one subcommand and its flags.
#[derive(Parser)]
#[command(name = "tiderec", version, about = "Streaming CTR training on timely dataflow")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model (DLRM, LR, FM, DeepFM, Wide & Deep, DIEN) on synthetic data, raw record files or converted
    /// Parquet.
    Train(Box<TrainArgs>),
    /// Convert raw record files (criteo, avazu, csv + spec) to featurized Parquet for batch replay.
    Convert(Box<ConvertArgs>),
    /// Train continuously from a Kafka topic (prequential evaluation, exactly-once checkpoints).
    Online(Box<OnlineArgs>),
    /// Replay Criteo files into a Kafka topic (creates the topic if needed).
    Produce(ProduceArgs),
    /// Draw loss, NE, AUC, PR-AUC and GAUC curves from a `train` or `online` `--metrics-log` file to a PNG.
    Plot(PlotArgs),
    /// Write a checkpoint's model as a serving snapshot (safetensors + model config JSON).
    Export(ExportArgs),
    /// Score labeled records with a checkpoint's model (AUC, logloss, NE, calibration, PR-AUC, GAUC),
    /// featurized by its pipeline.
    Eval(EvalArgs),
    /// Write one score per record (CSV or Parquet), featurized by the checkpoint's pipeline.
    Predict(PredictArgs),
    /// Score JSON records over HTTP with a checkpoint's model, following a checkpoint directory.
    Serve(ServeArgs),
    /// Measure throughput.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Write generated datasets (no real Ele.me rows exist; this writes elm-shaped ones).
    #[command(subcommand)]
    Generate(GenerateCommand),
    /// Feature-spec presets: list them, or print one as TOML to start a spec from.
    #[command(subcommand)]
    Spec(SpecCommand),
}

#[derive(Subcommand)]
enum SpecCommand {
    /// The preset names (use as `--spec preset:NAME`).
    List,
    /// Print a preset as TOML (`tiderec spec show criteo > my.toml`, edit, `--spec my.toml`).
    Show(SpecShowArgs),
    /// Parse and validate a spec (preset or TOML file), vocabularies included.
    Check(SpecShowArgs),
}

#[derive(Args)]
struct SpecShowArgs {
    /// `criteo`, `avazu`, `elm`, `elm_y_long`, `elm_dien`, `taobao_ad` (or `preset:NAME`), or a TOML file for `check`.
    name: String,
    /// Rows per table where the spec gives none (as `train --buckets`).
    #[arg(long, value_name = "N", default_value_t = tiderec::settings::DEFAULT_BUCKETS, value_parser = Range::<u64>::closed("buckets", 1, range::MAX_ROWS))]
    buckets: u64,
    /// Most items kept of a list where the spec gives none (as `train --max-len`; elm keeps 50,
    /// elm_y_long 400).
    #[arg(long, value_name = "N", default_value_t = tiderec::settings::DEFAULT_MAX_LEN, value_parser = Range::<usize>::closed("max_len", 1, 1 << 20))]
    max_len: usize,
    /// `check` only: `csv:PATH[,PATH…]` records to learn the spec's scales and quantiles from,
    /// and to warn about dense columns whose range makes training unstable.
    #[arg(long, value_name = "csv:PATH,…")]
    data: Option<String>,
}

#[derive(Subcommand)]
enum GenerateCommand {
    /// Ele.me-shaped CSV lines (39 columns, `;` lists; labels carry no signal). Train with `--data csv:FILE --spec elm`.
    Elm(ElmArgs),
}

#[derive(Args)]
struct ElmArgs {
    /// Output file.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Replace --out when it exists (refused otherwise).
    #[arg(long)]
    overwrite: bool,
    /// Number of lines.
    #[arg(long, value_name = "N", default_value_t = 100_000, value_parser = Range::<u64>::closed("rows", 1, range::MAX_STEPS))]
    rows: u64,
    /// List length scale: 1 = elm, 8 = elm_y_long.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = Range::<usize>::closed("list_scale", 1, 64))]
    list_scale: usize,
    /// Seed.
    #[arg(long, value_name = "SEED", default_value_t = 42)]
    seed: u64,
}

/// Flags of `tiderec train`: every setting, plus `--overwrite`.
#[derive(Args)]
struct TrainArgs {
    /// Replace --metrics-json when it exists (refused otherwise, unless --resume).
    #[arg(long)]
    overwrite: bool,
    #[command(flatten)]
    train: TrainFlags,
}

/// Flags of `tiderec convert`; the feature flags mean what they mean for `tiderec train`.
#[derive(Args)]
struct ConvertArgs {
    /// Input: `criteo:PATH[,PATH…]`, `avazu:PATH[,PATH…]` or `csv:PATH[,PATH…]` with --spec (files or directories).
    #[arg(long, value_name = "FORMAT:PATH,…")]
    from: String,
    /// Output: `parquet:DIR` (created; must not hold *.parquet files yet).
    #[arg(long, value_name = "parquet:DIR")]
    to: String,
    /// Rows per row group (the unit of reading, and of the per-epoch order of files from other writers).
    #[arg(long, value_name = "N", default_value_t = tiderec_sources::parquet::DEFAULT_ROW_GROUP_ROWS, value_parser = Range::<usize>::closed("row_group_rows", 1, 1 << 30))]
    row_group_rows: usize,
    /// Start a new file after this many rows (default: one file).
    #[arg(long, value_name = "N", value_parser = Range::<u64>::closed("rows_per_file", 1, range::MAX_STEPS))]
    rows_per_file: Option<u64>,
    /// zstd compression level (1-22).
    #[arg(long, value_name = "LEVEL", default_value_t = 3, value_parser = Range::<i32>::closed("zstd_level", 1, 22))]
    zstd_level: i32,
    /// The featurizing settings, as for `train` (a `--config` file's other settings are ignored).
    #[command(flatten)]
    settings: ConvertFlags,
}

impl ConvertArgs {
    fn into_settings(self) -> anyhow::Result<tiderec::convert::ConvertSettings> {
        let args = self;
        let mut s = args.settings.settings()?;
        s.data.source = args.from;
        let out = tiderec::convert::parse_target("to", &args.to)?;
        let mut inputs: Vec<Named> =
            args.settings.config_path().map(|c| Named::new("--config", c)).into_iter().collect();
        inputs.extend(paths::data_files("--from", &s.data.source)?);
        inputs.extend(s.data.spec.as_deref().map(paths::spec_files).unwrap_or_default());
        let outputs = [Named::new("--to", &out), Named::new("--dead-letters", &s.data.records.dead_letters)];
        paths::check_outputs(&inputs, &outputs)?;
        let writer = tiderec_sources::parquet::WriterOptions {
            row_group_rows: args.row_group_rows,
            rows_per_file: args.rows_per_file,
            zstd_level: args.zstd_level,
        };
        Ok(tiderec::convert::ConvertSettings { input: s, out, writer })
    }
}

/// Flags of `tiderec online`: the stream's, plus every flag of `train` (model, optimizers, workers,
/// checkpoints).
#[derive(Args)]
struct OnlineArgs {
    /// Kafka brokers, host:port[,host:port…].
    #[arg(long, value_name = "HOST:PORT,…", default_value = online_defaults::BROKERS)]
    brokers: String,
    /// Topic to train on.
    #[arg(long, value_name = "NAME")]
    topic: String,
    /// Consumer group offsets are committed to after each durable checkpoint (monitoring only).
    #[arg(long, value_name = "NAME", default_value = online_defaults::GROUP)]
    group: String,
    /// Record format: criteo (TSV lines), json (objects with label, I1..I13, C1..C26) or csv
    /// (delimited lines in the columns of --spec; its `user` column gives the GAUC).
    #[arg(long, value_name = "criteo|json|csv", default_value = "criteo")]
    format: String,
    /// Where partitions without a checkpointed offset start: earliest or latest.
    #[arg(long, value_name = "earliest|latest", default_value = online_defaults::START)]
    start: String,
    /// When a partition no longer holds the offset the run stands at (a checkpoint's
    /// offset past the partition's end, below its oldest record, or another record
    /// before it: a re-created topic, a broker that lost its data): fail (stop,
    /// naming the partition and offsets), earliest or latest (restart the partition
    /// there, with a warning).
    #[arg(long, default_value = "fail", value_name = "fail|earliest|latest")]
    on_offset_reset: tiderec_sources::offset_reset::OnOffsetReset,
    /// Stop when every partition reaches the end it had at start (batch catch-up, tests).
    #[arg(long)]
    until_end: bool,
    /// Also checkpoint when this many seconds passed since the last checkpoint.
    #[arg(long, value_name = "SECONDS", value_parser = online_ranges::CHECKPOINT_SECONDS)]
    checkpoint_seconds: Option<f64>,
    /// Predictions in the prequential window of the live metrics (AUC, logloss, NE, calibration,
    /// PR-AUC, GAUC).
    #[arg(long, value_name = "N", default_value_t = online_defaults::WINDOW, value_parser = online_ranges::WINDOW)]
    window: usize,
    /// Seconds between progress reports, metrics-log lines and lag queries.
    #[arg(long, value_name = "SECONDS", default_value_t = online_defaults::REPORT_SECONDS, value_parser = online_ranges::REPORT_SECONDS)]
    report_seconds: f64,
    /// Give up after the broker has been unreachable this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = online_defaults::BROKER_TIMEOUT, value_parser = online_ranges::BROKER_TIMEOUT)]
    broker_timeout: f64,
    /// Records buffered per partition before the partition is paused (backpressure).
    #[arg(long, value_name = "N", default_value_t = online_defaults::MAX_BUFFERED, value_parser = online_ranges::MAX_BUFFERED)]
    max_buffered: usize,
    /// Write the final summary as one JSON object here.
    #[arg(long, value_name = "FILE")]
    summary_json: Option<PathBuf>,
    /// Replace --summary-json when it exists (refused otherwise, unless --resume).
    #[arg(long)]
    overwrite: bool,
    /// A librdkafka consumer property, KEY=VALUE (repeatable), set after tiderec's own.
    #[arg(long, value_name = "KEY=VALUE")]
    kafka_option: Vec<String>,
    #[command(flatten)]
    train: TrainFlags,
}

#[derive(Args)]
struct ProduceArgs {
    /// Kafka brokers, host:port[,host:port…].
    #[arg(long, value_name = "HOST:PORT,…", default_value = online_defaults::BROKERS)]
    brokers: String,
    /// Topic to write.
    #[arg(long, value_name = "NAME")]
    topic: String,
    /// Records to replay: criteo:PATH[,PATH…], or csv:PATH[,PATH…] with --format csv.
    #[arg(long, value_name = "criteo:PATH,…")]
    from: String,
    /// Record format written: criteo (the TSV line), json, or csv (each line as it is).
    #[arg(long, value_name = "criteo|json|csv", default_value = "criteo")]
    format: String,
    /// With --format csv: the feature spec of the files (preset:NAME or FILE.toml); a file's
    /// header line, if the spec has one, is not sent.
    #[arg(long, value_name = "preset:NAME|FILE.toml")]
    spec: Option<String>,
    /// Partitions of the topic if it has to be created.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = Range::<usize>::closed("partitions", 1, 100_000))]
    partitions: usize,
    /// Records per second (default: as fast as the broker takes them).
    #[arg(long, value_name = "N", value_parser = Range::<f64>::above("rate", 0.0, 1e9))]
    rate: Option<f64>,
    /// Stop after this many records.
    #[arg(long, value_name = "N")]
    limit: Option<u64>,
    /// Replay the files this many times.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = Range::<u64>::closed("repeat", 1, 1_000_000))]
    repeat: u64,
    /// Give up after the broker has been unreachable this many seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = online_defaults::BROKER_TIMEOUT, value_parser = online_ranges::BROKER_TIMEOUT)]
    broker_timeout: f64,
    /// auto, bar, lines or none.
    #[arg(long, default_value = "auto", value_name = "auto|bar|lines|none")]
    progress: tiderec::progress::ProgressMode,
    /// A librdkafka property for the producer and the client creating the topic, KEY=VALUE
    /// (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    kafka_option: Vec<String>,
}

/// `KEY=VALUE` librdkafka properties.
fn parse_kafka_options(options: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    options
        .iter()
        .map(|o| match o.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => anyhow::bail!("invalid configuration `kafka_option`: `{o}` is not KEY=VALUE"),
        })
        .collect()
}

#[derive(Args)]
struct ExportArgs {
    /// A ckpt-<step> directory, or a checkpoint directory (its newest valid checkpoint).
    #[arg(long, value_name = "PATH")]
    checkpoint: PathBuf,
    /// Directory to write model.safetensors and model.json into.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Write only the embedding rows the checkpoint lists, those training changed
    /// (`<tensor>.ids` and `<tensor>.rows`); model.json says what the others hold, their
    /// values re-created from the seed (docs/export.md).
    #[arg(long)]
    compact: bool,
}

#[derive(Args)]
struct ServeArgs {
    /// A ckpt-<step> directory (served as it is), or a checkpoint directory: its newest valid
    /// checkpoint is served and each newer one is loaded as it appears.
    #[arg(long, value_name = "PATH")]
    checkpoint: PathBuf,
    /// Address to listen on (port 0: any free port; the address is printed).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8080")]
    addr: String,
    /// Connections open at once, one thread each (one more is answered 503).
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = Range::<usize>::closed("threads", 1, range::MAX_THREADS))]
    threads: usize,
    /// Connections open at once from one client address (one more gets 429; GET /health is
    /// still answered).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = Range::<usize>::closed("max_connections_per_ip", 1, range::MAX_THREADS))]
    max_connections_per_ip: usize,
    /// Most records in one request (more: 413), 1 to 16,777,216.
    #[arg(long, value_name = "N", default_value_t = 65_536, value_parser = Range::<usize>::closed("max_records", 1, 1 << 24))]
    max_records: usize,
    /// Largest request body in bytes, Content-Length or chunked (more: 413).
    #[arg(long, value_name = "BYTES", default_value_t = tiderec::serve::DEFAULT_MAX_BODY_BYTES, value_parser = Range::<usize>::closed("max_body_bytes", 1, 1 << 32))]
    max_body_bytes: usize,
    /// Bytes of request bodies held at once across all connections, at least --max-body-bytes (a
    /// request whose body does not fit in what is left gets 503 with Retry-After).
    #[arg(long, value_name = "BYTES", default_value_t = tiderec::serve::DEFAULT_MAX_BODY_MEMORY, value_parser = Range::<usize>::closed("max_body_memory", 1, 1 << 40))]
    max_body_memory: usize,
    /// Seconds to receive a request, head and body, from its first byte (then 408), and the
    /// longest idle time of a kept-alive connection.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0, value_parser = Range::<f64>::above("read_timeout", 0.0, 3600.0))]
    read_timeout: f64,
    /// Most records scored in one forward pass.
    #[arg(long, value_name = "N", default_value_t = 512, value_parser = Range::<usize>::closed("max_batch", 1, 1 << 20))]
    max_batch: usize,
    /// Microseconds to wait for more requests after the first one of a batch (at most one second).
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 500, value_parser = Range::<u64>::closed("max_wait_us", 0, 1_000_000))]
    max_wait_us: u64,
    /// Seconds between looks for a newer checkpoint (0: never reload).
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0, value_parser = Range::<f64>::closed("reload_every", 0.0, range::MAX_SECONDS))]
    reload_every: f64,
}

/// What `eval` and `predict` read.
#[derive(Args)]
struct ScoreArgs {
    /// A ckpt-<step> directory, or a checkpoint directory (its newest valid checkpoint).
    #[arg(long, value_name = "PATH")]
    checkpoint: PathBuf,
    /// Records to score: FORMAT:PATH[,PATH…] in the checkpoint's format (criteo, avazu, csv, taobao-ad,
    /// amazon-dien, parquet); csv and taobao-ad use the checkpoint's spec.
    #[arg(long, value_name = "FORMAT:PATH,…")]
    data: String,
    /// Records scored per forward pass.
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = Range::<usize>::closed("batch_size", 1, range::MAX_BATCH))]
    batch_size: usize,
    /// The malformed-record settings, as in `train`.
    #[command(flatten)]
    records: tiderec::settings::OverDefaults<tiderec::settings::RecordPolicy>,
}

impl ScoreArgs {
    /// The checkpoint's files and the records' files.
    fn inputs(&self) -> anyhow::Result<Vec<Named>> {
        let mut inputs = paths::tree_files("--checkpoint", &self.checkpoint)?;
        inputs.extend(paths::data_files("--data", &self.data)?);
        Ok(inputs)
    }

    fn options(&self, labeled: bool) -> anyhow::Result<tiderec::predict::ScoreOptions> {
        self.records.0.validate()?;
        Ok(tiderec::predict::ScoreOptions {
            checkpoint: self.checkpoint.clone(),
            data: self.data.clone(),
            batch_size: self.batch_size,
            labeled,
            records: self.records.0.clone(),
            span: (0.0, 1.0),
        })
    }
}

#[derive(Args)]
struct EvalArgs {
    #[command(flatten)]
    score: ScoreArgs,
    /// Score only the last fraction F of every file: the records `train --eval-fraction F`
    /// evaluated on (its split of line files by bytes, of Parquet files as replay splits them).
    #[arg(long, value_name = "F", value_parser = Range::<f64>::above("eval_fraction", 0.0, 1.0))]
    eval_fraction: Option<f64>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct PredictArgs {
    #[command(flatten)]
    score: ScoreArgs,
    /// Scores file: FILE.csv or FILE.parquet (columns file, position, score, and label for labeled input).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Replace --out when it exists (refused otherwise).
    #[arg(long)]
    overwrite: bool,
    /// The records have no label column (test files such as Criteo's test.txt or Avazu's test).
    #[arg(long)]
    unlabeled: bool,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct PlotArgs {
    /// JSON-lines metrics file written by `train --metrics-log` or `online --metrics-log`.
    #[arg(long, value_name = "FILE")]
    metrics: PathBuf,
    /// PNG to write.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Replace --out when it exists (refused otherwise).
    #[arg(long)]
    overwrite: bool,
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |x| format!("{x:.4}"))
}

fn run_online(args: OnlineArgs) -> anyhow::Result<()> {
    let settings = tiderec::online::OnlineSettings {
        train: {
            let train = args.train.settings()?;
            tiderec::applicable::check(&train, tiderec::applicable::For::Online)?;
            let mut outputs = run_files::train_outputs(&train);
            let summary = args.summary_json.as_ref().map(|p| Named::new("--summary-json", p));
            outputs.extend(summary.clone());
            paths::check_outputs(&run_files::train_inputs(&train, args.train.config_path())?, &outputs)?;
            run_files::check_replaced(&train, summary, args.overwrite)?;
            train
        },
        format: args.format.parse()?,
        brokers: args.brokers,
        topic: args.topic,
        group: args.group,
        start: args.start,
        on_offset_reset: args.on_offset_reset,
        until_end: args.until_end,
        checkpoint_seconds: args.checkpoint_seconds,
        window: args.window,
        report_seconds: args.report_seconds,
        broker_timeout: args.broker_timeout,
        max_buffered: args.max_buffered,
        kafka_options: parse_kafka_options(&args.kafka_option)?,
    };
    let t = &settings.train;
    eprintln!(
        "tiderec online: {} from {}/{}, {} worker(s), batch {}, seed {}",
        t.model.kind,
        settings.brokers,
        settings.topic,
        t.cluster.workers * t.cluster.processes,
        t.run.batch_size,
        t.run.seed
    );
    let Some(s) = tiderec::online::online(&settings).context("online training failed")? else {
        eprintln!("process {} finished; process 0 reports the metrics", t.cluster.process);
        return Ok(());
    };
    println!("trained {} samples in {} steps on {} worker(s)", s.samples, s.steps, s.workers);
    println!(
        "  this run        {} samples, {:.0} samples/s ({:.1} s)",
        s.samples_this_run, s.samples_per_sec, s.train_seconds
    );
    println!("  window AUC      {}   logloss {}", fmt_opt(s.window_auc), fmt_opt(s.window_logloss));
    println!(
        "  window NE       {}   calibration {}   PR-AUC {}   GAUC {}",
        fmt_opt(s.window_ne),
        fmt_opt(s.window_calibration),
        fmt_opt(s.window_pr_auc),
        fmt_opt(s.window_gauc)
    );
    println!("  params L2       {:.6}", s.params_l2);
    println!("  bad records     {}", s.bad_records);
    if let Some(step) = s.resumed_from_step {
        println!("  resumed from    step {step}");
    }
    println!(
        "  checkpoints     {} written{}",
        s.checkpoints_written,
        if s.stopped_by_signal { " (stopped by signal)" } else { "" }
    );
    println!("  offsets         {:?}", s.offsets);
    if let Some(path) = &args.summary_json {
        std::fs::write(path, serde_json::to_string_pretty(&s)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

#[cfg(feature = "kafka")]
fn run_produce(a: ProduceArgs) -> anyhow::Result<()> {
    use tiderec::online::produce::{parse_from, produce, ProduceSettings};
    use tiderec::online::RecordFormat;
    let format: RecordFormat = a.format.parse()?;
    let spec = match (&a.spec, format) {
        (Some(s), RecordFormat::Csv) => Some(tiderec::config::resolve_spec(
            s,
            tiderec::settings::DEFAULT_BUCKETS,
            tiderec::settings::DEFAULT_MAX_LEN,
        )?),
        (Some(_), f) => anyhow::bail!("invalid configuration `spec`: describes --format csv files, not {}", f.name()),
        (None, _) => None,
    };
    let settings = ProduceSettings {
        endpoint: tiderec_sources::kafka::KafkaEndpoint {
            brokers: a.brokers,
            topic: a.topic,
            broker_timeout: range::seconds("broker_timeout", a.broker_timeout)?,
            options: parse_kafka_options(&a.kafka_option)?,
        },
        files: parse_from(&a.from, format)?,
        format,
        spec,
        partitions: a.partitions,
        rate: a.rate,
        limit: a.limit,
        repeat: a.repeat,
        progress: a.progress,
    };
    let s = produce(&settings).context("produce failed")?;
    println!(
        "produced {} records into {} partitions of {} ({:.1} s, {:.0} records/s)",
        s.records, s.partitions, settings.endpoint.topic, s.seconds, s.records_per_sec
    );
    Ok(())
}

#[cfg(not(feature = "kafka"))]
fn run_produce(_a: ProduceArgs) -> anyhow::Result<()> {
    anyhow::bail!("this tiderec was built without Kafka support (cargo feature `kafka`)")
}

/// Keeps freed memory mapped instead of returning it to the system after a delay.
///
/// A training step frees and re-allocates the same large buffers (the GEMM's
/// packing space among them); with mimalloc's default the pages are purged
/// between steps and come back as fresh (zero-filled, often 2 MiB) page faults:
/// about 18 per DLRM step at batch 1,024, 2–3% of the step. The process keeps
/// its peak footprint instead, as a training process's caching allocator
/// would. `MIMALLOC_PURGE_DELAY` in the environment still wins.
fn keep_freed_memory_mapped() {
    // `mi_option_purge_delay` in mimalloc v3's `mi_option_e` (include/mimalloc.h); the
    // Rust bindings (libmimalloc-sys 0.1.49, locked) name options only up to 14.
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets a process-wide allocator option (an integer the allocator reads
        // when it decides to purge); no allocation is in flight on another thread yet.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    }
}

/// The command line, with every `train`/`online` setting's default shown in `--help`.
///
/// Those flags are `Option`s (a flag overrides the `--config` file only when given), so clap
/// knows no default for them; the defaults come from [`TrainSettings::default`], the one
/// place they are declared, and are appended to each flag's help.
fn parse_cli() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let defaults = serde_json::to_value(TrainSettings::default()).unwrap_or_default();
    let show = |v: &serde_json::Value| match v {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(a) if a.is_empty() => None,
        serde_json::Value::Array(a) => Some(
            a.iter().map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string)).collect::<Vec<_>>().join(","),
        ),
        serde_json::Value::Bool(false) => None,
        other => Some(other.to_string()),
    };
    let annotate = |cmd: clap::Command| {
        cmd.mut_args(|arg| {
            let key = arg.get_id().as_str().to_string();
            let already = arg.get_help().is_some_and(|h| h.to_string().contains("default"));
            match defaults.get(&key).and_then(show) {
                Some(value) if !already && !arg.is_required_set() && arg.get_default_values().is_empty() => {
                    let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                    arg.help(format!("{help} [default: {value}]"))
                }
                _ => arg,
            }
        })
    };
    let cmd = Cli::command()
        .mut_subcommand("train", annotate)
        .mut_subcommand("online", |c| {
            // Settings `online` refuses (it says why when one is given) are not offered.
            annotate(c).mut_args(|arg| {
                let refused = tiderec::applicable::NOT_ONLINE.iter().any(|(k, _)| *k == arg.get_id().as_str());
                if refused {
                    arg.hide(true)
                } else {
                    arg
                }
            })
        })
        .mut_subcommand("convert", annotate)
        .mut_subcommand("eval", annotate)
        .mut_subcommand("predict", annotate);
    let matches = cmd.get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// An error's output is the error and its causes; the backtrace of where it was made
/// only with `TIDEREC_BACKTRACE=1`, not whenever `RUST_BACKTRACE` is set for a panic's.
/// `RUST_LIB_BACKTRACE`, which errors read before `RUST_BACKTRACE`, still wins.
fn errors_without_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        let wanted = std::env::var("TIDEREC_BACKTRACE").is_ok_and(|v| v != "0" && !v.is_empty());
        // Set before any thread starts (the first thing `main` does).
        std::env::set_var("RUST_LIB_BACKTRACE", if wanted { "1" } else { "0" });
    }
}

/// `tiderec train`: checks the settings and the files, trains, and prints the run's summary
/// (process 0).
fn run_train(a: TrainArgs) -> anyhow::Result<()> {
    let settings = a.train.settings()?;
    tiderec::applicable::check(&settings, tiderec::applicable::For::Train)?;
    let inputs = run_files::train_inputs(&settings, a.train.config_path())?;
    paths::check_outputs(&inputs, &run_files::train_outputs(&settings))?;
    run_files::check_replaced(&settings, None, a.overwrite)?;
    let data = settings.data.source.clone();
    let workers = settings.cluster.workers * settings.cluster.processes;
    eprintln!(
        "tiderec train: {} on {data}, {workers} worker(s), batch {}, {} optimizer, seed {}",
        settings.model.kind, settings.run.batch_size, settings.optimizer.dense, settings.run.seed
    );
    let summary = tiderec::run::train(&settings).context("training failed")?;
    let Some(s) = summary else {
        eprintln!("process {} finished; process 0 reports the metrics", settings.cluster.process);
        return Ok(());
    };
    print_train_summary(&settings, &s);
    Ok(())
}

/// Prints the summary of a `train` run.
fn print_train_summary(settings: &TrainSettings, s: &tiderec_sinks::metrics::RunSummary) {
    println!("trained {} samples in {} steps ({} epochs) on {} worker(s)", s.samples, s.steps, s.epochs, s.workers);
    println!("  train loss      {:.4} (last steps), {:.4} (run mean)", s.train_loss, s.train_loss_mean);
    println!("  eval AUC        {}   (teacher AUC {})", fmt_opt(s.auc), fmt_opt(s.teacher_auc));
    println!(
        "  eval logloss    {}   NE {}   calibration {}",
        fmt_opt(s.logloss),
        fmt_opt(s.ne),
        fmt_opt(s.calibration)
    );
    println!("  eval PR-AUC     {}   GAUC {}", fmt_opt(s.pr_auc), fmt_opt(s.gauc));
    println!("  eval accuracy   {}   on {} samples", fmt_opt(s.accuracy), s.eval_samples);
    println!("  throughput      {:.0} samples/s   ({:.1} s training)", s.samples_per_sec, s.train_seconds);
    println!("  exchanged       {:.1} bytes/sample", s.bytes_per_sample);
    println!("  params L2       {:.6}", s.params_l2);
    println!("  bad records     {} {:?}", s.bad_records, s.bad_records_by_reason);
    let st = &s.store;
    println!(
        "  store ({})  {} lookups: {:.1}% hot, {:.1}% cold, {:.1}% miss; rows {} hot + {} cold",
        settings.store.kind,
        st.lookups,
        100.0 * st.hot_hits as f64 / st.lookups.max(1) as f64,
        100.0 * st.cold_hits as f64 / st.lookups.max(1) as f64,
        100.0 * st.misses as f64 / st.lookups.max(1) as f64,
        st.hot_rows,
        st.cold_rows
    );
    if settings.store.kind != tiderec_operators::store::StoreKind::Fixed {
        println!(
            "                  {} admitted, {} updates rejected, {} evicted, {} re-plans moving {} rows",
            st.admissions, st.rejections, st.evictions, st.replans, st.moves
        );
    }
    if let Some(step) = s.resumed_from_step {
        println!("  resumed from    step {step}");
    }
    if s.evaluations.len() > 1 {
        let best = s.evaluations.iter().find(|e| Some(e.step) == s.best_step);
        println!(
            "  evaluations     {}; best at step {} (epoch {}, AUC {}, logloss {}){}",
            s.evaluations.len(),
            best.map_or("n/a".into(), |b| b.step.to_string()),
            best.map_or("n/a".into(), |b| b.epoch.to_string()),
            fmt_opt(best.and_then(|b| b.auc)),
            fmt_opt(best.and_then(|b| b.logloss)),
            s.early_stopped_at_step
                .map_or(String::new(), |at| format!("; stopped early after step {at}, the model is the best's"))
        );
    }
    if s.checkpoints_written > 0 {
        println!(
            "  checkpoints     {} written: training stalled {:.2} s, writing took {:.2} s ({} steps trained \
             meanwhile)",
            s.checkpoints_written, s.checkpoint_seconds, s.checkpoint_write_seconds, s.checkpoint_overlap_steps
        );
    }
    if let Some(p) = &settings.run.metrics_json {
        println!("  metrics written to {}", p.display());
    }
}

/// `tiderec plot`: draws a metrics log's curves to a PNG.
fn run_plot(a: PlotArgs) -> anyhow::Result<()> {
    let out = Named::new("--out", &a.out);
    paths::check_outputs(&[Named::new("--metrics", &a.metrics)], std::slice::from_ref(&out))?;
    paths::check_new(&out, a.overwrite)?;
    let n = cli::plot::plot_metrics(&a.metrics, &a.out).context("plot failed")?;
    println!("plotted {n} reports from {} to {}", a.metrics.display(), a.out.display());
    Ok(())
}

/// `tiderec export`: writes a checkpoint's model as a serving snapshot.
fn run_export(a: ExportArgs) -> anyhow::Result<()> {
    use tiderec::serving::TableLayout;
    use tiderec_sinks::checkpoint::export::{CONFIG_FILE, MODEL_FILE};
    let outputs = [&a.out, &a.out.join(MODEL_FILE), &a.out.join(CONFIG_FILE)].map(|p| Named::new("--out", p));
    paths::check_outputs(&paths::tree_files("--checkpoint", &a.checkpoint)?, &outputs)?;
    let layout = if a.compact { TableLayout::Listed } else { TableLayout::Whole };
    let s = tiderec::serving::export(&a.checkpoint, &a.out, layout).context("export failed")?;
    let rows = match layout {
        TableLayout::Whole => format!("{} embedding rows", s.embedding_rows),
        TableLayout::Listed => format!("{} listed embedding rows of {}", s.embedding_rows, s.table_rows),
    };
    println!("exported step {}: {} dense parameters, {rows} to {}", s.step, s.dense_params, a.out.display());
    Ok(())
}

/// `tiderec serve`: scores records over HTTP until a stop signal.
fn run_serve(a: ServeArgs) -> anyhow::Result<()> {
    let mut options = tiderec::serve::ServeOptions::new(a.checkpoint, a.addr);
    options.threads = a.threads;
    options.max_connections_per_ip = a.max_connections_per_ip;
    options.max_records = a.max_records;
    options.max_body_bytes = a.max_body_bytes;
    options.max_body_memory = a.max_body_memory;
    options.read_timeout = range::seconds("read_timeout", a.read_timeout)?;
    options.limits.max_batch = a.max_batch;
    options.limits.max_wait = std::time::Duration::from_micros(a.max_wait_us);
    let reload_every = range::seconds("reload_every", a.reload_every)?;
    options.reload_every = (!reload_every.is_zero()).then_some(reload_every);
    let stop = tiderec::stop::stop_flag()?;
    tiderec::serve::run(&options, &stop).context("serve failed")?;
    Ok(())
}

/// `tiderec eval`: scores labeled records and prints the metrics.
fn run_eval(a: EvalArgs) -> anyhow::Result<()> {
    let dead_letters = Named::new("--dead-letters", &a.score.records.0.dead_letters);
    paths::check_outputs(&a.score.inputs()?, &[dead_letters])?;
    let mut options = a.score.options(true)?;
    if let Some(f) = a.eval_fraction {
        options = options.held_out(f);
    }
    let r = tiderec::predict::eval(&options).context("eval failed")?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "step {}: {} samples, AUC {}, logloss {:.4}, accuracy {}, NE {}, calibration {}, PR-AUC {}, GAUC \
             {}, {} bad records",
            r.step,
            r.samples,
            fmt_opt(r.auc),
            r.logloss,
            fmt_opt(r.accuracy),
            fmt_opt(r.ne),
            fmt_opt(r.calibration),
            fmt_opt(r.pr_auc),
            fmt_opt(r.gauc),
            r.bad_records
        );
    }
    Ok(())
}

/// `tiderec predict`: writes one score per record.
fn run_predict(a: PredictArgs) -> anyhow::Result<()> {
    let out = Named::new("--out", &a.out);
    let dead_letters = Named::new("--dead-letters", &a.score.records.0.dead_letters);
    paths::check_outputs(&a.score.inputs()?, &[out.clone(), dead_letters])?;
    paths::check_new(&out, a.overwrite)?;
    let options = a.score.options(!a.unlabeled)?;
    let r = tiderec::predict::predict(&options, &a.out).context("predict failed")?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "step {}: scored {} records in {:.2} s ({:.0} records/s), {} bad records{}; scores in {}",
            r.step,
            r.records,
            r.seconds,
            r.records_per_sec,
            r.bad_records,
            if r.bad_records > 0 {
                format!(" (listed in {})", options.records.dead_letters.display())
            } else {
                String::new()
            },
            a.out.display()
        );
    }
    Ok(())
}

/// `tiderec spec list`: prints the preset names.
fn run_spec_list() {
    for name in tiderec_operators::spec::FeatureSpec::PRESETS {
        println!("{name}");
    }
}

/// `tiderec spec show`: prints a preset as TOML.
fn run_spec_show(a: SpecShowArgs) -> anyhow::Result<()> {
    let name = a.name.strip_prefix("preset:").unwrap_or(&a.name);
    let spec = tiderec_operators::spec::FeatureSpec::preset(name, a.buckets, a.max_len).with_context(|| {
        format!("no preset `{name}`; presets: {}", tiderec_operators::spec::FeatureSpec::PRESETS.join(", "))
    })?;
    println!("# tiderec feature spec: preset `{name}` (edit, then pass with --spec FILE.toml)");
    print!("{}", spec.to_toml());
    Ok(())
}

/// `tiderec spec check`: validates a spec, and learns its ranges from `--data` records.
fn run_spec_check(a: SpecShowArgs) -> anyhow::Result<()> {
    let mut spec = tiderec::config::resolve_spec(&a.name, a.buckets, a.max_len)?;
    if let Some(data) = &a.data {
        let paths = match tiderec::config::DataSpec::parse("data", data)? {
            tiderec::config::DataSpec::Csv(paths) => paths,
            _ => anyhow::bail!("--data: `spec check` reads `csv:PATH[,PATH…]` files"),
        };
        let max_line = tiderec::settings::RecordPolicy::default().max_line_bytes;
        let (learned, warnings) = tiderec::spec_fit::check_ranges(&mut spec, &paths, max_line)?;
        for line in learned.into_iter().chain(warnings.iter().map(|w| format!("warning: {w}"))) {
            eprintln!("{line}");
        }
    }
    let (d, s) = spec.shape();
    println!(
        "ok: {} columns, {d} dense, {s} sparse fields, {} sequence lists",
        spec.columns.len(),
        spec.sequence_lists().count()
    );
    Ok(())
}

/// `tiderec generate elm`: writes elm-shaped CSV lines.
fn run_generate_elm(a: ElmArgs) -> anyhow::Result<()> {
    use std::io::Write;
    paths::check_new(&Named::new("--out", &a.out), a.overwrite)?;
    let file = std::fs::File::create(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
    let mut w = std::io::BufWriter::new(file);
    let mut line = Vec::new();
    for i in 0..a.rows {
        line.clear();
        tiderec_sources::elm::elm_line(a.seed, i, a.list_scale, &mut line);
        line.push(b'\n');
        w.write_all(&line).with_context(|| format!("cannot write {}", a.out.display()))?;
    }
    w.flush().with_context(|| format!("cannot write {}", a.out.display()))?;
    eprintln!("wrote {} elm-shaped lines (list scale {}) to {}", a.rows, a.list_scale, a.out.display());
    Ok(())
}

/// `tiderec convert`: converts record files to Parquet and prints the summary.
fn run_convert(a: ConvertArgs) -> anyhow::Result<()> {
    let settings = a.into_settings()?;
    eprintln!("tiderec convert: {} -> parquet:{}", settings.input.data.source, settings.out.display());
    let s = tiderec::convert::convert(&settings).context("conversion failed")?;
    if s.interrupted {
        eprintln!(
            "interrupted by a signal: {} holds the first {} samples in complete files; convert again \
             into an empty directory for all of them",
            s.out, s.rows
        );
    }
    println!(
        "converted {} rows into {} file(s), {} row group(s) in {} ({:.1} s, {:.0} rows/s)",
        s.rows,
        s.files,
        s.row_groups,
        s.out,
        s.seconds,
        s.rows as f64 / s.seconds.max(1e-9)
    );
    println!("  {} -> {} bytes ({:.2}x)", s.bytes_in, s.bytes_out, s.bytes_in as f64 / s.bytes_out.max(1) as f64);
    println!("  bad records     {} {:?}", s.bad_records, s.bad_records_by_reason);
    if s.bad_records > 0 {
        eprintln!(
            "{} malformed records skipped; see {}",
            s.bad_records,
            settings.input.data.records.dead_letters.display()
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    errors_without_backtraces();
    keep_freed_memory_mapped();
    let cli = parse_cli();
    // An invalid cap on the vector extensions is refused before any kernel runs.
    tiderec_operators::cpu::check()?;
    match cli.command {
        Command::Train(args) => run_train(*args)?,
        Command::Online(args) => run_online(*args)?,
        Command::Produce(a) => run_produce(a)?,
        Command::Plot(a) => run_plot(a)?,
        Command::Export(a) => run_export(a)?,
        Command::Serve(a) => run_serve(a)?,
        Command::Eval(a) => run_eval(a)?,
        Command::Predict(a) => run_predict(a)?,
        Command::Spec(SpecCommand::List) => run_spec_list(),
        Command::Spec(SpecCommand::Show(a)) => run_spec_show(a)?,
        Command::Spec(SpecCommand::Check(a)) => run_spec_check(a)?,
        Command::Generate(GenerateCommand::Elm(a)) => run_generate_elm(a)?,
        Command::Convert(args) => run_convert(*args)?,
        Command::Bench(command) => cli::bench::command::run(command)?,
    }
    Ok(())
}
