//! Replaying converted Parquet files with several workers trains the same model
//! as reading the raw files with as many workers: rows are split inside row
//! groups exactly as the line readers split the raw files' bytes, so no worker
//! idles and every global batch is the raw files' one.

mod common;

use common::{rel_diff, run_ok, shared_data, tiderec, train_metrics as train};
use std::path::Path;

fn convert(from: &str, out: &Path, extra: &[&str]) {
    run_ok(
        tiderec()
            .args(["convert", "--progress", "none", "--from", from, "--to"])
            .arg(format!("parquet:{}", out.display()))
            .args(extra),
    );
}

/// `criteo:` and its conversion give the same run for `workers` workers.
fn assert_same_run(tsv: &serde_json::Value, pq: &serde_json::Value, what: &str) {
    for key in ["samples", "steps", "eval_samples"] {
        assert_eq!(tsv[key], pq[key], "{what}: {key}");
    }
    for key in ["params_l2", "train_loss", "auc"] {
        let (a, b) = (tsv[key].as_f64().unwrap(), pq[key].as_f64().unwrap());
        assert!(rel_diff(a, b) <= 1e-6, "{what}: {key}: TSV {a} vs Parquet {b}");
    }
}

#[test]
fn converted_criteo_trains_like_the_tsv_for_one_two_and_three_workers() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pq");
    let criteo = format!("criteo:{}", src.display());
    // Several files and row groups, so worker ranges start inside row groups and cross files.
    convert(
        &criteo,
        &out,
        &["--seed", "7", "--buckets", "20000", "--row-group-rows", "1500", "--rows-per-file", "4000"],
    );
    let parquet = format!("parquet:{}", out.display());
    for workers in ["1", "2", "3"] {
        // The default held-out fraction: the byte split of the raw files holds out the same rows.
        let args = ["--workers", workers, "--seed", "7", "--buckets", "20000", "--batch-size", "256", "--epochs", "2"];
        let tsv = train(&criteo, dir.path(), &format!("tsv{workers}"), &args);
        let pq = train(&parquet, dir.path(), &format!("pq{workers}"), &args);
        assert!(tsv["eval_samples"].as_u64().unwrap() > 0);
        assert_same_run(&tsv, &pq, &format!("W = {workers}"));
    }
}

#[test]
fn a_file_with_one_row_group_feeds_three_workers() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pq");
    let criteo = format!("criteo:{}", src.display());
    convert(&criteo, &out, &[]);
    let parquet = format!("parquet:{}", out.display());
    let args = ["--workers", "3", "--batch-size", "300", "--eval-fraction", "0", "--model", "lr"];
    let pq = train(&parquet, dir.path(), "pq", &args);
    let tsv = train(&criteo, dir.path(), "tsv", &args);
    assert_eq!(pq["samples"], 10_000, "every row once");
    // 10,000 rows at 300 per step take 34 steps when all three workers read (each about a
    // third, 100 per step); were one worker alone it would take 100.
    let steps = pq["steps"].as_u64().unwrap();
    assert!((34..=36).contains(&steps), "{steps} steps: all three workers read");
    assert_eq!(pq["steps"], tsv["steps"]);
    let (a, b) = (tsv["params_l2"].as_f64().unwrap(), pq["params_l2"].as_f64().unwrap());
    assert!(rel_diff(a, b) <= 1e-6, "TSV {a} vs Parquet {b}");
}
