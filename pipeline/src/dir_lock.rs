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
//! only records its last holder.
//!
//! **The lock file stays** in a directory the run leaves behind (a checkpoint
//! directory, a converted dataset, a directory that existed before the run,
//! whether or not the run succeeded): `DirLock` has no `Drop` that removes
//! it. It names its last holder, and readers skip it ([`is_lock_file`];
//! Parquet readers list `*.parquet` files only). Removing it on every release
//! would be safe among runs that check what they locked (below), but not
//! against a running binary of an earlier version, which does not; a file of
//! a few bytes in a directory that stays anyway is not worth that.
//!
//! **One exception, and why it is safe.** A run that fails after
//! [`DirLock::acquire`] created its directory removes that directory, lock
//! file and all, when nothing else is in it ([`DirLock::remove_created`]): a
//! failed `convert --to parquet:NEW` leaves no `NEW/` holding only `.lock`.
//! Removing a lock file could otherwise let two later runs hold two locks:
//! one that opened the old file before it went and locked it after, and one
//! that made a new file. So the holder unlinks the file while it still holds
//! it, and [`DirLock::acquire`], once it has locked a file, checks that the
//! file at the lock's path is still the one it locked (same device and inode)
//! and otherwise starts over; a lock on a removed file is never kept.
//!
//! The processes of one cluster run all write into the checkpoint directory
//! (each its own workers' shards), so each locks its own file
//! ([`lock_file_name`]): `.lock` for process 0 (and every single-process
//! run), `.lock.p<k>` for process `k`. Processes of one run never meet. A
//! process of another run always meets a holder ([`DirLock::acquire_for_process`]):
//! each lock file records its run's process count, and after taking its own
//! file a process `k > 0` refuses a `.lock` held by a run of another count (or
//! by a single-process run), while process 0 (and a single-process run)
//! refuses any `.lock.p<k>` held by a process `k` outside its run (`k` at or
//! past its count, or another count). Each checks the other's file after
//! taking its own, so of two runs starting at once the later check sees the
//! earlier lock: one of them is refused. Two runs of the same count meet at
//! every file both lock.

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
    /// The process count of its run (written by [`DirLock::acquire_for_process`]).
    pub processes: Option<usize>,
}

impl Holder {
    /// This process, running `command`.
    pub fn current(command: &str) -> Holder {
        Holder { command: Some(command.to_string()), pid: Some(std::process::id()), host: host_name(), processes: None }
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
        if let Some(n) = self.processes {
            text.push_str(&format!("processes={n}\n"));
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
                "processes" => holder.processes = value.parse().ok(),
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
    file: File,
    path: PathBuf,
    /// The locked directory.
    dir: PathBuf,
    /// The directories [`DirLock::acquire`] created to make `dir`, outermost first
    /// (empty when `dir` existed).
    created: Vec<PathBuf>,
}

/// How often [`DirLock::acquire`] starts over when the file it locked was removed by
/// its holder meanwhile (each time, another run has just given the directory up).
const MAX_ATTEMPTS: usize = 64;

impl DirLock {
    /// Creates `dir` if missing and locks its file `name` for `command` (a
    /// name such as `tiderec train`, written into the file with this
    /// process's pid and host). Never waits: a lock held elsewhere is
    /// [`LockError::Held`]. A file whose holder removed it before this lock took
    /// hold is not kept: acquiring starts over (see the [module docs](self)).
    pub fn acquire(dir: &Path, name: &str, command: &str) -> Result<DirLock, LockError> {
        Self::acquire_as(dir, name, &Holder::current(command))
    }

    /// Locks `dir` for process `process` of a run of `processes` (1: a single-process
    /// run) running `command`: its own file ([`lock_file_name`]), then refuses, with
    /// [`LockError::Held`] naming the holder, any process of another run holding the
    /// directory (see the [module docs](self)).
    pub fn acquire_for_process(
        dir: &Path,
        process: usize,
        processes: usize,
        command: &str,
    ) -> Result<DirLock, LockError> {
        let holder = Holder { processes: Some(processes), ..Holder::current(command) };
        let lock = Self::acquire_as(dir, &lock_file_name(process), &holder)?;
        let ours = |k: usize, h: &Holder| k < processes && h.processes == Some(processes);
        if process > 0 {
            check_held(dir, &dir.join(LOCK_FILE), |h| ours(0, h))?;
        } else {
            let entries = std::fs::read_dir(dir).map_err(io_error(dir))?;
            for name in entries.flatten().map(|e| e.file_name()) {
                let Some(k) = name.to_str().and_then(|n| n.strip_prefix(".lock.p")?.parse::<usize>().ok()) else {
                    continue;
                };
                if k > 0 && name.to_str() == Some(lock_file_name(k).as_str()) {
                    check_held(dir, &dir.join(name), |h| ours(k, h))?;
                }
            }
        }
        Ok(lock)
    }

    /// [`Self::acquire`], writing `holder` into the file.
    fn acquire_as(dir: &Path, name: &str, holder: &Holder) -> Result<DirLock, LockError> {
        let path = dir.join(name);
        // Why the last attempt started over, for the error when none holds.
        let mut last = None;
        for _ in 0..MAX_ATTEMPTS {
            let created = create_dirs(dir).map_err(io_error(dir))?;
            let opened = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path);
            let mut file = match opened {
                Ok(file) => file,
                // Its holder removed the directory since it was made here: start over.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(io_error(&path)(e)),
            };
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    let holder = read_holder(&mut file);
                    return Err(LockError::Held { dir: dir.to_path_buf(), lock: path, holder });
                }
                Err(TryLockError::Error(e)) => return Err(io_error(&path)(e)),
            }
            if !is_at(&file, &path).map_err(io_error(&path))? {
                // Locked after its holder removed it: the lock guards nothing; start over.
                last = None;
                continue;
            }
            write_holder(&mut file, holder).map_err(io_error(&path))?;
            return Ok(DirLock { file, path, dir: dir.to_path_buf(), created });
        }
        // Opening kept failing (a link into a folder that does not exist, say): that error.
        let gone = last.unwrap_or_else(|| {
            std::io::Error::other(format!("removed by its holders {MAX_ATTEMPTS} times while being locked"))
        });
        Err(io_error(&path)(gone))
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether [`Self::acquire`] created the directory (it did not exist before).
    pub fn created_dir(&self) -> bool {
        self.created.last() == Some(&self.dir)
    }

    /// Releases the lock, and gives up a directory that [`Self::acquire`] created when
    /// it holds nothing but the lock file: removes the lock file (still holding it),
    /// then, once the lock is released, the directories `acquire` created, innermost
    /// first, each only while empty. For a run that failed: it leaves no directory it
    /// made. A directory that existed before, or that holds anything else, keeps all
    /// it holds, the lock file too. Returns whether the directory was removed.
    pub fn remove_created(self) -> bool {
        let DirLock { file, path, dir, created } = self;
        let ours = created.last() == Some(&dir);
        let only_the_lock = || {
            std::fs::read_dir(&dir).is_ok_and(|mut entries| {
                entries.all(|e| e.is_ok_and(|e| Some(e.file_name().as_os_str()) == path.file_name()))
            })
        };
        // Unlinked while held: a run that opened it before locks it only after, sees it
        // gone (`is_at`) and starts over.
        if !ours || !only_the_lock() || std::fs::remove_file(&path).is_err() {
            return false;
        }
        drop(file);
        for d in created.iter().rev() {
            if std::fs::remove_dir(d).is_err() {
                break;
            }
        }
        !dir.exists()
    }
}

/// Refuses the lock file at `path` when a live process holds it and `ours` says its
/// holder is not of this run. A holder that has not written itself yet is waited for
/// briefly, and so is one that does not read as of this run: a lock file outlives its
/// run, so a peer that has just taken it may not have replaced the last run's text yet.
/// One that never reads as of this run within the wait is not.
fn check_held(dir: &Path, path: &Path, ours: impl Fn(&Holder) -> bool) -> Result<(), LockError> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(path)(e)),
    };
    match file.try_lock_shared() {
        // Nobody holds it (this shared lock is released when `file` closes).
        Ok(()) => return Ok(()),
        Err(TryLockError::WouldBlock) => {}
        Err(TryLockError::Error(e)) => return Err(io_error(path)(e)),
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    let mut holder = read_holder(&mut file);
    while (holder.pid.is_none() || !ours(&holder)) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
        let _ = file.seek(SeekFrom::Start(0));
        holder = read_holder(&mut file);
    }
    if ours(&holder) {
        Ok(())
    } else {
        Err(LockError::Held { dir: dir.to_path_buf(), lock: path.to_path_buf(), holder })
    }
}

/// Creates `dir` and its missing ancestors; returns those this call created, outermost
/// first (as `create_dir_all`, but saying what it made).
fn create_dirs(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut missing: Vec<&Path> =
        dir.ancestors().filter(|a| !a.as_os_str().is_empty()).take_while(|a| !a.is_dir()).collect();
    missing.reverse();
    let mut created = Vec::new();
    for d in missing {
        match std::fs::create_dir(d) {
            Ok(()) => created.push(d.to_path_buf()),
            // Made meanwhile by another run: not this one's.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(created)
}

/// Whether `file` (open) is still the file at `path`: false once it was
/// unlinked (no name left: its holder removed it; a file at `path` now is
/// another) or nothing is at `path`. Link counts, not inode numbers, tell: on
/// some overlay filesystems an open file's inode differs from its path's.
fn is_at(file: &File, path: &Path) -> std::io::Result<bool> {
    use std::os::unix::fs::MetadataExt;
    if file.metadata()?.nlink() == 0 {
        return Ok(false);
    }
    match std::fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
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
    fn a_process_of_a_run_of_another_size_meets_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        // A two-process run, process 1 first: its processes never meet.
        let one = DirLock::acquire_for_process(dir.path(), 1, 2, "tiderec train process 1 of 2").unwrap();
        let zero = DirLock::acquire_for_process(dir.path(), 0, 2, "tiderec train process 0 of 2").unwrap();
        assert_eq!(Holder::read(zero.path()).processes, Some(2));
        // Process 2 of a three-process run has no file of the first run to meet but `.lock`.
        let Err(LockError::Held { lock, holder, .. }) = DirLock::acquire_for_process(dir.path(), 2, 3, "x") else {
            panic!("process 2 of another run must be refused");
        };
        assert_eq!(lock, dir.path().join(LOCK_FILE));
        assert_eq!((holder.pid, holder.processes), (Some(std::process::id()), Some(2)));
        drop((zero, one));
        // The other way round: a stray process 2 is there first; process 0 of a
        // two-process run (and a single-process run) meets it.
        let stray = DirLock::acquire_for_process(dir.path(), 2, 3, "tiderec train process 2 of 3").unwrap();
        for (process, processes) in [(0, 2), (0, 1)] {
            let Err(LockError::Held { lock, .. }) = DirLock::acquire_for_process(dir.path(), process, processes, "y")
            else {
                panic!("process {process} of {processes} must meet the stray process");
            };
            assert_eq!(lock, stray.path());
        }
        // Its own run's process 0 does not.
        drop(DirLock::acquire_for_process(dir.path(), 0, 3, "tiderec train process 0 of 3").unwrap());
        drop(stray);
        // Stale files of ended runs block nothing.
        drop(DirLock::acquire_for_process(dir.path(), 0, 1, "tiderec train").unwrap());
        drop(DirLock::acquire_for_process(dir.path(), 1, 4, "tiderec train").unwrap());
    }

    #[test]
    fn a_created_directory_holding_only_the_lock_is_removed_and_others_are_kept() {
        let root = tempfile::tempdir().unwrap();
        // Made here, with a missing parent: both go, and nothing is left of them.
        let nested = root.path().join("a/b");
        let lock = DirLock::acquire(&nested, LOCK_FILE, "tiderec convert").unwrap();
        assert!(lock.created_dir());
        assert!(lock.remove_created());
        assert!(!root.path().join("a").exists());
        // Made here but holding something else: all of it stays.
        let lock = DirLock::acquire(&nested, LOCK_FILE, "tiderec convert").unwrap();
        std::fs::write(nested.join("dead-letters.tsv"), b"x").unwrap();
        assert!(!lock.remove_created());
        assert!(nested.join(LOCK_FILE).exists() && nested.join("dead-letters.tsv").exists());
        // There before: never removed, the lock file stays.
        let lock = DirLock::acquire(root.path(), LOCK_FILE, "tiderec convert").unwrap();
        assert!(!lock.created_dir());
        assert!(!lock.remove_created());
        assert!(root.path().join(LOCK_FILE).exists());
        // A plain release keeps the lock file (see the module docs).
        let dir = root.path().join("c");
        drop(DirLock::acquire(&dir, LOCK_FILE, "tiderec convert").unwrap());
        assert!(dir.join(LOCK_FILE).exists());
    }

    /// A lock path that is a link into a folder that does not exist fails with the
    /// open's own error, not as a lock removed by its holders.
    #[test]
    fn a_lock_file_that_cannot_be_opened_is_named_with_the_reason() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("out");
        std::fs::create_dir(&dir).unwrap();
        std::os::unix::fs::symlink(root.path().join("missing/lock"), dir.join(LOCK_FILE)).unwrap();
        let e = DirLock::acquire(&dir, LOCK_FILE, "tiderec train").expect_err("no lock through a dangling link");
        let text = e.to_string();
        assert!(text.contains(LOCK_FILE) && !text.contains("removed by its holders"), "{text}");
    }

    /// A run that opened the lock file before its holder removed it holds nothing once it
    /// locks it: `is_at` tells, and `acquire` starts over on a file of its own.
    #[test]
    fn a_lock_on_a_removed_file_is_not_kept() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("out");
        let held = DirLock::acquire(&dir, LOCK_FILE, "tiderec convert").unwrap();
        let path = held.path().to_path_buf();
        let early = File::open(&path).unwrap();
        assert!(is_at(&early, &path).unwrap());
        assert!(held.remove_created());
        early.try_lock().expect("the removed file is locked by nobody");
        assert!(!is_at(&early, &path).unwrap(), "nothing at the path");
        let again = DirLock::acquire(&dir, LOCK_FILE, "tiderec train").unwrap();
        assert!(!is_at(&early, again.path()).unwrap(), "another file at the path");
        assert!(is_at(&again.file, again.path()).unwrap());
        // The new file is locked, by `again` alone.
        assert!(matches!(DirLock::acquire(&dir, LOCK_FILE, "x"), Err(LockError::Held { .. })));
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
