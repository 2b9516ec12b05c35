//! How the processes of a cluster run start, with real processes on 127.0.0.1: processes
//! given different `--connect-timeout`s train together; a signal while a process waits
//! for its peers ends it at once; a hosts file whose lines are not distinct `host:port`
//! addresses is refused before any wait. Every process is waited for within a bound and
//! killed on drop.

mod common;

use common::tiderec;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A small DLRM run on the synthetic stream (one worker per process).
const RUN: &[&str] = &[
    "train",
    "--samples",
    "400000",
    "--batch-size",
    "128",
    "--buckets",
    "2000",
    "--workers",
    "1",
    "--eval-fraction",
    "0",
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
        let stderr = dir.join(format!("stderr-{i}.txt"));
        let child = tiderec()
            .args(args)
            .args(["--processes", &n.to_string(), "--process", &i.to_string(), "--hosts"])
            .arg(hosts)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("tiderec starts");
        Proc { child, stderr }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits at most `limit` for the exit (the test fails past it); returns the status,
    /// the standard error and the time waited.
    fn finish(&mut self, limit: Duration) -> (ExitStatus, String, Duration) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status, self.stderr(), start.elapsed());
            }
            assert!(start.elapsed() < limit, "process still running after {limit:?}; stderr:\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, signal: &str) {
        let sent = std::process::Command::new("kill").args([signal, &self.child.id().to_string()]).status().unwrap();
        assert!(sent.success(), "kill {signal}");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether something listens on TCP `port` (IPv4), by `/proc/net/tcp`.
fn listening(port: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!(":{port:04X} ");
    table.lines().skip(1).any(|l| {
        let fields: Vec<&str> = l.split_whitespace().collect();
        fields.len() > 3 && format!("{} ", fields[1]).ends_with(&local) && fields[3] == "0A"
    })
}

fn port(address: &str) -> u16 {
    address.rsplit_once(':').unwrap().1.parse().unwrap()
}

#[test]
fn a_process_with_a_short_connect_timeout_trains_with_one_at_the_default() {
    // Process 0 declares a peer lost after 0.9 s of silence; process 1, at the default 60 s,
    // must beat often enough for it. Process 1 starts first, so that it already waits when
    // process 0's short handshake deadline starts; a start slower than that is tried again.
    for attempt in 0..3 {
        let dir = tempfile::tempdir().unwrap();
        let (hosts, addresses) = hosts_file(dir.path(), 2);
        let args: Vec<&str> = RUN.iter().copied().chain(["--steps", "400"]).collect();
        let mut p1 = Proc::start(dir.path(), &hosts, 1, 2, &args, &[]);
        std::thread::sleep(Duration::from_secs(2));
        let mut p0 = Proc::start(dir.path(), &hosts, 0, 2, &args, &["--connect-timeout", "0.9"]);
        let (s0, e0, _) = p0.finish(Duration::from_secs(120));
        if !s0.success() && e0.contains("did not connect to process 0 within") && attempt < 2 {
            continue;
        }
        let (s1, e1, _) = p1.finish(Duration::from_secs(120));
        assert!(s0.success(), "process 0 failed:\n{e0}\nprocess 1:\n{e1}");
        assert!(s1.success(), "process 1 failed:\n{e1}");
        assert!(!e0.contains(&format!("lost process 1 ({})", addresses[1])), "{e0}");
        return;
    }
}

#[test]
fn a_signal_while_waiting_for_the_peers_stops_the_process_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (hosts, addresses) = hosts_file(dir.path(), 2);
    // Process 0 alone, waiting for process 1 to connect (the default 60 s).
    let mut p0 = Proc::start(dir.path(), &hosts, 0, 2, RUN, &[]);
    let started = Instant::now();
    while !listening(port(&addresses[0])) {
        assert!(started.elapsed() < Duration::from_secs(60), "process 0 never listened:\n{}", p0.stderr());
        assert!(p0.child.try_wait().unwrap().is_none(), "process 0 ended:\n{}", p0.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    p0.signal("-INT");
    let (status, err, waited) = p0.finish(Duration::from_secs(20));
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("stopped before training: waiting for process 1 ({})", addresses[1])), "{err}");
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
    assert!(!err.contains("panicked"), "{err}");
    // Process 1 alone, retrying its connection to process 0.
    let mut p1 = Proc::start(dir.path(), &hosts, 1, 2, RUN, &[]);
    let started = Instant::now();
    while !listening(port(&addresses[1])) {
        assert!(started.elapsed() < Duration::from_secs(60), "process 1 never listened:\n{}", p1.stderr());
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    p1.signal("-TERM");
    let (status, err, waited) = p1.finish(Duration::from_secs(20));
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("stopped before training: waiting for process 0 ({})", addresses[0])), "{err}");
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
}

#[test]
fn a_hosts_line_that_is_not_a_distinct_host_and_port_is_refused_at_once_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_, addresses) = hosts_file(dir.path(), 2);
    let cases = [
        (format!("127.0.0.1\n{}\n", addresses[1]), "line 1: \"127.0.0.1\" is not host:port"),
        (format!("{}\n127.0.0.1:0\n", addresses[0]), "line 2: \"127.0.0.1:0\" is not host:port"),
        (format!("# cluster\n{}\n\n{}\n", addresses[0], addresses[0]), "line 4: \"{a}\" repeats line 2"),
        (format!("{} {}\n{}\n", addresses[0], addresses[1], addresses[1]), "line 1: "),
    ];
    for (i, (text, expect)) in cases.iter().enumerate() {
        let hosts = dir.path().join(format!("hosts-{i}.txt"));
        std::fs::write(&hosts, text).unwrap();
        for process in 0..2 {
            let mut p = Proc::start(dir.path(), &hosts, process, 2, RUN, &[]);
            let (status, err, waited) = p.finish(Duration::from_secs(20));
            assert_eq!(status.code(), Some(1), "{err}");
            let expect = expect.replace("{a}", &addresses[0]);
            assert!(err.contains(&format!("{} {expect}", hosts.display())), "case {i}, process {process}:\n{err}");
            assert!(waited < Duration::from_secs(10), "waited {waited:?}");
        }
    }
}

#[test]
fn a_process_other_than_0_warns_of_the_outputs_only_process_0_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (hosts, _) = hosts_file(dir.path(), 2);
    let args: Vec<&str> = RUN.iter().copied().chain(["--steps", "20"]).collect();
    let log = dir.path().join("p1-metrics.jsonl");
    let log_arg = log.display().to_string();
    let board = dir.path().join("p1-board").display().to_string();
    let mut p0 = Proc::start(dir.path(), &hosts, 0, 2, &args, &[]);
    let mut p1 = Proc::start(dir.path(), &hosts, 1, 2, &args, &["--metrics-log", &log_arg, "--tensorboard", &board]);
    let (s1, e1, _) = p1.finish(Duration::from_secs(120));
    let (s0, e0, _) = p0.finish(Duration::from_secs(120));
    assert!(s0.success() && s1.success(), "process 0:\n{e0}\nprocess 1:\n{e1}");
    let warning = "warning: process 1 ignores --metrics-log, --tensorboard: only process 0 writes them";
    assert_eq!(e1.lines().filter(|l| *l == warning).count(), 1, "{e1}");
    assert!(!e0.contains("ignores"), "{e0}");
    assert!(!log.exists(), "process 1 wrote no metrics log");
}
