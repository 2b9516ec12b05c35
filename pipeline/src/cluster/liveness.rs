//! Heartbeats between the processes of a running cluster.
//!
//! A process that dies closes its connections and timely reports it
//! ([`super::lost_peer`]); one that is stopped (`SIGSTOP`), hung or cut off
//! by the network closes nothing, and timely would wait for it forever. So
//! every pair of processes keeps a second connection ([`super::handshake`])
//! on which each side writes one byte every [`interval`] and reads with a
//! timeout: a peer silent for the whole timeout is reported through
//! `on_silence` (which ends the run). The end of a heartbeat stream, or
//! an error on it, is not a verdict: a peer that finished its run closes it
//! normally, and a dead one is reported by timely.
//!
//! The threads are detached; they stop on their own once `done` is set (a
//! reader within one timeout, a writer within one interval) or their
//! connection ends.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Time between two heartbeats for a silence `timeout`: a quarter of it, at most one second.
pub fn interval(timeout: Duration) -> Duration {
    (timeout / 4).min(Duration::from_secs(1))
}

/// Starts a writer and a reader thread for the heartbeat connection to every process in
/// `beats`; `on_silence(p)` runs when process `p` sent nothing for `timeout` while `done`
/// is unset.
pub fn watch(
    beats: Vec<Option<TcpStream>>,
    timeout: Duration,
    done: Arc<AtomicBool>,
    on_silence: Arc<dyn Fn(usize) + Send + Sync>,
) -> std::io::Result<()> {
    for (p, stream) in beats.into_iter().enumerate() {
        let Some(stream) = stream else { continue };
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut writer = stream.try_clone()?;
        let writer_done = done.clone();
        std::thread::Builder::new().name(format!("tiderec:beat-to-{p}")).spawn(move || {
            while !writer_done.load(Ordering::Relaxed) && writer.write_all(&[1]).is_ok() {
                std::thread::sleep(interval(timeout));
            }
        })?;
        let (mut reader, done, on_silence) = (stream, done.clone(), on_silence.clone());
        std::thread::Builder::new().name(format!("tiderec:beat-from-{p}")).spawn(move || {
            let mut buf = [0u8; 64];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        if !done.load(Ordering::Relaxed) {
                            on_silence(p);
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
