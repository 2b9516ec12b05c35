//! Checkpoints written again at the same step, and the runs around them, through the
//! release binary: a checkpoint rewritten after an improving evaluation is whole (never a
//! delta of itself), the last evaluation's improvement reaches `DIR/best`, a resume never
//! goes past (and so never prunes) a newer checkpoint it cannot judge, a failure after the
//! rename is a warning, and a replacement cut short by a crash is undone on resume.

mod common;

use common::{checkpoint_entries as entries, metrics, run_err, run_ok, tiderec};
use std::path::Path;

/// Synthetic data, 256 samples a step; each test adds `--samples` and `--eval-fraction`.
const SMALL: &[&str] = &["train", "--batch-size", "256", "--buckets", "5000", "--seed", "7", "--progress", "none"];

/// Runs `tiderec` with `SMALL` and `extra`, which must succeed; returns the metrics and stderr.
fn train(extra: &[&str], out: &Path) -> (serde_json::Value, String) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let m = out.join(format!("m-{}.json", N.fetch_add(1, Ordering::Relaxed)));
    let o = run_ok(tiderec().args(SMALL).args(extra).arg("--metrics-json").arg(&m));
    (metrics(&m), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn manifest(ck: &Path, step: u64) -> serde_json::Value {
    metrics(&ck.join(format!("ckpt-{step}/manifest.json")))
}

/// Every checkpoint in `ck` that is a delta follows an earlier step.
fn assert_deltas_follow_earlier_steps(ck: &Path) {
    for step in entries(ck).0 {
        if let Some(parent) = manifest(ck, step)["delta"]["parent"].as_u64() {
            assert!(parent < step, "ckpt-{step} is a delta of ckpt-{parent}");
        }
    }
}

/// `DIR/best` is a checkpoint `tiderec export` reads, of step `step`.
fn assert_best_loads(ck: &Path, step: u64, out: &Path) {
    let link = std::fs::read_link(ck.join("best")).expect("DIR/best");
    assert_eq!(link, Path::new(&format!("ckpt-{step}")));
    let o = run_ok(tiderec().args(["export", "--checkpoint"]).arg(ck.join("best")).arg("--out").arg(out));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("step {step}")));
}

/// `--checkpoint-every 5` with 10 steps per epoch: step 10's checkpoint is written, then the
/// epoch's first evaluation improves and step 10 is checkpointed again. That rewrite must be
/// whole: as a delta it would name the directory it replaces as its parent, which the
/// replacement removes, and every later link, the resume and `DIR/best` would break.
#[test]
fn a_checkpoint_rewritten_after_the_epochs_evaluation_is_whole_and_every_checkpoint_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = ck.to_str().unwrap();
    // 10 steps per epoch (the eval split comes on top).
    let base = ["--samples", "2560", "--eval-fraction", "0.2", "--checkpoint-every", "5", "--checkpoint-dir", ck_arg];
    let (first, stderr) = train(&[&base[..], &["--epochs", "2"]].concat(), tmp.path());
    assert_eq!(first["steps"], 20, "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    assert_deltas_follow_earlier_steps(&ck);
    let best = first["best_step"].as_u64().expect("the run evaluates");
    assert_best_loads(&ck, best, &tmp.path().join("served"));
    // The newest checkpoint (and its chain) loads: the resume starts from the last step.
    let (resumed, stderr) = train(&[&base[..], &["--resume", "--epochs", "3"]].concat(), tmp.path());
    assert_eq!(resumed["resumed_from_step"], 20, "{stderr}");
    assert!(!stderr.contains("skipping checkpoint"), "{stderr}");
    assert_eq!(resumed["steps"], 30);
    assert_deltas_follow_earlier_steps(&ck);
}

/// The evaluation at the end of `--steps` (step 12, between `--eval-every` points) improves
/// on the earlier ones: its step is checkpointed again, so `DIR/best` names the summary's
/// best step, and that checkpoint loads.
#[test]
fn an_improving_last_evaluation_at_the_steps_end_is_what_best_names() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = ck.to_str().unwrap();
    // 20 steps per epoch, so step 12 is inside the first.
    let args = ["--samples", "5120", "--eval-fraction", "0.2", "--steps", "12", "--checkpoint-every", "6"];
    let (m, stderr) = train(&[&args[..], &["--eval-every", "5", "--checkpoint-dir", ck_arg]].concat(), tmp.path());
    let evaluated: Vec<u64> =
        m["evaluations"].as_array().unwrap().iter().map(|e| e["step"].as_u64().unwrap()).collect();
    assert_eq!(evaluated, vec![5, 10, 12], "{stderr}");
    assert_eq!(m["best_step"], 12, "the case under test: the last evaluation improves ({stderr})");
    assert_best_loads(&ck, 12, &tmp.path().join("served"));
    assert_deltas_follow_earlier_steps(&ck);
    assert!(manifest(&ck, 12)["delta"].is_null(), "the rewrite of the chain's newest step is whole");
}

/// A newer checkpoint in a format this build cannot read (a newer build's) may be valid: a
/// resume that would go back past it (and prune it with its first checkpoint) is refused,
/// naming it, and it is still there.
#[test]
fn a_resume_refuses_to_go_past_a_newer_checkpoint_of_a_newer_format() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = ck.to_str().unwrap();
    // 10 steps per epoch.
    let base = ["--samples", "2560", "--eval-fraction", "0", "--epochs", "3", "--checkpoint-every", "4"];
    let base = [&base[..], &["--checkpoint-dir", ck_arg]].concat();
    train(&[&base[..], &["--steps", "8"]].concat(), tmp.path());
    assert_eq!(entries(&ck).0, vec![4, 8]);
    // ckpt-8 as a newer build would have written it.
    let path = ck.join("ckpt-8/manifest.json");
    let mut newer = metrics(&path);
    newer["format_version"] = (newer["format_version"].as_u64().unwrap() + 1).into();
    std::fs::write(&path, serde_json::to_string_pretty(&newer).unwrap()).unwrap();
    let e = run_err(tiderec().args(SMALL).args(&base).args(["--steps", "16", "--resume"]));
    assert!(e.contains("ckpt-8") && e.contains("format version"), "{e}");
    assert_eq!(entries(&ck).0, vec![4, 8], "nothing was removed");
    assert_eq!(metrics(&path), newer);
}

/// `DIR/best` cannot be replaced (a directory is in its way): the checkpoints are durable, so
/// the run warns and goes on instead of failing them.
#[test]
fn a_best_link_that_cannot_be_set_is_a_warning_not_a_failed_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    std::fs::create_dir_all(ck.join("best")).unwrap();
    std::fs::write(ck.join("best/in-the-way"), b"x").unwrap();
    let args = ["--samples", "2560", "--eval-fraction", "0.2", "--checkpoint-every", "4", "--checkpoint-dir"];
    let args = [&args[..], &[ck.to_str().unwrap()]].concat();
    let (m, stderr) = train(&args, tmp.path());
    assert_eq!(m["steps"], 10);
    assert!(stderr.contains("warning") && stderr.contains("best"), "{stderr}");
    assert!(m["checkpoints_written"].as_u64().unwrap() >= 3, "{m}");
    assert_eq!(entries(&ck).0.last(), Some(&10));
    assert!(ck.join("best/in-the-way").is_file());
}

/// A crash between the two renames of a replacement leaves the step's checkpoint only as
/// `.old-ckpt-<step>-<pid>`: the resume renames it back and starts from it.
#[test]
fn a_checkpoint_left_by_an_interrupted_replacement_is_restored_on_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = ck.to_str().unwrap();
    // 10 steps per epoch.
    let base = ["--samples", "2560", "--eval-fraction", "0", "--epochs", "3", "--checkpoint-every", "4"];
    let base = [&base[..], &["--checkpoint-dir", ck_arg]].concat();
    train(&[&base[..], &["--steps", "8"]].concat(), tmp.path());
    assert_eq!(entries(&ck).0, vec![4, 8]);
    std::fs::rename(ck.join("ckpt-8"), ck.join(".old-ckpt-8-99999")).unwrap();
    let (m, stderr) = train(&[&base[..], &["--steps", "12", "--resume"]].concat(), tmp.path());
    assert_eq!(m["resumed_from_step"], 8, "{stderr}");
    assert!(stderr.contains("restored") && stderr.contains(".old-ckpt-8-99999"), "{stderr}");
    let (steps, other) = entries(&ck);
    assert!(steps.contains(&8) && steps.contains(&12), "{steps:?}");
    assert!(other.is_empty(), "{other:?}");
}
