//! A resume continues the data it was trained on, or says why it cannot: through
//! the release binary, on Criteo samples copied into a temporary directory.

mod common;

use common::{checkpoint_entries, metrics, run_err, run_ok, shared_data, tiderec};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Writes lines `from..to` of the Criteo sample to `dir/name`.
fn lines_of_sample(dir: &Path, name: &str, from: usize, to: usize) -> Option<PathBuf> {
    let sample = shared_data("criteo/sample.train")?;
    let text = std::fs::read_to_string(sample).unwrap();
    let path = dir.join(name);
    let lines: Vec<&str> = text.lines().skip(from).take(to - from).collect();
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    Some(path)
}

/// A small DLRM run on `data` with checkpoints in `ckpt`, metrics in `metrics`.
fn train(data: &Path, ckpt: &Path, metrics: &Path, extra: &[&str]) -> Command {
    let mut c = tiderec();
    c.args(["train", "--progress", "none", "--batch-size", "128", "--buckets", "5000", "--seed", "3"])
        .args(["--bottom", "32,16", "--top", "32,1", "--eval-fraction", "0"])
        .arg("--data")
        .arg(format!("criteo:{}", data.display()))
        .arg("--checkpoint-dir")
        .arg(ckpt)
        .arg("--metrics-json")
        .arg(metrics)
        .arg("--dead-letters")
        .arg(metrics.with_extension("dead.tsv"))
        .args(extra);
    c
}

#[test]
fn a_resume_on_other_data_is_refused_unless_new_data_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let (Some(a), Some(b)) =
        (lines_of_sample(dir.path(), "a.tsv", 0, 2048), lines_of_sample(dir.path(), "b.tsv", 4096, 5120))
    else {
        return;
    };
    let ckpt = dir.path().join("ckpt");
    let m = |name: &str| dir.path().join(format!("{name}.json"));
    // One epoch of a, stopped after 10 of its 16 steps.
    run_ok(&mut train(&a, &ckpt, &m("first"), &["--steps", "10", "--checkpoint-every", "5"]));
    let (steps, _) = checkpoint_entries(&ckpt);
    assert_eq!(steps.last(), Some(&10));

    // Other data: refused, naming both files, and nothing written.
    let err = run_err(&mut train(&b, &ckpt, &m("refused"), &["--resume"]));
    for part in ["trained on other data", "a.tsv", "b.tsv", "epoch 0, 10 steps into it", "--new-data"] {
        assert!(err.contains(part), "missing `{part}` in: {err}");
    }
    assert_eq!(checkpoint_entries(&ckpt).0, steps, "a refused resume writes no checkpoint");

    // The same bytes under another name and place resume where the run stopped.
    let moved = dir.path().join("moved");
    std::fs::create_dir(&moved).unwrap();
    std::fs::copy(&a, moved.join("copy.tsv")).unwrap();
    run_ok(&mut train(&moved.join("copy.tsv"), &ckpt, &m("moved"), &["--resume"]));
    let resumed = metrics(&m("moved"));
    assert_eq!(resumed["resumed_from_step"], 10, "{resumed}");
    assert_eq!(resumed["samples"], 2048, "the rest of the epoch, once: {resumed}");
    let epoch_steps = resumed["steps"].as_u64().unwrap();

    // --new-data keeps the model (the step count goes on) and reads b from its start.
    let out = run_ok(&mut train(&b, &ckpt, &m("new"), &["--resume", "--new-data"]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--new-data: keeping the model"));
    let new = metrics(&m("new"));
    assert_eq!(new["resumed_from_step"], epoch_steps, "{new}");
    assert!(new["steps"].as_u64().unwrap() >= epoch_steps + 8, "{new}");
    assert_eq!(new["samples"], 2048 + 1024, "all of b, once: {new}");

    // A changed file (one byte, same size) is other data too.
    let mut bytes = std::fs::read(&b).unwrap();
    let at = bytes.len() / 2;
    bytes[at] = if bytes[at] == b'1' { b'2' } else { b'1' };
    std::fs::write(&b, &bytes).unwrap();
    let err = run_err(&mut train(&b, &ckpt, &m("changed"), &["--resume", "--epochs", "2"]));
    assert!(err.contains("the same size, other contents"), "{err}");

    let err = run_err(&mut train(&b, &ckpt, &m("flag"), &["--new-data"]));
    assert!(err.contains("`new_data`") && err.contains("applies to --resume"), "{err}");
}
