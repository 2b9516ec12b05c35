//! `online --start latest` started again before its first checkpoint, against a real
//! Kafka-protocol broker (tansu on 127.0.0.1, see `kafka.rs` for the broker and
//! `CI=true`): the first start's ends are recorded in the checkpoint directory
//! (`start-latest.json`), and a run killed before it checkpointed starts there again, so
//! every record produced after the first start is trained, with the same or another
//! process count. A record of another topic, or of partitions the topic no longer has, is
//! refused; `--start earliest` ignores a record.

mod common;
mod kafka_broker;

use common::{run_err, run_ok};
use kafka_broker::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The recorded start of the run writing checkpoints under `dir`.
fn recorded(dir: &Path) -> PathBuf {
    dir.join("ckpt").join("start-latest.json")
}

/// Starts `cmd` with its stdout dropped and its stderr kept.
fn spawn(mut cmd: Command) -> Child {
    cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("tiderec starts")
}

/// Waits until the trainers `children` writing under `dir` recorded where they start. A
/// build that records nothing is given 30 s, by which its partitions are long open, so
/// that what the test asserts next shows where it starts instead.
fn wait_for_recorded_start(dir: &Path, children: &mut [Child]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !recorded(dir).exists() && Instant::now() < deadline {
        for c in children.iter_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                panic!("a trainer exited ({status}) before it recorded its start");
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The samples of the last report in the metrics log `log` (0 before any).
fn logged_samples(log: &Path) -> u64 {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let last = text.lines().rev().find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok());
    last.and_then(|r| r["samples"].as_u64()).unwrap_or(0)
}

/// Waits up to `within` for the trainer `child` to report `n` samples in `log`; whether it did.
fn reaches(log: &Path, n: u64, child: &mut Child, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if logged_samples(log) == n {
            return true;
        }
        if let Ok(Some(status)) = child.try_wait() {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
            }
            panic!("the trainer exited ({status}) at {} samples, short of {n}: {stderr}", logged_samples(log));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn signal(child: &Child, sig: &str) {
    assert!(Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap().success(), "kill {sig}");
}

/// The `ckpt-*` directories under `dir`.
fn checkpoints(dir: &Path) -> usize {
    let entries = std::fs::read_dir(dir.join("ckpt")).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default();
    entries.iter().filter(|e| e.file_name().to_string_lossy().starts_with("ckpt-")).count()
}

/// A trainer started at the end of a topic (500 records in each of 2 partitions) trains the
/// 640 records produced next and is killed before any checkpoint; 320 more are produced and
/// the same command starts it again: it trains the 960 records produced after the first
/// start, and its checkpoint stands at 980 in each partition.
#[test]
fn a_run_killed_before_its_first_checkpoint_trains_every_record_since_its_first_start() {
    let Some(sample) = criteo_sample() else { return };
    let broker = Broker::start();
    assert_eq!(produce(&broker, "clicks", &sample, &["--partitions", "2", "--limit", "1000"]), 1000);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("metrics.jsonl");
    let log_flag = log.display().to_string();
    // `--resume`: the command a service restarts with (after a checkpoint it resumes from it).
    let flags = ["--start", "latest", "--resume", "--checkpoint-every", "1000000", "--metrics-log", &log_flag];
    let cmd = || running_online_cmd(&broker.addr(), "clicks", dir.path(), 2, &flags);

    let mut first = spawn(cmd());
    wait_for_recorded_start(dir.path(), std::slice::from_mut(&mut first));
    assert_eq!(produce(&broker, "clicks", &sample, &["--limit", "640"]), 640);
    assert!(
        reaches(&log, 640, &mut first, Duration::from_secs(90)),
        "the first start trained {}",
        logged_samples(&log)
    );
    signal(&first, "-KILL");
    first.wait().unwrap();
    assert_eq!(checkpoints(dir.path()), 0, "killed before its first checkpoint");
    assert_eq!(produce(&broker, "clicks", &sample, &["--limit", "320"]), 320);

    let mut again = spawn(cmd());
    let trained = reaches(&log, 960, &mut again, Duration::from_secs(90));
    signal(&again, "-TERM");
    let out = again.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "SIGTERM exits 0 ({}): {stderr}", out.status);
    let s = summary(dir.path());
    assert!(trained, "the second start trained {} samples of the 960 produced since the first: {s}", s["samples"]);
    assert_eq!(s["samples"], 960, "{s}");
    assert_eq!((s["offsets"]["clicks/0"].as_i64(), s["offsets"]["clicks/1"].as_i64()), (Some(980), Some(980)), "{s}");
    let m = final_model(dir.path());
    assert_eq!((m.samples, m.offsets.values().copied().collect::<Vec<_>>()), (960, vec![980, 980]));
    let line = stderr.lines().find(|l| l.contains("start-latest.json")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.starts_with("--start latest:") && line.contains("partition 0 at 500, 1 at 500"), "{line}");
    assert!(!recorded(dir.path()).exists(), "the checkpoint holds the offsets: the record is removed");

    // `--start earliest` is as before: every record of the topic, and no record of a start.
    let earliest = tempfile::tempdir().unwrap();
    run_ok(&mut online_cmd(&broker, "clicks", earliest.path(), 1, &["--start", "earliest"]));
    assert_eq!(summary(earliest.path())["samples"], 1960);
    assert!(!recorded(earliest.path()).exists());
}

/// Two processes start at the end of a topic of 3 partitions (333 records each; process 0
/// reads partitions 0 and 2, process 1 reads 1) and are killed before any checkpoint; 300
/// records are produced; one process with one worker starts again from the recorded ends
/// and trains exactly those 300.
#[test]
fn a_start_recorded_by_two_processes_is_taken_up_by_one() {
    let Some(sample) = criteo_sample() else { return };
    let broker = Broker::start();
    assert_eq!(produce(&broker, "clicks", &sample, &["--partitions", "3", "--limit", "999"]), 999);
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("run");
    let hosts = base.path().join("hosts.txt");
    std::fs::write(&hosts, format!("127.0.0.1:{}\n127.0.0.1:{}\n", free_port(), free_port())).unwrap();
    let mut cluster: Vec<Child> = (0..2)
        .map(|i| {
            let process = i.to_string();
            let flags = ["--start", "latest", "--processes", "2", "--process", &process];
            let mut cmd = running_online_cmd(&broker.addr(), "clicks", &dir, 1, &flags);
            cmd.arg("--hosts").arg(&hosts);
            spawn(cmd)
        })
        .collect();
    wait_for_recorded_start(&dir, &mut cluster);
    for c in &mut cluster {
        signal(c, "-KILL");
        c.wait().unwrap();
    }
    assert_eq!(checkpoints(&dir), 0);
    if let Ok(text) = std::fs::read_to_string(recorded(&dir)) {
        let record: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(record["offsets"], serde_json::json!({"0": 333, "1": 333, "2": 333}), "{record}");
        assert_eq!((record["topic"].as_str(), record["processes"].as_u64()), (Some("clicks"), Some(2)), "{record}");
    }
    assert_eq!(produce(&broker, "clicks", &sample, &["--limit", "300"]), 300);

    let out = run_ok(&mut online_cmd(&broker, "clicks", &dir, 1, &["--start", "latest", "--resume"]));
    let s = summary(&dir);
    assert_eq!(s["samples"], 300, "trained {s}; {}", String::from_utf8_lossy(&out.stderr));
    for p in 0..3 {
        assert_eq!(s["offsets"][format!("clicks/{p}")], 433, "{s}");
    }
}

/// A recorded start is kept for the topic it was recorded on: a start on another topic, or
/// on the topic re-created with fewer partitions, is refused naming the file and leaves it
/// as it is; `--start earliest` does not judge it and reads the topic from its oldest record.
#[test]
fn a_recorded_start_of_another_topic_or_of_lost_partitions_is_refused() {
    let Some(sample) = criteo_sample() else { return };
    let mut broker = Broker::start();
    produce(&broker, "clicks", &sample, &["--partitions", "2", "--limit", "200"]);
    let dir = tempfile::tempdir().unwrap();
    let latest = ["--start", "latest", "--checkpoint-every", "1000000"];
    let mut first = spawn(running_online_cmd(&broker.addr(), "clicks", dir.path(), 1, &latest));
    wait_for_recorded_start(dir.path(), std::slice::from_mut(&mut first));
    signal(&first, "-KILL");
    first.wait().unwrap();
    let kept = std::fs::read(recorded(dir.path())).expect("the first start recorded its ends");

    produce(&broker, "views", &sample, &["--partitions", "2", "--limit", "200"]);
    let err = run_err(&mut online_cmd(&broker, "views", dir.path(), 1, &["--start", "latest"]));
    assert!(err.contains("start-latest.json") && err.contains("`clicks`") && err.contains("`views`"), "{err}");
    assert_eq!(std::fs::read(recorded(dir.path())).unwrap(), kept);

    // The in-memory broker forgets its topics: `clicks` comes back with one partition.
    broker.restart(Duration::from_millis(200));
    produce(&broker, "clicks", &sample, &["--partitions", "1", "--limit", "100"]);
    let err = run_err(&mut online_cmd(&broker, "clicks", dir.path(), 1, &["--start", "latest", "--resume"]));
    assert!(err.contains("start-latest.json") && err.contains("on 2 partitions") && err.contains("now has 1"), "{err}");
    assert_eq!(std::fs::read(recorded(dir.path())).unwrap(), kept);

    let out = run_ok(&mut online_cmd(&broker, "clicks", dir.path(), 1, &["--start", "earliest"]));
    assert_eq!(summary(dir.path())["samples"], 100);
    assert!(String::from_utf8_lossy(&out.stderr).contains("--start earliest reads the partitions"));
    assert!(!recorded(dir.path()).exists(), "removed once a checkpoint holds the offsets");
}
