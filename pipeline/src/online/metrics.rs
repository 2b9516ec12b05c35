//! Live metrics of the online trainer: a Prometheus endpoint
//! (`--metrics-addr`) and a JSON-lines log (`--metrics-log`, read by
//! `tiderec plot`).
//!
//! [`OnlineMetrics`] is shared by the workers of one process: each worker
//! sets the lag of the partitions it owns; worker 0 sets the training
//! figures after every step. The HTTP thread only reads.

use crate::PipelineError;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// One line of the JSON-lines metrics log.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MetricsRecord {
    /// Seconds since the run started.
    pub time_s: f64,
    /// Global training steps so far.
    pub step: u64,
    /// Training samples so far.
    pub samples: u64,
    /// Training throughput since the run started.
    pub samples_per_sec: f64,
    /// Mean training loss of the recent steps.
    pub loss: f64,
    /// Prequential AUC over the window (null with one class only).
    pub window_auc: Option<f64>,
    /// Prequential log loss over the window.
    pub window_logloss: Option<f64>,
    /// Records behind the end of the partitions this process owns.
    pub lag: i64,
    /// Seconds since the last checkpoint (null before the first).
    pub checkpoint_age_s: Option<f64>,
    /// Malformed records skipped so far.
    pub bad_records: u64,
}

/// The metrics of one process, registered for Prometheus.
pub struct OnlineMetrics {
    registry: Registry,
    samples: Counter,
    steps: Counter,
    bad_records: Gauge,
    window_auc: Gauge<f64, AtomicU64>,
    window_logloss: Gauge<f64, AtomicU64>,
    loss: Gauge<f64, AtomicU64>,
    checkpoint_age: Gauge<f64, AtomicU64>,
    checkpoint_unix: Gauge<f64, AtomicU64>,
    lag: Family<Vec<(String, String)>, Gauge>,
}

impl Default for OnlineMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl OnlineMetrics {
    /// Registers every metric under the `tiderec_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tiderec");
        let m = OnlineMetrics {
            samples: Counter::default(),
            steps: Counter::default(),
            bad_records: Gauge::default(),
            window_auc: Gauge::default(),
            window_logloss: Gauge::default(),
            loss: Gauge::default(),
            checkpoint_age: Gauge::default(),
            checkpoint_unix: Gauge::default(),
            lag: Family::default(),
            registry: Registry::default(),
        };
        registry.register("samples", "Training samples consumed", m.samples.clone());
        registry.register("steps", "Synchronous training steps", m.steps.clone());
        registry.register("bad_records", "Malformed records skipped (dead-lettered)", m.bad_records.clone());
        registry.register("window_auc", "Prequential AUC over the rolling window", m.window_auc.clone());
        registry.register("window_logloss", "Prequential log loss over the rolling window", m.window_logloss.clone());
        registry.register("train_loss", "Mean training loss of the recent steps", m.loss.clone());
        registry.register(
            "checkpoint_age_seconds",
            "Seconds since the last durable checkpoint",
            m.checkpoint_age.clone(),
        );
        registry.register(
            "checkpoint_unix_seconds",
            "Unix time of the last durable checkpoint",
            m.checkpoint_unix.clone(),
        );
        registry.register("partition_lag", "Records behind the partition's end", m.lag.clone());
        OnlineMetrics { registry, ..m }
    }

    /// Sets the figures of `r` (worker 0 after a step).
    pub fn record(&self, r: &MetricsRecord, steps_delta: u64, samples_delta: u64) {
        self.steps.inc_by(steps_delta);
        self.samples.inc_by(samples_delta);
        self.bad_records.set(r.bad_records as i64);
        self.window_auc.set(r.window_auc.unwrap_or(f64::NAN));
        self.window_logloss.set(r.window_logloss.unwrap_or(f64::NAN));
        self.loss.set(r.loss);
        self.checkpoint_age.set(r.checkpoint_age_s.unwrap_or(f64::NAN));
    }

    /// Records a durable checkpoint written now.
    pub fn checkpointed(&self) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.checkpoint_unix.set(now.as_secs_f64());
    }

    /// Sets the lag of `partition` of `topic`.
    pub fn set_lag(&self, topic: &str, partition: i32, lag: i64) {
        self.lag
            .get_or_create(&vec![("topic".into(), topic.into()), ("partition".into(), partition.to_string())])
            .set(lag);
    }

    /// Σ lag over the partitions set so far.
    pub fn total_lag(&self) -> i64 {
        // The family has no iterator; the text encoding is the source of truth.
        self.render()
            .lines()
            .filter(|l| l.starts_with("tiderec_partition_lag{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<i64>().ok())
            .sum()
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// Serves `GET /metrics` on `addr` from a background thread for the life of the process.
pub fn serve(addr: &str, metrics: Arc<OnlineMetrics>) -> Result<(), PipelineError> {
    let server = tiny_http::Server::http(addr)
        .map_err(|e| PipelineError::config("metrics_addr", format!("cannot listen on {addr}: {e}")))?;
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || {
            for request in server.incoming_requests() {
                let response = if request.url() == "/metrics" {
                    let header = tiny_http::Header::from_bytes(
                        &b"Content-Type"[..],
                        &b"application/openmetrics-text; version=1.0.0; charset=utf-8"[..],
                    )
                    .expect("a valid header");
                    tiny_http::Response::from_string(metrics.render()).with_header(header)
                } else {
                    tiny_http::Response::from_string("see /metrics\n").with_status_code(404)
                };
                let _ = request.respond(response);
            }
        })
        .map_err(|e| PipelineError::Dataflow(format!("cannot start the metrics thread: {e}")))?;
    Ok(())
}

/// Appends JSON lines to a file.
pub struct MetricsLog {
    file: std::io::BufWriter<std::fs::File>,
}

impl MetricsLog {
    /// Creates (truncates) `path`, or appends to it when `append`.
    pub fn create(path: &Path, append: bool) -> Result<Self, PipelineError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(append)
            .write(true)
            .truncate(!append)
            .open(path)
            .map_err(|e| PipelineError::config("metrics_log", format!("cannot open {}: {e}", path.display())))?;
        Ok(MetricsLog { file: std::io::BufWriter::new(file) })
    }

    /// Writes one record as a line and flushes it.
    pub fn write(&mut self, r: &MetricsRecord) -> Result<(), PipelineError> {
        let line = serde_json::to_string(r).map_err(|e| PipelineError::Dataflow(e.to_string()))?;
        writeln!(self.file, "{line}")
            .and_then(|_| self.file.flush())
            .map_err(|e| PipelineError::Dataflow(format!("cannot write the metrics log: {e}")))
    }
}

/// Reads a JSON-lines metrics log; a malformed line is an error naming its number.
pub fn read_log(path: &Path) -> Result<Vec<MetricsRecord>, PipelineError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| PipelineError::config("metrics", format!("cannot read {}: {e}", path.display())))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| PipelineError::config("metrics", format!("{}:{}: {e}", path.display(), i + 1)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text_with_lag_per_partition() {
        let m = OnlineMetrics::new();
        m.set_lag("clicks", 0, 5);
        m.set_lag("clicks", 1, 7);
        m.set_lag("clicks", 1, 3);
        let r = MetricsRecord { step: 2, samples: 256, window_auc: Some(0.75), bad_records: 1, ..Default::default() };
        m.record(&r, 2, 256);
        let text = m.render();
        assert!(text.contains("tiderec_samples_total 256"), "{text}");
        assert!(text.contains("tiderec_window_auc 0.75"), "{text}");
        assert!(text.contains(r#"tiderec_partition_lag{topic="clicks",partition="1"} 3"#), "{text}");
        assert_eq!(m.total_lag(), 8);
    }

    #[test]
    fn log_round_trip_and_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let mut log = MetricsLog::create(&path, false).unwrap();
        let r = MetricsRecord { step: 1, samples: 10, window_auc: None, loss: 0.5, ..Default::default() };
        log.write(&r).unwrap();
        log.write(&MetricsRecord { step: 2, ..r.clone() }).unwrap();
        let back = read_log(&path).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0], r);
        std::fs::write(&path, "{\"step\": 1}\nnot json\n").unwrap();
        let e = read_log(&path).unwrap_err().to_string();
        assert!(e.contains(":1:") || e.contains(":2:"), "{e}");
    }
}
