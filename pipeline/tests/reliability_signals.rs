//! SIGINT and SIGTERM to `tiderec train` and `tiderec convert` through real
//! processes: the first signal stops cleanly (the current step finishes, the
//! checkpoint and the metrics are written, exit 0, nothing temporary left),
//! `--resume` continues from that checkpoint to the uninterrupted result, and
//! a second signal exits at once with a non-zero status.

mod common;

use common::{checkpoint_entries as entries, metrics, rel_diff, run_ok, shared_data, tiderec};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Synthetic data, as many epochs as it takes to be interrupted (the callers set the batch size).
const BASE: &[&str] = &[
    "train",
    "--samples",
    "10240",
    "--eval-fraction",
    "0.1",
    "--buckets",
    "20000",
    "--seed",
    "5",
    "--progress",
    "none",
];

fn train_cmd(workers: &str, extra: &[&str]) -> Command {
    let mut c = tiderec();
    c.args(BASE).args(["--workers", workers]).args(extra);
    c
}

fn signal(child: &Child, sig: &str) {
    assert!(Command::new("kill").args([sig, &child.id().to_string()]).status().unwrap().success(), "kill {sig}");
}

/// Waits until `ready` holds while `child` is still running.
fn wait_until(child: &mut Child, what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        assert!(child.try_wait().unwrap().is_none(), "the process ended before {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Interrupts a checkpointing run with `sig` after its first checkpoint; checks the clean
/// stop, then resumes it to `steps` past the stop and compares with an uninterrupted run.
fn interrupt_and_resume(sig: &str, workers: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = ck.display().to_string();
    let m = tmp.path().join("m.json");
    let ckpt = ["--checkpoint-dir", &ck_arg, "--checkpoint-every", "7", "--batch-size", "256"];
    let mut child =
        train_cmd(workers, &[&ckpt[..], &["--epochs", "1000", "--metrics-json", m.to_str().unwrap()]].concat())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tiderec starts");
    wait_until(&mut child, "a first checkpoint", || ck.exists() && !entries(&ck).0.is_empty());
    signal(&child, sig);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{sig} exits 0: {:?}\n{stderr}", out.status);
    let stopped = metrics(&m);
    let step = stopped["interrupted_at_step"].as_u64().unwrap_or_else(|| panic!("interrupted: {stopped}"));
    assert_eq!(stopped["steps"], step);
    assert!(stopped["auc"].is_null(), "evaluation is skipped");
    assert!(stderr.contains(&format!("stopped after step {step}")) && stderr.contains("--resume"), "{stderr}");
    let (steps, other) = entries(&ck);
    assert_eq!(steps.last(), Some(&step), "a checkpoint of the step it stopped at");
    assert!(other.is_empty(), "nothing temporary left: {other:?}");
    // Resume to 30 steps past the stop: the same model as a run that never stopped.
    let end = (step + 30).to_string();
    let resumed_m = tmp.path().join("r.json");
    run_ok(
        train_cmd(workers, &[&ckpt[..], &["--epochs", "1000", "--resume", "--steps", &end]].concat())
            .arg("--metrics-json")
            .arg(&resumed_m),
    );
    let straight_m = tmp.path().join("s.json");
    let straight = ["--epochs", "1000", "--steps", &end, "--batch-size", "256"];
    run_ok(train_cmd(workers, &straight).arg("--metrics-json").arg(&straight_m));
    let (resumed, straight) = (metrics(&resumed_m), metrics(&straight_m));
    assert_eq!(resumed["resumed_from_step"], step);
    assert!(resumed["interrupted_at_step"].is_null());
    assert_eq!(resumed["steps"], straight["steps"]);
    for key in ["params_l2", "train_loss", "auc"] {
        let (a, b) = (resumed[key].as_f64().unwrap(), straight[key].as_f64().unwrap());
        assert!(rel_diff(a, b) <= 1e-6, "{sig}: {key}: resumed {a} vs uninterrupted {b}");
    }
}

#[test]
fn sigterm_stops_train_cleanly_and_resume_continues() {
    interrupt_and_resume("-TERM", "2");
}

#[test]
fn sigint_stops_train_cleanly_and_resume_continues() {
    interrupt_and_resume("-INT", "1");
}

#[test]
fn a_second_signal_exits_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = ck.display().to_string();
    // Large steps, so both signals arrive while the first step after them runs.
    let mut child = train_cmd(
        "2",
        &["--epochs", "1000", "--batch-size", "8192", "--checkpoint-dir", &ck_arg, "--checkpoint-every", "1"],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .expect("tiderec starts");
    wait_until(&mut child, "a first checkpoint", || ck.exists() && !entries(&ck).0.is_empty());
    // Two different signals (two of the same kind may merge while pending).
    signal(&child, "-INT");
    signal(&child, "-TERM");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn sigterm_to_convert_leaves_a_valid_partial_dataset() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("pq");
    // The same file many times over: long enough to be interrupted.
    let from = format!("criteo:{}", vec![src.display().to_string(); 300].join(","));
    let mut child = tiderec()
        .args([
            "convert",
            "--progress",
            "none",
            "--from",
            &from,
            "--row-group-rows",
            "4096",
            "--rows-per-file",
            "20000",
        ])
        .arg("--to")
        .arg(format!("parquet:{}", out.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tiderec starts");
    let files = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|d| d.map(|e| e.unwrap().file_name().into_string().unwrap()).collect())
            .unwrap_or_default()
    };
    // Files keep their temporary names until the conversion ends: the second one begun means the first is complete.
    wait_until(&mut child, "a first complete file", || files(&out).iter().any(|f| f == ".part-00001.parquet.tmp"));
    signal(&child, "-TERM");
    let output = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "SIGTERM exits 0: {:?}\n{stderr}", output.status);
    assert!(stderr.contains("interrupted by a signal"), "{stderr}");
    let rows: u64 = stdout
        .split("converted ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("rows reported: {stdout}"));
    assert!(rows > 0 && rows < 300 * 10_000, "a partial conversion: {rows} rows");
    let names = files(&out);
    // The writer's lock file (`.lock`, see `tiderec::dir_lock`) stays by design; no other dot-file may.
    let temporary = names.iter().filter(|f| f.starts_with('.') && !tiderec::dir_lock::is_lock_file(f));
    assert_eq!(temporary.count(), 0, "no temporary file left: {names:?}");
    // The partial output is a valid dataset holding exactly the rows reported.
    let m = tmp.path().join("m.json");
    run_ok(
        tiderec()
            .args(["train", "--progress", "none", "--model", "lr", "--eval-fraction", "0", "--batch-size", "4096"])
            .arg("--data")
            .arg(format!("parquet:{}", out.display()))
            .arg("--metrics-json")
            .arg(&m),
    );
    assert_eq!(metrics(&m)["samples"], rows);
}
