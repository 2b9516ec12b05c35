//! `tiderec online` (training from a Kafka topic) and `tiderec produce`
//! (replaying Criteo files into one): their flags and what they run.

use super::fmt_opt;
use anyhow::Context;
use clap::Args;
use std::path::PathBuf;
use tiderec::online::defaults as online_defaults;
use tiderec::online::ranges as online_ranges;
use tiderec::paths::{self, Named};
use tiderec::run_files;
use tiderec::settings::range::{self, Range};
use tiderec::settings::TrainFlags;

/// Flags of `tiderec online`: the stream's, plus every flag of `train` (model, optimizers, workers,
/// checkpoints).
#[derive(Args)]
pub(crate) struct OnlineArgs {
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
    /// A librdkafka consumer property, KEY=VALUE (repeatable), set after tiderec's own; those
    /// the exactly-once reader depends on (group.id, auto.offset.reset, … docs/online.md
    /// lists them) are refused, naming the property.
    #[arg(long, value_name = "KEY=VALUE")]
    kafka_option: Vec<String>,
    #[command(flatten)]
    train: TrainFlags,
}

#[derive(Args)]
pub(crate) struct ProduceArgs {
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
pub(crate) fn parse_kafka_options(options: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    options
        .iter()
        .map(|o| match o.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => anyhow::bail!("invalid configuration `kafka_option`: `{o}` is not KEY=VALUE"),
        })
        .collect()
}

pub(crate) fn run_online(args: OnlineArgs) -> anyhow::Result<()> {
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
pub(crate) fn run_produce(a: ProduceArgs) -> anyhow::Result<()> {
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
pub(crate) fn run_produce(_a: ProduceArgs) -> anyhow::Result<()> {
    anyhow::bail!("this tiderec was built without Kafka support (cargo feature `kafka`)")
}
