//! Every model's defaults on the real Criteo sample (first 8,000 rows train,
//! last 2,000 eval, one epoch): the factorization models reach at least
//! DLRM's default AUC, and each model's default is within 0.005 AUC of the
//! best setting of the grid its default was chosen from (the grid's winners
//! on seed 42 are listed here and trained beside the defaults).

mod common;

use common::{shared_data, train_metrics};

/// Per model: the best (dense lr, embedding lr) of the measured grid on seed 42.
const TUNED: [(&str, &str, &str); 5] = [
    ("dlrm", "0.001", "0.02"),
    ("lr", "0.01", "0.05"),
    ("fm", "0.01", "0.01"),
    ("deepfm", "0.003", "0.01"),
    ("wdl", "0.003", "0.01"),
];

#[test]
fn every_model_trains_well_on_its_defaults() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&data).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let (head, tail) = lines.split_at(8000);
    let (train, eval) = (dir.path().join("train.tsv"), dir.path().join("eval.tsv"));
    std::fs::write(&train, head.join("\n")).unwrap();
    std::fs::write(&eval, tail.join("\n")).unwrap();
    let data = format!("criteo:{}", train.display());
    let eval = format!("criteo:{}", eval.display());
    let auc = |name: &str, extra: &[&str]| {
        let mut flags = vec!["--eval", eval.as_str(), "--workers", "2"];
        flags.extend_from_slice(extra);
        train_metrics(&data, dir.path(), name, &flags)["auc"].as_f64().unwrap()
    };
    let mut table = Vec::new();
    for (model, lr, sparse_lr) in TUNED {
        let default = auc(&format!("{model}-default"), &["--model", model]);
        let tuned = auc(&format!("{model}-tuned"), &["--model", model, "--lr", lr, "--sparse-lr", sparse_lr]);
        table.push((model, default, tuned));
    }
    for (model, default, tuned) in &table {
        eprintln!("{model}: default AUC {default:.4}, tuned {tuned:.4}");
        assert!(default + 0.005 >= *tuned, "{model}: default AUC {default:.4} is more than 0.005 below {tuned:.4}");
    }
    let dlrm = table[0].1;
    for (model, default, _) in &table[2..] {
        assert!(*default >= dlrm, "{model}: default AUC {default:.4} below DLRM's {dlrm:.4}");
    }
}
