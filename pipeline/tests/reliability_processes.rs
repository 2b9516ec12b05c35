//! Cluster runs that go wrong, with real processes on 127.0.0.1: processes
//! started with different settings or checkpoint directories (and one build
//! run from two different executables, which agree on it), a
//! process that never starts, one killed
//! mid-run, and a worker that fails where no step tells the others. Every process must stop on its own, non-zero, within a
//! bounded time, with an error that names what went wrong — never a hang or
//! one of timely's internal panics.

mod common;

use common::tiderec;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A small, quick DLRM run on the synthetic stream (one worker per process).
const RUN: &[&str] = &[
    "train",
    "--samples",
    "4000",
    "--steps",
    "20",
    "--batch-size",
    "128",
    "--buckets",
    "2000",
    "--workers",
    "1",
    "--progress",
    "none",
];

/// `n` free ports on 127.0.0.1 (all held until every one is chosen) as `127.0.0.1:PORT`,
/// written one per line to `dir/hosts.txt`.
fn hosts_file(dir: &Path, n: usize) -> (PathBuf, Vec<String>) {
    let held: Vec<TcpListener> = (0..n).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addresses: Vec<String> = held.iter().map(|l| format!("127.0.0.1:{}", l.local_addr().unwrap().port())).collect();
    let path = dir.join("hosts.txt");
    std::fs::write(&path, addresses.iter().map(|a| format!("{a}\n")).collect::<String>()).unwrap();
    (path, addresses)
}

/// A `tiderec` process with its standard error in a file; killed on drop.
struct Proc {
    child: Child,
    stderr: PathBuf,
}

impl Proc {
    /// Starts process `i` of `n` of the run `args` with `extra` flags.
    fn start(dir: &Path, hosts: &Path, i: usize, n: usize, args: &[&str], extra: &[&str]) -> Proc {
        Proc::launch(tiderec(), dir, hosts, i, n, args, extra)
    }

    /// [`Proc::start`] with the command `tiderec` (another executable, another working directory).
    fn launch(
        mut tiderec: Command,
        dir: &Path,
        hosts: &Path,
        i: usize,
        n: usize,
        args: &[&str],
        extra: &[&str],
    ) -> Proc {
        let stderr = dir.join(format!("stderr-{i}.txt"));
        tiderec
            .args(args)
            .args(["--processes", &n.to_string(), "--process", &i.to_string(), "--hosts"])
            .arg(hosts)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap());
        // An executable copied a moment ago may still be open for writing in a child another
        // test thread forked meanwhile (ETXTBSY, "Text file busy") until that child execs.
        for _ in 0..50 {
            match tiderec.spawn() {
                Err(e) if e.raw_os_error() == Some(26) => std::thread::sleep(Duration::from_millis(100)),
                spawned => return Proc { child: spawned.expect("tiderec starts"), stderr },
            }
        }
        panic!("{:?} stayed busy", tiderec.get_program());
    }

    /// Waits at most `limit` for the exit (the process is killed and the test fails past it);
    /// returns the status, the standard error and the time waited.
    fn finish(&mut self, limit: Duration) -> (ExitStatus, String, Duration) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let err = std::fs::read_to_string(&self.stderr).unwrap_or_default();
                return (status, err, start.elapsed());
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let err = std::fs::read_to_string(&self.stderr).unwrap_or_default();
                panic!("process still running after {limit:?}; killed. stderr:\n{err}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Fails unless the process exited non-zero within `limit` with a clear error (no panic);
    /// returns its standard error.
    fn fails_clearly(&mut self, limit: Duration) -> String {
        let (status, err, _) = self.finish(limit);
        assert!(!status.success(), "the process should have failed; stderr:\n{err}");
        assert!(!err.contains("panicked") && !err.contains("MergeQueue"), "a clear error, not a panic:\n{err}");
        err
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts two processes whose flags differ by `p0` / `p1`; both must fail naming `expect`.
fn mismatch(p0: &[&str], p1: &[&str], expect: &str) {
    let dir = tempfile::tempdir().unwrap();
    let (hosts, _) = hosts_file(dir.path(), 2);
    let mut procs = [Proc::start(dir.path(), &hosts, 0, 2, RUN, p0), Proc::start(dir.path(), &hosts, 1, 2, RUN, p1)];
    for (i, p) in procs.iter_mut().enumerate() {
        let err = p.fails_clearly(Duration::from_secs(60));
        assert!(err.contains("the processes disagree on"), "process {i}:\n{err}");
        assert!(err.contains(expect), "process {i} should name `{expect}`:\n{err}");
    }
}

#[test]
fn processes_with_a_different_learning_rate_stop_naming_it() {
    mismatch(&["--lr", "0.001"], &["--lr", "0.01"], "lr: process 0 has 0.001; process 1 has 0.01");
}

#[test]
fn processes_with_a_different_seed_stop_naming_it() {
    mismatch(&["--seed", "3"], &["--seed", "4"], "seed: process 0 has 3; process 1 has 4");
}

#[test]
fn processes_with_a_different_model_stop_naming_it() {
    mismatch(&["--model", "dlrm"], &["--model", "fm"], "model: process 0 has dlrm; process 1 has fm");
}

#[test]
fn processes_with_a_different_dimension_stop_naming_it() {
    // FM, whose factor width is `--dim` alone (DLRM ties it to the last `--bottom` width).
    mismatch(
        &["--model", "fm", "--dim", "16"],
        &["--model", "fm", "--dim", "8"],
        "dim: process 0 has 16; process 1 has 8",
    );
}

#[test]
fn a_missing_process_is_named_with_its_address_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (hosts, addresses) = hosts_file(dir.path(), 2);
    // Only process 0: it names process 1 and where it should be.
    let mut p0 = Proc::start(dir.path(), &hosts, 0, 2, RUN, &["--connect-timeout", "3"]);
    let (status, err, waited) = p0.finish(Duration::from_secs(30));
    assert!(!status.success(), "{err}");
    assert!(err.contains(&format!("process 1 ({})", addresses[1])), "{err}");
    assert!(err.contains("within 3 s (--connect-timeout)"), "{err}");
    assert!(waited >= Duration::from_millis(2900) && waited < Duration::from_secs(20), "waited {waited:?}");
    // Only process 1: it names process 0 and its address.
    let mut p1 = Proc::start(dir.path(), &hosts, 1, 2, RUN, &["--connect-timeout", "2"]);
    let err = p1.fails_clearly(Duration::from_secs(30));
    assert!(err.contains(&format!("cannot reach process 0 at {}", addresses[0])), "{err}");
}

/// Two processes of a long run; once `ready` holds, process 1 gets `signal` (`-KILL`,
/// `-STOP`) and process 0 must stop within 60 s naming it; returns process 0's error.
fn signal_process_1(dir: &Path, signal: &str, extra: &[&str], ready: impl Fn() -> bool) -> String {
    let (hosts, addresses) = hosts_file(dir, 2);
    // The quick run's flags with an epoch too long to end during the test.
    let mut long = RUN.to_vec();
    let samples = long.iter().position(|a| *a == "--samples").unwrap();
    long[samples + 1] = "50000000";
    let steps = long.iter().position(|a| *a == "--steps").unwrap();
    long.drain(steps..steps + 2);
    let mut p0 = Proc::start(dir, &hosts, 0, 2, &long, extra);
    let mut p1 = Proc::start(dir, &hosts, 1, 2, &long, extra);
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready() {
        for p in [&mut p0, &mut p1] {
            if let Some(status) = p.child.try_wait().unwrap() {
                panic!("a process exited early ({status}): {}", std::fs::read_to_string(&p.stderr).unwrap());
            }
        }
        assert!(Instant::now() < deadline, "the run never got going");
        std::thread::sleep(Duration::from_millis(20));
    }
    let sent = std::process::Command::new("kill").args([signal, &p1.child.id().to_string()]).status().unwrap();
    assert!(sent.success(), "kill {signal}");
    let err = p0.fails_clearly(Duration::from_secs(60));
    assert!(err.contains(&format!("lost process 1 ({})", addresses[1])), "{err}");
    assert!(err.contains("after training step"), "{err}");
    err
}

#[test]
fn a_killed_process_stops_the_other_naming_it_and_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let ck_arg = ck.display().to_string();
    let has_checkpoint = || {
        std::fs::read_dir(&ck)
            .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("ckpt-")))
            .unwrap_or(false)
    };
    let extra = ["--checkpoint-dir", &ck_arg, "--checkpoint-every", "20"];
    let err = signal_process_1(dir.path(), "-KILL", &extra, has_checkpoint);
    assert!(err.contains("its connection broke"), "{err}");
    assert!(err.contains(&format!("The newest checkpoint is {}", ck.join("ckpt-").display())), "{err}");
    assert!(err.contains("--resume"), "{err}");
}

#[test]
fn a_killed_process_without_checkpoints_says_the_run_must_start_again() {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let err = signal_process_1(dir.path(), "-KILL", &[], || started.elapsed() > Duration::from_secs(4));
    assert!(err.contains("No checkpoints were written"), "{err}");
}

#[test]
fn a_stopped_process_stops_the_other_once_its_heartbeats_cease() {
    // SIGSTOP closes no connection: only the missing heartbeats tell.
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let err = signal_process_1(dir.path(), "-STOP", &["--connect-timeout", "3"], || {
        started.elapsed() > Duration::from_secs(4)
    });
    assert!(err.contains("it sent no heartbeat for 3 s (--connect-timeout)"), "{err}");
}

#[test]
fn three_processes_name_the_one_that_differs() {
    let dir = tempfile::tempdir().unwrap();
    let (hosts, _) = hosts_file(dir.path(), 3);
    let mut procs: Vec<Proc> = (0..3)
        .map(|i| {
            let extra: &[&str] = if i == 2 { &["--eval-batch-size", "1024"] } else { &[] };
            Proc::start(dir.path(), &hosts, i, 3, RUN, extra)
        })
        .collect();
    for (i, p) in procs.iter_mut().enumerate() {
        let err = p.fails_clearly(Duration::from_secs(60));
        assert!(err.contains("eval_batch_size: processes 0, 1 have 4096; process 2 has 1024"), "process {i}:\n{err}");
    }
}

#[test]
fn a_process_whose_worker_fails_outside_a_step_stops_the_other_naming_it() {
    // Only process 0 writes the metrics log, and /dev/full refuses it: its worker fails
    // where no step tells the other process's worker, which would wait for it forever.
    let dir = tempfile::tempdir().unwrap();
    let (hosts, addresses) = hosts_file(dir.path(), 2);
    let mut p0 = Proc::start(dir.path(), &hosts, 0, 2, RUN, &["--metrics-log", "/dev/full"]);
    let mut p1 = Proc::start(dir.path(), &hosts, 1, 2, RUN, &[]);
    let err = p0.fails_clearly(Duration::from_secs(60));
    assert!(err.contains("cannot write the metrics log /dev/full"), "{err}");
    let err = p1.fails_clearly(Duration::from_secs(60));
    assert!(err.contains(&format!("lost process 0 ({})", addresses[0])), "{err}");
    assert!(err.contains("it stopped with an error of its own"), "{err}");
}

#[test]
fn a_worker_failing_outside_a_step_stops_its_process_with_its_error() {
    // One process, two workers: worker 0 alone writes the metrics log.
    let dir = tempfile::tempdir().unwrap();
    let child = tiderec()
        .current_dir(dir.path())
        .args(RUN.iter().map(|a| if *a == "1" { "2" } else { a }))
        .args(["--metrics-log", "/dev/full"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("stderr.txt")).unwrap())
        .spawn()
        .expect("tiderec starts");
    let mut p = Proc { child, stderr: dir.path().join("stderr.txt") };
    let err = p.fails_clearly(Duration::from_secs(60));
    assert!(err.contains("cannot write the metrics log /dev/full"), "{err}");
}

#[test]
fn processes_reading_different_copies_of_a_file_stop_naming_it() {
    let Some(sample) = common::shared_data("criteo/sample.train") else { return };
    let lines: Vec<String> = std::fs::read_to_string(sample).unwrap().lines().take(2000).map(String::from).collect();
    let dir = tempfile::tempdir().unwrap();
    // The same name and size on both "hosts", the lines shuffled differently.
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(a.join("day.txt"), lines.join("\n") + "\n").unwrap();
    std::fs::write(b.join("day.txt"), lines.iter().rev().cloned().collect::<Vec<_>>().join("\n") + "\n").unwrap();
    let (hosts, _) = hosts_file(dir.path(), 2);
    let run = |data: &Path| {
        let data = format!("criteo:{}", data.join("day.txt").display());
        let args = ["train", "--data", &data, "--batch-size", "128", "--buckets", "2000", "--workers", "1"];
        args.iter().map(|s| s.to_string()).chain(["--progress".into(), "none".into()]).collect::<Vec<String>>()
    };
    let (run_a, run_b) = (run(&a), run(&b));
    let (run_a, run_b): (Vec<&str>, Vec<&str>) =
        (run_a.iter().map(String::as_str).collect(), run_b.iter().map(String::as_str).collect());
    let mut procs =
        [Proc::start(dir.path(), &hosts, 0, 2, &run_a, &[]), Proc::start(dir.path(), &hosts, 1, 2, &run_b, &[])];
    for (i, p) in procs.iter_mut().enumerate() {
        let err = p.fails_clearly(Duration::from_secs(60));
        assert!(err.contains("the processes disagree on"), "process {i}:\n{err}");
        assert!(err.contains("day.txt") && err.contains("contents"), "process {i} should name the file:\n{err}");
    }
}

/// The checkpoints (`ckpt-*`) and temporary checkpoint directories in `dir`.
fn checkpoints_in(dir: &Path) -> Vec<String> {
    let names = std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()));
    names.map_or_else(|_| Vec::new(), |n| n.filter(|n| n.starts_with("ckpt-") || n.contains("tmp-ckpt")).collect())
}

#[test]
fn processes_given_different_checkpoint_dirs_stop_naming_both() {
    // Every worker writes its shard where process 0's path says: process 1's own directory
    // would never hold a checkpoint to resume from.
    let dir = tempfile::tempdir().unwrap();
    let (hosts, _) = hosts_file(dir.path(), 2);
    let (a, b) = (dir.path().join("ck-a"), dir.path().join("ck-b"));
    let (a_arg, b_arg) = (a.display().to_string(), b.display().to_string());
    let mut procs = [
        Proc::start(dir.path(), &hosts, 0, 2, RUN, &["--checkpoint-dir", &a_arg]),
        Proc::start(dir.path(), &hosts, 1, 2, RUN, &["--checkpoint-dir", &b_arg]),
    ];
    for (i, p) in procs.iter_mut().enumerate() {
        let err = p.fails_clearly(Duration::from_secs(60));
        assert!(err.contains("the processes disagree on 1 setting"), "process {i}:\n{err}");
        assert!(err.contains(&format!("checkpoint_dir: process 0 has {a_arg}; process 1 has {b_arg}")), "{i}:\n{err}");
    }
    assert!(checkpoints_in(&a).is_empty() && checkpoints_in(&b).is_empty(), "refused before training");
}

#[test]
fn processes_whose_checkpoint_dir_is_not_one_directory_stop_naming_it() {
    // The same relative path from two working directories: one path, two directories, as
    // the same path on two hosts without a shared file system.
    let dir = tempfile::tempdir().unwrap();
    let (hosts, addresses) = hosts_file(dir.path(), 2);
    let cwd = [dir.path().join("host-0"), dir.path().join("host-1")];
    let mut procs: Vec<Proc> = (0..2)
        .map(|i| {
            std::fs::create_dir_all(&cwd[i]).unwrap();
            let mut cmd = tiderec();
            cmd.current_dir(&cwd[i]);
            Proc::launch(cmd, dir.path(), &hosts, i, 2, RUN, &["--checkpoint-dir", "ck", "--checkpoint-every", "5"])
        })
        .collect();
    let (ck0, ck1) = (cwd[0].join("ck"), cwd[1].join("ck"));
    for (i, p) in procs.iter_mut().enumerate() {
        let err = p.fails_clearly(Duration::from_secs(60));
        assert!(err.contains("--checkpoint-dir ck is not one directory shared by every process"), "{i}:\n{err}");
        assert!(err.contains(&format!("process 0 ({}) wrote .tiderec-handshake-", addresses[0])), "{i}:\n{err}");
        assert!(err.contains(&format!("into {}", ck0.display())), "process {i}:\n{err}");
        let missing = format!("process 1 ({}) does not find it in {}: there is no", addresses[1], ck1.display());
        assert!(err.contains(&missing), "process {i}:\n{err}");
    }
    assert!(checkpoints_in(&ck0).is_empty() && checkpoints_in(&ck1).is_empty(), "refused before training");
    let left: Vec<_> = std::fs::read_dir(&ck0).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().starts_with(".tiderec-handshake-")), "marker left: {left:?}");
}

#[test]
fn processes_of_one_build_agree_on_it_whatever_their_executables_bytes() {
    // Process 1 runs a copy of the executable elsewhere, with one byte appended: the bytes of
    // the same sources built on another host (whose line tables hold other paths). The build
    // is named by its sources, features, target and profile, so only the learning rate,
    // which differs on purpose so the run stops at the handshake, is named.
    let dir = tempfile::tempdir().unwrap();
    let (hosts, _) = hosts_file(dir.path(), 2);
    let original = PathBuf::from(tiderec().get_program());
    let copy = dir.path().join("tiderec-same-build");
    std::fs::copy(&original, &copy).unwrap();
    std::fs::OpenOptions::new().append(true).open(&copy).unwrap().write_all(&[0]).unwrap();
    let mut procs = [
        Proc::start(dir.path(), &hosts, 0, 2, RUN, &["--lr", "0.001"]),
        Proc::launch(Command::new(&copy), dir.path(), &hosts, 1, 2, RUN, &["--lr", "0.01"]),
    ];
    for (i, p) in procs.iter_mut().enumerate() {
        let err = p.fails_clearly(Duration::from_secs(60));
        assert!(err.contains("the processes disagree on 1 setting"), "process {i}:\n{err}");
        assert!(err.contains("lr: process 0 has 0.001; process 1 has 0.01"), "process {i}:\n{err}");
        assert!(!err.contains("tiderec build: "), "one build: process {i}:\n{err}");
    }
}
