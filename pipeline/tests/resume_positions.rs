//! A resume continues from its checkpoint's data position exactly, or refuses: the worker
//! count a file position was read with, a manifest whose copies of the position disagree,
//! and the bad-record counts of `--new-data`. Through the release binary, on copies of the
//! Criteo sample in a temporary directory.

mod common;

use common::{metrics, refused, run_ok, shared_data, tiderec};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Copies the first `lines` lines of the Criteo sample to `dir/name`.
fn sample_copy(dir: &Path, name: &str, lines: usize) -> Option<PathBuf> {
    let text = std::fs::read_to_string(shared_data("criteo/sample.train")?).unwrap();
    let path = dir.join(name);
    let kept: Vec<&str> = text.lines().take(lines).collect();
    std::fs::write(&path, kept.join("\n") + "\n").unwrap();
    Some(path)
}

/// A small DLRM run on Criteo `data` with `workers` workers, checkpoints in `ckpt` and its
/// metrics in `dir/name.json`.
fn train(data: &Path, ckpt: &Path, workers: usize, name: &str, extra: &[&str]) -> Command {
    let dir = ckpt.parent().unwrap();
    let mut c = tiderec();
    c.args(["train", "--progress", "none", "--batch-size", "128", "--buckets", "5000", "--seed", "3"])
        .args(["--bottom", "32,16", "--top", "32,1", "--eval-fraction", "0", "--no-shuffle"])
        .args(["--workers", &workers.to_string()])
        .arg("--data")
        .arg(format!("criteo:{}", data.display()))
        .arg("--checkpoint-dir")
        .arg(ckpt)
        .arg("--metrics-json")
        .arg(dir.join(format!("{name}.json")))
        .arg("--dead-letters")
        .arg(dir.join(format!("{name}-dead.tsv")))
        .args(extra);
    c
}

/// A file position 40 steps into an epoch read by two workers resumes on two workers only
/// (one would skip the first 40 steps of the whole file, not of each half); `--new-data`
/// and a checkpoint at an epoch boundary resume on any count.
#[test]
fn a_file_position_inside_an_epoch_resumes_only_on_its_worker_count() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(data) = sample_copy(tmp.path(), "day.tsv", 10_000) else { return };
    let ck = tmp.path().join("ck");
    run_ok(&mut train(&data, &ck, 2, "first", &["--steps", "40"]));
    let err = refused(&mut train(&data, &ck, 1, "one", &["--steps", "60", "--resume"]));
    for part in ["ckpt-40", "40 steps into epoch 0", "2 worker(s) in all read", "1 worker(s) would skip", "--new-data"]
    {
        assert!(err.contains(part), "missing {part:?}: {err}");
    }
    assert!(!tmp.path().join("one.json").exists(), "refused before any step");
    let two = run_ok(&mut train(&data, &ck, 2, "two", &["--steps", "60", "--resume"]));
    assert!(two.status.success());
    assert_eq!(metrics(&tmp.path().join("two.json"))["resumed_from_step"], 40);
    // --new-data reads the data from its start: any count.
    let fresh = tmp.path().join("ck-new");
    run_ok(&mut train(&data, &fresh, 2, "first-new", &["--steps", "40"]));
    run_ok(&mut train(&data, &fresh, 1, "one-new", &["--steps", "50", "--resume", "--new-data"]));
    // A whole epoch read by two workers: the next one is read whole by any count.
    let boundary = tmp.path().join("ck-epoch");
    run_ok(&mut train(&data, &boundary, 2, "epoch", &["--epochs", "1"]));
    let three = &["--epochs", "2", "--resume"];
    run_ok(&mut train(&data, &boundary, 3, "three", three));
    let m = metrics(&tmp.path().join("three.json"));
    assert_eq!(m["epochs"], 2, "{m}");
    assert!(m["resumed_from_step"].as_u64().unwrap() > 0, "{m}");
}

/// Generated samples are indexed globally: a position inside an epoch of them resumes on
/// another worker count.
#[test]
fn a_generated_position_inside_an_epoch_resumes_on_another_worker_count() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let run = |workers: &str, steps: &str, name: &str, resume: bool| {
        let mut c = tiderec();
        c.args(["train", "--progress", "none", "--samples", "10240", "--batch-size", "256", "--seed", "5"])
            .args(["--workers", workers, "--steps", steps, "--checkpoint-dir"])
            .arg(&ck)
            .arg("--metrics-json")
            .arg(tmp.path().join(format!("{name}.json")))
            .arg("--dead-letters")
            .arg(tmp.path().join("dead.tsv"));
        if resume {
            c.arg("--resume");
        }
        run_ok(&mut c);
        metrics(&tmp.path().join(format!("{name}.json")))
    };
    run("2", "15", "first", false);
    let m = run("1", "30", "resumed", true);
    assert_eq!(m["resumed_from_step"], 15, "{m}");
    assert_eq!(m["steps"], 30, "{m}");
}

/// A manifest whose data position was edited to disagree with its own step count in the
/// epoch is skipped as damaged, with a warning naming it, and the run resumes from the
/// checkpoint before it.
#[test]
fn a_manifest_whose_position_disagrees_with_itself_is_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(data) = sample_copy(tmp.path(), "day.tsv", 10_000) else { return };
    let ck = tmp.path().join("ck");
    run_ok(&mut train(&data, &ck, 2, "first", &["--steps", "40", "--checkpoint-every", "20"]));
    let manifest = ck.join("ckpt-40").join("manifest.json");
    let mut m: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    assert_eq!(m["data_position"]["global_steps_in_epoch"], 40);
    assert_eq!(m["data_position"]["workers"], 2, "the readers' worker count is recorded");
    m["data_position"]["global_steps_in_epoch"] = 20.into();
    std::fs::write(&manifest, serde_json::to_string(&m).unwrap()).unwrap();
    let out = run_ok(&mut train(&data, &ck, 2, "resumed", &["--steps", "60", "--resume"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ckpt-40") && err.contains("`data_position.global_steps_in_epoch` is 20"), "{err}");
    assert_eq!(metrics(&tmp.path().join("resumed.json"))["resumed_from_step"], 20);
}

/// `--resume --new-data` counts the malformed records of the new data only: the old
/// data's two bad lines are neither reported nor held against the budget.
#[test]
fn new_data_starts_the_bad_record_counts_over() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(clean) = sample_copy(tmp.path(), "clean.tsv", 1000) else { return };
    let bad = tmp.path().join("bad.tsv");
    let mut text = std::fs::read_to_string(&clean).unwrap();
    text.push_str("not\ta criteo line\nnor\tthis one\n");
    std::fs::write(&bad, text).unwrap();
    let ck = tmp.path().join("ck");
    run_ok(&mut train(&bad, &ck, 1, "bad", &["--epochs", "1"]));
    assert_eq!(metrics(&tmp.path().join("bad.json"))["bad_records"], 2);
    run_ok(&mut train(&clean, &ck, 1, "new", &["--epochs", "2", "--resume", "--new-data"]));
    let m = metrics(&tmp.path().join("new.json"));
    assert!(m["resumed_from_step"].as_u64().unwrap() > 0, "{m}");
    assert_eq!(m["bad_records"], 0, "{m}");
}

/// A checkpoint directory named for another step than its manifest's is refused by the
/// readers of an explicit checkpoint path, naming the directory and both steps.
#[test]
fn a_checkpoint_named_for_another_step_is_refused_by_its_readers() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(data) = sample_copy(tmp.path(), "day.tsv", 3000) else { return };
    let ck = tmp.path().join("ck");
    run_ok(&mut train(&data, &ck, 1, "first", &["--steps", "20", "--checkpoint-every", "10"]));
    let export = |from: &Path, out: &str| {
        let mut c = tiderec();
        c.args(["export", "--checkpoint"]).arg(from).arg("--out").arg(tmp.path().join(out));
        c
    };
    run_ok(&mut export(&ck.join("ckpt-20"), "good"));
    std::fs::rename(ck.join("ckpt-10"), ck.join("ckpt-30")).unwrap();
    let err = refused(&mut export(&ck.join("ckpt-30"), "renamed"));
    for part in ["ckpt-30", "step 30", "step 10"] {
        assert!(err.contains(part), "missing {part:?}: {err}");
    }
    assert!(!tmp.path().join("renamed").join("model.json").exists());
}
