//! `tiderec bench serve`: throughput and latency of `tiderec serve` under a
//! concurrent load from another process.
//!
//! The bench starts `tiderec serve` as a child process on a free port of
//! 127.0.0.1, turns the first records of a Criteo file into JSON objects,
//! and runs `clients` threads, each with one kept-alive connection sending
//! `records_per_request` records per request back to back, for `seconds`
//! after a one-second warm-up. Latency is the client's: from writing the
//! request to reading the whole response.

use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiderec::serve::client::Client;
use tiderec::PipelineError;
use tiderec_sources::json::criteo_line_to_json;

/// What to measure.
#[derive(Clone, Debug)]
pub struct ServeBench {
    /// The `tiderec` binary to start as the server.
    pub binary: PathBuf,
    /// Checkpoint to serve.
    pub checkpoint: PathBuf,
    /// Criteo TSV file the records come from.
    pub criteo: PathBuf,
    /// Concurrent connections.
    pub clients: usize,
    /// Records per request.
    pub records_per_request: usize,
    /// Measured seconds.
    pub seconds: f64,
    /// The server's `--max-batch`.
    pub max_batch: usize,
    /// The server's `--max-wait-us`.
    pub max_wait_us: u64,
}

/// What it measured.
#[derive(Clone, Debug, Serialize)]
pub struct ServeReport {
    /// Concurrent connections.
    pub clients: usize,
    /// Records per request.
    pub records_per_request: usize,
    /// Requests answered in the measured window.
    pub requests: u64,
    /// Requests per second.
    pub requests_per_sec: f64,
    /// Records scored per second.
    pub records_per_sec: f64,
    /// Median latency, milliseconds.
    pub p50_ms: f64,
    /// 99th-percentile latency, milliseconds.
    pub p99_ms: f64,
    /// Slowest request, milliseconds.
    pub max_ms: f64,
    /// Mean records per forward pass on the server (its batching).
    pub mean_server_batch: f64,
}

struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bench_error(what: impl std::fmt::Display) -> PipelineError {
    PipelineError::dataflow(tiderec::error::DataflowFailure::Incomplete, format!("bench serve: {what}"))
}

/// Runs the bench (see the module docs).
pub fn run(b: &ServeBench) -> Result<ServeReport, PipelineError> {
    if b.clients == 0 || b.records_per_request == 0 || !b.seconds.is_finite() || b.seconds <= 0.0 {
        return Err(PipelineError::config("clients", "bench serve needs clients, records and seconds above 0"));
    }
    let text = std::fs::read(&b.criteo).map_err(|e| bench_error(format!("{}: {e}", b.criteo.display())))?;
    let records: Vec<String> = text.split(|&c| c == b'\n').filter_map(criteo_line_to_json).take(10_000).collect();
    if records.len() < b.records_per_request {
        return Err(bench_error(format!("{} holds fewer than {} records", b.criteo.display(), b.records_per_request)));
    }
    let mut child = Command::new(&b.binary)
        .args(["serve", "--addr", "127.0.0.1:0", "--checkpoint"])
        .arg(&b.checkpoint)
        .args(["--max-batch", &b.max_batch.to_string(), "--max-wait-us", &b.max_wait_us.to_string()])
        .args(["--max-connections-per-ip", &(b.clients + 2).to_string()])
        .args(["--threads", &(b.clients + 8).max(256).to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| bench_error(format!("cannot start {}: {e}", b.binary.display())))?;
    let stdout = child.stdout.take().ok_or_else(|| bench_error("no stdout"))?;
    let child = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).map_err(bench_error)?;
    let addr = line
        .rsplit("http://")
        .next()
        .map(str::trim)
        .filter(|a| line.starts_with("serving ") && !a.is_empty())
        .ok_or_else(|| bench_error(format!("the server did not start: {line:?}")))?
        .to_string();
    let bodies: Vec<Vec<u8>> =
        records.chunks_exact(b.records_per_request).map(|c| format!("[{}]", c.join(",")).into_bytes()).collect();
    let bodies = Arc::new(bodies);
    let measuring = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for k in 0..b.clients {
        let (bodies, measuring, done, addr) = (bodies.clone(), measuring.clone(), done.clone(), addr.clone());
        threads.push(std::thread::spawn(move || -> Result<Vec<f64>, String> {
            let mut client = Client::connect(&addr, Duration::from_secs(30)).map_err(|e| e.to_string())?;
            let mut latencies = Vec::new();
            let mut i = k;
            while !done.load(Ordering::Relaxed) {
                // A request counts when it starts and ends inside the measured window.
                let (t, counted) = (Instant::now(), measuring.load(Ordering::Relaxed));
                let r = client.post("/score", &bodies[i % bodies.len()]).map_err(|e| e.to_string())?;
                if r.status != 200 {
                    return Err(format!("status {}: {}", r.status, r.text()));
                }
                if counted && measuring.load(Ordering::Relaxed) {
                    latencies.push(t.elapsed().as_secs_f64() * 1e3);
                }
                i += stride(k);
            }
            Ok(latencies)
        }));
    }
    std::thread::sleep(Duration::from_secs(1));
    let before = health(&addr)?;
    measuring.store(true, Ordering::SeqCst);
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(b.seconds));
    measuring.store(false, Ordering::SeqCst);
    let elapsed = start.elapsed().as_secs_f64();
    let after = health(&addr)?;
    done.store(true, Ordering::SeqCst);
    let mut latencies = Vec::new();
    for t in threads {
        latencies.extend(t.join().map_err(|_| bench_error("a client panicked"))?.map_err(bench_error)?);
    }
    drop(child);
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| latencies.get(((latencies.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
    let requests = latencies.len() as u64;
    let batches = (after.1 - before.1).max(1) as f64;
    Ok(ServeReport {
        clients: b.clients,
        records_per_request: b.records_per_request,
        requests,
        requests_per_sec: requests as f64 / elapsed,
        records_per_sec: (requests * b.records_per_request as u64) as f64 / elapsed,
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        max_ms: latencies.last().copied().unwrap_or(0.0),
        mean_server_batch: (after.0 - before.0) as f64 / batches,
    })
}

/// Clients walk the bodies with coprime strides so they do not send the same body in lockstep.
fn stride(k: usize) -> usize {
    [1, 3, 7, 11, 13][k % 5]
}

/// The server's (records, batches) counts.
fn health(addr: &str) -> Result<(u64, u64), PipelineError> {
    let r = Client::connect(addr, Duration::from_secs(10)).and_then(|mut c| c.get("/health")).map_err(bench_error)?;
    let v: serde_json::Value = serde_json::from_slice(&r.body).map_err(bench_error)?;
    let n = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
    Ok((n("records"), n("batches")))
}
