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
//! * `GET /health` answers the model served (step, checkpoint, model),
//!   counts of records, batches and reloads, and a `warning` while the
//!   served checkpoint is deleted, or while a newer checkpoint than the one
//!   served cannot be loaded (naming it).
//!
//! Invariants:
//! * A request holds at most `max_records` records (more: `413`, counted
//!   while the body is split, before any record is copied or featurized),
//!   and is scored in jobs of at most `max_batch` records, one after the
//!   other, so the records of other requests interleave with a large one and
//!   no forward pass holds more than `max_batch` records. Memory per request
//!   is bounded by `max_body_bytes` and `max_records`, whatever arrives, and
//!   chunked or not.
//! * The bodies of all requests together hold at most `max_body_memory`
//!   bytes, and those of one client address at most its share of them, the
//!   share of `max_connections_per_ip` in `threads` (but at least one body of
//!   `max_body_bytes`; `budget.rs`): a body's bytes are reserved as they
//!   arrive, before its buffer grows to hold them, never for a length only
//!   announced, and given back when its last holder drops it. A request
//!   whose announced length does not fit in what is left is answered `503`
//!   with `Retry-After`, saying which bound it met, before its body is read;
//!   one whose bytes stop fitting as they arrive is answered so then, and
//!   the rest of its body is not read. `GET /health` reserves nothing and
//!   shows the bytes held.
//! * A refused record holding `NaN` or `Infinity` is answered saying so,
//!   whatever the record format saw; a body that is not UTF-8 names the
//!   offset of its first bad byte.
//! * One answer comes from one model: a request pins the model generation
//!   current when its body is split (`generations.rs`), and every job of it
//!   is scored by that model, whatever reloads happen meanwhile; a request
//!   never fails, nor is scored again, because the model changed. The pin
//!   goes before the answer is written, so a slow reader holds no model.
//! * Every answer's body is valid JSON: a score that is not finite (a model
//!   overflowing on extreme values) answers `422` naming its record.
//! * Connections, slow clients and the bounds on them: `listen.rs`.
//!
//! Records of concurrent requests are scored together (see `batcher.rs`).
//! When `--checkpoint` names a checkpoint directory (the `--checkpoint-dir`
//! of a training or online run) rather than one `ckpt-<step>`, a watcher
//! follows its newest valid checkpoint (see `watch.rs`) and the scoring
//! thread takes each one loaded between two batches: no request fails or
//! waits for a load.

mod address;
mod batcher;
mod budget;
pub mod client;
mod generations;
mod http;
/// The chunked body decoder, for the fuzz target `serve_chunked_body`.
pub use http::{read_chunked, ChunkedError};
mod listen;
mod records;
mod rows;
mod score;
mod watch;
mod work;
/// A checkpoint loaded as the scorer `serve` answers with: usable from a program of its own.
pub use score::Loaded;

use crate::error::DataflowFailure;
use crate::PipelineError;
use address::ClientKey;
use batcher::{BatchLimits, Job, Reply, ServingState, Work};
use budget::{Body, BodyBudget, Full, Reservation};
use generations::Generations;
use http::{Head, HttpError, Transfer};
use listen::Connections;
use std::io::BufReader;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tiderec_sinks::checkpoint::layout;
use tiderec_sources::request_body::{non_finite, split_records, BodyError};

/// The largest `max_records` accepted.
pub const MAX_RECORDS_LIMIT: usize = 1 << 24;

/// The default largest request body (16 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 << 20;

/// The default memory of request bodies across all connections (1 GiB): 64 bodies of the
/// default largest size at once, a quarter of what 256 connections (the default `threads`)
/// could hold with one such body each.
pub const DEFAULT_MAX_BODY_MEMORY: usize = 1 << 30;

/// Settings of a server.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// A `ckpt-<step>` directory, or a checkpoint directory to follow.
    pub checkpoint: PathBuf,
    /// `host:port` to listen on (port 0: any free port).
    pub addr: String,
    /// Connections open at once (one thread each); one more is answered `503`.
    pub threads: usize,
    /// Connections open at once from one client address; one more gets `429` (or `/health`).
    pub max_connections_per_ip: usize,
    /// Batching limits of the scoring thread.
    pub limits: BatchLimits,
    /// How often to look for a newer checkpoint (`None`: never).
    pub reload_every: Option<Duration>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Bytes of request bodies held at once across all connections (at least `max_body_bytes`);
    /// a request whose body does not fit in what is left gets `503`.
    pub max_body_memory: usize,
    /// Most records in one request.
    pub max_records: usize,
    /// Time to receive a request (head and body) from its first byte, and the longest idle
    /// time of a kept-alive connection.
    pub read_timeout: Duration,
}

impl ServeOptions {
    /// Defaults for `checkpoint` on `addr`.
    pub fn new(checkpoint: PathBuf, addr: String) -> ServeOptions {
        ServeOptions {
            checkpoint,
            addr,
            threads: 256,
            max_connections_per_ip: 64,
            limits: BatchLimits { max_batch: 512, max_wait: Duration::from_micros(500) },
            reload_every: Some(Duration::from_secs(1)),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_body_memory: DEFAULT_MAX_BODY_MEMORY,
            max_records: 65_536,
            read_timeout: Duration::from_secs(5),
        }
    }

    /// The bytes of request bodies one client address may hold at once: the share of
    /// `max_body_memory` that `max_connections_per_ip` is of `threads`, so that one address
    /// cannot hold more of the body memory than of the connections, but at least one body
    /// of `max_body_bytes` (and at most `max_body_memory`).
    pub fn body_memory_per_address(&self) -> usize {
        let share = self.max_body_memory as u128 * self.max_connections_per_ip as u128 / self.threads.max(1) as u128;
        usize::try_from(share).unwrap_or(usize::MAX).max(self.max_body_bytes).min(self.max_body_memory)
    }

    /// Refuses settings the server cannot run with, naming the setting.
    fn check(&self) -> Result<(), PipelineError> {
        let bad = |key: &str, reason: String| Err(PipelineError::config(key, reason));
        if self.threads == 0 || self.max_connections_per_ip == 0 {
            return bad("threads", "serve needs at least one connection, in all and per client".into());
        }
        if self.limits.max_batch == 0 {
            return bad("max_batch", "serve needs a batch of at least one record".into());
        }
        if !(1..=MAX_RECORDS_LIMIT).contains(&self.max_records) {
            return bad("max_records", format!("{} is not in 1..={MAX_RECORDS_LIMIT}", self.max_records));
        }
        if self.max_body_bytes == 0 {
            return bad("max_body_bytes", "serve needs a body of at least one byte".into());
        }
        if self.max_body_memory < self.max_body_bytes {
            return bad(
                "max_body_memory",
                format!(
                    "{} bytes is below max_body_bytes ({} bytes): a body of the largest size could never be read",
                    self.max_body_memory, self.max_body_bytes
                ),
            );
        }
        if self.read_timeout.is_zero() || self.read_timeout > Duration::from_secs(3600) {
            return bad("read_timeout", format!("{:?} is not between 0 and one hour", self.read_timeout));
        }
        Ok(())
    }
}

/// What the connection threads share.
pub(crate) struct Context {
    options: ServeOptions,
    state: Arc<Mutex<ServingState>>,
    stop: AtomicBool,
    connections: Connections,
    budget: Arc<BodyBudget>,
    /// The model generations requests pin (see `generations.rs`).
    generations: Arc<Generations>,
}

impl Context {
    /// A copy of the served model's state (a poisoned lock still holds the last state).
    fn state(&self) -> ServingState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A running server.
pub struct Server {
    addr: SocketAddr,
    ctx: Arc<Context>,
    stop_watch: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    others: Vec<JoinHandle<()>>,
    scorer: Option<JoinHandle<()>>,
    records: String,
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, PipelineError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| PipelineError::dataflow(DataflowFailure::Thread, "cannot start a serving thread").with_source(e))
}

impl Server {
    /// Loads the model, binds `options.addr` and starts the threads.
    pub fn start(options: &ServeOptions) -> Result<Server, PipelineError> {
        options.check()?;
        // Its identity is taken before it is read, as the watcher takes a checkpoint's.
        let (model, first) = watch::load_identified(&options.checkpoint, Loaded::load, |m| &m.path)?;
        let state = Arc::new(Mutex::new(ServingState {
            step: model.step,
            checkpoint: model.path.display().to_string(),
            model: model.model_name.to_string(),
            records: 0,
            batches: 0,
            reloads: 0,
            deltas: 0,
            stale: false,
            warning: None,
            load_failure: None,
            schema: Arc::new(model.describe()),
        }));
        let records = model.summary();
        let listener = TcpListener::bind(&options.addr)
            .map_err(|e| PipelineError::config("addr", format!("cannot listen on {}: {e}", options.addr)))?;
        let addr = listener
            .local_addr()
            .map_err(|e| PipelineError::config("addr", format!("cannot listen on {}: {e}", options.addr)))?;
        let ctx = Arc::new(Context {
            options: options.clone(),
            state: state.clone(),
            stop: AtomicBool::new(false),
            connections: Connections::default(),
            budget: BodyBudget::new(options.max_body_memory, options.body_memory_per_address()),
            generations: Generations::new(),
        });
        let stop_watch = Arc::new(AtomicBool::new(false));
        let (work_tx, work_rx) = mpsc::channel::<Work>();
        let limits = options.limits;
        let (st, generations) = (state.clone(), ctx.generations.clone());
        let scorer = spawn("serve-score", move || batcher::run(model, generations, work_rx, st, limits))?;
        let mut others = Vec::new();
        if let Some(every) = options.reload_every {
            let dir = options.checkpoint.clone();
            if !dir.join(layout::MANIFEST_FILE).is_file() {
                let (st, stop, work) = (state.clone(), stop_watch.clone(), work_tx.clone());
                others.push(spawn("serve-reload", move || watch::run(&dir, every, first, &work, &st, &stop))?);
            }
        }
        let c = ctx.clone();
        let accept = spawn("serve-accept", move || listen::accept(listener, c, work_tx))?;
        Ok(Server { addr, ctx, stop_watch, accept: Some(accept), others, scorer: Some(scorer), records })
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
        self.ctx.state()
    }

    /// Stops accepting requests, answers the ones in flight and joins every thread; the state
    /// it ends in, the requests answered while stopping counted.
    pub fn shutdown(mut self) -> ServingState {
        self.ctx.stop.store(true, Ordering::SeqCst);
        self.stop_watch.store(true, Ordering::SeqCst);
        // A connection wakes the accept loop, which then sees `stop`.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(if wake.is_ipv4() { [127, 0, 0, 1].into() } else { std::net::Ipv6Addr::LOCALHOST.into() });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        self.ctx.connections.wait_closed(self.ctx.options.read_timeout + Duration::from_secs(1));
        for t in self.others.drain(..) {
            let _ = t.join();
        }
        if let Some(t) = self.scorer.take() {
            let _ = t.join();
        }
        self.ctx.state()
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
    let s = server.shutdown();
    println!("stopped: {} records in {} batches, {} reloads, last step {}", s.records, s.batches, s.reloads, s.step);
    Ok(s)
}

/// A response to write: status, JSON body, and whether the connection closes after it.
pub(crate) struct Response {
    status: u16,
    body: Vec<u8>,
    close: bool,
    /// Seconds for a `Retry-After` header.
    retry_after: Option<u32>,
}

impl Response {
    fn json(status: u16, body: String) -> Response {
        Response { status, body: body.into_bytes(), close: false, retry_after: None }
    }

    fn error(status: u16, message: impl Into<String>) -> Response {
        Response::json(status, serde_json::json!({ "error": message.into() }).to_string())
    }
}

const ROUTES: &str = "use POST /score, GET /schema or GET /health";

/// The response to one request whose head is read, from a client at `ip`; `None` when the
/// client went away.
fn route(
    head: &Head,
    reader: &mut BufReader<TcpStream>,
    writer: &mut TcpStream,
    deadline: Instant,
    ip: ClientKey,
    ctx: &Context,
    work: &Sender<Work>,
) -> Option<Response> {
    let has_body = head.transfer != Transfer::Identity || head.content_length.unwrap_or(0) > 0;
    let response = match (head.method.as_str(), head.path.as_str()) {
        ("GET", "/health") => health(ctx),
        ("GET", "/schema") => {
            let s = ctx.state();
            let mut body = (*s.schema).clone();
            body["step"] = s.step.into();
            body["model"] = s.model.into();
            Response::json(200, body.to_string())
        }
        ("POST", "/score") => return score_request(head, reader, writer, deadline, ip, ctx, work),
        (_, "/score" | "/health" | "/schema") => Response::error(405, ROUTES),
        _ => Response::error(404, ROUTES),
    };
    // A body left unread would be taken for the next request: close instead.
    Some(Response { close: response.close || has_body, ..response })
}

/// The answer to `GET /health`: the state, its warnings and the body bytes held.
fn health(ctx: &Context) -> Response {
    let state = ctx.state();
    let mut health = serde_json::to_value(&state).unwrap_or_default();
    if let Some(warning) = state.warnings() {
        health["warning"] = warning.into();
    }
    health["body_bytes"] = ctx.budget.in_use().into();
    Response::json(200, health.to_string())
}

/// Reads a `POST /score` body from a client at `ip` and scores it.
fn score_request(
    head: &Head,
    reader: &mut BufReader<TcpStream>,
    writer: &mut TcpStream,
    deadline: Instant,
    ip: ClientKey,
    ctx: &Context,
    work: &Sender<Work>,
) -> Option<Response> {
    let max_body = ctx.options.max_body_bytes;
    let closing = |status, message: String| Some(Response { close: true, ..Response::error(status, message) });
    let length = match (&head.transfer, head.content_length) {
        (Transfer::Unsupported(codings), _) => {
            let message =
                format!("the Transfer-Encoding {codings:?} is not supported (send chunked or a Content-Length)");
            return closing(501, message);
        }
        (Transfer::Chunked, _) => None,
        (Transfer::Identity, Some(n)) if n > max_body => {
            return closing(413, format!("request body over {max_body} bytes"))
        }
        (Transfer::Identity, Some(n)) => Some(n),
        (Transfer::Identity, None) => {
            let message = "a request body needs a Content-Length or Transfer-Encoding: chunked";
            return closing(411, message.into());
        }
    };
    // Nothing is reserved for a length only announced: a body that cannot fit in what is left
    // now is refused before `100 Continue` (a client that waits for it sends no body to
    // refuse); one that may fit reserves its bytes as they arrive.
    let mut held = Reservation::empty(&ctx.budget, ip);
    if let Some(Err(full)) = length.map(|n| held.fits(n)) {
        return Some(busy(&full));
    }
    if head.expect_continue && http::write_continue(writer, deadline).is_err() {
        return None;
    }
    let mut refused = None;
    let body = {
        let grow = |n| held.grow(n).map_err(|full| refused = Some(full)).is_ok();
        match length {
            Some(n) => http::read_body(reader, n, deadline, grow),
            None => http::read_chunked_body(reader, max_body, deadline, grow),
        }
    };
    match body {
        Ok(body) => Some(score(Body::new(body, held), ctx, work)),
        Err(HttpError::Refused) => {
            let full = refused.unwrap_or(Full::Total { held: ctx.budget.in_use(), limit: ctx.options.max_body_memory });
            Some(busy(&full))
        }
        Err(HttpError::Timeout) => closing(
            408,
            format!("the request body was not received within {:?} (--read-timeout)", ctx.options.read_timeout),
        ),
        Err(e @ HttpError::TooLarge { .. }) => closing(413, e.to_string()),
        Err(e @ HttpError::Bad(_)) => closing(400, e.to_string()),
        Err(_) => None,
    }
}

/// The answer to a request whose body does not fit in what is left of `--max-body-memory` (in
/// all, or of its address's share: `full` says which); the connection closes, as the rest of
/// the body is not read.
fn busy(full: &Full) -> Response {
    let message = format!("the server is busy: {full}; retry");
    Response { close: true, retry_after: Some(1), ..Response::error(503, message) }
}

/// Scores the records of `body` in jobs of at most `max_batch` records, all by the model
/// generation current now, whatever reloads happen meanwhile.
fn score(body: Body, ctx: &Context, work: &Sender<Work>) -> Response {
    let ranges = match split_records(&body, ctx.options.max_records) {
        Ok(r) => r.ranges,
        Err(e @ BodyError::TooMany { .. }) => return Response::error(413, e.to_string()),
        Err(e) => return Response::error(400, e.to_string()),
    };
    // Held until every job is answered, and let go of before the answer is written.
    let pin = ctx.generations.pin(work);
    let body = Arc::new(body);
    let (reply, answer) = mpsc::channel();
    let stopping = || Response::error(503, "the server is stopping");
    let mut scores = Vec::with_capacity(ranges.len());
    let mut step = None;
    for (k, chunk) in ranges.chunks(ctx.options.limits.max_batch).enumerate() {
        let job = Job {
            body: body.clone(),
            records: chunk.to_vec(),
            first: k * ctx.options.limits.max_batch,
            generation: pin.generation(),
            reply: reply.clone(),
        };
        if work.send(Work::Score(job)).is_err() {
            return stopping();
        }
        match answer.recv() {
            Ok(Reply::Scored { step: s, scores: part }) => {
                step = Some(s);
                scores.extend(part);
            }
            Ok(Reply::BadRecord { index, reason }) => {
                // A record refused for a NaN or Infinity says so, whatever the format saw.
                let record = ranges.get(index).and_then(|r| body.get(r.clone())).unwrap_or_default();
                let reason = non_finite(record).map_or(reason, |n| n.to_string());
                return Response::error(400, format!("record {index}: {reason}"));
            }
            Ok(Reply::Failed(reason)) => return Response::error(500, reason),
            Err(_) => return stopping(),
        }
    }
    drop(pin);
    match step.map(|step| scores_body(step, &scores)) {
        Some(Ok(body)) => Response::json(200, body),
        Some(Err(e)) => Response::error(422, e.to_string()),
        // `split_records` gives at least one record, so at least one job was scored.
        None => Response::error(500, "no record was scored"),
    }
}

/// A score that no JSON number can hold: the model gave `NaN` (or an infinity) for a record,
/// as it can for values far outside those it was trained on (a float overflow in its layers).
#[derive(Debug, thiserror::Error, PartialEq)]
#[error(
    "record {index}: the model's score is {value}, not a finite number (its values may be far outside those \
     the model was trained on)"
)]
struct NonFiniteScore {
    /// The record's index in the request.
    index: usize,
    /// The score.
    value: f32,
}

/// The body of a `200` answer: `{"step": S, "scores": [...]}`, each score in the shortest text
/// that reads back as the same f32. Invariant: the body is valid JSON; a score that is not finite
/// is an error naming the first such record instead, never written.
fn scores_body(step: u64, scores: &[f32]) -> Result<String, NonFiniteScore> {
    if let Some(index) = scores.iter().position(|s| !s.is_finite()) {
        return Err(NonFiniteScore { index, value: scores[index] });
    }
    let list: Vec<String> = scores.iter().map(f32::to_string).collect();
    Ok(format!("{{\"step\":{step},\"scores\":[{}]}}", list.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_scores_name_their_record_and_finite_ones_are_json() {
        let body = scores_body(7, &[0.25, 1.0e-8, 1.0]).unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!((v["step"].as_u64(), v["scores"][1].as_f64().map(|x| x as f32)), (Some(7), Some(1.0e-8)));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let e = scores_body(7, &[0.5, 0.5, bad, f32::NAN]).unwrap_err();
            assert_eq!(e.index, 2);
            assert!(e.to_string().starts_with("record 2: the model's score is "), "{e}");
        }
    }
}
