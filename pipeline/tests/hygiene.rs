//! Training hygiene through the binary: evaluation every epoch, early stopping
//! with the best model kept, the `best` checkpoint link, learning-rate
//! schedules across a resume, L2 penalties and FTRL's L1.

mod common;

use common::{metrics, rel_diff, run_err, run_ok, shared_data, tiderec, train_metrics};
use std::path::Path;

/// The real Criteo head: 8,000 training and 2,000 held-out records.
const CRITEO_SPLIT: &[&str] = &["--eval-fraction", "0.2", "--buckets", "20000", "--seed", "3"];

fn criteo() -> Option<String> {
    shared_data("criteo/sample.train").map(|p| format!("criteo:{}", p.display()))
}

fn evaluations(m: &serde_json::Value) -> Vec<(u64, f64)> {
    m["evaluations"]
        .as_array()
        .expect("an evaluation list")
        .iter()
        .map(|e| (e["step"].as_u64().unwrap(), e["auc"].as_f64().unwrap()))
        .collect()
}

#[test]
fn ten_epochs_of_dlrm_on_criteo_stop_early_with_the_best_epochs_model() {
    let Some(data) = criteo() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, extra: &[&str]| {
        let args: Vec<&str> = CRITEO_SPLIT.iter().copied().chain(extra.iter().copied()).collect();
        train_metrics(&data, tmp.path(), name, &args)
    };
    let two = run("two", &["--epochs", "10", "--early-stop", "2", "--workers", "2"]);
    let evals = evaluations(&two);
    let stopped = two["early_stopped_at_step"].as_u64().expect("ten epochs overfit 8,000 records: it stops early");
    let epochs = two["epochs"].as_u64().unwrap();
    assert!(epochs < 10, "stopped after {epochs} epochs");
    assert_eq!(evals.len() as u64, epochs, "one evaluation per epoch");
    assert_eq!(evals.last().unwrap().0, stopped);
    // The best is the highest AUC, followed by exactly two evaluations without improvement.
    let best = (0..evals.len()).fold(0, |b, i| if evals[i].1 > evals[b].1 { i } else { b });
    assert_eq!(evals.len(), best + 3, "{evals:?}");
    assert_eq!(two["best_step"].as_u64(), Some(evals[best].0));
    assert_eq!(two["auc"].as_f64(), Some(evals[best].1), "the final AUC is the best epoch's");
    // The model is the best epoch's: a run of exactly that many epochs ends with the same one.
    let best_epoch = (best + 1).to_string();
    let short = run("short", &["--epochs", &best_epoch, "--workers", "2"]);
    assert_eq!(short["params_l2"], two["params_l2"], "the best epoch's parameters were restored");
    assert_eq!(short["auc"], two["auc"]);
    // With checkpoints the best model comes back from `DIR/best`, the same model.
    let ck = tmp.path().join("ck");
    let ck_arg = ck.to_str().unwrap();
    let disk = run("disk", &["--epochs", "10", "--early-stop", "2", "--workers", "2", "--checkpoint-dir", ck_arg]);
    assert_eq!(disk["params_l2"], two["params_l2"]);
    assert_eq!(disk["auc"], two["auc"]);
    let link = std::fs::read_link(ck.join("best")).expect("DIR/best");
    assert_eq!(link, Path::new(&format!("ckpt-{}", evals[best].0)));
    let manifest = metrics(&ck.join("best/manifest.json"));
    assert_eq!(manifest["step"].as_u64(), Some(evals[best].0));
    let out = tmp.path().join("served");
    let o = run_ok(tiderec().args(["export", "--checkpoint"]).arg(ck.join("best")).arg("--out").arg(&out));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("step {}", evals[best].0)));
}

#[test]
fn one_and_two_workers_stop_early_at_the_same_step() {
    // Generated data (the same global batches for any worker count; file data is split
    // between workers by position, so its batches differ); 20 steps per epoch.
    let tmp = tempfile::tempdir().unwrap();
    let run = |workers: &str| {
        let args = ["--samples", "5120", "--batch-size", "256", "--eval-fraction", "0.2", "--buckets", "20000"];
        let more = ["--seed", "7", "--lr", "0.005", "--sparse-lr", "0.1", "--epochs", "8", "--early-stop", "2"];
        let all: Vec<&str> = args.iter().chain(&more).copied().chain(["--workers", workers]).collect();
        train_metrics("synthetic", tmp.path(), &format!("w{workers}"), &all)
    };
    let (one, two) = (run("1"), run("2"));
    assert!(two["early_stopped_at_step"].as_u64().is_some_and(|s| s < 160), "{two}");
    for key in ["early_stopped_at_step", "best_step", "steps", "epochs"] {
        assert_eq!(one[key], two[key], "{key}");
    }
    let (e1, e2) = (evaluations(&one), evaluations(&two));
    assert_eq!(e1.len(), e2.len());
    for ((s1, a1), (s2, a2)) in e1.into_iter().zip(e2) {
        assert!(s1 == s2 && rel_diff(a1, a2) <= 1e-4, "step {s1}: AUC {a1} vs {a2}");
    }
    let (p1, p2) = (one["params_l2"].as_f64().unwrap(), two["params_l2"].as_f64().unwrap());
    assert!(rel_diff(p1, p2) <= 1e-4, "params_l2 {p1} vs {p2}");
}

#[test]
fn a_schedule_trains_the_same_on_one_and_two_workers() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |workers: &str, schedule: &[&str]| {
        let args = ["--samples", "5120", "--batch-size", "256", "--eval-fraction", "0", "--buckets", "20000"];
        let more = ["--seed", "7", "--lr", "0.005", "--sparse-lr", "0.1", "--steps", "30", "--workers", workers];
        let all: Vec<&str> = args.iter().chain(&more).chain(schedule).copied().collect();
        let m = train_metrics("synthetic", tmp.path(), &format!("w{workers}-{}", schedule.len()), &all);
        m["params_l2"].as_f64().unwrap()
    };
    // A warm-up over 5 steps, then a linear decay to 0 at step 160, on both optimizers.
    let schedule = ["--lr-warmup", "5", "--lr-decay", "linear", "--lr-decay-steps", "160"];
    let (one, two, flat) = (run("1", &schedule), run("2", &schedule), run("2", &[]));
    assert!(rel_diff(one, two) <= 1e-6, "{one} vs {two}");
    assert!(rel_diff(two, flat) > 1e-3, "the schedule changes training: {two} vs {flat}");
}

/// Synthetic data, 40 steps per epoch, evaluated every 10 steps on its held-out part;
/// a high rate so that the evaluations stop improving.
const SYNTHETIC: &[&str] = &[
    "--samples",
    "10240",
    "--batch-size",
    "256",
    "--eval-fraction",
    "0.1",
    "--buckets",
    "20000",
    "--seed",
    "7",
    "--workers",
    "2",
    "--eval-every",
    "10",
    "--early-stop",
    "3",
    "--lr",
    "0.02",
    "--sparse-lr",
    "0.3",
    "--epochs",
    "3",
];

/// A warm-up, then cosine decay to 0 at step 120.
const SCHEDULE: &[&str] = &["--lr-warmup", "10", "--lr-decay", "cosine", "--lr-decay-steps", "120"];

#[test]
fn a_resumed_run_continues_the_schedule_and_the_early_stop_state() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = ck.to_str().unwrap().to_string();
    let args = |schedule: &[&str], steps: &str, extra: &[&str]| -> Vec<String> {
        SYNTHETIC.iter().chain(schedule).chain(&["--steps", steps]).chain(extra).map(|s| s.to_string()).collect()
    };
    let straight = train_metrics("synthetic", tmp.path(), "straight", &to_strs(&args(SCHEDULE, "120", &[])));
    let stopped = straight["early_stopped_at_step"].as_u64().expect("the run stops early");
    let best = straight["best_step"].as_u64().unwrap();
    assert!(best < 60 && 60 < stopped && stopped < 120, "best {best}, stopped after {stopped}");
    // Interrupted at step 60, between the best step and the stop: the resumed run must
    // know the best step and the patience spent, and restore the best model from `DIR/best`.
    let first = args(SCHEDULE, "60", &["--checkpoint-dir", &ck_arg]);
    train_metrics("synthetic", tmp.path(), "first", &to_strs(&first));
    let resumed = args(SCHEDULE, "120", &["--checkpoint-dir", &ck_arg, "--resume"]);
    let resumed = train_metrics("synthetic", tmp.path(), "resumed", &to_strs(&resumed));
    assert_eq!(resumed["resumed_from_step"], 60);
    for key in ["steps", "samples", "epochs", "best_step", "early_stopped_at_step", "evaluations", "auc"] {
        assert_eq!(straight[key], resumed[key], "{key}");
    }
    let (a, b) = (straight["params_l2"].as_f64().unwrap(), resumed["params_l2"].as_f64().unwrap());
    assert!(rel_diff(a, b) <= 1e-6, "params_l2 {a} vs {b}");
    assert_eq!(std::fs::read_link(ck.join("best")).unwrap(), Path::new(&format!("ckpt-{best}")));
    // The schedule changes training: the same run at a constant rate ends elsewhere.
    let flat = train_metrics("synthetic", tmp.path(), "flat", &to_strs(&args(&[], "120", &[])));
    assert_ne!(flat["evaluations"], straight["evaluations"]);
    // A resume with another schedule is refused, naming the difference.
    let other = ["--lr-warmup", "10", "--lr-decay", "cosine", "--lr-decay-steps", "200"];
    let other = args(&other, "120", &["--checkpoint-dir", &ck_arg, "--resume"]);
    let e = run_err(tiderec().arg("train").args(["--progress", "none"]).args(&other));
    assert!(e.contains("schedule"), "{e}");
}

fn to_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn fifty_steps(extra: &[&str], dir: &Path, name: &str) -> serde_json::Value {
    let base = ["--steps", "50", "--samples", "12800", "--batch-size", "256", "--eval-fraction", "0", "--seed", "11"];
    let args: Vec<&str> =
        base.iter().chain(["--buckets", "20000", "--workers", "2"].iter()).chain(extra).copied().collect();
    train_metrics("synthetic", dir, name, &args)
}

#[test]
fn l2_penalties_shrink_the_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let plain = fifty_steps(&[], tmp.path(), "plain")["params_l2"].as_f64().unwrap();
    let dense = fifty_steps(&["--l2-dense", "0.5"], tmp.path(), "dense")["params_l2"].as_f64().unwrap();
    assert!(dense < plain * 0.999, "dense penalty: {dense} vs {plain}");
    // Row SGD: each touched row shrinks by (1 − lr·λ) besides its gradient step. (Adaptive
    // row optimizers divide the penalty by their accumulator like any gradient.)
    let sgd = ["--sparse-optimizer", "sgd", "--sparse-lr", "0.05"];
    let plain = fifty_steps(&sgd, tmp.path(), "sgd")["params_l2"].as_f64().unwrap();
    let args: Vec<&str> = sgd.iter().copied().chain(["--l2-embedding", "0.5"]).collect();
    let rows = fifty_steps(&args, tmp.path(), "rows")["params_l2"].as_f64().unwrap();
    assert!(rows < plain * 0.999, "embedding penalty: {rows} vs {plain}");
}

/// Exact zeros among the embedding values of `ckpt`'s newest checkpoint.
fn zeros(ckpt: &Path) -> usize {
    let model = tiderec::serving::load(ckpt).unwrap();
    model.tables.iter().map(|t| t.values().iter().filter(|&&v| v == 0.0).count()).sum()
}

#[test]
fn ftrl_l1_makes_exact_zeros() {
    let tmp = tempfile::tempdir().unwrap();
    let mut counts = Vec::new();
    for l1 in ["0", "0.5"] {
        let ck = tmp.path().join(format!("ck-{l1}"));
        let flags = ["--model", "lr", "--sparse-optimizer", "ftrl", "--sparse-lr", "0.1", "--ftrl-l1", l1];
        let ck_arg = ck.to_str().unwrap();
        let args: Vec<&str> = flags.iter().copied().chain(["--ftrl-l2", "1", "--checkpoint-dir", ck_arg]).collect();
        fifty_steps(&args, tmp.path(), &format!("ftrl-{l1}"));
        counts.push(zeros(&ck));
    }
    assert!(counts[1] > counts[0] + 1000, "L1 zeroes rows FTRL touched: {counts:?}");
}

#[test]
fn bad_hygiene_settings_are_refused_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    for (flags, key) in [
        (vec!["--l2-dense=-0.5"], "l2_dense"),
        (vec!["--early-stop", "0"], "early_stop"),
        (vec!["--best-metric", "accuracy"], "best_metric"),
        (vec!["--lr-decay", "sometimes"], "lr_decay"),
        (vec!["--ftrl-l1", "1"], "ftrl"),
        (vec!["--early-stop", "2", "--eval-fraction", "0"], "early_stop"),
    ] {
        let e = run_err(tiderec().args(["train", "--progress", "none", "--steps", "1"]).args(&flags));
        assert!(e.contains(key), "{flags:?}: {e}");
    }
    // The same keys in a TOML file.
    let toml = tmp.path().join("run.toml");
    std::fs::write(&toml, "l2_embedding = -1.0\n").unwrap();
    let e = run_err(tiderec().args(["train", "--progress", "none", "--config"]).arg(&toml));
    assert!(e.contains("l2_embedding"), "{e}");
    std::fs::write(&toml, "lr_decay = \"cosine\"\nlr_warmup = 5\nlr_decay_steps = 4\n").unwrap();
    let e = run_err(tiderec().args(["train", "--progress", "none", "--config"]).arg(&toml));
    assert!(e.contains("lr_decay_steps"), "{e}");
}
