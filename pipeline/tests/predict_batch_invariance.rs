//! `tiderec predict` through the release binary: a record's score does not depend on
//! `--batch-size`. Every model scores the same records at batch sizes 1, 7 (a prime, so
//! records sit at every place of their batches), 300 (past the 256 rows where a
//! training forward may change a product's summation) and the default 4096 (the whole
//! input in one pass), and the scores files must be equal byte for byte; with the
//! CPU's kernels and with the portable ones (`TIDEREC_MAX_ISA=portable`, where wide
//! layers would otherwise change summation with the rows).

mod common;

use common::{run_ok, shared_data, tiderec};
use std::path::{Path, PathBuf};

/// The batch sizes every model is scored at.
const BATCH_SIZES: [&str; 4] = ["1", "7", "300", "4096"];

/// The kernel caps each model is scored under: the CPU's own, and none.
const ISAS: [&str; 2] = ["native", "portable"];

/// The first `lines` lines of `source`, repeated as needed, written to `dir/name`.
fn records(source: &Path, dir: &Path, name: &str, lines: usize) -> PathBuf {
    let text = std::fs::read_to_string(source).unwrap();
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let picked: Vec<&str> = all.iter().copied().cycle().take(lines).collect();
    let path = dir.join(name);
    std::fs::write(&path, picked.join("\n") + "\n").unwrap();
    path
}

/// Trains `model` for a few steps on `data`; returns its checkpoint directory.
fn train(dir: &Path, data: &str, model: &str) -> PathBuf {
    let ck = dir.join(format!("ck-{model}"));
    run_ok(
        tiderec()
            .args(["train", "--data", data, "--model", model, "--steps", "5"])
            .args(["--batch-size", "32", "--buckets", "1000", "--progress", "none"])
            .arg("--checkpoint-dir")
            .arg(&ck)
            .arg("--dead-letters")
            .arg(dir.join(format!("{model}-dead.tsv"))),
    );
    ck
}

/// The scores file of `predict` of `data` with the checkpoint `ck` at `batch_size` under
/// `TIDEREC_MAX_ISA=isa`.
fn scores(ck: &Path, data: &str, dir: &Path, batch_size: &str, isa: &str) -> String {
    let out = dir.join("scores.csv");
    run_ok(
        tiderec()
            .env("TIDEREC_MAX_ISA", isa)
            .args(["predict", "--overwrite", "--data", data, "--batch-size", batch_size])
            .arg("--checkpoint")
            .arg(ck)
            .arg("--out")
            .arg(&out)
            .arg("--dead-letters")
            .arg(dir.join("predict-dead.tsv")),
    );
    std::fs::read_to_string(&out).unwrap()
}

/// Each of `models`, trained on `data` (`records` records), scores the same bytes at every
/// batch size of [`BATCH_SIZES`] under every cap of [`ISAS`].
fn check_models(dir: &Path, data: &str, records: usize, models: &[&str]) {
    for model in models {
        let ck = train(dir, data, model);
        for isa in ISAS {
            let reference = scores(&ck, data, dir, BATCH_SIZES[0], isa);
            assert_eq!(reference.lines().count(), records + 1, "{model}: a header and one row per record");
            for batch_size in &BATCH_SIZES[1..] {
                let got = scores(&ck, data, dir, batch_size, isa);
                let differing: Vec<(&str, &str)> =
                    reference.lines().zip(got.lines()).filter(|(a, b)| a != b).take(3).collect();
                assert!(
                    got == reference,
                    "{model} (TIDEREC_MAX_ISA={isa}): --batch-size {batch_size} scores differ from --batch-size 1, \
                     e.g. {differing:?}"
                );
            }
        }
    }
}

/// DLRM (its first layer reads 13 dense features: matrixmultiply's sums), LR, FM,
/// DeepFM and Wide & Deep on 700 Criteo records.
#[test]
fn criteo_models_score_the_same_bytes_at_every_batch_size() {
    let Some(sample) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = records(&sample, dir.path(), "criteo.tsv", 700);
    let data = format!("criteo:{}", path.display());
    check_models(dir.path(), &data, 700, &["dlrm", "lr", "fm", "deepfm", "wdl"]);
}

/// DIEN (GRU and attention over histories padded to each batch's longest) and its
/// sum-pooling form on 380 Amazon records.
#[test]
fn dien_models_score_the_same_bytes_at_every_batch_size() {
    let Some(sample) = shared_data("amazon_dien/local_test") else { return };
    let dir = tempfile::tempdir().unwrap();
    let path = records(&sample, dir.path(), "amazon.tsv", 380);
    let data = format!("amazon-dien:{}", path.display());
    check_models(dir.path(), &data, 380, &["dien", "dien-sum"]);
}
