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
