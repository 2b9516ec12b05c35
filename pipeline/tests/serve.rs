//! `tiderec serve` as a separate process: scores under concurrent requests
//! agree with `tiderec eval`, bad requests are answered with what is wrong,
//! and a checkpoint written while requests flow is taken up without a failed
//! request.

mod common;

use common::{run_ok, shared_data, tiderec};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiderec::serve::client::Client;
use tiderec_sources::json::criteo_line_to_json;

struct Served {
    child: Child,
    addr: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(checkpoint: &Path, extra: &[&str]) -> Served {
    let mut child = tiderec()
        .args(["serve", "--addr", "127.0.0.1:0", "--checkpoint"])
        .arg(checkpoint)
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.rsplit("http://").next().unwrap().trim().to_string();
    assert!(line.starts_with("serving "), "{line}");
    Served { child, addr }
}

/// Trains a small DLRM on `lines` of the Criteo sample with checkpoints in `dir/ckpt`.
fn train(data: &Path, dir: &Path, extra: &[&str]) -> PathBuf {
    let ckpt = dir.join("ckpt");
    run_ok(
        tiderec()
            .args(["train", "--buckets", "2000", "--bottom", "32,16", "--top", "32,1", "--progress", "none"])
            .args(["--workers", "2", "--batch-size", "256"])
            .arg("--data")
            .arg(format!("criteo:{}", data.display()))
            .arg("--checkpoint-dir")
            .arg(&ckpt)
            .arg("--dead-letters")
            .arg(dir.join("dl.tsv"))
            .args(extra),
    );
    ckpt
}

fn scores(body: &[u8]) -> (u64, Vec<f64>) {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    let step = v["step"].as_u64().unwrap();
    (step, v["scores"].as_array().unwrap().iter().map(|s| s.as_f64().unwrap()).collect())
}

fn records(path: &Path, n: usize) -> (Vec<String>, Vec<f64>) {
    let text = std::fs::read(path).unwrap();
    let lines: Vec<&[u8]> = text.split(|&b| b == b'\n').filter(|l| !l.is_empty()).take(n).collect();
    let labels = lines.iter().map(|l| if l.starts_with(b"1") { 1.0 } else { 0.0 }).collect();
    (lines.iter().map(|l| criteo_line_to_json(l).unwrap()).collect(), labels)
}

#[test]
fn concurrent_requests_score_as_eval_does() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "20"]);
    let n = 800;
    let (records, labels) = records(&data, n);
    let subset = dir.path().join("subset.tsv");
    let text = std::fs::read_to_string(&data).unwrap();
    std::fs::write(&subset, text.lines().take(n).collect::<Vec<_>>().join("\n")).unwrap();
    let eval = run_ok(
        tiderec()
            .args(["eval", "--json", "--checkpoint"])
            .arg(&ckpt)
            .arg("--data")
            .arg(format!("criteo:{}", subset.display())),
    );
    let eval: serde_json::Value = serde_json::from_slice(&eval.stdout).unwrap();
    assert_eq!(eval["samples"].as_u64(), Some(n as u64));

    let server = serve(&ckpt, &["--max-wait-us", "2000", "--threads", "8"]);
    // 8 clients, each sending its own slice of the records in requests of 1 to 7 records.
    let records = Arc::new(records);
    let threads: Vec<_> = (0..8)
        .map(|k| {
            let (records, addr) = (records.clone(), server.addr.clone());
            std::thread::spawn(move || {
                let mut client = Client::connect(&addr, Duration::from_secs(30)).unwrap();
                let mut out = Vec::new();
                let mut i = k * 100;
                while i < (k + 1) * 100 {
                    let end = (i + 1 + i % 7).min((k + 1) * 100);
                    let body = format!("[{}]", records[i..end].join(","));
                    let r = client.post("/score", body.as_bytes()).unwrap();
                    assert_eq!(r.status, 200, "{}", r.text());
                    let (step, s) = scores(&r.body);
                    assert_eq!(step, 20);
                    assert_eq!(s.len(), end - i);
                    out.extend(s);
                    i = end;
                }
                out
            })
        })
        .collect();
    let probs: Vec<f64> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
    assert_eq!(probs.len(), n);
    let logloss = probs
        .iter()
        .zip(&labels)
        .map(|(&p, &y)| {
            let p = p.clamp(1e-7, 1.0 - 1e-7);
            -(y * p.ln() + (1.0 - y) * (1.0 - p).ln())
        })
        .sum::<f64>()
        / n as f64;
    let want = eval["logloss"].as_f64().unwrap();
    assert!((logloss - want).abs() < 1e-6, "served logloss {logloss} vs eval {want}");
    let mut health = Client::connect(&server.addr, Duration::from_secs(10)).unwrap();
    let h: serde_json::Value = serde_json::from_slice(&health.get("/health").unwrap().body).unwrap();
    assert_eq!(h["records"].as_u64(), Some(n as u64));
    // Requests from concurrent connections shared forward passes.
    assert!(h["batches"].as_u64().unwrap() < 8 * 100, "{h}");
}

#[test]
fn bad_requests_are_answered_with_the_reason() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    let server = serve(&ckpt, &[]);
    let mut c = Client::connect(&server.addr, Duration::from_secs(10)).unwrap();
    let r = c.post("/score", br#"[{"I1": 3}, {"I2": "x"}]"#).unwrap();
    assert_eq!((r.status, r.text().contains("record 1: bad_integer in `I2`")), (400, true), "{}", r.text());
    let r = c.post("/score", br#"{"C26": "not hex"}"#).unwrap();
    assert_eq!((r.status, r.text().contains("bad_hex in `C26`")), (400, true), "{}", r.text());
    let r = c.post("/score", b"[]").unwrap();
    assert_eq!(r.status, 400);
    let r = c.post("/score", b"42").unwrap();
    assert_eq!(r.status, 400);
    let r = c.get("/nowhere").unwrap();
    assert_eq!(r.status, 404);
    // The connection and the server are still fine: one object, then two records as lines.
    let r = c.post("/score", br#"{"I1": 3, "label": 1}"#).unwrap();
    assert_eq!((r.status, scores(&r.body).1.len()), (200, 1));
    let r = c.post("/score", b"{\"I1\": 3}\n{\"I2\": 4}\n").unwrap();
    assert_eq!((r.status, scores(&r.body).1.len()), (200, 2));
    // A missing checkpoint is refused at start with its path.
    let out = tiderec().args(["serve", "--addr", "127.0.0.1:0", "--checkpoint"]).arg(dir.path().join("none")).output();
    let out = out.unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("none"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_new_checkpoint_is_taken_up_while_requests_flow() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "10"]);
    let server = serve(&ckpt, &["--reload-every", "0.1"]);
    let (records, _) = records(&data, 64);
    let body = Arc::new(format!("[{}]", records.join(",")));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (body, stop, addr) = (body.clone(), stop.clone(), server.addr.clone());
            std::thread::spawn(move || {
                let mut client = Client::connect(&addr, Duration::from_secs(30)).unwrap();
                let mut seen = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let r = client.post("/score", body.as_bytes()).unwrap();
                    assert_eq!(r.status, 200, "{}", r.text());
                    seen.push(scores(&r.body));
                }
                seen
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    // Resume and train on: a newer checkpoint appears in the directory being served.
    train(&data, dir.path(), &["--steps", "30", "--resume"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut health = Client::connect(&server.addr, Duration::from_secs(10)).unwrap();
    loop {
        let h: serde_json::Value = serde_json::from_slice(&health.get("/health").unwrap().body).unwrap();
        if h["step"].as_u64() == Some(30) {
            assert_eq!(h["reloads"].as_u64(), Some(1), "{h}");
            break;
        }
        assert!(Instant::now() < deadline, "the server never took up step 30: {h}");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::SeqCst);
    let seen: Vec<(u64, Vec<f64>)> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    let of = |step: u64| seen.iter().filter(|(s, _)| *s == step).map(|(_, v)| v.clone()).collect::<Vec<_>>();
    let (old, new) = (of(10), of(30));
    assert!(!old.is_empty() && !new.is_empty(), "{} answers at step 10, {} at step 30", old.len(), new.len());
    assert_eq!(old.len() + new.len(), seen.len(), "every answer is from one of the two checkpoints");
    // Each step's answers are one model's: identical across requests, and the two models differ.
    assert!(old.iter().all(|v| *v == old[0]) && new.iter().all(|v| *v == new[0]));
    assert_ne!(old[0], new[0]);
    // The new answers are those of a server started on the new checkpoint alone.
    let fresh = serve(&ckpt.join("ckpt-30"), &[]);
    let r = Client::connect(&fresh.addr, Duration::from_secs(10)).unwrap().post("/score", body.as_bytes()).unwrap();
    assert_eq!(scores(&r.body), (30, new[0].clone()));
}
