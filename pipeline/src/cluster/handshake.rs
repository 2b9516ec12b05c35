//! The start-up handshake of a cluster run: connect every pair of processes
//! (within a deadline), exchange fingerprints, and only then hand the
//! connections to timely.
//!
//! Connections follow timely's layout: process `i` listens on its own
//! address in the hosts file, connects to every process below it and writes
//! its index as a big-endian `u64` (what timely's own start-up does, so the
//! sockets can be handed to timely unchanged). Every pair also opens a
//! second connection, flagged by the index's top bit, that carries only
//! heartbeats ([`super::liveness`]). Then, on every data connection,
//! both sides write one frame — [`MAGIC`], a big-endian `u64` length, and
//! the JSON of `(process, fingerprint, connect_timeout)` — and read the other's with
//! `read_exact`, so nothing past the frame is consumed and timely's stream
//! starts clean. Process 0 writes its frame first; every other process reads
//! process 0's frame before it writes its own, so that with a checkpoint
//! directory its frame can say whether it finds the marker process 0 wrote
//! there ([`super::shared_dir`]). Fields a frame lacks read as absent, so an
//! older build's frame still parses and the fingerprints' difference names
//! the build ([`super::build`]).
//!
//! Invariants:
//! * **Bounded.** Every connect, accept and read has the same deadline
//!   (`--connect-timeout` from the start of the handshake); a process that is
//!   missing or silent is named with its address when it passes. Refused
//!   connections and failed name look-ups are retried until then; an address
//!   that is not `host:port` fails at once.
//! * **Interruptible.** Every wait (connect, accept, the first byte of a
//!   frame) looks at the SIGINT/SIGTERM flag at least every 200 ms and ends
//!   with [`ClusterFailure::Stopped`] once it is set, naming the process
//!   waited for.
//! * **One heartbeat rate.** Each frame carries its process's
//!   `--connect-timeout`; [`Links::shortest_timeout`] is the shortest, which
//!   sets how often every process beats ([`super::liveness`]).
//! * **Same verdict everywhere.** The connections form a full mesh, so every
//!   process holds every fingerprint (and every process's verdict on the
//!   checkpoint directory) and computes the same differences.
//! * **Settings first.** Differing fingerprints are reported before the
//!   checkpoint directory's check, whose verdicts mean little when the
//!   processes were given different directories or builds.
//! * **Strangers ignored.** A connection that does not speak the handshake
//!   (another program, a process of another run) is dropped with a warning
//!   and the wait goes on.

use super::fingerprint::{differences, Fingerprint};
use super::shared_dir::{self, Found, Marker};
use crate::error::ClusterFailure;
use crate::PipelineError;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The first bytes of a handshake frame (name and protocol version).
pub const MAGIC: &[u8; 8] = b"tdrcHS01";

/// Largest accepted frame (a fingerprint is a few kilobytes).
const MAX_FRAME: u64 = 1 << 20;

/// One process's frame.
#[derive(Serialize, Deserialize)]
struct Hello {
    process: usize,
    fingerprint: Fingerprint,
    /// Process 0, with a checkpoint directory: the marker it wrote there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    marker: Option<Marker>,
    /// Another process, when process 0 named a marker and it has a checkpoint directory:
    /// what it found there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    found: Option<Found>,
    /// Its `--connect-timeout` in seconds: every process beats often enough for the shortest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    connect_timeout: Option<f64>,
}

/// The top bit of the index a connecting process sends: set on heartbeat connections.
const HEARTBEAT_LANE: u64 = 1 << 63;

/// The connections of one process to every other, in process order (`None` at its own index).
pub struct Links {
    /// For timely's traffic.
    pub data: Vec<Option<TcpStream>>,
    /// For heartbeats.
    pub beats: Vec<Option<TcpStream>>,
    /// The shortest `--connect-timeout` of all processes: the silence after which some
    /// process declares a peer lost, so every process beats often enough for it.
    pub shortest_timeout: Duration,
}

/// What the handshake of one process starts from.
pub struct Start<'a> {
    /// This process's index.
    pub me: usize,
    /// `host:port` of every process.
    pub addresses: &'a [String],
    /// The fingerprint every process must have.
    pub mine: &'a Fingerprint,
    /// `--checkpoint-dir`, checked to be one directory for all.
    pub checkpoint_dir: Option<&'a Path>,
    /// This process's `--connect-timeout`.
    pub timeout: Duration,
    /// Set by SIGINT/SIGTERM: the wait for the others ends at once with [`ClusterFailure::Stopped`].
    pub stop: &'a AtomicBool,
}

/// Connects process `start.me` to every other process of `start.addresses` and checks that
/// every fingerprint equals `start.mine` and, with a `checkpoint_dir` (`--checkpoint-dir`, the
/// same path on every process when the fingerprints agree), that it is one directory for all.
pub fn connect_and_agree(start: Start<'_>) -> Result<Links, PipelineError> {
    let Start { me, addresses, mine, checkpoint_dir, timeout, stop } = start;
    let deadline = Instant::now() + timeout;
    let wait = Wait { deadline, secs: timeout.as_secs_f64(), stop };
    // Listen first, so lower processes waiting on this one are not refused longer than needed.
    let listeners = std::iter::once(addresses[me].as_str())
        .map(|a| {
            TcpListener::bind(a).map_err(|e| {
                PipelineError::cluster(
                    ClusterFailure::Listen,
                    None,
                    format!("process {me} cannot listen on {a} (its line in the hosts file)"),
                )
                .with_source(e)
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let none = || -> Vec<Option<TcpStream>> { (0..addresses.len()).map(|_| None).collect() };
    let (mut sockets, mut beats) = (none(), none());
    for (p, address) in addresses.iter().enumerate().take(me) {
        sockets[p] = Some(connect(me, p, address, 0, &wait)?);
        beats[p] = Some(connect(me, p, address, HEARTBEAT_LANE, &wait)?);
    }
    accept(me, addresses, &listeners, [&mut sockets, &mut beats], &wait)?;
    drop(listeners);
    // Process 0 writes its marker (removed when `written` drops), then its frame; every
    // other process reads process 0's frame first, so its own can say what it found.
    let written = match (me, checkpoint_dir) {
        (0, Some(dir)) => Some(Marker::write(dir)?),
        _ => None,
    };
    let mut hello = Hello {
        process: me,
        fingerprint: mine.clone(),
        marker: written.as_ref().map(|w| w.marker.clone()),
        found: None,
        connect_timeout: Some(timeout.as_secs_f64()),
    };
    let mut frames: Vec<(usize, Hello)> = Vec::with_capacity(addresses.len());
    if me != 0 {
        let first = read_hello(&mut sockets, 0, addresses, &wait)?;
        hello.found = first.marker.as_ref().zip(checkpoint_dir).map(|(m, dir)| shared_dir::check(dir, m));
        frames.push((0, first));
    }
    let encoded = serde_json::to_vec(&hello).map_err(|e| {
        PipelineError::cluster(ClusterFailure::Handshake, None, "cannot encode the handshake").with_source(e)
    })?;
    for (p, s) in sockets.iter_mut().enumerate() {
        if let Some(s) = s {
            write_frame(s, &encoded).map_err(|e| lost_during_handshake(p, &addresses[p], e))?;
        }
    }
    for p in (0..addresses.len()).filter(|&p| p != me && (me == 0 || p != 0)) {
        frames.push((p, read_hello(&mut sockets, p, addresses, &wait)?));
    }
    // Every process has looked for the marker by now.
    drop(written);
    frames.push((me, hello));
    frames.sort_by_key(|(p, _)| *p);
    let prints: Vec<(usize, &Fingerprint)> = frames.iter().map(|(p, h)| (*p, &h.fingerprint)).collect();
    let lines = differences(&prints);
    if !lines.is_empty() {
        return Err(PipelineError::cluster(
            ClusterFailure::Disagree,
            None,
            format!(
                "the processes disagree on {} setting{} (every process of a run must run the same tiderec build, \
                 started with the same settings):\n  {}",
                lines.len(),
                if lines.len() == 1 { "" } else { "s" },
                lines.join("\n  ")
            ),
        ));
    }
    if let (Some(dir), Some(marker)) = (checkpoint_dir, frames.first().and_then(|(_, h)| h.marker.as_ref())) {
        let found: Vec<(usize, Found)> = frames.iter().filter_map(|(p, h)| Some((*p, h.found.clone()?))).collect();
        if let Some(reason) = shared_dir::refusal(dir, marker, &found, addresses) {
            return Err(PipelineError::cluster(ClusterFailure::Disagree, None, reason));
        }
    }
    for s in sockets.iter_mut().flatten() {
        s.set_read_timeout(None).and_then(|_| s.set_write_timeout(None)).map_err(io_error)?;
    }
    let shortest_timeout = frames
        .iter()
        .filter_map(|(_, h)| h.connect_timeout)
        .filter(|t| t.is_finite() && *t > 0.0)
        .map(Duration::from_secs_f64)
        .fold(timeout, Duration::min);
    Ok(Links { data: sockets, beats, shortest_timeout })
}

/// How long the start-up waits, and what ends the wait early.
struct Wait<'a> {
    /// When every connect, accept and read gives up.
    deadline: Instant,
    /// `--connect-timeout`, for the messages.
    secs: f64,
    /// Set by SIGINT/SIGTERM.
    stop: &'a AtomicBool,
}

impl Wait<'_> {
    /// The longest one blocking step may take before the stop flag is looked at again.
    const SLICE: Duration = Duration::from_millis(200);

    /// An error when a signal asked this process to stop while it waited for `waiting_for`.
    fn check_stop(&self, waiting_for: impl FnOnce() -> String) -> Result<(), PipelineError> {
        if !self.stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let reason = format!("stopped before training: waiting for {}", waiting_for());
        Err(PipelineError::cluster(ClusterFailure::Stopped, None, reason))
    }

    /// Until the deadline, at most [`Self::SLICE`] (at least a millisecond).
    fn slice(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now()).clamp(Duration::from_millis(1), Self::SLICE)
    }
}

/// Connects to process `p` at `address`, retrying refusals and failed name look-ups until the
/// deadline (or a signal), and sends `me` (with `lane`'s bit). An address that is not
/// `host:port` is refused at once: no retry can mend it.
fn connect(me: usize, p: usize, address: &str, lane: u64, wait: &Wait<'_>) -> Result<TcpStream, PipelineError> {
    loop {
        wait.check_stop(|| format!("process {p} ({address})"))?;
        let last = match try_connect(address, wait) {
            Ok(mut s) => {
                s.set_nodelay(true).map_err(io_error)?;
                set_deadline(&s, wait.deadline);
                s.write_all(&(me as u64 | lane).to_be_bytes()).map_err(|e| lost_during_handshake(p, address, e))?;
                return Ok(s);
            }
            Err(Unreachable::Malformed(e)) => {
                return Err(PipelineError::cluster(
                    ClusterFailure::Connect,
                    Some(p),
                    format!("process {p}'s address {address:?} in the hosts file is not host:port ({e})"),
                ))
            }
            Err(Unreachable::NotYet(e)) => e,
        };
        if Instant::now() >= wait.deadline {
            return Err(PipelineError::cluster(
                ClusterFailure::Connect,
                Some(p),
                format!(
                    "process {me} cannot reach process {p} at {address} within {} s (--connect-timeout): {last}; \
                 is process {p} started, with the same hosts file?",
                    wait.secs
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(100).min(wait.deadline.saturating_duration_since(Instant::now())));
    }
}

/// Why a connection attempt failed.
enum Unreachable {
    /// Refused, timed out, or the name did not resolve (yet): worth another try.
    NotYet(String),
    /// The address cannot be parsed: no retry helps.
    Malformed(String),
}

fn try_connect(address: &str, wait: &Wait<'_>) -> Result<TcpStream, Unreachable> {
    let addrs: Vec<SocketAddr> = match address.to_socket_addrs() {
        Ok(a) => a.collect(),
        // The standard library says `InvalidInput` for a missing or bad port and an
        // unparsable address; a failed look-up is another kind.
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => return Err(Unreachable::Malformed(e.to_string())),
        Err(e) => return Err(Unreachable::NotYet(e.to_string())),
    };
    let mut last = format!("{address} resolves to no address");
    for a in addrs {
        // Short attempts, so that a signal is seen while an unanswered address is tried.
        match TcpStream::connect_timeout(&a, wait.slice().max(Duration::from_millis(10)) * 5) {
            Ok(s) => return Ok(s),
            Err(e) => last = e.to_string(),
        }
    }
    Err(Unreachable::NotYet(last))
}

/// Accepts both connections (data, heartbeats) of every process above `me` until `deadline`.
fn accept(
    me: usize,
    addresses: &[String],
    listeners: &[TcpListener],
    lanes: [&mut Vec<Option<TcpStream>>; 2],
    wait: &Wait<'_>,
) -> Result<(), PipelineError> {
    let deadline = wait.deadline;
    for l in listeners {
        l.set_nonblocking(true).map_err(io_error)?;
    }
    let expected = me + 1..addresses.len();
    let [sockets, beats] = lanes;
    let missing = |sockets: &[Option<TcpStream>], beats: &[Option<TcpStream>], p: usize| {
        sockets[p].is_none() || beats[p].is_none()
    };
    let named = |sockets: &[Option<TcpStream>], beats: &[Option<TcpStream>]| -> Vec<String> {
        expected
            .clone()
            .filter(|&p| missing(sockets, beats, p))
            .map(|p| format!("process {p} ({})", addresses[p]))
            .collect()
    };
    while expected.clone().any(|p| missing(sockets, beats, p)) {
        wait.check_stop(|| named(sockets, beats).join(", "))?;
        let mut accepted = false;
        for l in listeners {
            let (mut s, peer) = match l.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => {
                    return Err(PipelineError::cluster(
                        ClusterFailure::Listen,
                        None,
                        format!("process {me} cannot accept connections"),
                    )
                    .with_source(e))
                }
            };
            accepted = true;
            s.set_nonblocking(false).and_then(|_| s.set_nodelay(true)).map_err(io_error)?;
            // A process sends its index at once; a silent stranger must not hold up the others.
            set_deadline(&s, deadline.min(Instant::now() + Duration::from_secs(5)));
            let mut index = [0u8; 8];
            match s.read_exact(&mut index).map(|_| u64::from_be_bytes(index)) {
                Ok(v) => {
                    let p = (v & !HEARTBEAT_LANE) as usize;
                    let lane = if v & HEARTBEAT_LANE == 0 { &mut *sockets } else { &mut *beats };
                    if expected.contains(&p) && lane[p].is_none() {
                        lane[p] = Some(s);
                    } else {
                        eprintln!("warning: ignoring a connection from {peer} that says it is process {p}");
                    }
                }
                Err(e) => eprintln!("warning: ignoring a connection from {peer}: {e}"),
            }
        }
        if Instant::now() >= deadline {
            let first = expected.clone().find(|&p| missing(sockets, beats, p));
            let missing = named(sockets, beats);
            return Err(PipelineError::cluster(
                ClusterFailure::Connect,
                first,
                format!(
                    "{} did not connect to process {me} within {} s (--connect-timeout); is every \
                     process started, with the same hosts file?",
                    missing.join(", "),
                    wait.secs
                ),
            ));
        }
        if !accepted {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// Reads the frame of process `p` from its data connection, within the deadline; a signal
/// ends the wait for its first byte.
fn read_hello(
    sockets: &mut [Option<TcpStream>],
    p: usize,
    addresses: &[String],
    wait: &Wait<'_>,
) -> Result<Hello, PipelineError> {
    let Some(s) = sockets[p].as_mut() else {
        return Err(PipelineError::cluster(
            ClusterFailure::Handshake,
            Some(p),
            format!("no connection to process {p}"),
        ));
    };
    // Peeked in short slices, so nothing is consumed before the whole frame is read.
    loop {
        wait.check_stop(|| format!("process {p} ({})", addresses[p]))?;
        let _ = s.set_read_timeout(Some(wait.slice()));
        match s.peek(&mut [0u8; 1]) {
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                if Instant::now() >= wait.deadline {
                    return Err(lost_during_handshake(p, &addresses[p], e));
                }
            }
            // Data, the end of the stream or an error: `read_frame` tells which.
            _ => break,
        }
    }
    set_deadline(s, wait.deadline);
    let frame = read_frame(s).map_err(|e| lost_during_handshake(p, &addresses[p], e))?;
    serde_json::from_slice(&frame).map_err(|e| {
        PipelineError::cluster(
            ClusterFailure::Handshake,
            Some(p),
            format!("process {p} ({}) sent a bad handshake", addresses[p]),
        )
        .with_source(e)
    })
}

fn write_frame(s: &mut TcpStream, body: &[u8]) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(16 + body.len());
    frame.extend_from_slice(MAGIC);
    frame.extend_from_slice(&(body.len() as u64).to_be_bytes());
    frame.extend_from_slice(body);
    s.write_all(&frame)?;
    s.flush()
}

fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidData, m);
    let mut head = [0u8; 16];
    s.read_exact(&mut head)?;
    if &head[..8] != MAGIC {
        return Err(invalid("not a tiderec handshake of this version".into()));
    }
    let len = u64::from_be_bytes(head[8..].try_into().expect("8 bytes"));
    if len > MAX_FRAME {
        return Err(invalid(format!("a handshake of {len} bytes")));
    }
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body)?;
    Ok(body)
}

/// Bounds the socket's reads and writes by `deadline` (at least a millisecond).
fn set_deadline(s: &TcpStream, deadline: Instant) {
    let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let _ = s.set_read_timeout(Some(left));
    let _ = s.set_write_timeout(Some(left));
}

fn lost_during_handshake(p: usize, address: &str, e: std::io::Error) -> PipelineError {
    let failed = format!("process {p} ({address}) failed the start-up handshake");
    let why = match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => "did not answer in time",
        std::io::ErrorKind::UnexpectedEof => "closed the connection",
        _ => return PipelineError::cluster(ClusterFailure::Handshake, Some(p), failed).with_source(e),
    };
    PipelineError::cluster(ClusterFailure::Handshake, Some(p), format!("{failed}: {why}"))
}

fn io_error(e: std::io::Error) -> PipelineError {
    PipelineError::cluster(ClusterFailure::Handshake, None, "cluster connection").with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(stop: &AtomicBool, secs: u64) -> Wait<'_> {
        Wait { deadline: Instant::now() + Duration::from_secs(secs), secs: secs as f64, stop }
    }

    #[test]
    fn an_address_without_a_port_fails_at_once_and_a_refused_one_is_retried() {
        let stop = AtomicBool::new(false);
        let started = Instant::now();
        let e = connect(1, 0, "127.0.0.1", 0, &wait(&stop, 5)).unwrap_err().to_string();
        assert!(started.elapsed() < Duration::from_secs(1), "no retry: {:?}", started.elapsed());
        assert!(e.contains("address \"127.0.0.1\" in the hosts file is not host:port"), "{e}");
        // Nothing listens there: refused, retried to the deadline.
        let free = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let started = Instant::now();
        let e = connect(1, 0, &free.to_string(), 0, &wait(&stop, 1)).unwrap_err().to_string();
        assert!(started.elapsed() >= Duration::from_millis(900), "retried: {:?}", started.elapsed());
        assert!(e.contains("is process 0 started"), "{e}");
    }

    #[test]
    fn a_set_stop_flag_ends_the_wait_naming_the_process_waited_for() {
        let stop = AtomicBool::new(true);
        let free = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let e = connect(1, 0, &free.to_string(), 0, &wait(&stop, 30)).unwrap_err();
        assert!(matches!(e, PipelineError::Cluster { failure: ClusterFailure::Stopped, .. }), "{e}");
        assert_eq!(e.to_string(), format!("stopped before training: waiting for process 0 ({free})"));
    }
}
