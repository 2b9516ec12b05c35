//! [`LiveMetrics`] registered with `prometheus-client`, and the HTTP thread
//! that serves them (feature `prometheus`; see the [module docs](super)).

use crate::error::DataflowFailure;
use crate::metrics_log::MetricsRecord;
use crate::PipelineError;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use tiderec_operators::metrics::EvalSummary;

type FloatGauge = Gauge<f64, AtomicU64>;

/// A window gauge: its name, its help and its value in a [`MetricsRecord`].
type WindowGauge = (&'static str, &'static str, fn(&MetricsRecord) -> Option<f64>);

/// The window figures of a [`MetricsRecord`], in exposition order.
const WINDOW: [WindowGauge; 6] = [
    ("window_auc", "AUC of the window (online: prequential; train: the latest evaluation)", |r| r.window_auc),
    ("window_logloss", "Log loss of the window", |r| r.window_logloss),
    ("window_ne", "Normalized entropy of the window: log loss over the entropy of its CTR", |r| r.window_ne),
    ("window_calibration", "Mean prediction over observed CTR in the window", |r| r.window_calibration),
    ("window_pr_auc", "PR-AUC (average precision) of the window", |r| r.window_pr_auc),
    ("window_gauc", "Impression-weighted per-user AUC of the window (NaN without a user column)", |r| r.window_gauc),
];

/// The metrics of one process, registered for Prometheus.
pub struct LiveMetrics {
    registry: Registry,
    samples: Counter,
    steps: Counter,
    bad_records: Gauge,
    window: [FloatGauge; WINDOW.len()],
    loss: FloatGauge,
    checkpoint_age: FloatGauge,
    checkpoint_unix: FloatGauge,
    lag: Family<Vec<(String, String)>, Gauge>,
}

impl Default for LiveMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl LiveMetrics {
    /// Registers every metric under the `tiderec_` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("tiderec");
        let m = LiveMetrics {
            samples: Counter::default(),
            steps: Counter::default(),
            bad_records: Gauge::default(),
            window: Default::default(),
            loss: Gauge::default(),
            checkpoint_age: Gauge::default(),
            checkpoint_unix: Gauge::default(),
            lag: Family::default(),
            registry: Registry::default(),
        };
        registry.register("samples", "Training samples consumed", m.samples.clone());
        registry.register("steps", "Synchronous training steps", m.steps.clone());
        registry.register("bad_records", "Malformed records skipped (dead-lettered)", m.bad_records.clone());
        for ((name, help, _), gauge) in WINDOW.iter().zip(&m.window) {
            registry.register(*name, *help, gauge.clone());
        }
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
        registry.register("partition_lag", "Records behind the partition's end (online)", m.lag.clone());
        LiveMetrics { registry, ..m }
    }

    /// Sets the figures of `r` (worker 0 after a step); the step and sample counters grow
    /// by `steps_delta` and `samples_delta`. An undefined figure is NaN.
    pub fn record(&self, r: &MetricsRecord, steps_delta: u64, samples_delta: u64) {
        self.steps.inc_by(steps_delta);
        self.samples.inc_by(samples_delta);
        self.bad_records.set(r.bad_records as i64);
        self.set_window_of(r);
        self.loss.set(r.loss);
        self.checkpoint_age.set(r.checkpoint_age_s.unwrap_or(f64::NAN));
    }

    /// Sets the window figures alone (`train`, after an evaluation); all NaN without `figures`.
    pub fn set_window(&self, figures: Option<&EvalSummary>) {
        let mut r = MetricsRecord::default();
        r.set_window(figures);
        self.set_window_of(&r);
    }

    fn set_window_of(&self, r: &MetricsRecord) {
        for ((_, _, value), gauge) in WINDOW.iter().zip(&self.window) {
            gauge.set(value(r).unwrap_or(f64::NAN));
        }
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

/// Serves `GET /metrics` on `addr` from a background thread for the life of the process;
/// returns the address bound (the port chosen when `addr`'s port is 0).
pub fn serve(addr: &str, metrics: Arc<LiveMetrics>) -> Result<String, PipelineError> {
    let server = tiny_http::Server::http(addr)
        .map_err(|e| PipelineError::config("metrics_addr", format!("cannot listen on {addr}: {e}")))?;
    let bound = server.server_addr().to_string();
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
        .map_err(|e| {
            PipelineError::dataflow(DataflowFailure::Thread, "cannot start the metrics thread").with_source(e)
        })?;
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text_with_lag_per_partition() {
        let m = LiveMetrics::new();
        m.set_lag("clicks", 0, 5);
        m.set_lag("clicks", 1, 7);
        m.set_lag("clicks", 1, 3);
        let r = MetricsRecord {
            step: 2,
            samples: 256,
            window_auc: Some(0.75),
            window_ne: Some(0.875),
            window_gauc: Some(0.625),
            bad_records: 1,
            ..Default::default()
        };
        m.record(&r, 2, 256);
        let text = m.render();
        assert!(text.contains("tiderec_samples_total 256"), "{text}");
        assert!(text.contains("tiderec_window_auc 0.75"), "{text}");
        assert!(text.contains("tiderec_window_ne 0.875"), "{text}");
        assert!(text.contains("tiderec_window_gauc 0.625"), "{text}");
        assert!(text.contains("tiderec_window_pr_auc NaN"), "an undefined figure is NaN: {text}");
        assert!(text.contains(r#"tiderec_partition_lag{topic="clicks",partition="1"} 3"#), "{text}");
        assert_eq!(m.total_lag(), 8);
        m.set_window(Some(&EvalSummary { pr_auc: Some(0.5), ..Default::default() }));
        let text = m.render();
        assert!(text.contains("tiderec_window_pr_auc 0.5") && text.contains("tiderec_window_auc NaN"), "{text}");
        assert!(text.contains("tiderec_samples_total 256"), "the counters stay: {text}");
    }
}
