//! The evaluation metrics of `train` and `eval` on real samples through the release
//! binary: every metric in `--metrics-json` and `eval --json`, the ranking metrics equal
//! to scikit-learn's on `predict`'s scores (GAUC per the records' `userid`), NE and
//! calibration to their closed forms, and `train --metrics-addr` serving them while it
//! trains.
//!
//! The scikit-learn comparison needs `python3` with scikit-learn (`scripts/test.sh`
//! installs it); without it that test prints why and returns, or fails under `CI=true`.

mod common;

use common::{run_err, run_ok, shared_data, tiderec, train_metrics};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The metrics every evaluation reports.
const METRICS: [&str; 7] = ["auc", "logloss", "accuracy", "ne", "calibration", "pr_auc", "gauc"];

/// Quick training flags for the 100-row samples.
const QUICK: &[&str] = &["--batch-size", "16", "--buckets", "1000"];

/// `(score, label, line)` of every row of a `predict` CSV (`file,position,score,label`).
fn scores(csv: &Path) -> Vec<(f32, f32, usize)> {
    let text = std::fs::read_to_string(csv).unwrap();
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.rsplitn(4, ',').collect();
            (f[1].parse().unwrap(), f[0].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect()
}

#[test]
fn train_and_eval_report_every_metric_and_the_ranking_ones_equal_scikit_learn() {
    let Some(train) = shared_data("taobao_ad/train_sample.csv") else { return };
    let Some(test) = shared_data("taobao_ad/test_sample.csv") else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ck = d.join("ck");
    let test_data = format!("taobao-ad:{}", test.display());
    let mut flags = vec!["--epochs", "2", "--eval", &test_data, "--checkpoint-dir", ck.to_str().unwrap()];
    flags.extend(QUICK);
    let m = train_metrics(&format!("taobao-ad:{}", train.display()), d, "run", &flags);
    // Every metric, in the summary and in each evaluation; GAUC too (taobao-ad names `userid`).
    for key in METRICS {
        assert!(m[key].is_number(), "{key} in {m}");
        let evaluations = m["evaluations"].as_array().unwrap();
        assert_eq!(evaluations.len(), 2);
        assert!(evaluations.iter().all(|e| e[key].is_number()), "{key} in every evaluation: {m}");
    }
    // `eval` of the final checkpoint on the same records reports the same figures.
    let o = run_ok(
        tiderec()
            .args(["eval", "--json", "--data", &test_data, "--checkpoint"])
            .arg(&ck)
            .arg("--dead-letters")
            .arg(d.join("eval-dead.tsv")),
    );
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for key in METRICS {
        assert_eq!(e[key], m[key], "{key}: eval {e}, train {m}");
    }
    // Predict's probabilities: NE and calibration by their closed forms ...
    let csv = d.join("scores.csv");
    run_ok(
        tiderec()
            .args(["predict", "--data", &test_data, "--checkpoint"])
            .arg(&ck)
            .arg("--out")
            .arg(&csv)
            .arg("--dead-letters")
            .arg(d.join("predict-dead.tsv")),
    );
    let rows = scores(&csv);
    assert_eq!(rows.len() as u64, e["samples"].as_u64().unwrap());
    let n = rows.len() as f64;
    let ctr = rows.iter().filter(|r| r.1 == 1.0).count() as f64 / n;
    let mean = rows.iter().map(|r| r.0 as f64).sum::<f64>() / n;
    let loss = rows
        .iter()
        .map(|&(p, y, _)| {
            let p = (p as f64).clamp(1e-7, 1.0 - 1e-7);
            if y == 1.0 {
                -p.ln()
            } else {
                -(1.0 - p).ln()
            }
        })
        .sum::<f64>()
        / n;
    let entropy = -(ctr * ctr.ln() + (1.0 - ctr) * (1.0 - ctr).ln());
    let close = |key: &str, want: f64| {
        let got = e[key].as_f64().unwrap();
        assert!((got - want).abs() <= 1e-9, "{key}: eval {got}, closed form {want}");
    };
    close("logloss", loss);
    close("ne", loss / entropy);
    close("calibration", mean / ctr);
    // ... and AUC, PR-AUC and GAUC (per `userid`, column 3 of the line) by scikit-learn.
    if !common::sklearn_available() {
        return;
    }
    let lines: Vec<String> = std::fs::read_to_string(&test).unwrap().lines().map(String::from).collect();
    let tsv = d.join("scores.tsv");
    let mut f = std::fs::File::create(&tsv).unwrap();
    for &(p, y, line) in &rows {
        let user = lines[line - 1].split(',').nth(2).unwrap();
        writeln!(f, "{p}\t{y}\t{user}").unwrap();
    }
    drop(f);
    let theirs = common::sklearn_metrics(&tsv);
    for key in ["auc", "pr_auc", "gauc"] {
        close(key, theirs[key].as_f64().unwrap_or_else(|| panic!("scikit-learn's {key}: {theirs}")));
    }
}

#[test]
fn converted_parquet_keeps_the_users_and_gives_the_same_metrics() {
    let Some(train) = shared_data("taobao_ad/train_sample.csv") else { return };
    let Some(test) = shared_data("taobao_ad/test_sample.csv") else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let parquet = |src: &Path, name: &str| {
        let out = d.join(name);
        run_ok(
            tiderec()
                .args(["convert", "--progress", "none", "--buckets", "1000"])
                .args(["--from", &format!("taobao-ad:{}", src.display())])
                .arg("--to")
                .arg(format!("parquet:{}", out.display()))
                .arg("--dead-letters")
                .arg(d.join(format!("{name}-dead.tsv"))),
        );
        format!("parquet:{}", out.display())
    };
    let (train_pq, test_pq) = (parquet(&train, "train-pq"), parquet(&test, "test-pq"));
    let runs = [
        (format!("taobao-ad:{}", train.display()), format!("taobao-ad:{}", test.display()), "csv"),
        (train_pq, test_pq, "parquet"),
    ];
    let m: Vec<serde_json::Value> = runs
        .iter()
        .map(|(data, eval, name)| {
            let mut flags = vec!["--eval", eval.as_str(), "--workers", "1", "--model", "lr"];
            flags.extend(QUICK);
            train_metrics(data, d, name, &flags)
        })
        .collect();
    assert!(m[1]["gauc"].is_number(), "the Parquet rows keep their users: {}", m[1]);
    for key in METRICS {
        let (a, b) = (m[0][key].as_f64().unwrap(), m[1][key].as_f64().unwrap());
        assert!((a - b).abs() <= 1e-9, "{key}: records {a}, Parquet {b}");
    }
}

#[test]
fn converted_behavior_data_keeps_its_users() {
    let Some(src) = shared_data("amazon_dien/local_test") else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (pq, ck) = (d.join("pq"), d.join("ck"));
    run_ok(
        tiderec()
            .args(["convert", "--progress", "none", "--buckets", "1000"])
            .args(["--from", &format!("amazon-dien:{}", src.display())])
            .arg("--to")
            .arg(format!("parquet:{}", pq.display()))
            .arg("--dead-letters")
            .arg(d.join("convert-dead.tsv")),
    );
    let data = format!("parquet:{}", pq.display());
    let mut flags = vec!["--model", "lr", "--eval-fraction", "0", "--checkpoint-dir", ck.to_str().unwrap()];
    flags.extend(QUICK);
    train_metrics(&data, d, "run", &flags);
    let o = run_ok(
        tiderec()
            .args(["eval", "--json", "--data", &data, "--checkpoint"])
            .arg(&ck)
            .arg("--dead-letters")
            .arg(d.join("eval-dead.tsv")),
    );
    let e: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(e["gauc"].is_number(), "the rows keep amazon-dien's users: {e}");
}

#[test]
fn criteo_has_no_user_column_so_no_gauc() {
    let Some(train) = shared_data("criteo/sample_train.txt") else { return };
    let Some(test) = shared_data("criteo/sample_test.txt") else { return };
    let dir = tempfile::tempdir().unwrap();
    let eval = format!("criteo:{}", test.display());
    let mut flags = vec!["--eval", &eval];
    flags.extend(QUICK);
    let m = train_metrics(&format!("criteo:{}", train.display()), dir.path(), "run", &flags);
    for key in ["auc", "logloss", "ne", "calibration", "pr_auc"] {
        assert!(m[key].is_number(), "{key} in {m}");
    }
    assert!(m["gauc"].is_null(), "{m}");
}

/// `GET path` on `addr`; the whole response, or `None` when nothing answers.
fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// The value of the sample `name` in a Prometheus text exposition.
fn sample(body: &str, name: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn train_serves_prometheus_metrics_while_it_trains() {
    let Some(train) = shared_data("taobao_ad/train_sample.csv") else { return };
    let Some(test) = shared_data("taobao_ad/test_sample.csv") else { return };
    let dir = tempfile::tempdir().unwrap();
    // Far more epochs than the test waits for: it stops the run with SIGTERM.
    let mut child = tiderec()
        .args(["train", "--data", &format!("taobao-ad:{}", train.display())])
        .args(["--eval", &format!("taobao-ad:{}", test.display())])
        .args(["--epochs", "100000", "--eval-every", "3", "--metrics-addr", "127.0.0.1:0", "--progress", "none"])
        .args(QUICK)
        .arg("--dead-letters")
        .arg(dir.path().join("dead.tsv"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Port 0: the address chosen is printed.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut addr = None;
    let mut line = String::new();
    while addr.is_none() && stderr.read_line(&mut line).unwrap() > 0 {
        addr =
            line.trim().strip_prefix("metrics at http://").and_then(|a| a.strip_suffix("/metrics")).map(String::from);
        line.clear();
    }
    let addr = addr.expect("the metrics address is printed");
    let drain = std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    // Steps, samples and an evaluation's figures appear while training goes on.
    let deadline = Instant::now() + Duration::from_secs(60);
    let body = loop {
        let body = http_get(&addr, "/metrics").unwrap_or_default();
        let evaluated = sample(&body, "tiderec_window_gauc").is_some_and(f64::is_finite);
        if evaluated && sample(&body, "tiderec_steps_total").is_some_and(|s| s > 3.0) {
            break body;
        }
        assert!(Instant::now() < deadline, "no evaluation reached the endpoint: {body}");
        std::thread::sleep(Duration::from_millis(50));
    };
    for name in ["window_auc", "window_logloss", "window_ne", "window_calibration", "window_pr_auc"] {
        let v = sample(&body, &format!("tiderec_{name}"));
        assert!(v.is_some_and(f64::is_finite), "{name}: {body}");
    }
    assert!(sample(&body, "tiderec_samples_total").is_some_and(|s| s > 0.0), "{body}");
    assert!(sample(&body, "tiderec_train_loss").is_some_and(|s| s > 0.0), "{body}");
    let steps = sample(&body, "tiderec_steps_total").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while sample(&http_get(&addr, "/metrics").unwrap_or_default(), "tiderec_steps_total").unwrap_or(0.0) <= steps {
        assert!(Instant::now() < deadline, "the step counter stood still");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(http_get(&addr, "/other").unwrap_or_default().contains("404"));
    Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "SIGTERM exits 0, got {status}");
    drain.join().unwrap().unwrap();
}

#[test]
fn an_address_in_use_is_refused_naming_the_setting() {
    let Some(train) = shared_data("taobao_ad/train_sample.csv") else { return };
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let err = run_err(
        tiderec()
            .args(["train", "--data", &format!("taobao-ad:{}", train.display()), "--metrics-addr", &addr])
            .args(QUICK)
            .current_dir(dir.path()),
    );
    assert!(err.contains("metrics_addr") && err.contains(&addr), "{err}");
}
