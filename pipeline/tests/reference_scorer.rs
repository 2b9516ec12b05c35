//! `scripts/reference_scorer.py` (NumPy, from `model.json` and `model.safetensors`
//! alone) against `tiderec predict` on the same checkpoint, for every model kind
//! it rebuilds, on real Criteo records.

mod common;

use common::{run_ok, shared_data, skip, tiderec};
use std::path::{Path, PathBuf};
use std::process::Command;

fn scorer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/reference_scorer.py")
}

/// Whether `python3` with NumPy and safetensors is here (a note, or a failure under CI, when not).
fn python_ready() -> bool {
    let ok =
        Command::new("python3").args(["-c", "import numpy, safetensors"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        skip::cannot_run("python3 with numpy and safetensors not found (pip install numpy safetensors)");
    }
    ok
}

/// `tiderec predict`'s rows for the records of `file` (malformed ones dead-lettered).
fn predict_scores(ckpt: &Path, file: &Path, unlabeled: bool, out: &Path) -> Vec<Row> {
    let mut cmd = tiderec();
    cmd.args(["predict", "--checkpoint"]).arg(ckpt).arg("--data").arg(format!("criteo:{}", file.display()));
    cmd.arg("--out").arg(out).arg("--dead-letters").arg(out.with_extension("dead.tsv"));
    if unlabeled {
        cmd.arg("--unlabeled");
    }
    run_ok(&mut cmd);
    read_rows(out, unlabeled)
}

/// One row of the scorer's CSV.
struct Row {
    file: String,
    position: usize,
    score: f64,
    label: Option<f32>,
}

/// Runs the reference scorer on `files`; returns its rows (the header checked).
fn python_scores(model: &Path, files: &[&Path], unlabeled: bool, out: &Path) -> Vec<Row> {
    let mut cmd = Command::new("python3");
    cmd.arg(scorer()).arg("--model").arg(model).arg("--out").arg(out).args(["--batch-size", "64"]);
    if unlabeled {
        cmd.arg("--unlabeled");
    }
    let o = cmd.args(files).output().unwrap();
    assert!(o.status.success(), "reference scorer failed: {}", String::from_utf8_lossy(&o.stderr));
    read_rows(out, unlabeled)
}

/// The rows of a `file,position,score[,label]` CSV (the header checked).
fn read_rows(out: &Path, unlabeled: bool) -> Vec<Row> {
    let text = std::fs::read_to_string(out).unwrap();
    let mut lines = text.lines();
    let header = if unlabeled { "file,position,score" } else { "file,position,score,label" };
    assert_eq!(lines.next(), Some(header));
    lines
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            Row {
                file: cells[0].to_string(),
                position: cells[1].parse().unwrap(),
                score: cells[2].parse().unwrap(),
                label: cells.get(3).map(|s| s.parse().unwrap()),
            }
        })
        .collect()
}

/// The model.json of an export.
fn model_json(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("model.json")).unwrap()).unwrap()
}

/// Every model kind trained a few steps on the Criteo sample, exported, scored
/// by the Python reference from the export alone and by the library from the
/// checkpoint: the same probabilities within 1e-5, record by record, a
/// malformed record skipped by both at the same place, and `model.json`
/// naming the true kind and the tensors by layer and field.
#[test]
fn the_reference_scorer_matches_the_library_for_every_model_kind() {
    let Some(train) = shared_data("criteo/sample.train") else { return };
    if !python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&train).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let train_file = dir.path().join("train.tsv");
    std::fs::write(&train_file, lines[..8000].join("\n")).unwrap();
    // 400 held-out records with a malformed one (a bad label) at line 3.
    let mut held: Vec<String> = lines[8000..8400].iter().map(|s| s.to_string()).collect();
    held.insert(2, format!("7{}", &held[2][1..]));
    let score_file = dir.path().join("score.tsv");
    std::fs::write(&score_file, held.join("\n") + "\n").unwrap();

    let kinds: [(&str, &[&str]); 5] = [
        ("lr", &[]),
        ("fm", &["--dim", "8"]),
        ("deepfm", &["--dim", "8", "--deep", "32,16"]),
        ("wdl", &["--dim", "8", "--deep", "32,16", "--sparse-optimizer", "ftrl-adagrad"]),
        ("dlrm", &["--dim", "8", "--bottom", "32,8", "--top", "32,1"]),
    ];
    for (kind, flags) in kinds {
        let ckpt = dir.path().join(format!("ckpt-{kind}"));
        run_ok(
            tiderec()
                .args(["train", "--progress", "none", "--model", kind, "--buckets", "3000", "--steps", "60"])
                .args(["--batch-size", "128", "--sparse-lr", "0.05"])
                .args(flags)
                .arg("--data")
                .arg(format!("criteo:{}", train_file.display()))
                .arg("--checkpoint-dir")
                .arg(&ckpt),
        );
        let serve = dir.path().join(format!("serve-{kind}"));
        run_ok(tiderec().args(["export", "--checkpoint"]).arg(&ckpt).arg("--out").arg(&serve));

        let config = model_json(&serve);
        assert_eq!(config["kind"], kind);
        assert_eq!(config["model"]["kind"], kind);
        let tensors = &config["tensors"];
        match kind {
            "dlrm" => {
                assert_eq!(tensors["bottom.0.weight"], serde_json::json!([32, 13]));
                assert_eq!(tensors["top.0.weight"], serde_json::json!([32, 8 + 26 * 27 / 2]));
                assert_eq!(tensors["embeddings.C26"], serde_json::json!([3000, 8]));
            }
            "lr" => {
                assert_eq!(tensors["linear.weight"], serde_json::json!([1, 13]));
                assert_eq!(tensors["first_order.C1"], serde_json::json!([3000, 1]));
                assert!(tensors.get("embeddings.C1").is_none());
            }
            _ => {
                assert_eq!(tensors["first_order.C1"], serde_json::json!([3000, 1]));
                assert_eq!(tensors["embeddings.C1"], serde_json::json!([3000, 8]));
                assert_eq!(tensors.get("deep.0.weight").is_some(), kind != "fm", "{kind}: {tensors}");
            }
        }

        let want = predict_scores(&ckpt, &score_file, false, &dir.path().join(format!("{kind}-predict.csv")));
        let rows = python_scores(&serve, &[&score_file], false, &dir.path().join(format!("{kind}.csv")));
        assert_eq!(rows.len(), 400, "{kind}: one of 401 records is malformed");
        assert_eq!(want.len(), rows.len(), "{kind}: tiderec predict scored {} records", want.len());
        let positions: Vec<usize> = rows.iter().map(|r| r.position).collect();
        let expected: Vec<usize> = (1..=401).filter(|&p| p != 3).collect();
        assert_eq!(positions, expected, "{kind}: positions are line numbers, the malformed line 3 skipped");
        let mut worst = 0.0f64;
        for (r, w) in rows.iter().zip(&want) {
            assert_eq!((&r.file, r.position), (&w.file, w.position));
            assert_eq!(r.file, score_file.display().to_string());
            assert_eq!(r.label, w.label, "{kind}: label of line {}", r.position);
            worst = worst.max((r.score - w.score).abs());
        }
        assert!(worst < 1e-5, "{kind}: the reference's probabilities differ from predict's by up to {worst:e}");
        let (lo, hi) = want.iter().fold((1.0f64, 0.0f64), |(lo, hi), w| (lo.min(w.score), hi.max(w.score)));
        assert!(hi - lo > 1e-3, "{kind}: a trained model tells records apart ({lo}..{hi})");
        eprintln!("{kind}: {} records, largest difference {worst:e}, probabilities {lo:.4}..{hi:.4}", rows.len());

        if kind == "deepfm" {
            unlabeled_records_score_like_predict(&ckpt, &serve, dir.path());
        }
    }
}

/// Kaggle's unlabeled test records (`--unlabeled`) score as `tiderec predict --unlabeled` scores them.
fn unlabeled_records_score_like_predict(ckpt: &Path, serve: &Path, dir: &Path) {
    let Some(test) = shared_data("criteo/sample.test") else { return };
    let text = std::fs::read_to_string(test).unwrap();
    let lines: Vec<&str> = text.lines().take(200).collect();
    let unlabeled = dir.join("test.tsv");
    std::fs::write(&unlabeled, lines.join("\n")).unwrap();
    let want = predict_scores(ckpt, &unlabeled, true, &dir.join("test-predict.csv"));
    let rows = python_scores(serve, &[&unlabeled], true, &dir.join("test.csv"));
    assert_eq!((rows.len(), want.len()), (200, 200));
    for (r, w) in rows.iter().zip(&want) {
        assert!(r.label.is_none() && w.label.is_none());
        assert_eq!(r.position, w.position);
        assert!((r.score - w.score).abs() < 1e-5, "line {}: {} vs {}", r.position, r.score, w.score);
    }
}

/// A model the scorer cannot rebuild from Criteo records is refused with a
/// message naming why, not scored wrongly: a malformed model.json version.
#[test]
fn the_reference_scorer_refuses_an_unknown_format_version() {
    if !python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.json"), r#"{"format": "tiderec-serving", "format_version": 1}"#).unwrap();
    std::fs::write(dir.path().join("model.safetensors"), b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ").unwrap();
    let data = dir.path().join("d.tsv");
    std::fs::write(&data, "").unwrap();
    let o = Command::new("python3")
        .arg(scorer())
        .arg("--model")
        .arg(dir.path())
        .arg("--out")
        .arg(dir.path().join("o.csv"))
        .arg(&data)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("version 1") && !err.contains("Traceback"), "{err}");
}

/// A DIEN export names its GRU tensors as `torch.nn.GRU` does, with its shapes,
/// and describes the attention; the reference scorer, which reads Criteo
/// records, refuses the model with a message saying why instead of scoring it.
#[test]
fn a_dien_export_has_torch_gru_tensors_and_the_scorer_refuses_it() {
    if !python_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    run_ok(
        tiderec()
            .args(["train", "--progress", "none", "--data", "synthetic-behavior", "--model", "dien"])
            .args(["--samples", "2000", "--steps", "5", "--dim", "4", "--mlp", "8"])
            .arg("--checkpoint-dir")
            .arg(&ckpt),
    );
    let serve = dir.path().join("serve");
    run_ok(tiderec().args(["export", "--checkpoint"]).arg(&ckpt).arg("--out").arg(&serve));
    let config = model_json(&serve);
    assert_eq!(config["kind"], "dien");
    let e = 2 * 4; // two sequence fields (item, category) of width 4
    let t = &config["tensors"];
    assert_eq!(t["gru.weight_ih_l0"], serde_json::json!([3 * e, e]));
    assert_eq!(t["gru.weight_hh_l0"], serde_json::json!([3 * e, e]));
    assert_eq!(t["gru.bias_ih_l0"], serde_json::json!([3 * e]));
    assert_eq!(t["attention.weight"], serde_json::json!([e, e]));
    assert_eq!(config["forward"]["interest"]["kind"], "gru-attention");
    // The format the checkpoint records; only Criteo TSV is spelled out for other languages.
    assert_eq!(config["features"]["format"], "synthetic-behavior");
    assert_eq!(config["pipeline"]["format"], "synthetic-behavior");
    let data = dir.path().join("d.tsv");
    std::fs::write(&data, "").unwrap();
    let o = Command::new("python3")
        .arg(scorer())
        .arg("--model")
        .arg(&serve)
        .arg("--out")
        .arg(dir.path().join("o.csv"))
        .arg(&data)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("behaviour sequences") && !err.contains("Traceback"), "{err}");
}
