//! The ranking metrics against scikit-learn on the same predictions: `auc`
//! against `roc_auc_score`, `average_precision` against
//! `average_precision_score`, and `gauc` against `roc_auc_score` per user,
//! weighted by impressions (`scripts/sklearn_metrics.py`), to 1e-9.
//!
//! Needs `python3` with scikit-learn (`scripts/test.sh` installs it); without
//! it the test prints why and returns, or fails under `CI=true`.

#[path = "../../tests/support/skip.rs"]
mod skip;

use std::io::Write;
use std::path::Path;
use std::process::Command;
use tiderec_records::metrics::{auc, average_precision, gauc};
use tiderec_records::rng::unit_f64;

fn sklearn_available() -> bool {
    let ok = Command::new("python3").args(["-c", "import sklearn"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        skip::cannot_run("`python3 -c 'import sklearn'` fails (run `pip install scikit-learn`)");
    }
    ok
}

/// Predictions of one case: scores, labels and users.
struct Case {
    scores: Vec<f32>,
    labels: Vec<f32>,
    users: Vec<u64>,
}

/// `n` predictions with clicks more likely at higher scores; `grid` > 0 rounds the scores
/// to multiples of `1 / grid` (many ties); `users` users, each its own click rate.
fn case(seed: u64, n: u64, grid: u32, users: u64) -> Case {
    let mut c = Case { scores: Vec::new(), labels: Vec::new(), users: Vec::new() };
    for i in 0..n {
        let user = (unit_f64(seed, i, 0, 0) * users as f64) as u64;
        let mut score = unit_f64(seed, i, 1, 0) as f32;
        if grid > 0 {
            score = (score * grid as f32).round() / grid as f32;
        }
        let rate = 0.6 * score as f64 + 0.3 * unit_f64(seed, user, 9, 9);
        c.scores.push(score);
        c.labels.push(f32::from(unit_f64(seed, i, 2, 0) < rate));
        c.users.push(user);
    }
    c
}

/// scikit-learn's figures of each case (`auc`, `pr_auc`, `gauc`), through TSV files in `dir`
/// (one Python run: importing scikit-learn takes seconds).
fn sklearn(cases: &[&Case], dir: &Path) -> Vec<serde_json::Value> {
    let mut paths = Vec::new();
    for (k, c) in cases.iter().enumerate() {
        let path = dir.join(format!("samples-{k}.tsv"));
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        for i in 0..c.scores.len() {
            // `{}` of an f32 is its shortest round-trip decimal: distinct scores stay distinct
            // and ordered, equal ones equal, so the ranking is the same.
            writeln!(f, "{}\t{}\t{}", c.scores[i], c.labels[i], c.users[i]).unwrap();
        }
        f.flush().unwrap();
        paths.push(path);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/sklearn_metrics.py");
    let out = Command::new("python3").arg(script).args(&paths).output().unwrap();
    assert!(out.status.success(), "sklearn_metrics.py failed: {}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), cases.len());
    lines
}

fn assert_close(what: &str, ours: Option<f64>, theirs: &serde_json::Value) {
    match (ours, theirs.as_f64()) {
        (Some(a), Some(b)) => assert!((a - b).abs() <= 1e-9, "{what}: ours {a}, scikit-learn {b}"),
        (a, b) => assert_eq!(a, b, "{what}: both undefined or both defined"),
    }
}

#[test]
fn auc_pr_auc_and_gauc_equal_scikit_learn() {
    if !sklearn_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut all_positive = case(6, 100, 0, 5);
    all_positive.labels.iter_mut().for_each(|y| *y = 1.0);
    let cases = [
        ("continuous scores", case(1, 5000, 0, 200)),
        ("scores on a grid of 20 (ties)", case(2, 5000, 20, 50)),
        ("scores on a grid of 3 (heavy ties)", case(3, 2000, 3, 30)),
        ("few samples, many users", case(4, 60, 10, 40)),
        ("one user", case(5, 1000, 50, 1)),
        ("all positive (AUC and GAUC undefined)", all_positive),
    ];
    let figures = sklearn(&cases.iter().map(|c| &c.1).collect::<Vec<_>>(), dir.path());
    for ((name, c), theirs) in cases.iter().zip(&figures) {
        assert_close(&format!("{name}: AUC"), auc(&c.scores, &c.labels), &theirs["auc"]);
        assert_close(&format!("{name}: PR-AUC"), average_precision(&c.scores, &c.labels), &theirs["pr_auc"]);
        assert_close(&format!("{name}: GAUC"), gauc(&c.scores, &c.labels, &c.users), &theirs["gauc"]);
        assert_eq!(theirs["gauc"].is_number(), c.labels.contains(&0.0), "{name}: some user has both classes");
    }
}
