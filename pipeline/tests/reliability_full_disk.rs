//! A full disk never leaves half-written outputs: `export`, `predict` (CSV and
//! Parquet) and `convert` writing into a small tmpfs fail naming the error, and
//! leave nothing behind but what was there before.

mod common;

use common::small_fs::SmallFs;
use common::{run_err, run_ok, shared_data, tiderec};
use std::path::Path;

/// A checkpoint of a small model trained on `data` (a `criteo:` spec), in `dir`.
fn checkpoint(dir: &Path, data: &str) -> std::path::PathBuf {
    let ckpt = dir.join("ckpt");
    run_ok(
        tiderec()
            .args(["train", "--buckets", "500", "--bottom", "32,16", "--top", "32,1", "--steps", "20"])
            .args(["--progress", "none", "--data", data, "--checkpoint-dir"])
            .arg(&ckpt),
    );
    ckpt
}

fn assert_no_space(err: &str, what: &str) {
    assert!(err.contains("No space left on device"), "{what}: {err}");
}

#[test]
fn export_on_a_full_disk_leaves_no_files_and_no_directory_it_made() {
    let Some(train) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = checkpoint(dir.path(), &format!("criteo:{}", train.display()));
    // The tables alone are 26 × 500 × 16 floats (832 KB).
    let Some(small) = SmallFs::mount("256k") else { return };
    let out = small.path().join("model");
    let err = run_err(tiderec().args(["export", "--checkpoint"]).arg(&ckpt).arg("--out").arg(&out));
    assert_no_space(&err, "export");
    assert_eq!(small.entries(), Vec::<String>::new(), "export into a new directory");
    // A directory the user made stays, empty.
    std::fs::create_dir(&out).unwrap();
    let err = run_err(tiderec().args(["export", "--checkpoint"]).arg(&ckpt).arg("--out").arg(&out));
    assert_no_space(&err, "export");
    assert_eq!(small.entries(), ["model"], "export into the user's directory");
}

#[test]
fn predict_on_a_full_disk_leaves_no_scores_file() {
    let Some(train) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let data = format!("criteo:{}", train.display());
    let ckpt = checkpoint(dir.path(), &data);
    // 10,000 scores: over 16 KB as CSV or as Parquet (4 bytes a score).
    let Some(small) = SmallFs::mount("16k") else { return };
    for name in ["scores.csv", "scores.parquet"] {
        let out = small.path().join(name);
        let err =
            run_err(tiderec().args(["predict", "--checkpoint"]).arg(&ckpt).args(["--data", &data, "--out"]).arg(&out));
        assert_no_space(&err, name);
        assert_eq!(small.entries(), Vec::<String>::new(), "{name}");
    }
}

#[test]
fn convert_on_a_full_disk_leaves_no_parquet_files() {
    let Some(train) = shared_data("criteo/sample.train") else { return };
    let Some(small) = SmallFs::mount("64k") else { return };
    let out = small.path().join("dataset");
    // Small files, so some are complete before the disk fills: those go too.
    let err = run_err(
        tiderec()
            .args([
                "convert",
                "--progress",
                "none",
                "--buckets",
                "500",
                "--rows-per-file",
                "200",
                "--row-group-rows",
                "100",
            ])
            .arg("--from")
            .arg(format!("criteo:{}", train.display()))
            .arg("--to")
            .arg(format!("parquet:{}", out.display())),
    );
    assert_no_space(&err, "convert");
    let left: Vec<String> = small.entries().into_iter().filter(|e| e.contains("parquet")).collect();
    assert_eq!(left, Vec::<String>::new(), "convert");
}
