//! Whether `--checkpoint-dir` is one directory for every process of a cluster
//! run, checked during the handshake.
//!
//! Every worker writes its shard of a checkpoint into the temporary directory
//! that worker 0 creates and names by its path (`DIR/.tmp-ckpt-<step>-<pid>`,
//! see [`crate::checkpointing`]), and process 0 completes the checkpoint
//! there. So `DIR` must be the same path on every process (the
//! [fingerprint](super::fingerprint) compares it) and that path must be the
//! same directory on every host: one machine, or a shared file system.
//! Otherwise a shard's write fails, or lands where process 0 never looks, and
//! no checkpoint is ever complete, which a run would only find at its first
//! checkpoint or at a resume (each process resumes from its own `DIR`).
//!
//! The check: process 0 writes a marker file holding a random token into its
//! `DIR` ([`Marker::write`]) before it sends its handshake frame, which names
//! the marker; every other process reads process 0's frame first, looks for
//! the marker in its own `DIR` ([`check`]) and sends what it found in its own
//! frame. Every process thus holds every verdict and all stop with the same
//! error ([`refusal`]), naming the directory as each process resolves it.
//!
//! Invariants:
//! * **Read after written.** A process reads the marker only after it
//!   received process 0's frame, which process 0 sends only once the marker
//!   is written, synced and closed (close-to-open consistency, NFS included).
//! * **Removed.** Process 0 removes the marker once it holds every frame, and
//!   when its handshake fails ([`Written`] removes it on drop); only a process
//!   killed during the handshake leaves one (a 32-byte `.tiderec-handshake-*`
//!   file that listing, resuming and pruning checkpoints ignore).
//! * **One host passes.** Processes on one machine with one `DIR` (the tests'
//!   clusters on 127.0.0.1) find the marker: it is the same directory.

use crate::PipelineError;
use serde::{Deserialize, Serialize};
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The start of a marker file's name (then its token).
pub const PREFIX: &str = ".tiderec-handshake-";

/// What process 0 wrote, as its handshake frame names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// The random token: the file's name ends with it, and it is the file's content.
    pub token: String,
    /// Process 0's `DIR`, absolute, as process 0 resolves it (for the error).
    pub dir: String,
}

/// What a process other than 0 found in its own `DIR`, as its handshake frame says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Found {
    /// Its `DIR`, absolute, as it resolves it.
    pub dir: String,
    /// Why the marker is not there (`None`: it is, with the token).
    pub problem: Option<String>,
}

/// A marker file process 0 wrote: removed when dropped.
#[derive(Debug)]
pub struct Written {
    /// What the handshake frame says of it.
    pub marker: Marker,
    path: PathBuf,
}

impl Marker {
    /// Writes a new marker into `dir` (process 0, before its handshake frame).
    pub fn write(dir: &Path) -> Result<Written, PipelineError> {
        let token = token();
        let path = dir.join(format!("{PREFIX}{token}"));
        let written = std::fs::File::options()
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|mut f| f.write_all(token.as_bytes()).and_then(|_| f.sync_all()));
        let marker = Marker { token, dir: absolute(dir) };
        // Removed on every path from here, even if writing failed half-way.
        let written_marker = Written { marker, path };
        written.map_err(|e| {
            PipelineError::config(
                "checkpoint_dir",
                format!(
                    "cannot write {} to check that every process of the run shares {}: {e}",
                    written_marker.path.display(),
                    dir.display()
                ),
            )
        })?;
        Ok(written_marker)
    }

    /// The marker file's name.
    pub fn file_name(&self) -> String {
        format!("{PREFIX}{}", self.token)
    }
}

impl Drop for Written {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What a process whose `DIR` is `dir` finds of process 0's `marker`.
pub fn check(dir: &Path, marker: &Marker) -> Found {
    let path = dir.join(marker.file_name());
    let problem = match std::fs::read(&path) {
        Ok(content) if content == marker.token.as_bytes() => None,
        Ok(_) => Some(format!("{} holds another token", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(format!("there is no {}", marker.file_name())),
        Err(e) => Some(format!("cannot read {}: {e}", path.display())),
    };
    Found { dir: absolute(dir), problem }
}

/// The error of a run whose processes do not all find process 0's `marker` in their own
/// `DIR` (`found`: by process, those of the processes that looked), or `None` when all do.
/// `addresses` are the hosts file's, `dir` the `--checkpoint-dir` every process was given.
pub fn refusal(dir: &Path, marker: &Marker, found: &[(usize, Found)], addresses: &[String]) -> Option<String> {
    let address = |p: usize| addresses.get(p).map_or("?", String::as_str);
    let missing: Vec<String> = found
        .iter()
        .filter_map(|(p, f)| {
            let problem = f.problem.as_ref()?;
            Some(format!("process {p} ({}) does not find it in {}: {problem}", address(*p), f.dir))
        })
        .collect();
    if missing.is_empty() {
        return None;
    }
    Some(format!(
        "--checkpoint-dir {} is not one directory shared by every process: process 0 ({}) wrote {} into {}, but \
         {}. Every process writes its part of each checkpoint into the directory process 0 names, and process 0 \
         completes the checkpoint there, so --checkpoint-dir must name the same directory on every host (one \
         machine, or a file system they share)",
        dir.display(),
        address(0),
        marker.file_name(),
        marker.dir,
        missing.join("; ")
    ))
}

/// `dir` made absolute against this process's working directory (as given if that fails).
fn absolute(dir: &Path) -> String {
    std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf()).display().to_string()
}

/// 32 hex digits no other run is likely to pick: two hashes keyed by the system's
/// randomness ([`RandomState`]) of the time and this process's id.
fn token() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let seed = (now, std::process::id());
    format!("{:016x}{:016x}", RandomState::new().hash_one(seed), RandomState::new().hash_one(seed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn the_same_directory_finds_the_marker_and_it_is_removed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let written = Marker::write(dir.path()).unwrap();
        assert_eq!(names(dir.path()), vec![written.marker.file_name()]);
        let found = check(dir.path(), &written.marker);
        assert_eq!(found.problem, None);
        assert_eq!(refusal(dir.path(), &written.marker, &[(1, found.clone()), (2, found)], &[]), None);
        drop(written);
        assert!(names(dir.path()).is_empty(), "the marker is removed");
    }

    #[test]
    fn another_directory_is_refused_naming_both_and_the_process() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let written = Marker::write(a.path()).unwrap();
        let found = check(b.path(), &written.marker);
        assert_eq!(found.problem.as_deref(), Some(format!("there is no {}", written.marker.file_name()).as_str()));
        let addresses = ["h0:1".to_string(), "h1:2".to_string()];
        let err = refusal(Path::new("ck"), &written.marker, &[(1, found)], &addresses).unwrap();
        assert!(err.starts_with("--checkpoint-dir ck is not one directory shared by every process"), "{err}");
        assert!(err.contains(&format!("process 0 (h0:1) wrote {}", written.marker.file_name())), "{err}");
        assert!(err.contains(&format!("into {}", a.path().display())), "{err}");
        assert!(err.contains(&format!("process 1 (h1:2) does not find it in {}", b.path().display())), "{err}");
    }

    #[test]
    fn a_stale_file_of_the_same_name_is_not_taken_for_the_marker() {
        let dir = tempfile::tempdir().unwrap();
        let marker = Marker { token: "0123".into(), dir: String::new() };
        std::fs::write(dir.path().join(marker.file_name()), "another").unwrap();
        assert!(check(dir.path(), &marker).problem.unwrap().contains("holds another token"));
    }

    #[test]
    fn tokens_differ() {
        assert_ne!(token(), token());
        assert_eq!(token().len(), 32);
    }
}
