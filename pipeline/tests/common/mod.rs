//! Helpers shared by the CLI tests: spawn the release binary, read its metrics, find the shared data.
#![allow(dead_code)]

#[path = "../../../tests/support/skip.rs"]
pub mod skip;

#[path = "../../../tests/support/shared.rs"]
mod shared;

pub mod small_fs;

#[allow(unused_imports)]
pub use shared::{rel_diff, shared_data};

use std::path::Path;
use std::process::{Command, Output};

/// The release `tiderec` binary of this build, or `$TIDEREC_BIN` when set (test
/// executables copied to another machine, e.g. one with a GPU, where the build's path differs).
pub fn tiderec() -> Command {
    match std::env::var_os("TIDEREC_BIN") {
        Some(bin) => Command::new(bin),
        None => Command::new(env!("CARGO_BIN_EXE_tiderec")),
    }
}

/// Runs `cmd`, which must succeed (its output is shown otherwise).
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("tiderec starts");
    assert!(
        out.status.success(),
        "tiderec failed:\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The repository's script `scripts/NAME`.
pub fn script(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts").join(name)
}

/// Whether `python3` with NumPy, safetensors and PyTorch is here, as the export's reference
/// scorers need (a note, or a failure under `CI=true`, when not).
pub fn scorer_python_ready() -> bool {
    let import = "import numpy, safetensors, torch";
    let ok = Command::new("python3").args(["-c", import]).output().is_ok_and(|o| o.status.success());
    if !ok {
        skip::cannot_run("python3 with numpy, safetensors and torch not found (scripts/prerequisites.py install)");
    }
    ok
}

/// Whether `python3` has scikit-learn (saying why not, a failure under `CI=true`).
pub fn sklearn_available() -> bool {
    let ok = Command::new("python3").args(["-c", "import sklearn"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        skip::cannot_run("`python3 -c 'import sklearn'` fails (run `pip install scikit-learn`)");
    }
    ok
}

/// scikit-learn's `auc`, `pr_auc` and `gauc` of a TSV of `score<TAB>label[<TAB>group]` lines
/// (`scripts/sklearn_metrics.py`).
pub fn sklearn_metrics(tsv: &Path) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/sklearn_metrics.py");
    let out = Command::new("python3").arg(script).arg(tsv).output().unwrap();
    assert!(out.status.success(), "sklearn_metrics.py failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The metrics JSON written by `--metrics-json`.
pub fn metrics(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("metrics file written")).expect("valid JSON")
}

/// `tiderec train --data DATA` with `extra` flags, its dead letters and metrics
/// written in `dir` under `name`; returns the metrics.
pub fn train_metrics(data: &str, dir: &Path, name: &str, extra: &[&str]) -> serde_json::Value {
    let m = dir.join(format!("{name}.json"));
    run_ok(
        tiderec()
            .args(["train", "--progress", "none", "--data", data])
            .args(extra)
            .arg("--dead-letters")
            .arg(dir.join(format!("{name}-dead.tsv")))
            .arg("--metrics-json")
            .arg(&m),
    );
    metrics(&m)
}

/// The checkpoint steps in `dir` (its `ckpt-<step>` entries, sorted), and every other entry's
/// name but the writers' lock files (which stay, see `tiderec::dir_lock`).
pub fn checkpoint_entries(dir: &Path) -> (Vec<u64>, Vec<String>) {
    let (mut steps, mut other) = (Vec::new(), Vec::new());
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if tiderec::dir_lock::is_lock_file(&name) {
            continue;
        }
        match name.strip_prefix("ckpt-").and_then(|s| s.parse().ok()) {
            Some(s) => steps.push(s),
            None => other.push(name),
        }
    }
    steps.sort();
    (steps, other)
}

/// Runs `cmd`, which must fail; returns its stderr (checked not to be a panic).
pub fn run_err(cmd: &mut Command) -> String {
    let out = cmd.output().expect("tiderec starts");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "tiderec should have failed; stderr: {err}");
    assert!(!err.contains("panicked"), "a clear error, not a panic: {err}");
    err
}

/// Runs `cmd`, which must fail with an exit code (not killed by a signal, not a panic);
/// returns its stderr.
pub fn refused(cmd: &mut Command) -> String {
    let out = cmd.output().expect("tiderec starts");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.code().is_some(), "killed by a signal ({:?}): {err}", out.status);
    assert!(!out.status.success(), "should have failed: {err}");
    assert!(!err.contains("panicked"), "a clear error, not a panic: {err}");
    err
}

/// The events TensorBoard itself reads from `dir`: `{tag: [[step, value], …]}`, by
/// tensorboard's `EventAccumulator` (`None`, with a note or a failure under CI, without it).
pub fn tensorboard_scalars(dir: &std::path::Path) -> Option<serde_json::Value> {
    let script = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}))
"#;
    let probe = std::process::Command::new("python3").args(["-c", "import tensorboard"]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        skip::cannot_run("python3 with tensorboard not found (scripts/prerequisites.py install)");
        return None;
    }
    let out = std::process::Command::new("python3").args(["-c", script]).arg(dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some(serde_json::from_slice(&out.stdout).unwrap())
}
