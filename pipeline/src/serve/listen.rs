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
//!   `503` by the accept loop, without reading it, and closed.
//! * A client address holds at most `max_connections_per_ip` of them; one
//!   more is read once (its head, within the read timeout): `GET /health` is
//!   answered, anything else gets `429`, and it is closed.
//! * A request is received within `read_timeout` of its first byte (head and
//!   body), or answered `408` and closed; a kept-alive connection idle for
//!   `read_timeout` is closed; a response not taken by the client within
//!   `read_timeout` closes the connection.

use super::batcher::Work;
use super::http::{self, HttpError};
use super::{route, Context, Response};
use std::collections::HashMap;
use std::io::BufReader;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
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
    per_ip: HashMap<IpAddr, usize>,
}

/// What a new connection gets.
enum Admission {
    /// Its own thread, for as many requests as it sends.
    Served,
    /// Its own thread for one request: `GET /health`, or `429`.
    OverPerIp,
    /// `503` at once.
    Refused,
}

impl Connections {
    fn admit(&self, ip: IpAddr, max_total: usize, max_per_ip: usize) -> Admission {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.total >= max_total {
            return Admission::Refused;
        }
        open.total += 1;
        let n = open.per_ip.entry(ip).or_insert(0);
        *n += 1;
        if *n > max_per_ip {
            Admission::OverPerIp
        } else {
            Admission::Served
        }
    }

    fn release(&self, ip: IpAddr) {
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
    ip: IpAddr,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.ctx.connections.release(self.ip);
    }
}

/// Accepts connections until `ctx.stop` is set (and a connection wakes the loop).
pub fn accept(listener: TcpListener, ctx: Arc<Context>, work: Sender<Work>) {
    for stream in listener.incoming() {
        if ctx.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut stream) = stream else { continue };
        let Ok(peer) = stream.peer_addr() else { continue };
        let ip = peer.ip();
        let options = &ctx.options;
        let over = match ctx.connections.admit(ip, options.threads, options.max_connections_per_ip) {
            Admission::Refused => {
                let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
                let message = format!("more than {} connections are open; try again", options.threads);
                let _ = http::write_json(&mut stream, 503, &error_body(&message), true, Some(1));
                continue;
            }
            Admission::OverPerIp => true,
            Admission::Served => false,
        };
        let place = Place { ctx: ctx.clone(), ip };
        let work = work.clone();
        let spawned = std::thread::Builder::new()
            .name("serve-conn".into())
            .stack_size(256 << 10)
            .spawn(move || connection(stream, over, &place, &work));
        if let Err(e) = spawned {
            eprintln!("warning: serve: cannot start a connection thread: {e}");
        }
    }
}

fn error_body(message: &str) -> Vec<u8> {
    serde_json::json!({ "error": message }).to_string().into_bytes()
}

/// One connection: its requests, in order, until it closes, breaks a bound or the server stops.
fn connection(stream: TcpStream, over: bool, place: &Place, work: &Sender<Work>) {
    let ctx = &place.ctx;
    let timeout = ctx.options.read_timeout;
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(timeout));
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
                    _ => 400,
                };
                let _ = http::write_json(&mut writer, status, &error_body(&e.to_string()), true, None);
                return;
            }
        };
        let response = if over && !(head.method == "GET" && head.path == "/health") {
            let message =
                format!("more than {} connections from {}; try again", ctx.options.max_connections_per_ip, place.ip);
            Some(Response::closing(429, error_body(&message)))
        } else {
            route(&head, &mut reader, &mut writer, deadline, ctx, work)
        };
        let Some(Response { status, body, close, retry_after }) = response else { return };
        let close = close || over || head.close || stopping();
        if http::write_json(&mut writer, status, &body, close, retry_after).is_err() || close {
            return;
        }
    }
}
