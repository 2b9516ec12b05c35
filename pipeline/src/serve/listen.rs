//! Accepting connections: one thread per open connection, bounded in all and
//! per client address, each reading its requests under the read timeout.
//!
//! The accept layer is `std::net` and [`super::http`] rather than an HTTP
//! library, because every bound here needs the socket: its read timeout (to
//! give up a slow body with `408` and free the thread), the peer's address at
//! accept (to bound connections per client), and the connection count (to
//! refuse the excess at once instead of queueing it behind held threads).
//!
//! Invariants:
//! * A connection never waits for another: it has its own thread from
//!   accept to close, so `GET /health` and `GET /schema` are answered while
//!   any number of other connections are slow or scoring.
//! * At most `max_connections` connections are open; one more is answered
//!   `503` without its request being parsed, and closed.
//! * A client address (an IPv6 client's /64 prefix, [`ClientKey`]) holds at
//!   most `max_connections_per_ip` of them; one
//!   more is answered `429` the same way: it gets no thread of its own and
//!   is not counted among the open ones, so one address cannot take the
//!   places of others, however many connections it opens.
//! * A request is received within `read_timeout` of its first byte (head and
//!   body), or answered `408` and closed; a kept-alive connection idle for
//!   `read_timeout` is closed; a response not taken whole by the client
//!   within `read_timeout` from the start of its writing closes the
//!   connection, however slowly the client keeps reading it.
//! * A refusal by the accept loop is answered by one thread of its own, each
//!   within twice [`REFUSAL_WRITE`], from a queue of [`REFUSALS_QUEUED`] (more are
//!   closed unanswered), so clients that do not read cannot hold the accept loop.
//! * A connection closed by the server after an answer (a refusal, an error
//!   that leaves a body unread, `Connection: close`) is closed by [`linger`]:
//!   its write half shut, then what the client still sends read and dropped
//!   for a bounded time and number of bytes, so that the close does not reset
//!   the connection while the answer is on its way.
//! * An accept that fails (no file descriptor left, …) pauses the accept
//!   loop, from [`ACCEPT_PAUSE_MIN`] doubling to [`ACCEPT_PAUSE_MAX`] while
//!   accepts keep failing, reported once per such run: the loop never spins.

use super::address::ClientKey;
use super::batcher::Work;
use super::http::{self, HttpError};
use super::{route, Context, Response};
use std::collections::HashMap;
use std::io::BufReader;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{sync_channel, Sender, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The connections open, in all and per client address.
#[derive(Default)]
pub struct Connections {
    open: Mutex<Open>,
    closed: Condvar,
}

#[derive(Default)]
struct Open {
    total: usize,
    per_ip: HashMap<ClientKey, usize>,
}

/// The longest time the accept loop spends writing a refusal.
const REFUSAL_WRITE: Duration = Duration::from_millis(100);
/// The most bytes of a refused connection's request that are read and dropped.
const REFUSAL_DRAIN: usize = 64 << 10;
/// Refused connections waiting for their answer; more are closed unanswered.
const REFUSALS_QUEUED: usize = 64;
/// The first pause of the accept loop after a failed accept.
const ACCEPT_PAUSE_MIN: Duration = Duration::from_millis(10);
/// The longest pause of the accept loop after failed accepts.
const ACCEPT_PAUSE_MAX: Duration = Duration::from_millis(200);

/// What a new connection gets.
enum Admission {
    /// Its own thread, for as many requests as it sends (counted until it closes).
    Served,
    /// `429` at once: its address holds `max_per_ip` connections already (not counted).
    OverPerIp,
    /// `503` at once: `max_total` connections are open (not counted).
    Refused,
}

impl Connections {
    /// Admits a connection from the client `ip`, counting it, or says why not (counting nothing).
    fn admit(&self, ip: ClientKey, max_total: usize, max_per_ip: usize) -> Admission {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.per_ip.get(&ip).is_some_and(|&n| n >= max_per_ip) {
            return Admission::OverPerIp;
        }
        if open.total >= max_total {
            return Admission::Refused;
        }
        open.total += 1;
        *open.per_ip.entry(ip).or_insert(0) += 1;
        Admission::Served
    }

    fn release(&self, ip: ClientKey) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.per_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                open.per_ip.remove(&ip);
            }
        }
        self.closed.notify_all();
    }

    /// Waits until every connection is closed, or `within` has passed.
    pub fn wait_closed(&self, within: Duration) {
        let deadline = Instant::now() + within;
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while open.total > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            open = self.closed.wait_timeout(open, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }
}

/// Releases a connection's place when its thread ends, however it ends.
struct Place {
    ctx: Arc<Context>,
    ip: ClientKey,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.ctx.connections.release(self.ip);
    }
}

/// The pause of the accept loop after failed accepts ([`ACCEPT_PAUSE_MIN`] doubling to
/// [`ACCEPT_PAUSE_MAX`]), and whether a run of failures is under way.
#[derive(Default)]
struct Backoff {
    pause: Option<Duration>,
}

/// Whether a failed accept means the process or the system ran out of something (file
/// descriptors, buffers, memory), which only a pause can wait out; another error (a
/// client that reset its connection before it was accepted) concerns one connection.
fn exhausted(e: &std::io::Error) -> bool {
    // EMFILE, ENFILE, ENOBUFS, ENOMEM on Linux.
    matches!(e.raw_os_error(), Some(24 | 23 | 105 | 12))
}

impl Backoff {
    /// Pauses after the failed accept `e`, longer than after the last one of the same run;
    /// the first failure of a run is reported.
    fn failed(&mut self, e: &std::io::Error) {
        let pause = match self.pause {
            None => {
                eprintln!("warning: serve: cannot accept a connection: {e}; pausing the accept loop while this lasts");
                ACCEPT_PAUSE_MIN
            }
            Some(p) => (p * 2).min(ACCEPT_PAUSE_MAX),
        };
        self.pause = Some(pause);
        std::thread::sleep(pause);
    }

    /// Ends a run of failures with an accepted connection.
    fn accepted(&mut self) {
        if self.pause.take().is_some() {
            eprintln!("serve: accepting connections again");
        }
    }
}

/// Accepts connections until `ctx.stop` is set (and a connection wakes the loop).
pub fn accept(listener: TcpListener, ctx: Arc<Context>, work: Sender<Work>) {
    let refusals = refusal_thread();
    let mut backoff = Backoff::default();
    for stream in listener.incoming() {
        if ctx.stop.load(Ordering::SeqCst) {
            return;
        }
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) if exhausted(&e) => {
                backoff.failed(&e);
                continue;
            }
            Err(_) => continue,
        };
        backoff.accepted();
        let Ok(peer) = stream.peer_addr() else { continue };
        // The one key both per-address bounds count (connections here, body memory in `route`).
        let ip = ClientKey::of(peer.ip());
        let options = &ctx.options;
        match ctx.connections.admit(ip, options.threads, options.max_connections_per_ip) {
            Admission::Served => {}
            Admission::Refused => {
                let message = format!("more than {} connections are open; try again", options.threads);
                hand_over(&refusals, stream, 503, message);
                continue;
            }
            Admission::OverPerIp => {
                let message = format!("more than {} connections from {ip}; try again", options.max_connections_per_ip);
                hand_over(&refusals, stream, 429, message);
                continue;
            }
        }
        let place = Place { ctx: ctx.clone(), ip };
        let work = work.clone();
        let spawned = std::thread::Builder::new()
            .name("serve-conn".into())
            .stack_size(256 << 10)
            .spawn(move || connection(stream, &place, &work));
        if let Err(e) = spawned {
            eprintln!("warning: serve: cannot start a connection thread: {e}");
        }
    }
}

fn error_body(message: &str) -> Vec<u8> {
    serde_json::json!({ "error": message }).to_string().into_bytes()
}

/// A connection refused by the accept loop: its stream, the status and the message.
type Refusal = (TcpStream, u16, String);

/// The one thread that answers refused connections, fed by a queue of
/// [`REFUSALS_QUEUED`]; `None` where it cannot start (refused connections are then
/// closed unanswered).
fn refusal_thread() -> Option<SyncSender<Refusal>> {
    let (send, receive) = sync_channel::<Refusal>(REFUSALS_QUEUED);
    let spawned = std::thread::Builder::new().name("serve-refuse".into()).stack_size(256 << 10).spawn(move || {
        for (mut stream, status, message) in receive {
            refuse(&mut stream, status, &message);
        }
    });
    match spawned {
        Ok(_) => Some(send),
        Err(e) => {
            eprintln!("warning: serve: cannot start the thread answering refused connections: {e}");
            None
        }
    }
}

/// Queues a refused connection for its answer without waiting; with the queue full it is
/// closed unanswered (the accept loop never waits on a refused client).
fn hand_over(refusals: &Option<SyncSender<Refusal>>, stream: TcpStream, status: u16, message: String) {
    if let Some(queue) = refusals {
        let _ = queue.try_send((stream, status, message));
    }
}

/// Answers a connection that is not admitted with `status` (and `Retry-After: 1`) and
/// closes it, within [`REFUSAL_WRITE`] for the answer and as long again for the rest
/// ([`linger`]).
fn refuse(stream: &mut TcpStream, status: u16, message: &str) {
    let deadline = Instant::now() + REFUSAL_WRITE;
    if http::write_json(stream, status, &error_body(message), true, Some(1), deadline).is_ok() {
        linger(stream);
    }
}

/// Closes the write half of `stream`, whose answer is written, then reads and drops what
/// the client sends for at most [`REFUSAL_WRITE`] (up to [`REFUSAL_DRAIN`] bytes, or until it
/// closes), since a socket closed with unread bytes is reset, and a reset can take the
/// answer from a client before it reads it.
fn linger(stream: &mut TcpStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let (deadline, mut left) = (Instant::now() + REFUSAL_WRITE, REFUSAL_DRAIN);
    let mut buf = [0u8; 16 << 10];
    while left > 0 {
        let wait = deadline.saturating_duration_since(Instant::now());
        if wait.is_zero() || stream.set_read_timeout(Some(wait)).is_err() {
            break;
        }
        match std::io::Read::read(stream, &mut buf) {
            Ok(n) if n > 0 => left = left.saturating_sub(n),
            _ => break,
        }
    }
}

/// One connection: its requests, in order, until it closes, breaks a bound or the server stops.
fn connection(stream: TcpStream, place: &Place, work: &Sender<Work>) {
    let ctx = &place.ctx;
    let timeout = ctx.options.read_timeout;
    let _ = stream.set_nodelay(true);
    let Ok(read_half) = stream.try_clone() else { return };
    let mut reader = BufReader::new(read_half);
    let mut writer = stream;
    loop {
        let stopping = || ctx.stop.load(Ordering::SeqCst);
        if !matches!(http::wait_for_request(&mut reader, timeout, stopping), Ok(true)) {
            return;
        }
        let deadline = Instant::now() + timeout;
        let head = match http::read_head(&mut reader, deadline) {
            Ok(head) => head,
            Err(HttpError::Closed | HttpError::Io(_)) => return,
            Err(e) => {
                let status = match e {
                    HttpError::Timeout => 408,
                    HttpError::HeadTooLarge => 431,
                    HttpError::Version(_) => 505,
                    _ => 400,
                };
                let response = Response { close: true, ..Response::error(status, e.to_string()) };
                answer(&mut writer, response, timeout);
                return;
            }
        };
        let response = route(&head, &mut reader, &mut writer, deadline, place.ip, ctx, work);
        let Some(response) = response else { return };
        let close = response.close || head.close || stopping();
        if !answer(&mut writer, Response { close, ..response }, timeout) {
            return;
        }
    }
}

/// Writes `response`, taken whole by the client within `timeout` from now or not at all;
/// `true` when the connection stays open for the next request. A connection that closes
/// after its answer is closed by [`linger`] (the request's body may be left unread).
fn answer(writer: &mut TcpStream, response: Response, timeout: Duration) -> bool {
    let Response { status, body, close, retry_after } = response;
    let deadline = Instant::now() + timeout;
    if http::write_json(writer, status, &body, close, retry_after, deadline).is_err() {
        return false;
    }
    if close {
        linger(writer);
    }
    !close
}
