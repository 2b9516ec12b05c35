//! Two runs on one directory, through the release binary with real processes:
//! a second `train` on a checkpoint directory (or a second `convert` into an
//! output directory) is refused at start, naming the run that holds it, while
//! the first completes with its files intact; a holder killed with SIGKILL
//! blocks nobody. Every process is waited for within a bound, and killed on
//! drop.

mod common;

use common::{checkpoint_entries as entries, metrics, rel_diff, run_ok, shared_data, tiderec};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use tiderec::dir_lock::{Holder, LOCK_FILE};

/// Synthetic data, 40 steps per epoch, one worker.
const SYNTHETIC: &[&str] = &[
    "train",
    "--epochs",
    "1000",
    "--samples",
    "10240",
    "--batch-size",
    "256",
    "--eval-fraction",
    "0",
    "--buckets",
    "20000",
    "--seed",
    "11",
    "--workers",
    "1",
    "--progress",
    "none",
];

/// How long any one process may run before the test kills it and fails.
const LIMIT: Duration = Duration::from_secs(180);

fn train_cmd(steps: u64, extra: &[&str]) -> Command {
    let mut c = tiderec();
    c.args(SYNTHETIC).args(["--steps", &steps.to_string()]).args(extra);
    c
}

/// A running `tiderec`, killed on drop (a failing test leaves no process behind).
struct Running(Option<Child>);

impl Running {
    fn spawn(cmd: &mut Command) -> Running {
        Running(Some(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("tiderec starts")))
    }

    fn pid(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }

    fn running(&mut self) -> bool {
        self.0.as_mut().expect("running").try_wait().unwrap().is_none()
    }

    /// Waits until `ready` (the process must still be running), at most [`LIMIT`].
    fn wait_until(&mut self, what: &str, ready: impl Fn() -> bool) {
        let deadline = Instant::now() + LIMIT;
        while !ready() {
            assert!(self.running(), "the run ended before {what}");
            assert!(Instant::now() < deadline, "no {what} within {LIMIT:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Its exit and output, at most [`LIMIT`] from now.
    fn finish(mut self) -> Output {
        let deadline = Instant::now() + LIMIT;
        while self.running() {
            assert!(Instant::now() < deadline, "still running after {LIMIT:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.0.take().unwrap().wait_with_output().unwrap()
    }

    fn sigkill(mut self) {
        let mut child = self.0.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Whether the lock file of `dir` names process `pid`.
fn held_by(dir: &Path, pid: u32) -> bool {
    Holder::read(&dir.join(LOCK_FILE)).pid == Some(pid)
}

/// Runs `cmd`, which must fail within `fast`; returns its stderr.
fn refused(cmd: &mut Command, fast: Duration) -> String {
    let start = Instant::now();
    let out = Running::spawn(cmd).finish();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "a second writer must be refused: {err}");
    assert!(!err.contains("panicked"), "a clear error, not a panic: {err}");
    assert!(start.elapsed() < fast, "refused at start, not after {:?}: {err}", start.elapsed());
    err
}

/// The message names the directory, its lock file and the holder's pid and host.
fn assert_names_holder(err: &str, dir: &Path, command: &str, pid: u32) {
    let host = Holder::current("").host.expect("the host name is known here");
    assert!(err.contains(&format!("{} is in use by another run", dir.display())), "{err}");
    assert!(err.contains(&format!("{command} (pid {pid} on host {host})")), "{err}");
    assert!(err.contains(&dir.join(LOCK_FILE).display().to_string()), "{err}");
}

/// The metrics of a train that must succeed.
fn train(steps: u64, extra: &[&str], m: PathBuf) -> serde_json::Value {
    run_ok(train_cmd(steps, extra).arg("--metrics-json").arg(&m));
    metrics(&m)
}

#[test]
fn a_second_train_on_a_checkpoint_dir_is_refused_and_the_first_keeps_its_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = ck.display().to_string();
    let first_m = tmp.path().join("first.json");
    let steps = 400;
    let mut first = Running::spawn(
        train_cmd(steps, &["--checkpoint-dir", &ck_arg, "--checkpoint-every", "20"])
            .arg("--metrics-json")
            .arg(&first_m),
    );
    let pid = first.pid();
    first.wait_until("a first checkpoint", || held_by(&ck, pid) && !entries(&ck).0.is_empty());
    // With `--resume` (which a free directory with checkpoints accepts) or without: refused
    // by the lock, before anything else.
    for extra in [&["--resume"][..], &[]] {
        let args = [&["--checkpoint-dir", &ck_arg, "--checkpoint-every", "5"][..], extra].concat();
        let err = refused(&mut train_cmd(steps, &args), Duration::from_secs(20));
        assert_names_holder(&err, &ck, "tiderec train", pid);
    }
    assert!(first.running(), "the first run was still going while the second was refused");
    let out = first.finish();
    assert!(out.status.success(), "the first run completes: {}", String::from_utf8_lossy(&out.stderr));
    let m = metrics(&first_m);
    assert_eq!(m["steps"], steps);
    let (written, other) = entries(&ck);
    assert_eq!(written.last(), Some(&steps), "its last checkpoint is its own end");
    assert!(other.is_empty(), "nothing else in the directory: {other:?}");
    // Its checkpoints hold its model: resumed, it ends as an uninterrupted run.
    let end = steps + 40;
    let resumed = train(end, &["--checkpoint-dir", &ck_arg, "--resume"], tmp.path().join("r.json"));
    let straight = train(end, &[], tmp.path().join("s.json"));
    assert_eq!(resumed["resumed_from_step"], steps);
    let (a, b) = (resumed["params_l2"].as_f64().unwrap(), straight["params_l2"].as_f64().unwrap());
    assert!(rel_diff(a, b) <= 1e-6, "resumed {a} vs uninterrupted {b}");
}

#[test]
fn a_killed_holder_blocks_no_one_and_the_next_run_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = ck.display().to_string();
    let mut first = Running::spawn(&mut train_cmd(400, &["--checkpoint-dir", &ck_arg, "--checkpoint-every", "5"]));
    let pid = first.pid();
    first.wait_until("a first checkpoint", || held_by(&ck, pid) && !entries(&ck).0.is_empty());
    first.sigkill();
    assert!(held_by(&ck, pid), "the lock file still names the killed run");
    let last = *entries(&ck).0.last().unwrap();
    let m = tmp.path().join("m.json");
    let resume = ["--checkpoint-dir", &ck_arg, "--resume"];
    let next = Running::spawn(train_cmd(last + 20, &resume).arg("--metrics-json").arg(&m));
    let next_pid = next.pid();
    let out = next.finish();
    assert!(out.status.success(), "the stale lock does not block: {}", String::from_utf8_lossy(&out.stderr));
    let resumed = metrics(&m);
    assert_eq!((resumed["resumed_from_step"].as_u64(), resumed["steps"].as_u64()), (Some(last), Some(last + 20)));
    assert!(held_by(&ck, next_pid), "the lock file names its last holder");
}

/// `convert` of the Criteo sample repeated `copies` times into `out`.
fn convert_cmd(src: &Path, copies: usize, out: &Path) -> Command {
    let from = format!("criteo:{}", vec![src.display().to_string(); copies].join(","));
    let mut c = tiderec();
    c.args(["convert", "--progress", "none", "--from", &from, "--row-group-rows", "4096"])
        .arg("--to")
        .arg(format!("parquet:{}", out.display()));
    c
}

/// The Parquet files of `dir`, sorted, with their bytes.
fn parquet_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    files.sort();
    files.into_iter().map(|p| (p.file_name().unwrap().into(), std::fs::read(&p).unwrap())).collect()
}

#[test]
fn a_second_convert_into_one_directory_is_refused_and_the_first_completes() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pq");
    let copies = 100;
    let mut first = Running::spawn(&mut convert_cmd(&src, copies, &out));
    let pid = first.pid();
    first.wait_until("the lock taken", || held_by(&out, pid));
    let err = refused(&mut convert_cmd(&src, 1, &out), Duration::from_secs(20));
    assert_names_holder(&err, &out, "tiderec convert", pid);
    assert!(first.running(), "the first conversion was still going while the second was refused");
    let done = first.finish();
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    // Its files are those of a conversion that ran alone.
    let alone = tmp.path().join("alone");
    run_ok(&mut convert_cmd(&src, copies, &alone));
    let (got, want) = (parquet_files(&out), parquet_files(&alone));
    assert!(!got.is_empty() && got == want, "the files differ from a conversion alone");
}

#[test]
fn a_killed_convert_blocks_no_one() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pq");
    let mut first = Running::spawn(&mut convert_cmd(&src, 300, &out));
    let pid = first.pid();
    // Killed before its (only) file is complete: the directory holds no Parquet file.
    first.wait_until("the lock taken", || held_by(&out, pid));
    first.sigkill();
    assert!(parquet_files(&out).is_empty(), "killed before a file was complete");
    let output = run_ok(&mut convert_cmd(&src, 1, &out));
    assert!(String::from_utf8_lossy(&output.stdout).contains("converted 10000 rows"), "{output:?}");
}

/// A hosts file for a cluster of `n` processes on free ports of 127.0.0.1.
fn hosts_file(dir: &Path, n: usize) -> PathBuf {
    let port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let path = dir.join(format!("hosts-{n}.txt"));
    std::fs::write(&path, (0..n).map(|_| format!("127.0.0.1:{}\n", port())).collect::<String>()).unwrap();
    path
}

/// `train_cmd` as process `process` of a two-process cluster listed in `hosts`.
fn cluster_cmd(steps: u64, extra: &[&str], hosts: &Path, process: usize) -> Command {
    let mut c = train_cmd(steps, extra);
    c.args(["--processes", "2", "--process", &process.to_string(), "--connect-timeout", "5", "--hosts"]).arg(hosts);
    c
}

#[test]
fn online_and_a_cluster_are_refused_by_a_running_train() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = ck.display().to_string();
    let steps = 400;
    let mut first = Running::spawn(&mut train_cmd(steps, &["--checkpoint-dir", &ck_arg, "--checkpoint-every", "20"]));
    let pid = first.pid();
    first.wait_until("a first checkpoint", || held_by(&ck, pid) && !entries(&ck).0.is_empty());
    // `online` is refused before it looks for a broker (none listens where it is told to look).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let err = refused(
        tiderec()
            .args(["online", "--brokers", &format!("127.0.0.1:{port}"), "--topic", "t", "--progress", "none"])
            .args(["--checkpoint-dir", &ck_arg, "--resume"]),
        Duration::from_secs(20),
    );
    assert_names_holder(&err, &ck, "tiderec train", pid);
    // A two-process run: process 0 meets the lock at once; process 1 (its own lock file) then
    // fails for want of its peer, and neither touches the directory.
    let hosts = hosts_file(tmp.path(), 2);
    let args = ["--checkpoint-dir", &ck_arg, "--resume"];
    let one = Running::spawn(&mut cluster_cmd(steps, &args, &hosts, 1));
    let err = refused(&mut cluster_cmd(steps, &args, &hosts, 0), Duration::from_secs(20));
    assert_names_holder(&err, &ck, "tiderec train", pid);
    assert!(first.running(), "the first run was still going while the others were refused");
    let out = one.finish();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !err.contains("panicked"), "process 1 without its peer: {err}");
    let out = first.finish();
    assert!(out.status.success(), "the first run completes: {}", String::from_utf8_lossy(&out.stderr));
    let (written, other) = entries(&ck);
    assert_eq!(written.last(), Some(&steps), "its last checkpoint is its own end");
    assert!(other.is_empty(), "nothing else in the directory: {other:?}");
}

#[test]
fn a_running_two_process_run_holds_the_directory_against_any_other_process() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = ck.display().to_string();
    let hosts = hosts_file(tmp.path(), 2);
    let steps = 400;
    let args = ["--checkpoint-dir", &ck_arg, "--checkpoint-every", "20"];
    let mut cluster: Vec<Running> = (0..2).map(|k| Running::spawn(&mut cluster_cmd(steps, &args, &hosts, k))).collect();
    let (p0, p1) = (cluster[0].pid(), cluster[1].pid());
    let p1_holds = || Holder::read(&ck.join(format!("{LOCK_FILE}.p1"))).pid == Some(p1);
    cluster[0].wait_until("a first checkpoint", || held_by(&ck, p0) && p1_holds() && !entries(&ck).0.is_empty());
    // A single-process run meets process 0's lock; process 1 of another cluster meets process 1's.
    let err = refused(&mut train_cmd(steps, &["--checkpoint-dir", &ck_arg, "--resume"]), Duration::from_secs(20));
    assert_names_holder(&err, &ck, "tiderec train process 0 of 2", p0);
    let other_hosts = hosts_file(tmp.path(), 2);
    let err = refused(
        &mut cluster_cmd(steps, &["--checkpoint-dir", &ck_arg, "--resume"], &other_hosts, 1),
        Duration::from_secs(20),
    );
    let lock1 = ck.join(format!("{LOCK_FILE}.p1"));
    assert!(err.contains(&lock1.display().to_string()) && err.contains(&format!("pid {p1}")), "{err}");
    for (k, run) in cluster.drain(..).enumerate() {
        let out = run.finish();
        assert!(out.status.success(), "process {k} completes: {}", String::from_utf8_lossy(&out.stderr));
    }
    let (written, other) = entries(&ck);
    assert_eq!(written.last(), Some(&steps), "the cluster's last checkpoint is its own end");
    assert!(other.is_empty(), "nothing else in the directory: {other:?}");
}
