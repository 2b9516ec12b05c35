//! One writer per directory: an advisory lock on a file inside a directory
//! that a run writes (a checkpoint directory, `convert`'s output).
//!
//! **Invariant.** While a [`DirLock`] lives, no other process, and no other
//! `DirLock` of this process, holds the same lock file: [`DirLock::acquire`]
//! takes an exclusive `flock` without waiting and otherwise refuses with
//! [`LockError::Held`], naming the directory and the holder (its command, pid
//! and host, which the holder writes into the file once it has the lock).
//!
//! The kernel releases the lock when the holder's file is closed: when the
//! `DirLock` is dropped, when the process exits, and when it is killed, even
//! by SIGKILL. A lock file left behind therefore never blocks a later run; it
//! only records its last holder. It is never removed: a run that removed it
//! could let two later runs lock two different files of the same name.
//!
//! The processes of one cluster run all write into the checkpoint directory
//! (each its own workers' shards), so each locks its own file
//! ([`lock_file_name`]): `.lock` for process 0 (and every single-process
//! run), `.lock.p<k>` for process `k`. Every run has a process 0, so two runs
//! on one directory always meet at `.lock`; processes of one run never do.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The lock file of process 0 and of single-process runs.
pub const LOCK_FILE: &str = ".lock";

/// The lock file of process `process` of a run: [`LOCK_FILE`] for process 0,
/// `.lock.p<k>` for process `k` (as dead-letter files are suffixed).
pub fn lock_file_name(process: usize) -> String {
    match process {
        0 => LOCK_FILE.to_string(),
        k => format!("{LOCK_FILE}.p{k}"),
    }
}

/// Whether a directory entry named `name` is a lock file of this module.
pub fn is_lock_file(name: &str) -> bool {
    let process = name.strip_prefix(LOCK_FILE).map(|rest| rest.strip_prefix(".p"));
    match process {
        Some(None) => name == LOCK_FILE,
        Some(Some(k)) => !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    }
}

/// Errors taking a directory's lock.
#[derive(Debug, Error)]
pub enum LockError {
    /// Another run (or another lock of this process) holds the lock.
    #[error(
        "{} is in use by another run: {holder} holds its lock {}; wait for that run to end or stop it, or use \
         another directory",
        .dir.display(),
        .lock.display()
    )]
    Held {
        /// The locked directory.
        dir: PathBuf,
        /// Its lock file.
        lock: PathBuf,
        /// Who holds it, as it wrote itself into the lock file.
        holder: Holder,
    },
    /// The directory or its lock file could not be created, opened, locked or written.
    #[error("cannot lock {}: {source}", .path.display())]
    Io {
        /// The directory or the lock file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Who holds a lock, as written into its lock file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    /// What runs (`tiderec train`, `tiderec convert`, …).
    pub command: Option<String>,
    /// Its process id.
    pub pid: Option<u32>,
    /// The host it runs on.
    pub host: Option<String>,
}

impl Holder {
    /// This process, running `command`.
    pub fn current(command: &str) -> Holder {
        Holder { command: Some(command.to_string()), pid: Some(std::process::id()), host: host_name() }
    }

    /// The lock file's text: one `key=value` line per field known.
    fn to_text(&self) -> String {
        let mut text = String::new();
        if let Some(command) = &self.command {
            text.push_str(&format!("command={command}\n"));
        }
        if let Some(pid) = self.pid {
            text.push_str(&format!("pid={pid}\n"));
        }
        if let Some(host) = &self.host {
            text.push_str(&format!("host={host}\n"));
        }
        text
    }

    /// Reads back [`to_text`](Self::to_text); unknown or malformed lines are ignored.
    fn parse(text: &str) -> Holder {
        let mut holder = Holder::default();
        for (key, value) in text.lines().filter_map(|line| line.split_once('=')) {
            match key {
                "command" => holder.command = Some(value.to_string()),
                "pid" => holder.pid = value.parse().ok(),
                "host" => holder.host = Some(value.to_string()),
                _ => {}
            }
        }
        holder
    }

    /// The holder recorded in the lock file at `path` (all fields unknown if it cannot be read).
    pub fn read(path: &Path) -> Holder {
        std::fs::read_to_string(path).map(|text| Holder::parse(&text)).unwrap_or_default()
    }
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (Some(pid), host) = (self.pid, &self.host) else {
            // Between taking the lock and writing its name, or an unreadable file.
            return f.write_str("a process that has not written its pid and host yet");
        };
        let command = self.command.as_deref().unwrap_or("a process");
        write!(f, "{command} (pid {pid} on host {})", host.as_deref().unwrap_or("unknown"))
    }
}

/// This machine's host name, when the system tells it.
fn host_name() -> Option<String> {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|s| s.trim().to_string())
        .chain(std::env::var("HOSTNAME").ok())
        .find(|s| !s.is_empty())
}

/// A held lock on a directory; released when dropped (see the [module docs](self)).
#[derive(Debug)]
pub struct DirLock {
    /// Open for as long as the lock is held: closing it releases the lock.
    _file: File,
    path: PathBuf,
}

impl DirLock {
    /// Creates `dir` if missing and locks its file `name` for `command` (a
    /// name such as `tiderec train`, written into the file with this
    /// process's pid and host). Never waits: a lock held elsewhere is
    /// [`LockError::Held`].
    pub fn acquire(dir: &Path, name: &str, command: &str) -> Result<DirLock, LockError> {
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        let path = dir.join(name);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_error(&path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let holder = read_holder(&mut file);
                return Err(LockError::Held { dir: dir.to_path_buf(), lock: path, holder });
            }
            Err(TryLockError::Error(e)) => return Err(io_error(&path)(e)),
        }
        write_holder(&mut file, &Holder::current(command)).map_err(io_error(&path))?;
        Ok(DirLock { _file: file, path })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> LockError + '_ {
    move |source| LockError::Io { path: path.to_path_buf(), source }
}

/// The holder recorded in an open lock file (all fields unknown if it cannot be read).
fn read_holder(file: &mut File) -> Holder {
    let mut text = String::new();
    match file.read_to_string(&mut text) {
        Ok(_) => Holder::parse(&text),
        Err(_) => Holder::default(),
    }
}

/// Replaces the lock file's content with `holder`.
fn write_holder(file: &mut File, holder: &Holder) -> std::io::Result<()> {
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(holder.to_text().as_bytes())?;
    file.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_in_the_same_process_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let held = DirLock::acquire(dir.path(), LOCK_FILE, "tiderec train").unwrap();
        let Err(LockError::Held { dir: d, lock, holder }) = DirLock::acquire(dir.path(), LOCK_FILE, "tiderec online")
        else {
            panic!("a second lock must be refused");
        };
        assert_eq!((d.as_path(), lock.as_path()), (dir.path(), held.path()));
        assert_eq!(holder, Holder::current("tiderec train"));
        let e = DirLock::acquire(dir.path(), LOCK_FILE, "x").unwrap_err().to_string();
        let pid = format!("tiderec train (pid {} on host ", std::process::id());
        assert!(e.contains(&dir.path().display().to_string()) && e.contains(&pid), "{e}");
        assert!(e.contains(&held.path().display().to_string()), "{e}");
    }

    #[test]
    fn a_dropped_lock_is_released_and_the_file_names_the_new_holder() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b");
        drop(DirLock::acquire(&nested, LOCK_FILE, "tiderec convert with a longer name").unwrap());
        let again = DirLock::acquire(&nested, LOCK_FILE, "tiderec train").unwrap();
        assert_eq!(Holder::read(again.path()), Holder::current("tiderec train"), "no trace of the longer one");
    }

    #[test]
    fn the_holder_is_written_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DirLock::acquire(dir.path(), ".lock.p3", "tiderec train").unwrap();
        let holder = Holder::read(lock.path());
        assert_eq!(holder.pid, Some(std::process::id()));
        assert_eq!(holder.command.as_deref(), Some("tiderec train"));
        assert_eq!(holder.host, host_name());
        assert!(holder.host.is_some(), "the host is known on this system");
    }

    #[test]
    fn processes_of_one_run_lock_their_own_files() {
        let dir = tempfile::tempdir().unwrap();
        let locks: Vec<_> =
            (0..3).map(|k| DirLock::acquire(dir.path(), &lock_file_name(k), "tiderec train").unwrap()).collect();
        let names: Vec<_> = locks.iter().map(|l| l.path().file_name().unwrap().to_str().unwrap()).collect();
        assert_eq!(names, [".lock", ".lock.p1", ".lock.p2"]);
        assert!(names.iter().all(|n| is_lock_file(n)));
        assert!(!is_lock_file(".locksmith") && !is_lock_file("ckpt-3") && !is_lock_file(".lock.x"));
        assert!(!is_lock_file(".lock.p") && !is_lock_file(".lock.p1x"));
        assert!(matches!(DirLock::acquire(dir.path(), ".lock.p1", "x"), Err(LockError::Held { .. })));
    }

    #[test]
    fn an_unknown_holder_is_said_so() {
        assert_eq!(Holder::parse("").to_string(), "a process that has not written its pid and host yet");
        let h = Holder::parse("pid=12\nhost=box\nfuture=1\n");
        assert_eq!(h.to_string(), "a process (pid 12 on host box)");
        assert_eq!(Holder::parse(&Holder::current("c").to_text()), Holder::current("c"));
    }

    #[test]
    fn an_unusable_directory_is_an_io_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, b"").unwrap();
        let e = DirLock::acquire(&file, LOCK_FILE, "x").unwrap_err();
        assert!(matches!(&e, LockError::Io { path, .. } if path == &file), "{e}");
        assert!(e.to_string().starts_with(&format!("cannot lock {}: ", file.display())), "{e}");
    }
}
