//! `tiderec produce`: replays record files into a Kafka topic (demos, tests,
//! load generation). Record `i` (counting non-empty lines over all files in
//! order, a skipped header not counted) goes to partition `i mod partitions`,
//! so a topic filled twice from the same files holds the same records at the
//! same offsets.

use super::RecordFormat;
use crate::error::DataflowFailure;
use crate::progress::{Progress, Unit};
use crate::PipelineError;
use std::io::BufRead;
use std::path::PathBuf;
use std::time::Instant;
use tiderec_operators::spec::FeatureSpec;
use tiderec_sources::json::criteo_line_to_json;
use tiderec_sources::kafka::producer::{ensure_topic, RecordWriter};
use tiderec_sources::kafka::KafkaEndpoint;

/// Settings of `tiderec produce`.
#[derive(Clone, Debug)]
pub struct ProduceSettings {
    /// Brokers, topic and broker timeout.
    pub endpoint: KafkaEndpoint,
    /// Criteo TSV files (or, for [`RecordFormat::Csv`], a spec's delimited files) to replay, in order.
    pub files: Vec<PathBuf>,
    /// How records are written to the topic.
    pub format: RecordFormat,
    /// For [`RecordFormat::Csv`] files: their feature spec. A file's first line that is
    /// the spec's header ([`FeatureSpec::is_header`]) is not sent.
    pub spec: Option<FeatureSpec>,
    /// Partitions of the topic when it has to be created.
    pub partitions: usize,
    /// Records per second (unlimited when `None`).
    pub rate: Option<f64>,
    /// Stop after this many records.
    pub limit: Option<u64>,
    /// Replay the files this many times.
    pub repeat: u64,
    /// auto, bar, lines or none.
    pub progress: crate::progress::ProgressMode,
}

/// What `produce` wrote.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ProduceSummary {
    /// Records acknowledged by the broker.
    pub records: u64,
    /// Partitions of the topic.
    pub partitions: usize,
    /// Seconds taken.
    pub seconds: f64,
    /// Records per second.
    pub records_per_sec: f64,
}

/// Parses `criteo:PATH[,PATH…]` or, for `--format csv`, `csv:PATH[,PATH…]` (files or directories).
pub fn parse_from(spec: &str, format: RecordFormat) -> Result<Vec<PathBuf>, PipelineError> {
    use crate::config::DataSpec;
    match (DataSpec::parse("from", spec)?, format) {
        (DataSpec::Criteo(paths), _) | (DataSpec::Csv(paths), RecordFormat::Csv) => Ok(paths),
        (DataSpec::Csv(_), f) => Err(PipelineError::config(
            "from",
            format!("`{spec}`: csv:PATH files are replayed with --format csv (and their --spec), not {}", f.name()),
        )),
        _ => Err(PipelineError::config(
            "from",
            format!("`{spec}`: produce replays criteo:PATH files, or csv:PATH files with --format csv"),
        )),
    }
}

/// Replays the files into the topic (creating it if needed) and waits for every record
/// to be acknowledged.
pub fn produce(settings: &ProduceSettings) -> Result<ProduceSummary, PipelineError> {
    if settings.partitions == 0 {
        return Err(PipelineError::config("partitions", "must be positive"));
    }
    if settings.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return Err(PipelineError::config("rate", "must be a positive number of records per second"));
    }
    let partitions = ensure_topic(&settings.endpoint, settings.partitions)?;
    let mut writer = RecordWriter::new(&settings.endpoint, settings.rate)?;
    let mut progress = Progress::with_unit(settings.progress, settings.limit, Unit::Samples);
    let start = Instant::now();
    let mut sent = 0u64;
    'outer: for _ in 0..settings.repeat.max(1) {
        for path in &settings.files {
            let mut first = true;
            let file = std::fs::File::open(path)
                .map_err(|e| PipelineError::config("from", format!("cannot open {}: {e}", path.display())))?;
            for line in std::io::BufReader::with_capacity(1 << 20, file).split(b'\n') {
                let line =
                    line.map_err(|e| PipelineError::config("from", format!("cannot read {}: {e}", path.display())))?;
                let line = line.strip_suffix(b"\r").unwrap_or(&line);
                let line = if first { tiderec_sources::lines::strip_bom(line) } else { line };
                let header = first && settings.spec.as_ref().is_some_and(|s| s.is_header(line));
                first = false;
                if line.is_empty() || header {
                    continue;
                }
                if settings.limit.is_some_and(|l| sent >= l) {
                    break 'outer;
                }
                let partition = (sent % partitions as u64) as i32;
                match settings.format {
                    RecordFormat::Criteo | RecordFormat::Csv => writer.send(partition, line)?,
                    // A line that is not a Criteo record is sent as it is: the trainer dead-letters it.
                    RecordFormat::Json => match criteo_line_to_json(line) {
                        Some(json) => writer.send(partition, json.as_bytes())?,
                        None => writer.send(partition, line)?,
                    },
                }
                sent += 1;
                if sent.is_multiple_of(4096) {
                    let rate = sent as f64 / start.elapsed().as_secs_f64().max(1e-9);
                    progress.advance(sent, &format!("{rate:.0} records/s"));
                }
            }
        }
    }
    let records = writer.finish()?;
    progress.finish();
    let seconds = start.elapsed().as_secs_f64();
    if records != sent {
        return Err(PipelineError::dataflow(
            DataflowFailure::Delivery,
            format!("{sent} records sent but {records} acknowledged"),
        ));
    }
    Ok(ProduceSummary { records, partitions, seconds, records_per_sec: records as f64 / seconds.max(1e-9) })
}
