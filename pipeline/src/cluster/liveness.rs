//! Heartbeats between the processes of a running cluster.
//!
//! A process that dies closes its connections and timely reports it
//! ([`super::lost_peer`]); one that is stopped (`SIGSTOP`), hung or cut off
//! by the network closes nothing, and timely would wait for it forever. So
//! every pair of processes keeps a second connection ([`super::handshake`])
//! on which each side writes one byte every [`interval`] of the shortest
//! `--connect-timeout` of all processes (each tells the others its own in
//! the handshake) and reads with its own timeout: a peer silent for the
//! whole timeout is reported through
//! `on_lost` (which ends the run). The end of a heartbeat stream, or
//! an error on it, is not a verdict: a peer that finished its run closes it
//! normally, and a dead one is reported by timely.
//!
//! The byte says how the writer stands: [`ALIVE`], or [`FAILED`] once one of its
//! workers failed with an error of its own ([`super::failure`]), which its peers'
//! workers may never learn of through the dataflow: a reader that sees it reports
//! the writer through `on_lost` unless its own workers have ended within a short
//! grace (a failure inside a step reaches them through the step).
//!
//! The threads are detached; they stop on their own once `done` is set (a
//! reader within one timeout, a writer within one interval) or their
//! connection ends.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::failure::Failure;

/// Time between two heartbeats for a silence `timeout`: a quarter of it, at most one second.
pub fn interval(timeout: Duration) -> Duration {
    (timeout / 4).min(Duration::from_secs(1))
}

/// The heartbeat of a process whose workers have not failed.
pub const ALIVE: u8 = 1;
/// The heartbeat of a process one of whose workers failed with its own error.
pub const FAILED: u8 = 2;

/// How long after a peer's [`FAILED`] this process's workers may take to end on their own.
const FAILED_GRACE: Duration = Duration::from_secs(2);

/// What the heartbeat threads of a process share.
#[derive(Clone)]
pub struct Beats {
    /// A peer silent this long is lost (this process's `--connect-timeout`).
    pub timeout: Duration,
    /// Time between two heartbeats this process writes: [`interval`] of the shortest
    /// timeout of all processes, so that no peer's reader finds it silent.
    pub interval: Duration,
    /// Set once the local workers are joined.
    pub done: Arc<AtomicBool>,
    /// This process's workers' first error: the byte written says whether there is one.
    pub failure: Arc<Failure>,
}

/// Starts a writer and a reader thread for the heartbeat connection to every process in
/// `streams`; `on_lost(p, cause)` runs when process `p` sent nothing for the timeout while
/// `done` is unset, or sent [`FAILED`].
pub fn watch(
    streams: Vec<Option<TcpStream>>,
    beats: Beats,
    on_lost: Arc<dyn Fn(usize, String) + Send + Sync>,
) -> std::io::Result<()> {
    for (p, stream) in streams.into_iter().enumerate() {
        let Some(stream) = stream else { continue };
        stream.set_read_timeout(Some(beats.timeout))?;
        stream.set_write_timeout(Some(beats.timeout))?;
        let mut writer = stream.try_clone()?;
        let mine = beats.clone();
        std::thread::Builder::new().name(format!("tiderec:beat-to-{p}")).spawn(move || {
            let beat = || if mine.failure.failed() { FAILED } else { ALIVE };
            while !mine.done.load(Ordering::Relaxed) && writer.write_all(&[beat()]).is_ok() {
                std::thread::sleep(mine.interval);
            }
            // The last word of a failed process, should it end before the next beat.
            if mine.failure.failed() {
                let _ = writer.write_all(&[FAILED]);
            }
        })?;
        let (mut reader, beats, on_lost) = (stream, beats.clone(), on_lost.clone());
        std::thread::Builder::new().name(format!("tiderec:beat-from-{p}")).spawn(move || {
            let mut buf = [0u8; 64];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) if buf[..n].contains(&FAILED) => {
                        // A failure inside a step reaches this process's workers through the
                        // step, and they end on their own: only one they never learn of
                        // (they are still running after a while) makes the peer lost.
                        std::thread::sleep(FAILED_GRACE);
                        if !beats.done.load(Ordering::Relaxed) {
                            on_lost(p, "it stopped with an error of its own (its output names it)".into());
                        }
                        return;
                    }
                    Ok(_) => {}
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        if !beats.done.load(Ordering::Relaxed) {
                            let secs = beats.timeout.as_secs_f64();
                            on_lost(
                                p,
                                format!(
                                    "it sent no heartbeat for {secs} s (--connect-timeout): it is stopped, hung or \
                                     cut off"
                                ),
                            );
                        }
                        return;
                    }
                    Err(_) => return,
                }
            }
        })?;
    }
    Ok(())
}
