//! `train --metrics-log`: the online trainer's JSON lines, with each held-out
//! evaluation in the `window_*` fields, read back by `tiderec plot`.

mod common;

use common::{run_ok, shared_data, tiderec, train_metrics};

#[test]
fn train_writes_the_online_log_with_every_evaluation_and_plot_reads_it() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("steps.jsonl");
    let m = train_metrics(
        &format!("criteo:{}", data.display()),
        dir.path(),
        "run",
        &["--model", "fm", "--epochs", "2", "--eval-fraction", "0.2", "--metrics-log", log.to_str().unwrap()],
    );
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.len() >= 3, "{} lines", lines.len());
    assert_eq!(lines[0]["step"], 1);
    assert!(lines[0]["window_auc"].is_null(), "no evaluation before the first step");
    let steps: Vec<u64> = lines.iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "{steps:?}");
    assert_eq!(steps.last().copied(), m["steps"].as_u64());
    // Every evaluation of the run appears in the log, in order, and the last line has the final one.
    let evaluations: Vec<f64> =
        m["evaluations"].as_array().unwrap().iter().map(|e| e["auc"].as_f64().unwrap()).collect();
    assert_eq!(evaluations.len(), 2);
    let mut logged: Vec<f64> = lines.iter().filter_map(|l| l["window_auc"].as_f64()).collect();
    logged.dedup();
    assert_eq!(logged, evaluations);
    assert_eq!(lines.last().unwrap()["window_auc"].as_f64(), m["auc"].as_f64());
    for key in ["ne", "calibration", "pr_auc"] {
        let last = &lines.last().unwrap()[format!("window_{key}")];
        assert!(last.is_number() && last.as_f64() == m[key].as_f64(), "{key}: {last} vs {}", m[key]);
    }
    assert!(lines.iter().all(|l| l["window_gauc"].is_null()), "Criteo names no user: no GAUC");
    let png = dir.path().join("curves.png");
    let out = run_ok(tiderec().args(["plot", "--metrics"]).arg(&log).arg("--out").arg(&png));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("plotted {} reports", lines.len())));
    assert!(std::fs::metadata(&png).unwrap().len() > 1000);
}

#[test]
fn tensorboard_reads_every_report_of_the_metrics_log_as_scalars() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let (log, tb) = (dir.path().join("steps.jsonl"), dir.path().join("tb"));
    let m = train_metrics(
        &format!("criteo:{}", data.display()),
        dir.path(),
        "run",
        &["--model", "fm", "--epochs", "2", "--eval-fraction", "0.2", "--metrics-log", log.to_str().unwrap()]
            .into_iter()
            .chain(["--tensorboard", tb.to_str().unwrap()])
            .collect::<Vec<_>>(),
    );
    let Some(scalars) = common::tensorboard_scalars(&tb) else { return };
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // Every line of the log is one event: its step and its loss, as float32.
    let loss = scalars["train/loss"].as_array().unwrap();
    assert_eq!(loss.len(), lines.len(), "{scalars}");
    for (event, line) in loss.iter().zip(&lines) {
        assert_eq!(event[0], line["step"]);
        assert_eq!(event[1].as_f64().unwrap(), line["loss"].as_f64().unwrap() as f32 as f64);
    }
    // The evaluations appear under eval/, from the first report after each; the last is the run's.
    let auc = scalars["eval/auc"].as_array().unwrap();
    assert_eq!(auc.len(), lines.iter().filter(|l| l["window_auc"].is_number()).count());
    assert_eq!(auc.last().unwrap()[1].as_f64().unwrap(), m["auc"].as_f64().unwrap() as f32 as f64);
    for tag in ["eval/logloss", "eval/ne", "eval/calibration", "eval/pr_auc", "train/samples_per_sec"] {
        assert!(scalars[tag].as_array().is_some_and(|v| !v.is_empty()), "{tag}: {scalars}");
    }
    assert!(scalars.get("eval/gauc").is_none(), "Criteo names no user: no GAUC");
    assert!(scalars.get("online/lag").is_none(), "train has no lag");
    // A second run writes a file of its own beside the first.
    let again = dir.path().join("again");
    std::fs::create_dir(&again).unwrap();
    train_metrics(
        &format!("criteo:{}", data.display()),
        &again,
        "run",
        &["--steps", "3", "--tensorboard", tb.to_str().unwrap()],
    );
    assert_eq!(std::fs::read_dir(&tb).unwrap().count(), 2);
}

/// The steps of the records of a metrics log, in order.
fn logged_steps(log: &std::path::Path) -> Vec<u64> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["step"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_resumed_run_logs_each_step_once_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (log, ck) = (dir.path().join("steps.jsonl"), dir.path().join("ck"));
    let train = |steps: &str, extra: &[&str]| {
        let mut cmd = tiderec();
        cmd.current_dir(dir.path())
            .args(["train", "--samples", "10240", "--batch-size", "256", "--eval-fraction", "0", "--buckets"])
            .args(["20000", "--seed", "11", "--progress", "none", "--steps", steps, "--checkpoint-every", "5"])
            .arg("--checkpoint-dir")
            .arg(&ck)
            .arg("--metrics-log")
            .arg(&log)
            .args(extra);
        run_ok(&mut cmd)
    };
    // A run checkpointed at step 5 logs on to step 8 (its end); its checkpoint of step 8
    // never made it (killed first, say), so the resumed run starts after step 5.
    train("8", &[]);
    let first = logged_steps(&log);
    assert_eq!((first.first(), first.last()), (Some(&1), Some(&8)), "{first:?}");
    std::fs::remove_dir_all(ck.join("ckpt-8")).unwrap();
    // It redoes steps 6 to 8, and logs step 8 (its end) again.
    let out = train("8", &["--resume"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("after step 5, which the resumed run writes again"), "{stderr}");
    let steps = logged_steps(&log);
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "each step once, in order: {steps:?}");
    let kept: Vec<u64> = first.iter().copied().filter(|&s| s <= 5).collect();
    assert_eq!(steps[..kept.len()], kept[..], "the records up to the checkpoint stay: {steps:?}");
    assert_eq!(steps.last(), Some(&8), "{steps:?}");
}
