//! Reading micro-batches ahead (`--read-ahead on`) trains, counts and writes dead letters as
//! reading them in place (`--read-ahead off`) does: over epochs, several workers, a held-out
//! split, a run cut short by `--steps` with a malformed record in the batch read ahead, a
//! resumed run, and a record that fails the run under `--on-bad-record fail`.

mod common;

use common::{checkpoint_entries, metrics, run_ok, shared_data, tiderec};
use std::path::{Path, PathBuf};

/// The Criteo sample (100 lines) with lines 10 and 20 malformed, and line 50 too when
/// `late_bad`: that line lies in the second micro-batch of 32.
fn corrupt_sample(dir: &Path, late_bad: bool) -> Option<PathBuf> {
    let src = shared_data("criteo/sample_train.txt")?;
    let text = std::fs::read_to_string(src).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let mut bad = vec![9, 19];
    if late_bad {
        bad.push(49);
    }
    for i in bad {
        let mut fields: Vec<String> = lines[i].split('\t').map(String::from).collect();
        fields[1] = "abc".into();
        lines[i] = fields.join("\t");
    }
    let path = dir.join(if late_bad { "late.txt" } else { "corrupt.txt" });
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    Some(path)
}

/// The run's metrics and its dead letters' lines, sorted (several workers interleave them).
fn train(dir: &Path, name: &str, data: &Path, extra: &[&str]) -> (serde_json::Value, Vec<String>) {
    let (m, dead) = (dir.join(format!("{name}.json")), dir.join(format!("{name}-dead.tsv")));
    run_ok(
        tiderec()
            .args(["train", "--progress", "none", "--max-bad-fraction", "0.1", "--batch-size", "32", "--data"])
            .arg(format!("criteo:{}", data.display()))
            .args(extra)
            .arg("--dead-letters")
            .arg(&dead)
            .arg("--metrics-json")
            .arg(&m),
    );
    let mut letters: Vec<String> = match std::fs::read_to_string(&dead) {
        Ok(text) => text.lines().map(String::from).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("{}: {e}", dead.display()),
    };
    letters.sort();
    (metrics(&m), letters)
}

/// The figures that must not depend on how the data is read.
fn figures(m: &serde_json::Value) -> Vec<(String, serde_json::Value)> {
    [
        "params_l2",
        "train_loss",
        "auc",
        "logloss",
        "samples",
        "steps",
        "eval_samples",
        "bad_records",
        "bad_records_by_reason",
    ]
    .iter()
    .map(|k| (k.to_string(), m[*k].clone()))
    .collect()
}

#[test]
fn reading_ahead_trains_and_counts_as_reading_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let Some(data) = corrupt_sample(dir.path(), false) else { return };
    for (workers, eval) in [
        ("1", &["--eval-fraction", "0.2", "--eval-every", "2"][..]),
        ("3", &["--eval-fraction", "0"]),
        ("2", &["--eval-fraction", "0.1"]),
    ] {
        let extra = [&["--workers", workers, "--epochs", "2"][..], eval].concat();
        let name = format!("w{workers}");
        let (ahead, ahead_letters) =
            train(dir.path(), &format!("{name}-ahead"), &data, &[&extra[..], &["--read-ahead=on"]].concat());
        let extra_in_place = [&extra[..], &["--read-ahead=off"]].concat();
        let (in_place, in_place_letters) = train(dir.path(), &format!("{name}-in-place"), &data, &extra_in_place);
        assert_eq!(figures(&ahead), figures(&in_place), "{workers} workers");
        assert_eq!(ahead_letters, in_place_letters, "{workers} workers");
        assert!(ahead["bad_records"].as_u64().unwrap() > 0, "{ahead}");
        assert_eq!(ahead_letters.len() as u64, ahead["bad_records"].as_u64().unwrap(), "{ahead_letters:?}");
    }
}

#[test]
fn a_run_cut_short_neither_counts_nor_writes_the_batch_read_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let Some(data) = corrupt_sample(dir.path(), true) else { return };
    // One step of 32 samples: lines 1–34 (lines 10 and 20 malformed); the batch read ahead
    // behind it holds line 50.
    for (name, read) in [("cut-ahead", &["--read-ahead=on"][..]), ("cut-in-place", &["--read-ahead=off"][..])] {
        let extra = [&["--steps", "1", "--workers", "1", "--eval-fraction", "0"][..], read].concat();
        let (m, letters) = train(dir.path(), name, &data, &extra);
        assert_eq!(m["bad_records"], 2, "{read:?}: {m}");
        let lines: Vec<&str> = letters.iter().map(|l| l.split('\t').nth(1).unwrap()).collect();
        assert_eq!(lines, ["10", "20"], "{read:?}");
    }
}

#[test]
fn a_resumed_run_reads_and_writes_as_the_whole_run() {
    let dir = tempfile::tempdir().unwrap();
    let Some(data) = corrupt_sample(dir.path(), true) else { return };
    let ckpt = dir.path().join("ckpt");
    let ckpt_flags = ["--checkpoint-dir", ckpt.to_str().unwrap(), "--checkpoint-every", "2"];
    let base = ["--eval-fraction", "0", "--epochs", "2", "--workers", "2"];
    let (whole, whole_letters) = train(dir.path(), "whole", &data, &[&base[..], &["--read-ahead=off"]].concat());
    // Stop after step 4 of 8 (the second epoch's first step)...
    train(dir.path(), "first", &data, &[&base[..], &ckpt_flags, &["--steps", "4"]].concat());
    assert_eq!(checkpoint_entries(&ckpt).0.last(), Some(&4));
    // ...and resume: the data skipped to step 4, read ahead from there.
    let resume = ["--resume", "--read-ahead=on"];
    let (resumed, letters) = train(dir.path(), "resumed", &data, &[&base[..], &ckpt_flags, &resume].concat());
    assert_eq!(resumed["resumed_from_step"], 4, "{resumed}");
    for key in ["params_l2", "bad_records", "bad_records_by_reason"] {
        assert_eq!(resumed[key], whole[key], "{key}");
    }
    assert_eq!(letters, whole_letters, "the skipped epoch's and step's dead letters, and the rest");
    assert_eq!(whole["bad_records"], 6, "three per epoch: {whole}");
}

#[test]
fn a_failing_record_read_ahead_fails_the_run_as_read_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let Some(data) = corrupt_sample(dir.path(), true) else { return };
    // Lines 10 and 20 fail the first step under `fail` unless they come later: drop them.
    let text = std::fs::read_to_string(&data).unwrap();
    let lines: Vec<&str> = text.lines().enumerate().filter(|(i, _)| *i != 9 && *i != 19).map(|(_, l)| l).collect();
    let late = dir.path().join("late-only.txt");
    std::fs::write(&late, lines.join("\n") + "\n").unwrap();
    let mut errors = Vec::new();
    for read in ["on", "off"] {
        let err = common::run_err(
            tiderec()
                .args(["train", "--progress", "none", "--workers", "1", "--batch-size", "32", "--eval-fraction", "0"])
                .args(["--on-bad-record", "fail", "--read-ahead", read, "--data"])
                .arg(format!("criteo:{}", late.display()))
                .arg("--dead-letters")
                .arg(dir.path().join(format!("dead-{read}.tsv"))),
        );
        // Line 48 of the file (line 50 of the sample) lies in the second micro-batch: the run
        // fails naming it, whether that batch was read during the first step or after it.
        let line = err.lines().find(|l| l.contains("late-only.txt:48")).unwrap_or_else(|| panic!("{read}: {err}"));
        errors.push(line.to_string());
    }
    assert_eq!(errors[0], errors[1]);
}
