//! `tiderec online`: continuous training from a Kafka topic, and `tiderec
//! produce`, which replays a file into a topic.
//!
//! The online trainer runs the same synchronous trainer as `tiderec train`
//! (threads and processes, every model) on Criteo records (TSV or JSON) or on
//! the delimited records of a feature spec (`--format csv --spec S`). What is
//! particular to a stream:
//!
//! * **Deterministic steps.** Step `t` trains on a fixed quota of records
//!   from every partition ([`tiderec_sources::kafka::step_quotas`] of the
//!   global batch size), so its records are the same whatever the timing,
//!   worker count or restarts. A partition that has not received its quota
//!   yet makes the step wait.
//! * **Prequential evaluation.** Every batch is scored by the model before
//!   it is trained on; AUC, log loss, NE, calibration, PR-AUC (and GAUC where
//!   the records name a user) over the last `--window` predictions are
//!   reported live ([`prequential`]; the Prometheus endpoint is
//!   [`crate::live_metrics`]'s).
//! * **Exactly-once.** A checkpoint records, with the weights and optimizer
//!   state of step `t`, the next offset of every partition after step `t`.
//!   On start the trainer restores the newest valid checkpoint and every
//!   worker seeks its partitions to those offsets; records fetched but not
//!   yet trained on when a process dies are simply read again. Offsets are
//!   committed to the consumer group only after the checkpoint is durable,
//!   for monitoring tools; the trainer never reads them back.
//! * **A start at the end sticks.** With `--start latest`, the ends the first
//!   start found are recorded in the checkpoint directory before any step, and
//!   a start before the first checkpoint begins there again (the `start` module), so a
//!   run killed before it checkpointed skips nothing produced meanwhile.
//! * **Stopping.** SIGINT or SIGTERM: the workers agree to stop before the
//!   next step, write a checkpoint and exit 0. `--until-end` stops when every
//!   partition reaches the end it had when the run started.
//! * **Failing.** A worker whose reader fails (a partition that no longer
//!   holds its offset, an unreachable broker) reports its error to its process
//!   before it votes, and workers waiting for records stop waiting on such an
//!   error: the run ends promptly with the error naming the partition, never
//!   waiting on a quiet partition (see the worker module).
//! * **Agreement.** The processes of a cluster compare their settings and the
//!   topic's partition count at start ([`OnlineSettings::fingerprint`]).
// Without `kafka` the Kafka items these docs link to do not exist.
#![cfg_attr(not(feature = "kafka"), allow(rustdoc::broken_intra_doc_links))]

pub mod prequential;
#[cfg(feature = "kafka")]
pub mod produce;
#[cfg(feature = "kafka")]
mod start;
#[cfg(feature = "kafka")]
mod worker;

use crate::{PipelineError, TrainSettings};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use tiderec_sources::offset_reset::OnOffsetReset;

/// How records of the topic are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RecordFormat {
    /// One Criteo TSV line per record.
    Criteo,
    /// One JSON object per record ([`tiderec_sources::json`]).
    Json,
    /// One delimited line per record, in the columns of the feature spec (`--spec`), whose
    /// `user` column (if any) gives the prequential GAUC.
    Csv,
}

impl RecordFormat {
    /// The name the flags take.
    pub fn name(self) -> &'static str {
        match self {
            RecordFormat::Criteo => "criteo",
            RecordFormat::Json => "json",
            RecordFormat::Csv => "csv",
        }
    }
}

impl std::str::FromStr for RecordFormat {
    type Err = PipelineError;
    fn from_str(s: &str) -> Result<Self, PipelineError> {
        match s {
            "criteo" => Ok(RecordFormat::Criteo),
            "json" => Ok(RecordFormat::Json),
            "csv" => Ok(RecordFormat::Csv),
            other => Err(PipelineError::config("format", format!("`{other}` is not criteo, json or csv"))),
        }
    }
}

/// Settings of `tiderec online` (the model, optimizers, workers and checkpoints come
/// from `train`, the same keys and flags).
#[derive(Clone, Debug)]
pub struct OnlineSettings {
    /// Model, optimizers, workers, checkpoints, bad-record policy.
    pub train: TrainSettings,
    /// `host:port[,host:port…]`.
    pub brokers: String,
    /// The topic to train on.
    pub topic: String,
    /// Consumer group offsets are committed to (monitoring only).
    pub group: String,
    /// Record format.
    pub format: RecordFormat,
    /// Where partitions without a checkpointed offset start: `earliest` or `latest`.
    pub start: String,
    /// What to do when a partition no longer holds the position the run stands at
    /// (a checkpoint's offset past its end, a re-created topic; see
    /// `tiderec_sources::kafka::reset`).
    pub on_offset_reset: OnOffsetReset,
    /// Stop when every partition reaches the end it had at start.
    pub until_end: bool,
    /// Also write a checkpoint when this many seconds passed since the last one.
    pub checkpoint_seconds: Option<f64>,
    /// Predictions in the prequential window.
    pub window: usize,
    /// Seconds between reports (progress line, metrics log, lag queries).
    pub report_seconds: f64,
    /// Give up after the broker has been unreachable this long (seconds).
    pub broker_timeout: f64,
    /// Records buffered per partition before it is paused (backpressure).
    pub max_buffered: usize,
    /// librdkafka consumer properties set after tiderec's own.
    pub kafka_options: Vec<(String, String)>,
}

/// The ranges of [`OnlineSettings`]' numeric fields (also the parsers of their flags).
pub mod ranges {
    use crate::settings::range::{Range, MAX_SECONDS};

    /// `checkpoint_seconds`.
    pub const CHECKPOINT_SECONDS: Range<f64> = Range::above("checkpoint_seconds", 0.0, MAX_SECONDS);
    /// `window`.
    pub const WINDOW: Range<usize> = Range::closed("window", 1, 100_000_000);
    /// `report_seconds`: below 10 ms the reports (and their lag queries) would crowd out training.
    pub const REPORT_SECONDS: Range<f64> = Range::closed("report_seconds", 0.01, MAX_SECONDS);
    /// `broker_timeout` (of `online` and `produce`).
    pub const BROKER_TIMEOUT: Range<f64> = Range::closed("broker_timeout", 0.001, MAX_SECONDS);
    /// `max_buffered`.
    pub const MAX_BUFFERED: Range<usize> = Range::closed("max_buffered", 1, 1 << 30);
}

/// The defaults of the stream settings, declared once: [`OnlineSettings::default`] and the flags
/// of `tiderec online` and `tiderec produce` read them.
pub mod defaults {
    /// `brokers`.
    pub const BROKERS: &str = "127.0.0.1:9092";
    /// `group`.
    pub const GROUP: &str = "tiderec";
    /// `start`.
    pub const START: &str = "earliest";
    /// `window`: predictions in the prequential window.
    pub const WINDOW: usize = 10_000;
    /// `report_seconds`.
    pub const REPORT_SECONDS: f64 = 2.0;
    /// `broker_timeout`, in seconds (of `online` and `produce`).
    pub const BROKER_TIMEOUT: f64 = 120.0;
    /// `max_buffered`: records per partition.
    pub const MAX_BUFFERED: usize = 65_536;
}

impl Default for OnlineSettings {
    fn default() -> Self {
        OnlineSettings {
            train: TrainSettings::default(),
            brokers: defaults::BROKERS.into(),
            topic: String::new(),
            group: defaults::GROUP.into(),
            format: RecordFormat::Criteo,
            start: defaults::START.into(),
            on_offset_reset: OnOffsetReset::Fail,
            until_end: false,
            checkpoint_seconds: None,
            window: defaults::WINDOW,
            report_seconds: defaults::REPORT_SECONDS,
            broker_timeout: defaults::BROKER_TIMEOUT,
            max_buffered: defaults::MAX_BUFFERED,
            kafka_options: Vec::new(),
        }
    }
}

impl OnlineSettings {
    /// What the processes of an online cluster run must agree on: the training settings,
    /// the stream's (brokers may be reached by different addresses; reporting, metrics
    /// and buffering are per process) and the number of `partitions` of the topic each
    /// process found at start. Every process reads the count itself; the quotas of a step
    /// and which worker reads which partition follow from it, so processes that see
    /// different counts (partitions added between their starts) would take different
    /// records per step and leave a partition to nobody: the handshake refuses them.
    pub fn fingerprint(
        &self,
        resolved: &crate::config::Resolved,
        partitions: usize,
    ) -> crate::cluster::fingerprint::Fingerprint {
        let mut print = crate::cluster::fingerprint::of_train(&self.train, resolved);
        print.extend(
            [
                ("topic", self.topic.clone()),
                ("(broker) partitions of the topic", partitions.to_string()),
                ("group", self.group.clone()),
                ("format", format!("{:?}", self.format)),
                ("start", self.start.clone()),
                ("on_offset_reset", self.on_offset_reset.to_string()),
                ("isolation.level (--kafka-option)", self.isolation_level().to_string()),
                ("until_end", self.until_end.to_string()),
                ("checkpoint_seconds", format!("{:?}", self.checkpoint_seconds)),
                ("window", self.window.to_string()),
            ]
            .map(|(k, v)| (k.to_string(), v)),
        );
        print
    }

    /// The `isolation.level` a `--kafka-option` sets (the last one given), else `default`: the
    /// one librdkafka property given by the user that changes which records are read
    /// (aborted transactions kept or dropped). The others (credentials, certificate paths,
    /// timeouts) may differ between processes and are never compared or printed.
    fn isolation_level(&self) -> &str {
        let given = self.kafka_options.iter().rev().find(|(k, _)| k == "isolation.level");
        given.map_or("default", |(_, v)| v.as_str())
    }

    /// Checks the stream settings, and that no setting of `train` alone is given; errors name
    /// the key.
    pub fn validate_stream(&self) -> Result<(), PipelineError> {
        crate::applicable::check(&self.train, crate::applicable::For::Online)?;
        if self.brokers.trim().is_empty() {
            return Err(PipelineError::config("brokers", "must name at least one host:port"));
        }
        if self.topic.trim().is_empty() {
            return Err(PipelineError::config("topic", "must be given (--topic T)"));
        }
        if self.group.trim().is_empty() {
            return Err(PipelineError::config("group", "must not be empty"));
        }
        if !matches!(self.start.as_str(), "earliest" | "latest") {
            return Err(PipelineError::config("start", format!("`{}` is not earliest or latest", self.start)));
        }
        ranges::WINDOW.check(self.window)?;
        ranges::REPORT_SECONDS.check(self.report_seconds)?;
        ranges::BROKER_TIMEOUT.check(self.broker_timeout)?;
        ranges::MAX_BUFFERED.check(self.max_buffered)?;
        if let Some(s) = self.checkpoint_seconds {
            ranges::CHECKPOINT_SECONDS.check(s)?;
            if self.train.checkpoints.checkpoint_dir.is_none() {
                return Err(PipelineError::config("checkpoint_seconds", "needs --checkpoint-dir DIR"));
            }
        }
        match (self.format, self.train.data.spec.is_some()) {
            (RecordFormat::Csv, false) => {
                return Err(PipelineError::config(
                    "spec",
                    "--format csv reads records in the columns of a feature spec: give --spec preset:NAME or \
                     --spec FILE.toml",
                ))
            }
            (RecordFormat::Criteo | RecordFormat::Json, true) => {
                return Err(PipelineError::config(
                    "spec",
                    format!("describes `--format csv` records, not {}", self.format.name()),
                ))
            }
            _ => {}
        }
        if self.train.model.kind.is_dien() && self.format != RecordFormat::Csv {
            return Err(PipelineError::config(
                "model",
                format!(
                    "{} records are Criteo-shaped; dien needs behaviour sequences (`--format csv` with a spec \
                     whose lists have pooling = \"none\")",
                    self.format.name()
                ),
            ));
        }
        Ok(())
    }

    /// The data the records are: Criteo-shaped, or a spec's delimited lines (no files).
    pub fn data(&self) -> crate::config::DataSpec {
        match self.format {
            RecordFormat::Criteo | RecordFormat::Json => crate::config::DataSpec::Criteo(Vec::new()),
            RecordFormat::Csv => crate::config::DataSpec::Csv(Vec::new()),
        }
    }

    /// The broker timeout as a duration.
    pub fn broker_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.broker_timeout)
    }
}

/// What an online run did (process 0).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OnlineSummary {
    /// Global training steps, including those before a resume.
    pub steps: u64,
    /// Training samples, including those before a resume.
    pub samples: u64,
    /// Samples trained by this run (after the resume).
    pub samples_this_run: u64,
    /// The step restored from a checkpoint, if any.
    pub resumed_from_step: Option<u64>,
    /// Stopped by SIGINT/SIGTERM (rather than by `--until-end` or `--steps`).
    pub stopped_by_signal: bool,
    /// Prequential AUC over the final window.
    pub window_auc: Option<f64>,
    /// Prequential log loss over the final window.
    pub window_logloss: Option<f64>,
    /// Prequential normalized entropy over the final window.
    pub window_ne: Option<f64>,
    /// Prequential calibration (mean prediction over CTR) over the final window.
    pub window_calibration: Option<f64>,
    /// Prequential PR-AUC (average precision) over the final window.
    pub window_pr_auc: Option<f64>,
    /// Prequential GAUC over the final window (`None` unless the records name a user).
    pub window_gauc: Option<f64>,
    /// Training throughput of this run.
    pub samples_per_sec: f64,
    /// Malformed records skipped (dead-lettered), this run.
    pub bad_records: u64,
    /// Checkpoints written by this run.
    pub checkpoints_written: u64,
    /// `topic/partition` → next offset at the end.
    pub offsets: BTreeMap<String, i64>,
    /// √(Σ parameter²) at the end.
    pub params_l2: f64,
    /// Workers.
    pub workers: usize,
    /// Seconds of training.
    pub train_seconds: f64,
}

/// Runs the online trainer; returns the summary on process 0.
#[cfg(feature = "kafka")]
pub fn online(settings: &OnlineSettings) -> Result<Option<OnlineSummary>, PipelineError> {
    worker::online(settings)
}

/// Without the `kafka` feature there is no online trainer.
#[cfg(not(feature = "kafka"))]
pub fn online(_settings: &OnlineSettings) -> Result<Option<OnlineSummary>, PipelineError> {
    Err(PipelineError::config("online", "this tiderec was built without Kafka support (cargo feature `kafka`)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::fingerprint::differences;

    #[test]
    fn processes_that_count_different_partitions_are_refused_naming_the_count() {
        let settings = OnlineSettings { topic: "clicks".into(), ..OnlineSettings::default() };
        let resolved = settings.train.validate().unwrap();
        let (four, five) = (settings.fingerprint(&resolved, 4), settings.fingerprint(&resolved, 5));
        assert!(differences(&[(0, &four), (1, &settings.fingerprint(&resolved, 4))]).is_empty());
        let lines = differences(&[(0, &four), (1, &five)]);
        assert_eq!(lines, vec!["(broker) partitions of the topic: process 0 has 4; process 1 has 5".to_string()]);
    }

    #[test]
    fn processes_that_would_read_other_records_are_refused_and_credentials_never_compared() {
        let base = OnlineSettings { topic: "clicks".into(), ..OnlineSettings::default() };
        let resolved = base.train.validate().unwrap();
        let print = |s: &OnlineSettings| s.fingerprint(&resolved, 2);
        let reset = OnlineSettings { on_offset_reset: OnOffsetReset::Earliest, ..base.clone() };
        assert_eq!(
            differences(&[(0, &print(&base)), (1, &print(&reset))]),
            vec!["on_offset_reset: process 0 has fail; process 1 has earliest".to_string()]
        );
        let option = |k: &str, v: &str| OnlineSettings { kafka_options: vec![(k.into(), v.into())], ..base.clone() };
        assert_eq!(
            differences(&[(0, &print(&base)), (1, &print(&option("isolation.level", "read_committed")))]),
            vec!["isolation.level (--kafka-option): process 0 has default; process 1 has read_committed".to_string()]
        );
        let secret = print(&option("sasl.password", "hunter2"));
        assert!(differences(&[(0, &print(&base)), (1, &secret)]).is_empty());
        assert!(!format!("{secret:?}").contains("hunter2"));
    }
}
