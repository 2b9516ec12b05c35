//! `tiderec bench exchange --processes N` when one of the processes it starts goes wrong:
//! one killed before it connects stops the others and fails the run naming it; one stopped
//! (SIGSTOP) is ended with the others at `--timeout`. The parent never waits forever and
//! leaves no child behind.

mod common;

use common::tiderec;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// The bench's children: `(pid, process index)` of every process whose parent is `parent`.
fn children(parent: u32) -> Vec<(u32, usize)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // `pid (comm) state ppid …`; the command may hold blanks, so split after its `)`.
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid != Some(parent) {
            continue;
        }
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let index =
            args.windows(2).find(|w| w[0] == b"--process").and_then(|w| std::str::from_utf8(w[1]).ok()?.parse().ok());
        if let Some(index) = index {
            out.push((pid, index));
        }
    }
    out
}

/// Starts a two-process exchange bench with `extra` flags, sends `signal` to its process 1
/// as soon as it exists, and returns the bench's exit status, standard error and the pids
/// of its children.
fn signal_child_1(signal: &str, extra: &[&str]) -> (std::process::ExitStatus, String, Vec<u32>, Duration) {
    let mut bench: Child = tiderec()
        .args(["bench", "exchange", "--model", "fm", "--workers", "2", "--processes", "2"])
        .args(["--steps", "2", "--warmup", "0", "--batch-size", "256", "--rows", "20000", "--replicate", "0"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tiderec starts");
    let started = Instant::now();
    let pids = loop {
        let found = children(bench.id());
        if let Some(&(pid, _)) = found.iter().find(|(_, i)| *i == 1) {
            let sent = std::process::Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
            assert!(sent.success());
            break found.iter().map(|(p, _)| *p).collect::<Vec<_>>();
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no process 1 started");
        std::thread::sleep(Duration::from_millis(1));
    };
    let waited = Instant::now();
    loop {
        if bench.try_wait().unwrap().is_some() {
            break;
        }
        if waited.elapsed() > Duration::from_secs(60) {
            let _ = bench.kill();
            let _ = std::process::Command::new("kill").arg("-KILL").args(pids.iter().map(u32::to_string)).status();
            panic!("the bench still waits 60 s after its process 1 got {signal}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = bench.wait_with_output().unwrap();
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned(), pids, waited.elapsed())
}

/// Whether process `pid` is gone (or a zombie nobody reaps any more).
fn gone(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')').is_none_or(|(_, rest)| rest.trim_start().starts_with('Z'))
}

#[test]
fn a_process_killed_before_it_connects_fails_the_bench_and_stops_the_others() {
    let (status, err, pids, waited) = signal_child_1("-KILL", &[]);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("process 1 (signal: 9 (SIGKILL))"), "{err}");
    assert!(err.contains("the other processes were stopped"), "{err}");
    assert!(waited < Duration::from_secs(30), "waited {waited:?}");
    assert!(pids.iter().all(|&p| gone(p)), "a child is left: {pids:?}");
}

#[test]
fn a_process_that_never_connects_ends_the_bench_at_its_timeout() {
    let (status, err, pids, waited) = signal_child_1("-STOP", &["--timeout", "4"]);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("still running after 4 s (--timeout): stopped"), "{err}");
    assert!(waited >= Duration::from_secs(3) && waited < Duration::from_secs(30), "waited {waited:?}");
    assert!(pids.iter().all(|&p| gone(p)), "a child is left: {pids:?}");
}
