//! Live metrics of `train` and `online`: the Prometheus endpoint
//! (`--metrics-addr`, `GET /metrics`). Their JSON-lines log
//! (`--metrics-log`) is [`crate::metrics_log`]'s, and each endpoint update is
//! a [`MetricsRecord`](crate::metrics_log::MetricsRecord) of that log.
//!
//! Invariants:
//! * One [`LiveMetrics`] per process, shared by its workers: worker 0 sets the
//!   training figures and the window's after a step ([`LiveMetrics::record`];
//!   `train` also after each evaluation, [`LiveMetrics::set_window`]);
//!   `online`'s workers set the lag of the partitions they own. The HTTP
//!   thread only reads.
//! * The `window_*` figures are the prequential window's (`online`) or the
//!   latest evaluation's of the held-out split (`train`), the same values as
//!   the log's; an undefined figure is NaN.
//! * Only process 0 serves ([`start`]); the bound address is printed, so port
//!   0 picks any free port.
//! * Without the cargo feature `prometheus` there is no endpoint: [`start`]
//!   refuses an address (a configuration error naming `metrics_addr`) and no
//!   [`LiveMetrics`] value can exist.

#[cfg(feature = "prometheus")]
mod registry;

#[cfg(feature = "prometheus")]
pub use registry::{serve, LiveMetrics};

use crate::PipelineError;
use std::sync::Arc;

/// Without the feature `prometheus`: a type without values ([`start`] never makes one).
#[cfg(not(feature = "prometheus"))]
pub enum LiveMetrics {}

#[cfg(not(feature = "prometheus"))]
impl LiveMetrics {
    /// Sets the figures of `r` (no value exists to call it on).
    pub fn record(&self, _r: &crate::metrics_log::MetricsRecord, _steps_delta: u64, _samples_delta: u64) {
        match *self {}
    }

    /// Records a durable checkpoint (no value exists to call it on).
    pub fn checkpointed(&self) {
        match *self {}
    }

    /// Sets the window figures alone (no value exists to call it on).
    pub fn set_window(&self, _figures: Option<&tiderec_operators::metrics::EvalSummary>) {
        match *self {}
    }
}

/// The endpoint of process `process` for `--metrics-addr addr`: on process 0, the metrics
/// served from a background thread (the address printed on stderr); `None` without an
/// address or on the other processes.
pub fn start(addr: Option<&str>, process: usize) -> Result<Option<Arc<LiveMetrics>>, PipelineError> {
    let Some(addr) = addr.filter(|_| process == 0) else { return Ok(None) };
    serve_new(addr).map(Some)
}

#[cfg(feature = "prometheus")]
fn serve_new(addr: &str) -> Result<Arc<LiveMetrics>, PipelineError> {
    let metrics = Arc::new(LiveMetrics::new());
    let bound = serve(addr, metrics.clone())?;
    eprintln!("metrics at http://{bound}/metrics");
    Ok(metrics)
}

#[cfg(not(feature = "prometheus"))]
fn serve_new(_addr: &str) -> Result<Arc<LiveMetrics>, PipelineError> {
    Err(PipelineError::config(
        "metrics_addr",
        "this tiderec was built without the Prometheus endpoint (cargo feature `prometheus`)",
    ))
}
