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
//! the JSON of `(process, fingerprint)` — and read the other's with
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
//!   missing or silent is named with its address when it passes.
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
}

/// The top bit of the index a connecting process sends: set on heartbeat connections.
const HEARTBEAT_LANE: u64 = 1 << 63;

/// The connections of one process to every other, in process order (`None` at its own index).
pub struct Links {
    /// For timely's traffic.
    pub data: Vec<Option<TcpStream>>,
    /// For heartbeats.
    pub beats: Vec<Option<TcpStream>>,
}

/// Connects process `me` to every other process of `addresses` and checks that every
/// fingerprint equals `mine` and, with a `checkpoint_dir` (`--checkpoint-dir`, the same
/// path on every process when the fingerprints agree), that it is one directory for all.
pub fn connect_and_agree(
    me: usize,
    addresses: &[String],
    mine: &Fingerprint,
    checkpoint_dir: Option<&Path>,
    timeout: Duration,
) -> Result<Links, PipelineError> {
    let deadline = Instant::now() + timeout;
    let secs = timeout.as_secs_f64();
    // Listen first, so lower processes waiting on this one are not refused longer than needed.
    let listeners = addresses[me]
        .split_whitespace()
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
        sockets[p] = Some(connect(me, p, address, 0, deadline, secs)?);
        beats[p] = Some(connect(me, p, address, HEARTBEAT_LANE, deadline, secs)?);
    }
    accept(me, addresses, &listeners, [&mut sockets, &mut beats], deadline, secs)?;
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
    };
    let mut frames: Vec<(usize, Hello)> = Vec::with_capacity(addresses.len());
    if me != 0 {
        let first = read_hello(&mut sockets, 0, addresses, deadline)?;
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
        frames.push((p, read_hello(&mut sockets, p, addresses, deadline)?));
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
    Ok(Links { data: sockets, beats })
}

/// Connects to process `p` at `address`, retrying until `deadline`, and sends `me` (with `lane`'s bit).
fn connect(
    me: usize,
    p: usize,
    address: &str,
    lane: u64,
    deadline: Instant,
    secs: f64,
) -> Result<TcpStream, PipelineError> {
    loop {
        let last = match try_connect(address, deadline) {
            Ok(mut s) => {
                s.set_nodelay(true).map_err(io_error)?;
                set_deadline(&s, deadline);
                s.write_all(&(me as u64 | lane).to_be_bytes()).map_err(|e| lost_during_handshake(p, address, e))?;
                return Ok(s);
            }
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(PipelineError::cluster(
                ClusterFailure::Connect,
                Some(p),
                format!(
                    "process {me} cannot reach process {p} at {address} within {secs} s (--connect-timeout): {last}; \
                 is process {p} started, with the same hosts file?"
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(100).min(deadline.saturating_duration_since(Instant::now())));
    }
}

fn try_connect(address: &str, deadline: Instant) -> Result<TcpStream, String> {
    let addrs: Vec<SocketAddr> = address.to_socket_addrs().map_err(|e| e.to_string())?.collect();
    let mut last = format!("{address} resolves to no address");
    for a in addrs {
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10));
        match TcpStream::connect_timeout(&a, left) {
            Ok(s) => return Ok(s),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

/// Accepts both connections (data, heartbeats) of every process above `me` until `deadline`.
fn accept(
    me: usize,
    addresses: &[String],
    listeners: &[TcpListener],
    lanes: [&mut Vec<Option<TcpStream>>; 2],
    deadline: Instant,
    secs: f64,
) -> Result<(), PipelineError> {
    for l in listeners {
        l.set_nonblocking(true).map_err(io_error)?;
    }
    let expected = me + 1..addresses.len();
    let [sockets, beats] = lanes;
    let missing = |sockets: &[Option<TcpStream>], beats: &[Option<TcpStream>], p: usize| {
        sockets[p].is_none() || beats[p].is_none()
    };
    while expected.clone().any(|p| missing(sockets, beats, p)) {
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
            let missing: Vec<String> = expected
                .clone()
                .filter(|&p| missing(sockets, beats, p))
                .map(|p| format!("process {p} ({})", addresses[p]))
                .collect();
            return Err(PipelineError::cluster(
                ClusterFailure::Connect,
                first,
                format!(
                    "{} did not connect to process {me} within {secs} s (--connect-timeout); is every \
                     process started, with the same hosts file?",
                    missing.join(", ")
                ),
            ));
        }
        if !accepted {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// Reads the frame of process `p` from its data connection, within `deadline`.
fn read_hello(
    sockets: &mut [Option<TcpStream>],
    p: usize,
    addresses: &[String],
    deadline: Instant,
) -> Result<Hello, PipelineError> {
    let Some(s) = sockets[p].as_mut() else {
        return Err(PipelineError::cluster(
            ClusterFailure::Handshake,
            Some(p),
            format!("no connection to process {p}"),
        ));
    };
    set_deadline(s, deadline);
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
