//! Per-epoch shuffling of line files and of their Parquet conversions, through the
//! release binary on `criteo/sample.train`: epochs after the first read blocks of each
//! worker's byte ranges in a seeded order, a TSV and its conversion still train the same
//! model, and a run stopped inside a shuffled epoch resumes to the uninterrupted result.

mod common;

use common::{rel_diff, run_ok, shared_data, tiderec, train_metrics as train};
use std::path::Path;

/// Flags of every run here: 10,000 rows at 256 per step, no held-out data.
const COMMON: [&str; 10] =
    ["--seed", "7", "--buckets", "20000", "--batch-size", "256", "--eval-fraction", "0", "--model", "fm"];

fn convert(from: &str, out: &Path) {
    run_ok(
        tiderec()
            .args(["convert", "--progress", "none", "--from", from, "--to"])
            .arg(format!("parquet:{}", out.display()))
            // Several files and row groups: blocks start inside row groups and cross files.
            .args(["--seed", "7", "--buckets", "20000", "--row-group-rows", "1500", "--rows-per-file", "4000"]),
    );
}

fn f64_of(m: &serde_json::Value, key: &str) -> f64 {
    m[key].as_f64().unwrap_or_else(|| panic!("{key} in {m}"))
}

#[test]
fn a_tsv_and_its_conversion_shuffle_alike_for_one_two_and_three_workers() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pq");
    let criteo = format!("criteo:{}", src.display());
    convert(&criteo, &out);
    let parquet = format!("parquet:{}", out.display());
    for workers in ["1", "2", "3"] {
        // Blocks of an odd size cut lines and row groups anywhere.
        let run = [&COMMON[..], &["--workers", workers, "--epochs", "3", "--shuffle-block-bytes", "40000"]].concat();
        let tsv = train(&criteo, dir.path(), &format!("tsv{workers}"), &run);
        let pq = train(&parquet, dir.path(), &format!("pq{workers}"), &run);
        assert_eq!(tsv["samples"], 30_000, "W = {workers}: every row once per epoch");
        for key in ["samples", "steps", "epochs"] {
            assert_eq!(tsv[key], pq[key], "W = {workers}: {key}");
        }
        for key in ["params_l2", "train_loss", "train_loss_mean"] {
            let (a, b) = (f64_of(&tsv, key), f64_of(&pq, key));
            assert!(rel_diff(a, b) <= 1e-6, "W = {workers}: {key}: TSV {a} vs Parquet {b}");
        }
        println!("W = {workers}: params_l2 TSV {} Parquet {}", tsv["params_l2"], pq["params_l2"]);
    }
}

#[test]
fn shuffling_changes_the_model_and_repeats_exactly() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let criteo = format!("criteo:{}", src.display());
    let run = [&COMMON[..], &["--workers", "2", "--epochs", "2"]].concat();
    let on = train(&criteo, dir.path(), "on", &run);
    let again = train(&criteo, dir.path(), "again", &run);
    let off = train(&criteo, dir.path(), "off", &[&run[..], &["--no-shuffle"]].concat());
    assert_eq!(on["params_l2"], again["params_l2"], "the same seed gives the same run");
    assert_eq!(on["train_loss"], again["train_loss"]);
    assert_eq!((on["samples"].clone(), on["steps"].clone()), (off["samples"].clone(), off["steps"].clone()));
    let (a, b) = (f64_of(&on, "params_l2"), f64_of(&off, "params_l2"));
    println!("params_l2 shuffled {a}, unshuffled {b}");
    assert!(rel_diff(a, b) > 1e-6, "the second epoch is read in another order: {a} vs {b}");
    // Another seed draws another order (and initial model).
    let seed_8: Vec<&str> = run.iter().map(|&a| if a == "7" { "8" } else { a }).collect();
    let other = train(&criteo, dir.path(), "other", &seed_8);
    assert_ne!(other["params_l2"], on["params_l2"]);
}

#[test]
fn a_run_stopped_inside_a_shuffled_epoch_resumes_bit_identically() {
    let Some(src) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let criteo = format!("criteo:{}", src.display());
    let ck = dir.path().join("ck");
    let ck = ck.to_str().unwrap();
    // 40 steps per epoch: step 50 lies inside the second epoch, the first shuffled one.
    let run = [&COMMON[..], &["--workers", "3", "--epochs", "3", "--shuffle-block-bytes", "30000"]].concat();
    let straight = train(&criteo, dir.path(), "straight", &[&run[..], &["--steps", "100"]].concat());
    let checkpoints = ["--checkpoint-dir", ck, "--checkpoint-every", "25"];
    let first = train(&criteo, dir.path(), "first", &[&run[..], &checkpoints, &["--steps", "50"]].concat());
    assert_eq!(first["epochs"], 1, "stopped inside the second epoch");
    let resumed =
        train(&criteo, dir.path(), "resumed", &[&run[..], &checkpoints, &["--steps", "100", "--resume"]].concat());
    assert_eq!(resumed["resumed_from_step"], 50);
    for key in ["params_l2", "train_loss", "train_loss_mean", "steps", "samples", "epochs"] {
        assert_eq!(straight[key], resumed[key], "{key}");
    }
    println!("params_l2 straight {}, resumed {}", straight["params_l2"], resumed["params_l2"]);
    // The newest checkpoint (step 100) stands inside the third epoch: resuming it with
    // another order of that epoch is refused, naming the difference.
    for other in [&["--no-shuffle"][..], &["--shuffle-block-bytes", "40000"]] {
        let mut args = [&COMMON[..], &["--workers", "3", "--epochs", "3"], other, &checkpoints].concat();
        args.extend(["--steps", "110", "--resume"]);
        let out = tiderec().args(["train", "--progress", "none", "--data", &criteo]).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{other:?} resumed");
        assert!(err.contains("stands in epoch 2, which its run read in blocks of 30000 bytes"), "{other:?}: {err}");
    }
}
