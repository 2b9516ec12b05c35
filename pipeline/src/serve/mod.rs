//! `tiderec serve`: HTTP scoring of JSON records with a checkpoint's model.
//!
//! * `POST /score` takes one record object, a JSON array of them, or
//!   newline-delimited objects, and answers `{"step": S, "scores": [p, …]}`,
//!   one click probability per record in order. A record is keyed by the
//!   column names of the records the checkpoint was trained on (Criteo's
//!   `I1`…`I13`, `C1`…`C26`; Avazu's header; a spec's columns; …), or is
//!   `{"line": TEXT}`, one line of the training files (see `records.rs`); a
//!   model trained on Parquet files scores featurized rows (`rows.rs`). A
//!   bad record answers 400 naming its index and field; nothing of that
//!   request is scored.
//! * `GET /schema` answers the format of the model's records and each field:
//!   its JSON type and the feature it becomes.
//! * `GET /health` answers the model served (step, checkpoint, model) and
//!   counts of records, batches and reloads.
//!
//! Records of concurrent requests are scored together (see `batcher.rs`).
//! When `--checkpoint` names a checkpoint directory (the `--checkpoint-dir`
//! of a training or online run) rather than one `ckpt-<step>`, a watcher
//! loads each newer checkpoint as it appears and the scoring thread takes it
//! between two batches: no request fails or waits for a load.

mod batcher;
pub mod client;
mod records;
mod rows;
mod score;

use crate::error::DataflowFailure;
use crate::PipelineError;
use batcher::{BatchLimits, Job, Reply, ServingState};
use score::Loaded;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use tiderec_sinks::checkpoint::layout;

/// Settings of a server.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// A `ckpt-<step>` directory, or a checkpoint directory to follow.
    pub checkpoint: PathBuf,
    /// `host:port` to listen on (port 0: any free port).
    pub addr: String,
    /// Connection threads: requests in flight at once.
    pub threads: usize,
    /// Batching limits of the scoring thread.
    pub limits: BatchLimits,
    /// How often to look for a newer checkpoint (`None`: never).
    pub reload_every: Option<Duration>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
}

impl ServeOptions {
    /// Defaults for `checkpoint` on `addr`.
    pub fn new(checkpoint: PathBuf, addr: String) -> ServeOptions {
        ServeOptions {
            checkpoint,
            addr,
            threads: 16,
            limits: BatchLimits { max_batch: 512, max_wait: Duration::from_micros(500) },
            reload_every: Some(Duration::from_secs(1)),
            max_body_bytes: 16 << 20,
        }
    }
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    http: Arc<tiny_http::Server>,
    state: Arc<Mutex<ServingState>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    records: String,
}

impl Server {
    /// Loads the model, binds `options.addr` and starts the threads.
    pub fn start(options: &ServeOptions) -> Result<Server, PipelineError> {
        if options.threads == 0 || options.limits.max_batch == 0 {
            return Err(PipelineError::config("threads", "serve needs at least one thread and a batch of one"));
        }
        let model = Loaded::load(&options.checkpoint)?;
        let state = Arc::new(Mutex::new(ServingState {
            step: model.step,
            checkpoint: model.path.display().to_string(),
            model: model.model_name.to_string(),
            records: 0,
            batches: 0,
            reloads: 0,
            schema: Arc::new(model.describe()),
        }));
        let records = model.summary();
        let http = tiny_http::Server::http(&options.addr)
            .map_err(|e| PipelineError::config("addr", format!("cannot listen on {}: {e}", options.addr)))?;
        let addr = http
            .server_addr()
            .to_ip()
            .ok_or_else(|| PipelineError::config("addr", format!("{} is not an IP address", options.addr)))?;
        let http = Arc::new(http);
        let stop = Arc::new(AtomicBool::new(false));
        let pending = Arc::new(Mutex::new(None));
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let mut threads = Vec::new();
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(name).spawn(f).map_err(|e| {
                PipelineError::dataflow(DataflowFailure::Thread, "cannot start a serving thread").with_source(e)
            })
        };
        let (st, pe, limits) = (state.clone(), pending.clone(), options.limits);
        threads.push(spawn("serve-score".into(), Box::new(move || batcher::run(model, jobs_rx, pe, st, limits)))?);
        for k in 0..options.threads {
            let (http, jobs, st, max_body) = (http.clone(), jobs_tx.clone(), state.clone(), options.max_body_bytes);
            threads.push(spawn(format!("serve-http-{k}"), Box::new(move || connections(&http, &jobs, &st, max_body)))?);
        }
        drop(jobs_tx);
        if let Some(every) = options.reload_every {
            let dir = options.checkpoint.clone();
            if !dir.join(layout::MANIFEST_FILE).is_file() {
                let (st, stop) = (state.clone(), stop.clone());
                threads.push(spawn("serve-reload".into(), Box::new(move || watch(&dir, every, &pending, &st, &stop)))?);
            }
        }
        Ok(Server { addr, http, state, stop, threads, records })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// One line saying what the records of the model it started with look like.
    pub fn records(&self) -> &str {
        &self.records
    }

    /// The model served and the counts so far.
    pub fn state(&self) -> ServingState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Stops accepting requests, answers the ones in flight and joins every thread.
    pub fn shutdown(self) {
        self.stop.store(true, Ordering::SeqCst);
        for _ in 0..self.threads.len() {
            self.http.unblock();
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Serves until `stop` is set (SIGINT/SIGTERM), printing the address first.
pub fn run(options: &ServeOptions, stop: &AtomicBool) -> Result<ServingState, PipelineError> {
    let server = Server::start(options)?;
    let s = server.state();
    // One write for both lines: a reader that takes the first line and closes the pipe
    // (`bench serve`, the tests) does not fail the second.
    let start = format!(
        "serving {} (step {}, {}) on http://{}\n{}\n",
        s.checkpoint,
        s.step,
        s.model,
        server.addr(),
        server.records()
    );
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), start.as_bytes());
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = server.state();
    server.shutdown();
    println!("stopped: {} records in {} batches, {} reloads, last step {}", s.records, s.batches, s.reloads, s.step);
    Ok(s)
}

fn json_body(status: u16, body: String) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let header = tiny_http::Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]).expect("a valid header");
    tiny_http::Response::from_data(body.into_bytes()).with_status_code(status).with_header(header)
}

fn json_response(status: u16, body: &serde_json::Value) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    json_body(status, body.to_string())
}

fn error(status: u16, message: impl Into<String>) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    json_response(status, &serde_json::json!({ "error": message.into() }))
}

const ROUTES: &str = "use POST /score, GET /schema or GET /health";

/// One connection thread: requests until the server is unblocked.
fn connections(http: &tiny_http::Server, jobs: &Sender<Job>, state: &Mutex<ServingState>, max_body: usize) {
    while let Ok(mut request) = http.recv() {
        let response = match (request.method(), request.url()) {
            (tiny_http::Method::Get, "/health") => {
                let s = state.lock().unwrap_or_else(|e| e.into_inner()).clone();
                json_response(200, &serde_json::to_value(s).unwrap_or_default())
            }
            (tiny_http::Method::Get, "/schema") => {
                let s = state.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let mut body = (*s.schema).clone();
                body["step"] = s.step.into();
                body["model"] = s.model.into();
                json_response(200, &body)
            }
            (tiny_http::Method::Post, "/score") => {
                let mut body = Vec::new();
                match request.as_reader().take(max_body as u64 + 1).read_to_end(&mut body) {
                    Err(e) => error(400, format!("cannot read the request body: {e}")),
                    Ok(n) if n > max_body => error(413, format!("request body over {max_body} bytes")),
                    Ok(_) => score(&body, jobs),
                }
            }
            (_, "/score" | "/health" | "/schema") => error(405, ROUTES),
            _ => error(404, ROUTES),
        };
        let _ = request.respond(response);
    }
}

fn score(body: &[u8], jobs: &Sender<Job>) -> tiny_http::Response<std::io::Cursor<Vec<u8>>> {
    let records = match split_records(body) {
        Ok(r) if r.is_empty() => return error(400, "no records"),
        Ok(r) => r,
        Err(e) => return error(400, e),
    };
    let (reply, answer) = mpsc::channel();
    if jobs.send(Job { records, reply }).is_err() {
        return error(503, "the server is stopping");
    }
    match answer.recv() {
        Ok(Reply::Scored { step, scores }) => {
            // Each score in the shortest text that reads back as the same f32.
            let list: Vec<String> = scores.iter().map(f32::to_string).collect();
            let body = format!("{{\"step\":{step},\"scores\":[{}]}}", list.join(","));
            json_body(200, body)
        }
        Ok(Reply::BadRecord { index, reason }) => error(400, format!("record {index}: {reason}")),
        Ok(Reply::Failed(reason)) => error(500, reason),
        Err(_) => error(503, "the server is stopping"),
    }
}

/// The records of a request body: one object, an array of objects, or one object per line.
/// An array is only split into its elements' bytes here; each record is parsed once, by the
/// scoring thread's record format.
pub fn split_records(body: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        let items: Vec<&serde_json::value::RawValue> =
            serde_json::from_slice(body).map_err(|e| format!("the body is not a JSON array of records: {e}"))?;
        return Ok(items.iter().map(|r| r.get().as_bytes().to_vec()).collect());
    }
    match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
        Ok(_) if first == Some(&b'{') => Ok(vec![body.to_vec()]),
        Ok(_) => Err("the body is neither a record object nor an array of them".into()),
        Err(_) => Ok(body
            .split(|&b| b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
            .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
            .map(<[u8]>::to_vec)
            .collect()),
    }
}

/// Loads each checkpoint newer than the one served and hands it to the scoring thread.
fn watch(dir: &Path, every: Duration, pending: &Mutex<Option<Loaded>>, state: &Mutex<ServingState>, stop: &AtomicBool) {
    let mut served = state.lock().unwrap_or_else(|e| e.into_inner()).step;
    let mut failed = None;
    while !stop.load(Ordering::SeqCst) {
        let mut slept = Duration::ZERO;
        while slept < every && !stop.load(Ordering::SeqCst) {
            let d = Duration::from_millis(20).min(every - slept);
            std::thread::sleep(d);
            slept += d;
        }
        let Ok(list) = layout::list_checkpoints(dir) else { continue };
        let Some((step, path)) = list.into_iter().max_by_key(|(s, _)| *s) else { continue };
        if step <= served || failed == Some(step) {
            continue;
        }
        match Loaded::load(&path) {
            Ok(model) => {
                eprintln!("serve: loaded step {step} from {}", path.display());
                *pending.lock().unwrap_or_else(|e| e.into_inner()) = Some(model);
                served = step;
                failed = None;
            }
            Err(e) => {
                // A checkpoint pruned or replaced while being read: try again at the next look,
                // and warn once per step.
                if path.exists() {
                    eprintln!("warning: serve: cannot load {}: {e}; still serving step {served}", path.display());
                    failed = Some(step);
                }
            }
        }
    }
}
