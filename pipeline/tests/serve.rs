//! `tiderec serve` as a separate process: scores under concurrent requests
//! agree with `tiderec eval`, records of every line format (Avazu with
//! crosses, a CSV spec, DIEN on Amazon histories) score as `tiderec predict`
//! scores the same lines, bad requests are answered with what is wrong, and
//! a checkpoint written while requests flow is taken up without a failed
//! request, and a server following a running online trainer (a real broker on
//! 127.0.0.1) answers from whole checkpoints only.

mod common;
mod kafka_broker;

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
    /// The start-up line saying what records look like.
    records: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(checkpoint: &Path, extra: &[&str]) -> Served {
    serve_on("127.0.0.1:0", checkpoint, extra)
}

/// `serve` listening on `addr`.
fn serve_on(addr: &str, checkpoint: &Path, extra: &[&str]) -> Served {
    serve_with_output(addr, checkpoint, extra).0
}

/// `serve` listening on `addr`, and the rest of its output (after the start-up lines) once it exits.
fn serve_with_output(addr: &str, checkpoint: &Path, extra: &[&str]) -> (Served, std::thread::JoinHandle<String>) {
    let mut child = tiderec()
        .args(["serve", "--addr", addr, "--checkpoint"])
        .arg(checkpoint)
        .args(extra)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut line, mut records) = (String::new(), String::new());
    let mut out = BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut line).unwrap();
    out.read_line(&mut records).unwrap();
    let addr = line.rsplit("http://").next().unwrap().trim().to_string();
    assert!(line.starts_with("serving "), "{line}");
    // The rest of its output (the counts it prints when stopped) is read, so it can print them.
    let rest = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut rest);
        rest
    });
    (Served { child, addr, records }, rest)
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
    // A key that is not a field (here a lower-case `c1`) is refused, not scored as an empty record.
    let r = c.post("/score", br#"[{"I1": 3}, {"c1": "0a"}]"#).unwrap();
    let unknown = "record 1: unknown field (the criteo fields are listed by GET /schema) in `c1`";
    assert_eq!((r.status, r.text().contains(unknown)), (400, true), "{}", r.text());
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
    let clients = hammer(&server.addr, &body, &stop, 4);
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

/// Each answer's step and scores.
type Answers = Vec<(u64, Vec<f64>)>;

/// `n` clients posting `body` to `/score` until `stop`, each returning its `(step, scores)` answers.
fn hammer(addr: &str, body: &Arc<String>, stop: &Arc<AtomicBool>, n: usize) -> Vec<std::thread::JoinHandle<Answers>> {
    (0..n)
        .map(|_| {
            let (body, stop, addr) = (body.clone(), stop.clone(), addr.to_string());
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
        .collect()
}

/// Trains one epoch of `data` (`FORMAT:PATH`) with `extra` flags into `dir/name`.
fn train_epoch(dir: &Path, name: &str, data: &str, extra: &[&str]) -> PathBuf {
    let ckpt = dir.join(name);
    run_ok(
        tiderec()
            .args(["train", "--epochs", "1", "--batch-size", "16", "--buckets", "500", "--progress", "none"])
            .args(["--data", data])
            .args(extra)
            .arg("--checkpoint-dir")
            .arg(&ckpt)
            .arg("--dead-letters")
            .arg(dir.join(format!("{name}-dead.tsv"))),
    );
    ckpt
}

/// `tiderec predict`'s scores of every record of `data`, in file order.
fn predicted(ckpt: &Path, data: &str, dir: &Path) -> Vec<f64> {
    let out = dir.join("predicted.csv");
    run_ok(
        tiderec()
            .args(["predict", "--batch-size", "7", "--data", data])
            .arg("--checkpoint")
            .arg(ckpt)
            .arg("--out")
            .arg(&out)
            .arg("--dead-letters")
            .arg(dir.join("predict-dead.tsv")),
    );
    let text = std::fs::read_to_string(&out).unwrap();
    text.lines().skip(1).map(|l| l.split(',').nth(2).unwrap().parse().unwrap()).collect()
}

/// Posts `records` in requests of 1 to 5 records and returns every score, in order.
fn served(client: &mut Client, records: &[String]) -> Vec<f64> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < records.len() {
        let end = (i + 1 + i % 5).min(records.len());
        let r = client.post("/score", format!("[{}]", records[i..end].join(",")).as_bytes()).unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let (_, s) = scores(&r.body);
        assert_eq!(s.len(), end - i);
        out.extend(s);
        i = end;
    }
    out
}

fn assert_close(served: &[f64], predicted: &[f64], what: &str) {
    assert_eq!(served.len(), predicted.len(), "{what}: one score per record");
    for (k, (a, b)) in served.iter().zip(predicted).enumerate() {
        assert!((a - b).abs() <= 1e-6, "{what}: record {k} served {a}, predicted {b}");
    }
    // The model is not a constant: the check compares scores that differ between records.
    assert!(predicted.iter().any(|p| (p - predicted[0]).abs() > 1e-6), "{what}: {predicted:?}");
}

/// The records of a delimited file with a header as JSON objects keyed by the header's
/// names; empty values are left out and `value` writes the others.
fn objects(path: &Path, delimiter: char, value: impl Fn(&str, &str) -> String) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines();
    let names: Vec<&str> = lines.next().unwrap().split(delimiter).collect();
    lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let fields: Vec<String> = names
                .iter()
                .zip(l.split(delimiter))
                .filter(|(_, v)| !v.is_empty())
                .map(|(n, v)| format!("{}: {}", serde_json::json!(n), value(n, v)))
                .collect();
            format!("{{{}}}", fields.join(", "))
        })
        .collect()
}

/// The lines of a file with a header, as `{"line": …}` records.
fn line_records(path: &Path, header: bool) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let skip = usize::from(header);
    text.lines().skip(skip).filter(|l| !l.is_empty()).map(|l| serde_json::json!({ "line": l }).to_string()).collect()
}

/// The `error` of the 400 answer to `body`.
fn post_error(client: &mut Client, body: &str) -> String {
    let r = client.post("/score", body.as_bytes()).unwrap();
    assert_eq!(r.status, 400, "{body}: {}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    v["error"].as_str().unwrap().to_string()
}

#[test]
fn avazu_records_with_crosses_score_as_predict_does() {
    let Some(data) = shared_data("avazu/avazu_sample.txt") else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("avazu:{}", data.display());
    let ckpt = train_epoch(dir.path(), "ckpt", &spec, &["--model", "wdl", "--crosses", "0:1,3:4"]);
    let want = predicted(&ckpt, &spec, dir.path());
    let server = serve(&ckpt, &[]);
    assert!(
        server.records.starts_with("records: avazu JSON objects with fields id, click, hour"),
        "{}",
        server.records
    );
    let mut c = Client::connect(&server.addr, Duration::from_secs(30)).unwrap();
    // Values as strings, and the integer columns as JSON numbers: the same text either way.
    let records = objects(&data, ',', |name, v| match name {
        "hour" | "C1" | "C14" | "C15" => v.to_string(),
        _ => serde_json::json!(v).to_string(),
    });
    assert_eq!(records.len(), 100);
    assert_close(&served(&mut c, &records), &want, "avazu objects");
    assert_close(&served(&mut c, &line_records(&data, true)), &want, "avazu lines");
    let schema: serde_json::Value = serde_json::from_slice(&c.get("/schema").unwrap().body).unwrap();
    let names: Vec<&str> = schema["fields"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(names, tiderec_operators::spec::AVAZU_COLUMNS);
    assert_eq!((schema["format"].as_str(), schema["fields"][1]["feature"].as_str()), (Some("avazu"), Some("label")));
    let e = post_error(&mut c, r#"[{"hour": "14102100"}, {"hour": "141021x0"}]"#);
    assert!(e.contains("record 1: bad_integer in `hour`"), "{e}");
    let e = post_error(&mut c, r#"[{"site_id": "a,b"}]"#);
    assert!(e.contains("record 0: the value holds `,` in `site_id`"), "{e}");
    let e = post_error(&mut c, r#"[{"siteid": "a"}]"#);
    assert!(e.contains("record 0: unknown field"), "{e}");
    let e = post_error(&mut c, r#"{"line": "1,2,14102100"}"#);
    assert!(e.contains("record 0: field_count"), "{e}");
}

#[test]
fn csv_spec_records_score_as_predict_does() {
    let Some(data) = shared_data("taobao_ad/train_sample.csv") else { return };
    let dir = tempfile::tempdir().unwrap();
    let columns = tiderec_operators::spec::TAOBAO_AD_COLUMNS.map(|c| format!("\"{c}\"")).join(", ");
    let spec = format!(
        "delimiter = \",\"\nheader = true\ncolumns = [{columns}]\n[label]\ncolumn = \"clk\"\n\
         [[dense]]\ncolumn = \"price\"\nlog1p = true\nclamp = [0.0, 500.0]\n\
         [[dense]]\ncolumn = \"cms_segid\"\nscale = \"standardize\"\n\
         [[categorical]]\ncolumn = \"cms_segid\"\nbuckets = 4\nencoding = \"quantile\"\n\
         [[categorical]]\ncolumn = \"userid\"\nbuckets = 300\n\
         [[categorical]]\ncolumn = \"pid\"\nbuckets = 20\n\
         [[categorical]]\ncolumn = \"age_level\"\nbuckets = 10\nencoding = \"identity\"\n\
         [[categorical]]\ncolumn = \"brand\"\nbuckets = 300\n\
         [[list]]\ncolumn = \"click_sequence\"\ndelimiter = \"^\"\nmax_len = 5\nbuckets = 300\npooling = \"mean\"\n"
    );
    let spec_path = dir.path().join("spec.toml");
    std::fs::write(&spec_path, spec).unwrap();
    let data_spec = format!("csv:{}", data.display());
    let ckpt =
        train_epoch(dir.path(), "ckpt", &data_spec, &["--model", "deepfm", "--spec", spec_path.to_str().unwrap()]);
    let want = predicted(&ckpt, &data_spec, dir.path());
    let server = serve(&ckpt, &[]);
    let mut c = Client::connect(&server.addr, Duration::from_secs(30)).unwrap();
    // Numbers as JSON numbers (their text as in the file), the sequence as a JSON array.
    let records = objects(&data, ',', |name, v| match name {
        "clk" | "price" | "age_level" | "cms_segid" => v.to_string(),
        "click_sequence" => serde_json::json!(v.split('^').collect::<Vec<_>>()).to_string(),
        _ => serde_json::json!(v).to_string(),
    });
    assert_eq!(records.len(), 100);
    assert_close(&served(&mut c, &records), &want, "csv objects");
    assert_close(&served(&mut c, &line_records(&data, true)), &want, "csv lines");
    let schema: serde_json::Value = serde_json::from_slice(&c.get("/schema").unwrap().body).unwrap();
    let field = |n: &str| schema["fields"].as_array().unwrap().iter().find(|f| f["name"] == n).unwrap().clone();
    assert_eq!((field("price")["type"].as_str(), field("price")["feature"].as_str()), (Some("number"), Some("dense")));
    assert_eq!(field("age_level")["type"], "integer");
    assert_eq!(
        (field("click_sequence")["feature"].as_str(), field("click_sequence")["separator"].as_str()),
        (Some("list"), Some("^"))
    );
    // A learned scale and quantile buckets: a number feeding a dense and a categorical feature.
    let segment = field("cms_segid");
    assert_eq!((segment["type"].as_str(), segment["feature"].as_str()), (Some("number"), Some("dense+categorical")));
    assert_eq!(field("time_stamp")["feature"], "none");
    let e = post_error(&mut c, r#"{"cms_segid": "many"}"#);
    assert!(e.contains("record 0: bad_integer in `cms_segid`"), "{e}");
    let e = post_error(&mut c, r#"[{"price": 1}, {"price": 2}, {"price": "cheap"}]"#);
    assert!(e.contains("record 2: bad_integer in `price`"), "{e}");
    let e = post_error(&mut c, r#"{"age_level": 12}"#);
    assert!(e.contains("record 0: bad_integer in `age_level`"), "{e}");
    let e = post_error(&mut c, r#"{"pid": ["a"]}"#);
    assert!(e.contains("record 0: a list where one value (string) belongs in `pid`"), "{e}");
}

#[test]
fn dien_on_amazon_histories_scores_as_predict_does() {
    let Some(data) = shared_data("amazon_dien/local_test") else { return };
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("amazon-dien:{}", data.display());
    let ckpt = train_epoch(dir.path(), "ckpt", &spec, &["--model", "dien"]);
    let want = predicted(&ckpt, &spec, dir.path());
    let server = serve(&ckpt, &[]);
    let mut c = Client::connect(&server.addr, Duration::from_secs(30)).unwrap();
    let text = std::fs::read_to_string(&data).unwrap();
    let lines: Vec<&str> = text.lines().map(|l| l.trim_end_matches('\r')).filter(|l| !l.is_empty()).collect();
    fn list(v: &str) -> Vec<&str> {
        if v.is_empty() {
            Vec::new()
        } else {
            v.split('\u{2}').collect()
        }
    }
    let records: Vec<String> = lines
        .iter()
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            serde_json::json!({
                "label": f[0].parse::<u8>().unwrap(), "user": f[1], "item": f[2], "category": f[3],
                "history_items": list(f[4]), "history_categories": list(f[5]),
            })
            .to_string()
        })
        .collect();
    assert_eq!(records.len(), 38);
    assert_close(&served(&mut c, &records), &want, "amazon objects");
    let as_lines: Vec<String> = lines.iter().map(|l| serde_json::json!({ "line": l }).to_string()).collect();
    assert_close(&served(&mut c, &as_lines), &want, "amazon lines");
    // Histories of different lengths: the category history is to blame, as in a file.
    let e = post_error(&mut c, r#"[{"history_items": ["a", "b"], "history_categories": ["x"]}]"#);
    assert!(e.contains("record 0: field_count in `history_categories`"), "{e}");
    let e = post_error(&mut c, r#"[{"user": "u"}, {"label": 2}]"#);
    assert!(e.contains("record 1: bad_label in `label`"), "{e}");
}

/// The rows of the Parquet files in `dir` as JSON objects keyed by their columns (label,
/// ids and id lists; not the source positions, which are no feature), read with the
/// parquet crate.
fn parquet_rows(dir: &Path) -> Vec<String> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float32Type, UInt64Type};
    use arrow_array::Array;
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.retain(|p| p.extension().is_some_and(|e| e == "parquet"));
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let reader =
            parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(file).unwrap())
                .unwrap()
                .build()
                .unwrap();
        for chunk in reader {
            let chunk = chunk.unwrap();
            for r in 0..chunk.num_rows() {
                let mut row = serde_json::Map::new();
                for (field, column) in chunk.schema().fields().iter().zip(chunk.columns()) {
                    if field.name() == tiderec_sources::parquet::schema::LINE_START_COLUMN {
                        continue;
                    }
                    let value = if let Some(c) = column.as_primitive_opt::<Float32Type>() {
                        serde_json::json!(c.value(r))
                    } else if let Some(c) = column.as_primitive_opt::<UInt64Type>() {
                        if c.is_null(r) {
                            serde_json::Value::Null
                        } else {
                            serde_json::json!(c.value(r))
                        }
                    } else {
                        let list = column.as_list::<i32>().value(r);
                        serde_json::json!(list.as_primitive::<UInt64Type>().values().to_vec())
                    };
                    row.insert(field.name().clone(), value);
                }
                out.push(serde_json::Value::Object(row).to_string());
            }
        }
    }
    out
}

/// The Amazon records of `src` converted to Parquet files in `dir/pq` (tables of 500 rows),
/// and a DIEN model trained on them (histories of at most 20 ids, the default `--max-len`).
fn amazon_parquet_model(src: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    let pq = dir.join("pq");
    run_ok(
        tiderec()
            .args(["convert", "--progress", "none", "--buckets", "500", "--row-group-rows", "10", "--from"])
            .arg(format!("amazon-dien:{}", src.display()))
            .arg("--to")
            .arg(format!("parquet:{}", pq.display())),
    );
    let ckpt = train_epoch(dir, "ckpt", &format!("parquet:{}", pq.display()), &["--model", "dien"]);
    (pq, ckpt)
}

#[test]
fn rows_of_a_model_trained_on_parquet_score_as_predict_does() {
    let Some(src) = shared_data("amazon_dien/local_test") else { return };
    let dir = tempfile::tempdir().unwrap();
    let (pq, ckpt) = amazon_parquet_model(&src, dir.path());
    let data = format!("parquet:{}", pq.display());
    let want = predicted(&ckpt, &data, dir.path());
    let server = serve(&ckpt, &[]);
    assert!(server.records.contains("parquet (from amazon-dien)"), "{}", server.records);
    let mut c = Client::connect(&server.addr, Duration::from_secs(30)).unwrap();
    let records = parquet_rows(&pq);
    assert_eq!(records.len(), 38);
    assert_close(&served(&mut c, &records), &want, "parquet rows");
    let schema: serde_json::Value = serde_json::from_slice(&c.get("/schema").unwrap().body).unwrap();
    let names: Vec<&str> = schema["fields"].as_array().unwrap().iter().map(|f| f["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["label", "user", "item", "category", "history_items", "history_categories"]);
    assert_eq!(schema["fields"][2]["table_size"], 500);
    let e = post_error(&mut c, r#"[{"item": 3}, {"item": 500}]"#);
    assert!(e.contains("record 1: id 500 is not below the table size 500 in `item`"), "{e}");
    let e = post_error(&mut c, r#"{"history_items": "a"}"#);
    assert!(e.contains("record 0: \"a\" is not an array of ids in `history_items`"), "{e}");
}

/// A row whose histories are far longer than the model reads is cut as the line format cuts
/// them (the last `max_len` ids, the most recent): it scores as the row holding only those,
/// and the scorer never pads a batch to the long one.
#[test]
fn a_long_history_in_a_row_is_cut_to_the_models_max_len() {
    let Some(src) = shared_data("amazon_dien/local_test") else { return };
    let dir = tempfile::tempdir().unwrap();
    let (pq, ckpt) = amazon_parquet_model(&src, dir.path());
    let server = serve(&ckpt, &[]);
    let mut c = Client::connect(&server.addr, Duration::from_secs(60)).unwrap();
    let base: serde_json::Value = serde_json::from_str(&parquet_rows(&pq)[0]).unwrap();
    let with = |items: &[u64], categories: &[u64]| {
        let mut row = base.clone();
        (row["history_items"], row["history_categories"]) = (serde_json::json!(items), serde_json::json!(categories));
        row.to_string()
    };
    let n = 200_000u64;
    let items: Vec<u64> = (0..n).map(|k| k * 7 % 500).collect();
    let categories: Vec<u64> = (0..n).map(|k| k * 13 % 500).collect();
    let last = (n - 20) as usize;
    let rows =
        [with(&items, &categories), with(&items[last..], &categories[last..]), with(&items[..20], &categories[..20])];
    let r = c.post("/score", format!("[{}]", rows.join(",")).as_bytes()).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let (_, s) = scores(&r.body);
    assert_eq!(s[0], s[1], "the long history scores as its last 20 ids");
    assert_ne!(s[1], s[2], "the first 20 ids are another history");
    // An id beyond its table is refused also where the history is cut off.
    let mut bad = items[..30].to_vec();
    bad[0] = 500;
    let e = post_error(&mut c, &with(&bad, &categories[..30]));
    assert!(e.contains("record 0: id 500 is not below the table size 500 in `history_items`"), "{e}");
}

/// `n` empty records as one JSON array.
fn empty_records(n: usize) -> Vec<u8> {
    let mut body = Vec::with_capacity(3 * n + 2);
    body.push(b'[');
    for k in 0..n {
        body.extend_from_slice(if k == 0 { b"{}" } else { b",{}" });
    }
    body.push(b']');
    body
}

fn health(addr: &str) -> serde_json::Value {
    let r = Client::connect(addr, Duration::from_secs(10)).unwrap().get("/health").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    serde_json::from_slice(&r.body).unwrap()
}

#[test]
fn requests_over_the_record_cap_are_refused_and_large_ones_are_scored_in_batches() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    // The defaults: at most 65,536 records a request, 512 a forward pass.
    let server = serve(&ckpt, &[]);
    let mut c = Client::connect(&server.addr, Duration::from_secs(60)).unwrap();
    let r = c.post("/score", &empty_records(65_537)).unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.text().contains("more than 65536 records"), "{}", r.text());
    // 5.6 million records in a body under the 16 MiB limit: refused, not scored.
    let huge = empty_records((16 << 20) / 3 - 1);
    assert!(huge.len() <= 16 << 20);
    let started = Instant::now();
    let r = Client::connect(&server.addr, Duration::from_secs(60)).unwrap().post("/score", &huge).unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert_eq!(health(&server.addr)["records"], 0, "nothing of a refused request is scored");
    // A request at the cap is scored whole, in passes of at most 512 records.
    let r = c.post("/score", &empty_records(65_536)).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let (step, s) = scores(&r.body);
    assert_eq!((step, s.len()), (5, 65_536));
    assert!(s.iter().all(|p| *p == s[0]), "empty records score alike");
    let h = health(&server.addr);
    assert_eq!(h["records"], 65_536);
    assert!(h["batches"].as_u64().unwrap() >= 128, "{h}");
    // The cap is a flag, range-checked.
    let capped = serve(&ckpt, &["--max-records", "10"]);
    let r = Client::connect(&capped.addr, Duration::from_secs(10)).unwrap().post("/score", &empty_records(11)).unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    let out =
        tiderec().args(["serve", "--addr", "127.0.0.1:0", "--max-records", "0", "--checkpoint"]).arg(&ckpt).output();
    let out = out.unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_records"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A connection that sent the head of a 100-byte `POST /score` and one byte of its body.
fn slow_client(addr: &str) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let head = "POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n[";
    s.write_all(head.as_bytes()).unwrap();
    s
}

/// The status of the first response on `s`, read within `within`.
fn status_within(s: &mut std::net::TcpStream, within: Duration) -> u16 {
    use std::io::Read;
    s.set_read_timeout(Some(within)).unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap_or_else(|e| panic!("no response within {within:?}: {e}"));
    std::str::from_utf8(&head[9..12]).unwrap().parse().unwrap()
}

#[test]
fn slow_clients_are_cut_off_and_health_answers_meanwhile() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    // The defaults: bodies read within 5 s.
    let server = serve(&ckpt, &[]);
    let mut slow: Vec<_> = (0..32).map(|_| slow_client(&server.addr)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let mut c = Client::connect(&server.addr, Duration::from_secs(2)).unwrap();
    let r = c.get("/health").expect("/health answers within 2 s");
    assert_eq!(r.status, 200);
    let r = c.post("/score", br#"{"I1": 3}"#).expect("a request is scored within 2 s");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    // Each slow body is given up after the read timeout, with 408.
    for s in &mut slow {
        assert_eq!(status_within(s, Duration::from_secs(8)), 408);
    }
    assert!(started.elapsed() < Duration::from_secs(8), "{:?}", started.elapsed());
    let out =
        tiderec().args(["serve", "--addr", "127.0.0.1:0", "--read-timeout", "0", "--checkpoint"]).arg(&ckpt).output();
    let out = out.unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("read_timeout"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The response to a connection that sent nothing, read to its end within `within`.
fn unasked_response(addr: &str, within: Duration) -> Raw {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(within)).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap_or_else(|e| panic!("no response within {within:?}: {e}"));
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no response head: {text:?}"));
    Raw { status: head[9..12].parse().unwrap(), head: head.to_string(), body: body.to_string() }
}

/// Connections over the bound per client address are answered `429` at once, without being
/// read (they send nothing here), and take no place among the `--threads` open ones: many of
/// them neither wait for the read timeout nor crowd out the connections admitted.
#[test]
fn connections_over_the_per_address_bound_are_refused_at_once_and_not_counted() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    let flags = ["--max-connections-per-ip", "4", "--threads", "6", "--read-timeout", "10"];
    let server = serve(&ckpt, &flags);
    // Four silent connections hold the address's places (accepted in order, before the others).
    let mut held: Vec<_> = (0..4).map(|_| std::net::TcpStream::connect(&server.addr).unwrap()).collect();
    let started = Instant::now();
    for _ in 0..20 {
        let r = unasked_response(&server.addr, Duration::from_secs(2));
        assert_eq!(r.status, 429, "{}", r.body);
        assert!(r.error().contains("more than 4 connections from 127.0.0.1"), "{}", r.body);
        assert!(r.head.contains("Connection: close"), "{}", r.head);
    }
    assert!(started.elapsed() < Duration::from_secs(5), "refused at once: {:?}", started.elapsed());
    // Clients that send their request (with a body) at once read the refusal too: what they
    // sent is read and dropped, so the close does not reset the answer away.
    let body = format!("[{}]", vec!["{}"; 2000].join(","));
    let request = format!("POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    for _ in 0..20 {
        assert_eq!(status_after(&server.addr, request.as_bytes()), Some(429));
    }
    // The held connections are served, and once one closes, the address has a place again.
    let r = exchange_on(&mut held[0], b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    assert_eq!(r.status, 200, "{}", r.body);
    let deadline = Instant::now() + Duration::from_secs(5);
    while health_status(&server.addr) != Some(200) {
        assert!(Instant::now() < deadline, "no place given back");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(held);
}

/// The status of `GET /health` on a new connection; `None` when the connection was closed
/// before a response could be read (a refusal that did not read the request).
fn health_status(addr: &str) -> Option<u16> {
    status_after(addr, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
}

/// The status of the response to `request` sent on a new connection; `None` when the
/// connection was closed before a response could be read.
fn status_after(addr: &str, request: &[u8]) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).ok()?;
    std::str::from_utf8(out.get(9..12)?).ok()?.parse().ok()
}

/// Polls `/health` until `done` holds for it (at most `within`).
fn health_until(addr: &str, within: Duration, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + within;
    loop {
        let h = health(addr);
        if done(&h) {
            return h;
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {h}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_deleted_checkpoint_gives_way_to_the_next_valid_one_even_at_a_lower_step() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "20"]);
    let server = serve(&ckpt, &["--reload-every", "0.1"]);
    let (records, _) = records(&data, 16);
    let body = format!("[{}]", records.join(","));
    let mut c = Client::connect(&server.addr, Duration::from_secs(30)).unwrap();
    let before = scores(&c.post("/score", body.as_bytes()).unwrap().body);
    assert_eq!(before.0, 20);
    // The served checkpoint is deleted: the model in memory keeps answering, and /health says so.
    std::fs::remove_dir_all(&ckpt).unwrap();
    let h = health_until(&server.addr, Duration::from_secs(5), |h| h["warning"].is_string());
    assert!(h["warning"].as_str().unwrap().contains("deleted"), "{h}");
    assert_eq!(h["step"], 20);
    assert_eq!(scores(&c.post("/score", body.as_bytes()).unwrap().body), before);
    // A new run writes a lower step: it is served, and /health names it before any request.
    train(&data, dir.path(), &["--steps", "5"]);
    let h = health_until(&server.addr, Duration::from_secs(60), |h| h["step"] == 5);
    assert!(h["checkpoint"].as_str().unwrap().ends_with("ckpt-5"), "{h}");
    assert_eq!((h["reloads"].as_u64(), h["warning"].is_null()), (Some(1), true), "{h}");
    let five = scores(&c.post("/score", body.as_bytes()).unwrap().body);
    assert_eq!(five.0, 5);
    let fresh = serve(&ckpt.join("ckpt-5"), &[]);
    let r = Client::connect(&fresh.addr, Duration::from_secs(10)).unwrap().post("/score", body.as_bytes()).unwrap();
    assert_eq!(scores(&r.body), five);
    // Replaced by another run at the same step: a checkpoint is followed by identity, not step.
    std::fs::remove_dir_all(&ckpt).unwrap();
    train(&data, dir.path(), &["--steps", "5", "--seed", "7"]);
    health_until(&server.addr, Duration::from_secs(60), |h| h["reloads"] == 2);
    let other = scores(&c.post("/score", body.as_bytes()).unwrap().body);
    assert_eq!(other.0, 5);
    assert_ne!(other.1, five.1, "the new run's model answers");
}

/// Copies checkpoint directory `from` into `dir` under its own name, atomically (a
/// temporary name first, which the watcher ignores, then a rename).
fn publish(from: &Path, dir: &Path) {
    let name = from.file_name().unwrap();
    let tmp = dir.join(format!(".tmp-{}", name.to_str().unwrap()));
    std::fs::create_dir_all(&tmp).unwrap();
    for f in std::fs::read_dir(from).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), tmp.join(f.file_name())).unwrap();
    }
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// Deltas that follow the served checkpoint are applied onto the served model while
/// requests flow: every answer is one checkpoint's (identical within a step), `/health`
/// counts the deltas and no whole reload, and the last answers are those of a server
/// started on the chain's last checkpoint alone (which loads the chain whole).
#[test]
fn deltas_following_the_served_checkpoint_are_applied_live() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    // No evaluation: the end of the run's would be an improvement, which rewrites the last
    // step's checkpoint whole (a checkpoint of one step is never a delta of itself).
    let chain = train(
        &data,
        dir.path(),
        &["--steps", "30", "--checkpoint-every", "10", "--checkpoint-delta-share", "1000", "--eval-fraction", "0"],
    );
    for step in [20, 30] {
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(chain.join(format!("ckpt-{step}/manifest.json"))).unwrap()).unwrap();
        assert_eq!(m["delta"]["parent"], step - 10, "ckpt-{step} is a delta");
    }
    let served_dir = dir.path().join("served");
    std::fs::create_dir(&served_dir).unwrap();
    publish(&chain.join("ckpt-10"), &served_dir);
    let server = serve(&served_dir, &["--reload-every", "0.05"]);
    let (records, _) = records(&data, 64);
    let body = Arc::new(format!("[{}]", records.join(",")));
    let stop = Arc::new(AtomicBool::new(false));
    let clients = hammer(&server.addr, &body, &stop, 3);
    for (k, step) in [20u64, 30].into_iter().enumerate() {
        std::thread::sleep(Duration::from_millis(150));
        publish(&chain.join(format!("ckpt-{step}")), &served_dir);
        let h = health_until(&server.addr, Duration::from_secs(30), |h| h["step"].as_u64() == Some(step));
        assert_eq!((h["deltas"].as_u64(), h["reloads"].as_u64()), (Some(k as u64 + 1), Some(0)), "{h}");
    }
    std::thread::sleep(Duration::from_millis(150));
    stop.store(true, Ordering::SeqCst);
    let seen: Vec<(u64, Vec<f64>)> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    for step in [10u64, 20, 30] {
        let answers: Vec<&Vec<f64>> = seen.iter().filter(|(s, _)| *s == step).map(|(_, v)| v).collect();
        assert!(answers.iter().all(|v| *v == answers[0]), "step {step}: one model's answers");
    }
    let last = seen.iter().rev().find(|(s, _)| *s == 30).expect("answers from step 30").1.clone();
    let fresh = serve(&chain.join("ckpt-30"), &[]);
    let r = Client::connect(&fresh.addr, Duration::from_secs(10)).unwrap().post("/score", body.as_bytes()).unwrap();
    assert_eq!(scores(&r.body), (30, last), "the live deltas give the model of the whole chain");
}

/// A request scored in many jobs while the served model changes four times (whole
/// checkpoints published one after the other, each taken up before the next) is answered
/// `200` by the model it started with: every record, all of them alike, gets the score that
/// model gives it alone, not one of the models taken meanwhile.
#[test]
fn a_request_is_scored_by_one_model_while_the_model_changes_several_times() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let whole = ["--checkpoint-every", "5", "--checkpoint-deltas", "0", "--keep-checkpoints", "10"];
    let chain = train(&data, dir.path(), &[&["--steps", "25"][..], &whole].concat());
    let served_dir = dir.path().join("served");
    std::fs::create_dir(&served_dir).unwrap();
    publish(&chain.join("ckpt-5"), &served_dir);
    // One record a job: the request's records are scored one forward pass after the other,
    // for seconds, while the checkpoints come.
    let n = 200_000;
    let flags = ["--reload-every", "0.05", "--max-batch", "1", "--max-records", "200000"];
    let server = serve(&served_dir, &flags);
    // A short record: 7 MB of them, under the 16 MiB of a body.
    let record = r#"{"I1": 3, "I2": 7, "C1": "68fd1e64"}"#;
    let body = format!("[{}]", vec![record; n].join(","));
    let addr = server.addr.clone();
    let request = std::thread::spawn(move || {
        let r = Client::connect(&addr, Duration::from_secs(300)).unwrap().post("/score", body.as_bytes()).unwrap();
        (r.status, r.body)
    });
    health_until(&server.addr, Duration::from_secs(30), |h| h["records"].as_u64() > Some(0));
    for step in [10u64, 15, 20, 25] {
        publish(&chain.join(format!("ckpt-{step}")), &served_dir);
        health_until(&server.addr, Duration::from_secs(30), |h| h["step"].as_u64() == Some(step));
    }
    let h = health(&server.addr);
    assert_eq!(h["reloads"], 4, "{h}");
    let in_flight = !request.is_finished();
    let (status, answer) = request.join().unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    assert!(in_flight, "the request must still be in flight after the reloads (make it longer): {h}");
    let (step, got) = scores(&answer);
    assert_eq!((step, got.len()), (5, n), "the model the request started with answers it");
    assert!(got.iter().all(|p| *p == got[0]), "one model scored every record");
    let one = format!("[{record}]");
    let mut c = Client::connect(&server.addr, Duration::from_secs(10)).unwrap();
    let now = scores(&c.post("/score", one.as_bytes()).unwrap().body);
    assert_eq!(now.0, 25);
    assert_ne!(now.1[0], got[0], "the models taken meanwhile score the record otherwise");
    let fresh = serve(&chain.join("ckpt-5"), &[]);
    let r = Client::connect(&fresh.addr, Duration::from_secs(10)).unwrap().post("/score", one.as_bytes()).unwrap();
    assert_eq!(scores(&r.body), (5, vec![got[0]]), "the score of step 5's model");
}

/// A delta that cannot be applied onto the served model (here the delta of another run, of
/// another shape, at the step after the served one) leaves the model as it was, and the next
/// look loads the newest checkpoint whole: the newest that loads (the failed delta's chain does
/// not, its base being of another run), so the served checkpoint again. The served chain's own
/// delta is then applied onto it.
#[test]
fn a_delta_that_cannot_be_applied_makes_the_next_look_load_whole() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let (x, z) = (dir.path().join("x"), dir.path().join("z"));
    // No evaluation, whose improvement at the end would rewrite ckpt-20 whole.
    let deltas =
        ["--steps", "20", "--checkpoint-every", "10", "--checkpoint-delta-share", "1000", "--eval-fraction", "0"];
    std::fs::create_dir_all(&x).unwrap();
    std::fs::create_dir_all(&z).unwrap();
    let chain = train(&data, &x, &deltas);
    let other = train(&data, &z, &[&deltas[..], &["--bottom", "64,16"]].concat());
    for ckpt in [&chain, &other] {
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(ckpt.join("ckpt-20/manifest.json")).unwrap()).unwrap();
        assert_eq!(m["delta"]["parent"], 10, "{} is a delta", ckpt.display());
    }
    let served_dir = dir.path().join("served");
    std::fs::create_dir(&served_dir).unwrap();
    publish(&chain.join("ckpt-10"), &served_dir);
    let server = serve(&served_dir, &["--reload-every", "0.05"]);
    let (records, _) = records(&data, 16);
    let body = format!("[{}]", records.join(","));
    let mut c = Client::connect(&server.addr, Duration::from_secs(30)).unwrap();
    let ten = scores(&c.post("/score", body.as_bytes()).unwrap().body);
    assert_eq!(ten.0, 10);
    publish(&other.join("ckpt-20"), &served_dir);
    let h = health_until(&server.addr, Duration::from_secs(15), |h| h["reloads"] == 1);
    assert_eq!((h["step"].as_u64(), h["deltas"].as_u64()), (Some(10), Some(0)), "{h}");
    assert!(h["checkpoint"].as_str().unwrap().ends_with("ckpt-10"), "{h}");
    assert_eq!(scores(&c.post("/score", body.as_bytes()).unwrap().body), ten);
    // The run's own delta of step 20 takes the failed one's place: applied onto the model.
    std::fs::remove_dir_all(served_dir.join("ckpt-20")).unwrap();
    publish(&chain.join("ckpt-20"), &served_dir);
    let h = health_until(&server.addr, Duration::from_secs(15), |h| h["step"] == 20);
    assert_eq!((h["deltas"].as_u64(), h["reloads"].as_u64()), (Some(1), Some(1)), "{h}");
    let twenty = scores(&c.post("/score", body.as_bytes()).unwrap().body);
    let fresh = serve(&chain.join("ckpt-20"), &[]);
    let r = Client::connect(&fresh.addr, Duration::from_secs(10)).unwrap().post("/score", body.as_bytes()).unwrap();
    assert_eq!(scores(&r.body), twenty, "the model of the whole chain");
}

/// A response taken slowly (a client reading a little at a time, so that every write makes
/// progress) is given up `--read-timeout` after it started: the connection closes and its
/// place is given back, instead of being held for as long as the client keeps reading.
#[test]
fn a_response_not_taken_within_the_read_timeout_closes_the_connection() {
    use std::io::{Read, Write};
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    // One connection at a time: /health answers 200 only once the slow one's place is free.
    let n = 1_500_000;
    let flags = ["--threads", "1", "--read-timeout", "2", "--max-records", "1500000", "--max-batch", "4096"];
    let server = serve(&ckpt, &flags);
    // About 16 MB of scores: far more than the socket buffers of both ends hold, so the
    // response is written as the client reads it, 128 KiB every 100 ms (many seconds).
    let body = empty_records(n);
    let mut s = std::net::TcpStream::connect(&server.addr).unwrap();
    s.write_all(post_head(&format!("Content-Length: {}\r\n", body.len())).as_bytes()).unwrap();
    s.write_all(&body).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let (started_tx, started) = std::sync::mpsc::channel();
    let reading = stop.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 128 << 10];
        let mut got = 0;
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        while !reading.load(Ordering::SeqCst) {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(k) if got == 0 => {
                    got += k;
                    let _ = started_tx.send(Instant::now());
                }
                Ok(k) => got += k,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        got
    });
    let first_byte = started.recv_timeout(Duration::from_secs(60)).expect("the response starts");
    while health_status(&server.addr) != Some(200) {
        let waited = first_byte.elapsed();
        assert!(waited < Duration::from_millis(6000), "the slow response still holds its place after {waited:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    assert!(reader.join().unwrap() > 0);
}

/// A response read from a raw connection: its status, head and body.
struct Raw {
    status: u16,
    head: String,
    body: String,
}

impl Raw {
    /// The `error` of a JSON error body.
    fn error(&self) -> String {
        let v: serde_json::Value = serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body));
        v["error"].as_str().unwrap_or_default().to_string()
    }
}

/// Sends `bytes` on `s` and reads one response, to the end of the connection (the
/// requests ask to close it, and a refused one is closed).
fn exchange_on(s: &mut std::net::TcpStream, bytes: &[u8]) -> Raw {
    use std::io::{Read, Write};
    s.write_all(bytes).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap_or_else(|e| panic!("no whole response: {e}"));
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no response head: {text:?}"));
    Raw { status: head[9..12].parse().unwrap(), head: head.to_string(), body: body.to_string() }
}

/// Opens a connection, sends `bytes` and reads one response.
fn exchange(addr: &str, bytes: &[u8]) -> Raw {
    exchange_on(&mut std::net::TcpStream::connect(addr).unwrap(), bytes)
}

/// The head of a `POST /score` with `headers`, closing the connection after the response.
fn post_head(headers: &str) -> String {
    format!("POST /score HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n")
}

/// `body` in chunks of at most `size` bytes, the first with an extension, and a trailer.
fn chunked(body: &[u8], size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, chunk) in body.chunks(size).enumerate() {
        let extension = if k == 0 { ";name=value" } else { "" };
        out.extend_from_slice(format!("{:x}{extension}\r\n", chunk.len()).as_bytes());
        out.extend_from_slice(chunk);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\nX-Trailer: ignored\r\n\r\n");
    out
}

#[test]
fn chunked_bodies_are_scored_and_bounded_like_content_length_ones() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    // The defaults: bodies of at most 16 MiB.
    let server = serve(&ckpt, &[]);
    let (records, _) = records(&data, 8);
    let body = format!("[{}]", records.join(","));
    let want = Client::connect(&server.addr, Duration::from_secs(10)).unwrap().post("/score", body.as_bytes()).unwrap();
    assert_eq!(want.status, 200, "{}", want.text());
    let mut request = post_head("Transfer-Encoding: chunked\r\n").into_bytes();
    request.extend(chunked(body.as_bytes(), 100));
    let r = exchange(&server.addr, &request);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(scores(r.body.as_bytes()), scores(&want.body), "a chunked body scores as the same body sent whole");

    // A chunk whose size passes the limit: 413 at its size line, its data not waited for.
    let started = Instant::now();
    let over = format!("{}{:x}\r\n", post_head("Transfer-Encoding: chunked\r\n"), (16 << 20) + 1);
    let r = exchange(&server.addr, over.as_bytes());
    assert_eq!((r.status, r.error().contains("over 16777216 bytes")), (413, true), "{}", r.body);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    // Chunks that pass it together: 413 at the size line of the one that passes it.
    let mut over = post_head("Transfer-Encoding: chunked\r\n").into_bytes();
    over.extend(format!("{:x}\r\n", (16 << 20) - 1).as_bytes());
    over.extend(std::iter::repeat_n(b' ', (16 << 20) - 1));
    over.extend(b"\r\n2\r\n");
    let r = exchange(&server.addr, &over);
    assert_eq!(r.status, 413, "{}", r.body);

    // A malformed size line: 400 naming it.
    let r = exchange(&server.addr, format!("{}zz\r\n", post_head("Transfer-Encoding: chunked\r\n")).as_bytes());
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.error().contains("the chunk size line \"zz\" is not a hex size"), "{}", r.body);
    // Content-Length and chunked together: refused (a request has one body length).
    let r = exchange(&server.addr, post_head("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n").as_bytes());
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.error().contains("both Content-Length and Transfer-Encoding"), "{}", r.body);
    // A head a proxy could read another way: 400, never read as chunked or as Content-Length.
    for smuggled in ["Transfer-Encoding : chunked\r\n", "X-A: b\r\n chunked\r\n", "Content-Length: +5\r\n"] {
        let r = exchange(&server.addr, format!("{}5\r\nhello\r\n0\r\n\r\n", post_head(smuggled)).as_bytes());
        assert_eq!(r.status, 400, "{smuggled:?}: {}", r.body);
    }
    // Another coding is not read.
    let r = exchange(&server.addr, post_head("Transfer-Encoding: gzip, chunked\r\n").as_bytes());
    assert_eq!(r.status, 501, "{}", r.body);
    assert!(r.error().contains("\"gzip, chunked\" is not supported"), "{}", r.body);
    assert_eq!(health(&server.addr)["records"], 16, "the two 8-record requests, nothing of the refused ones");
}

#[test]
fn the_body_memory_budget_answers_503_while_full_and_health_still_answers() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    // One address may take every connection, so it may hold the whole budget (its share is that
    // of --max-connections-per-ip in --threads): this test is about the budget of all of them.
    let flags = ["--max-body-bytes", "1000", "--max-body-memory", "1500", "--read-timeout", "30"];
    let server = serve(&ckpt, &[&flags[..], &["--max-connections-per-ip", "256"]].concat());
    let padded = |n: usize| format!("{:<n$}", r#"{"I1": 3}"#);
    // One connection holds 990 bytes of its 1000, its body stalled before its last 10: a body
    // holds the bytes that arrived (its buffer doubles as they come, up to the length
    // announced, so 1000 when they came in two reads).
    let mut held = std::net::TcpStream::connect(&server.addr).unwrap();
    let held_body = padded(1000);
    let head = post_head("Content-Length: 1000\r\n");
    std::io::Write::write_all(&mut held, format!("{head}{}", &held_body[..990]).as_bytes()).unwrap();
    let h = health_until(&server.addr, Duration::from_secs(10), |h| h["body_bytes"].as_u64() >= Some(990));
    let holding = h["body_bytes"].as_u64().unwrap();
    assert!(holding <= 1000, "{h}");
    // 600 more do not fit in 1500: 503 with Retry-After, before its body is sent.
    let r = exchange(&server.addr, post_head("Content-Length: 600\r\n").as_bytes());
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.head.ends_with("\r\nRetry-After: 1"), "{}", r.head);
    assert!(r.error().contains("busy") && r.error().contains("retry"), "{}", r.body);
    // Nor as a chunked body, refused when its data grows past what is left.
    let chunk = format!("{}258\r\n{}", post_head("Transfer-Encoding: chunked\r\n"), padded(600));
    let r = exchange(&server.addr, chunk.as_bytes());
    assert_eq!(r.status, 503, "{}", r.body);
    // 400 bytes fit, and /health answers meanwhile, counting the bytes held.
    let small = padded(400);
    let r = exchange(&server.addr, format!("{}{small}", post_head("Content-Length: 400\r\n")).as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(health(&server.addr)["body_bytes"], holding);
    // The held body arrives and is scored; its bytes are given back, and 600 now fit.
    let r = exchange_on(&mut held, &held_body.as_bytes()[990..]);
    assert_eq!((r.status, scores(r.body.as_bytes()).1.len()), (200, 1), "{}", r.body);
    health_until(&server.addr, Duration::from_secs(10), |h| h["body_bytes"] == 0);
    let r = exchange(&server.addr, format!("{}{}", post_head("Content-Length: 600\r\n"), padded(600)).as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    // The budget must hold one body of the largest size.
    let out = tiderec()
        .args([
            "serve",
            "--addr",
            "127.0.0.1:0",
            "--max-body-bytes",
            "1000",
            "--max-body-memory",
            "999",
            "--checkpoint",
        ])
        .arg(&ckpt)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("max_body_memory") && err.contains("max_body_bytes"), "{err}");
}

/// A model trained on Criteo rows converted to Parquet (`dir/pq`), whose records take dense
/// values as they are (no transform at serving).
fn criteo_parquet_model(data: &Path, dir: &Path) -> PathBuf {
    let subset = dir.join("subset.tsv");
    let text = std::fs::read_to_string(data).unwrap();
    std::fs::write(&subset, text.lines().take(2000).collect::<Vec<_>>().join("\n")).unwrap();
    let pq = dir.join("pq");
    run_ok(
        tiderec()
            .args(["convert", "--progress", "none", "--buckets", "500", "--from"])
            .arg(format!("criteo:{}", subset.display()))
            .arg("--to")
            .arg(format!("parquet:{}", pq.display())),
    );
    let data = format!("parquet:{}", pq.display());
    train_epoch(dir, "ckpt", &data, &["--bottom", "32,16", "--top", "32,1"])
}

/// A score that overflows to a non-finite value (huge finite dense values, as a row's dense
/// values are taken as given) is answered with an error naming its record, in valid JSON,
/// never `NaN` in a `200`.
#[test]
fn a_non_finite_score_is_an_error_naming_its_record() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = criteo_parquet_model(&data, dir.path());
    let server = serve(&ckpt, &[]);
    let mut c = Client::connect(&server.addr, Duration::from_secs(30)).unwrap();
    let huge = |sign: &dyn Fn(usize) -> f32| {
        let fields: Vec<String> = (1..=13).map(|i| format!("\"I{i}\": {:e}", 3.0e38 * sign(i))).collect();
        format!("{{{}}}", fields.join(", "))
    };
    let patterns = [huge(&|_| 1.0), huge(&|i| if i % 2 == 0 { 1.0 } else { -1.0 }), huge(&|_| -1.0)];
    let mut refused = 0;
    for record in &patterns {
        let r = c.post("/score", format!(r#"[{{"I1": 1, "C3": 4}}, {record}]"#).as_bytes()).unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.text()));
        match r.status {
            200 => assert_eq!(v["scores"].as_array().map(Vec::len), Some(2), "{v}"),
            422 => {
                let e = v["error"].as_str().unwrap();
                assert!(e.starts_with("record 1: the model's score is NaN, not a finite number"), "{e}");
                refused += 1;
            }
            s => panic!("status {s}: {v}"),
        }
    }
    assert!(refused > 0, "none of the huge records overflowed the model");
    // The connection and the server are still fine.
    let r = c.post("/score", br#"{"I1": 1, "C3": 4}"#).unwrap();
    assert_eq!((r.status, scores(&r.body).1.len()), (200, 1), "{}", r.text());
}

#[test]
fn nan_and_non_utf8_bodies_are_refused_saying_so() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    let server = serve(&ckpt, &[]);
    let mut c = Client::connect(&server.addr, Duration::from_secs(10)).unwrap();
    let e = post_error(&mut c, r#"{"I1": NaN, "C1": "68fd1e64"}"#);
    assert!(e.starts_with("record 0: not valid JSON: NaN/Infinity are not JSON numbers (`NaN` in `I1`"), "{e}");
    let e = post_error(&mut c, "{\"I1\": 1}\n{\"I2\": -Infinity}\n");
    assert!(e.starts_with("record 1: not valid JSON: NaN/Infinity are not JSON numbers (`-Infinity` in `I2`"), "{e}");
    let e = post_error(&mut c, r#"[{"I1": 1}, {"I3": NaN}]"#);
    assert!(e.contains("not valid JSON: NaN/Infinity are not JSON numbers (`NaN` in `I3`"), "{e}");
    // A pretty-printed object is one value: its NaN is named, not a line of it refused.
    let e = post_error(&mut c, "{\n  \"I1\": NaN,\n  \"C1\": \"68fd1e64\"\n}\n");
    assert!(e.contains("not valid JSON: NaN/Infinity are not JSON numbers (`NaN` in `I1`"), "{e}");
    let r = c.post("/score", b"{\"C1\": \"\xff\"}").unwrap();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("the body is not UTF-8 (byte offset 8)"), "{}", r.text());
    // The connection and the server are still fine.
    let r = c.post("/score", br#"{"I1": 3}"#).unwrap();
    assert_eq!((r.status, scores(&r.body).1.len()), (200, 1));
}

/// `serve` following the checkpoint directory of a running `online` trainer (a real broker
/// on 127.0.0.1, records produced while it trains) under clients that never pause: the
/// deltas are applied live, and every answer is one whole checkpoint's model, the scores
/// `predict` gives with that checkpoint, never a half-applied delta.
#[test]
fn serve_following_a_running_online_trainer_answers_from_whole_checkpoints_only() {
    use kafka_broker::{running_online_cmd, wait_for_checkpoint, Broker};
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let broker = Broker::start();
    let mut producer = tiderec()
        .args(["produce", "--brokers", &broker.addr(), "--topic", "live", "--progress", "none"])
        .args(["--partitions", "2", "--rate", "2500"])
        .arg("--from")
        .arg(format!("criteo:{}", data.display()))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let flags = ["--checkpoint-every", "10", "--keep-checkpoints", "1000"];
    let mut trainer = running_online_cmd(&broker.addr(), "live", d, 2, &flags).stdout(Stdio::null()).spawn().unwrap();
    wait_for_checkpoint(d, &mut trainer);
    let server = serve(&d.join("ckpt"), &["--reload-every", "0.05"]);
    let (records, _) = records(&data, 64);
    let body = Arc::new(format!("[{}]", records.join(",")));
    let stop = Arc::new(AtomicBool::new(false));
    let clients = hammer(&server.addr, &body, &stop, 3);
    assert!(producer.wait().unwrap().success(), "produce failed");
    // Let the trainer take up the last records, then stop it: it writes a last checkpoint.
    std::thread::sleep(Duration::from_secs(2));
    std::process::Command::new("kill").args(["-TERM", &trainer.id().to_string()]).status().unwrap();
    assert!(trainer.wait().unwrap().success(), "online exits 0 on SIGTERM");
    let last: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("summary.json")).unwrap()).unwrap();
    let last_step = last["steps"].as_u64().unwrap();
    let h = health_until(&server.addr, Duration::from_secs(30), |h| h["step"].as_u64() == Some(last_step));
    std::thread::sleep(Duration::from_millis(100));
    stop.store(true, Ordering::SeqCst);
    let seen: Vec<(u64, Vec<f64>)> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    let mut steps: Vec<u64> = seen.iter().map(|(s, _)| *s).collect();
    steps.sort_unstable();
    steps.dedup();
    assert!(steps.len() >= 3, "answers from {steps:?} only");
    assert!(h["deltas"].as_u64().unwrap_or(0) >= 1, "deltas applied live: {h}");
    // The records as a file, scored by `predict` with each checkpoint that answered.
    let file = d.join("records.tsv");
    let text = std::fs::read_to_string(&data).unwrap();
    std::fs::write(&file, text.lines().take(64).collect::<Vec<_>>().join("\n")).unwrap();
    let criteo = format!("criteo:{}", file.display());
    for &step in &steps {
        let answers: Vec<&Vec<f64>> = seen.iter().filter(|(s, _)| *s == step).map(|(_, v)| v).collect();
        assert!(answers.iter().all(|v| *v == answers[0]), "step {step}: answers of more than one model");
        let scored = d.join(format!("predict-{step}"));
        std::fs::create_dir(&scored).unwrap();
        let want = predicted(&d.join(format!("ckpt/ckpt-{step}")), &criteo, &scored);
        assert_close(answers[0], &want, &format!("step {step}"));
    }
}

/// Opens a connection that sends `prefix`, then one byte every 500 ms until the server closes
/// it or `stop` is set; the thread sending is returned with it.
fn trickle(addr: &str, prefix: &[u8], stop: &Arc<AtomicBool>) -> (std::net::TcpStream, std::thread::JoinHandle<()>) {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(prefix).unwrap();
    let (mut w, stop) = (s.try_clone().unwrap(), stop.clone());
    let sender = std::thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(500));
            if w.write_all(b"a").is_err() {
                return;
            }
        }
    });
    (s, sender)
}

/// Waits until `server` exits (at most `within`), which must be a success.
fn exits_within(server: &mut Served, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            assert!(status.success(), "serve exits 0 on SIGTERM: {status}");
            return;
        }
        assert!(Instant::now() < deadline, "serve did not stop within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A head trickled a byte every 500 ms, never ending its line, must still arrive whole within
/// the read timeout: it is answered `408` at the timeout (not when one read waits longer than
/// the time left), and a server stopped meanwhile stops without waiting for it.
#[test]
fn a_head_trickled_a_byte_at_a_time_is_cut_off_at_the_read_timeout() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    let mut server = serve(&ckpt, &["--read-timeout", "1"]);
    let stop = Arc::new(AtomicBool::new(false));
    let prefix = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    let started = Instant::now();
    let (mut slow, sender) = trickle(&server.addr, prefix, &stop);
    assert_eq!(status_within(&mut slow, Duration::from_secs(2)), 408);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    sender.join().unwrap();
    // SIGTERM while a head trickles: serve answers it 408 at the timeout and exits.
    let (_slow, sender) = trickle(&server.addr, prefix, &stop);
    std::thread::sleep(Duration::from_millis(200));
    std::process::Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap();
    exits_within(&mut server, Duration::from_secs(4));
    stop.store(true, Ordering::SeqCst);
    sender.join().unwrap();
}

/// The port of an address `host:port` as `serve` prints it.
fn port_of(addr: &str) -> &str {
    addr.rsplit(':').next().unwrap()
}

/// One client address sending bodies on every connection it may open, each stalled before its
/// last byte, holds at most its share of `--max-body-memory` (the share of
/// `--max-connections-per-ip` in `--threads`: with the defaults, 64 of 256, a quarter): the
/// connections over it are answered `503`, and a request from another address is scored.
#[test]
fn one_client_address_cannot_hold_the_whole_body_memory() {
    use std::io::{Read, Write};
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        common::skip::cannot_run("no IPv6 loopback (::1): a second client address is needed");
        return;
    }
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    // A quarter of 400,000 bytes: 100,000, room for 25 of the 3,999 bytes each connection
    // sends (in one write, read whole with its head: the server reads 8 KiB at a time); the
    // bodies wait for their last byte longer than this test takes.
    let (share, body) = (100_000usize, 4000usize);
    let flags = ["--read-timeout", "30", "--max-body-bytes", "100000", "--max-body-memory", "400000"];
    let server = serve_on("[::]:0", &ckpt, &flags);
    let port = port_of(&server.addr);
    let (first, other) = (format!("127.0.0.1:{port}"), format!("[::1]:{port}"));
    let padded = format!("{:<body$}", r#"{"I1": 3}"#);
    let request = format!("{}{}", post_head(&format!("Content-Length: {body}\r\n")), &padded[..body - 1]);
    let mut bodies: Vec<std::net::TcpStream> = (0..64)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&first).unwrap();
            s.write_all(request.as_bytes()).unwrap();
            s
        })
        .collect();
    let (fit, held) = (share / (body - 1), share / (body - 1) * (body - 1));
    health_until(&other, Duration::from_secs(10), |h| h["body_bytes"].as_u64() >= Some(held as u64));
    std::thread::sleep(Duration::from_millis(300));
    let r = Client::connect(&other, Duration::from_secs(10)).unwrap().post("/score", br#"{"I1": 3}"#).unwrap();
    assert_eq!(r.status, 200, "another address is scored: {}", r.text());
    assert_eq!(health(&other)["body_bytes"], held, "the first address holds its share, no more");
    // The bodies over the share were answered 503, naming the address and its share.
    let mut refused = 0;
    for s in &mut bodies {
        s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let mut out = Vec::new();
        if s.read_to_end(&mut out).is_ok() {
            let text = String::from_utf8_lossy(&out);
            assert!(text.starts_with("HTTP/1.1 503"), "{text}");
            let want = format!("request bodies from 127.0.0.1 hold {held} of the {share} bytes");
            assert!(text.contains(&want), "{text}");
            refused += 1;
        }
    }
    assert_eq!(refused, 64 - fit);
}

/// Heads announcing large bodies hold only the bytes they send: eight connections announcing
/// half of `--max-body-memory` each, sending 10 bytes and stalling, hold 80 bytes, and an
/// ordinary request is scored meanwhile, not refused for memory.
#[test]
fn bodies_announced_and_not_sent_hold_no_body_memory() {
    use std::io::Write;
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    let flags = ["--max-body-bytes", "1000000", "--max-body-memory", "1000000", "--read-timeout", "30"];
    let server = serve(&ckpt, &[&flags[..], &["--max-connections-per-ip", "256"]].concat());
    let head = post_head("Content-Length: 500000\r\n");
    let stalled: Vec<std::net::TcpStream> = (0..8)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&server.addr).unwrap();
            s.write_all(format!("{head}[{{\"I1\": 3}}").as_bytes()).unwrap();
            s
        })
        .collect();
    let h = health_until(&server.addr, Duration::from_secs(10), |h| h["body_bytes"].as_u64() >= Some(80));
    assert_eq!(h["body_bytes"], 80, "the bytes sent, not the 4 MB announced: {h}");
    let r = Client::connect(&server.addr, Duration::from_secs(10)).unwrap().post("/score", br#"{"I1": 3}"#).unwrap();
    assert_eq!(r.status, 200, "an ordinary request is scored: {}", r.text());
    // A body announced past what is left of the memory is still refused before it is sent.
    let r = exchange(&server.addr, post_head("Content-Length: 999990\r\n").as_bytes());
    assert_eq!(r.status, 503, "{}", r.body);
    assert_eq!(health(&server.addr)["body_bytes"], 80);
    drop(stalled);
    health_until(&server.addr, Duration::from_secs(10), |h| h["body_bytes"] == 0);
}

/// Answers that leave a request's body unread (`503` with the body memory spent, `413`, `501`)
/// reach a client that sent its head and body in one write, every time: the connection is
/// not reset under them by a close with unread bytes.
#[test]
fn answers_that_leave_a_body_unread_reach_the_client() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    let flags = ["--max-body-bytes", "20000", "--max-body-memory", "20000", "--read-timeout", "30"];
    let server = serve(&ckpt, &flags);
    let padded = |n: usize| format!("{:<n$}", r#"{"I1": 3}"#);
    // One connection holds the whole budget (the bytes it sent, its last one held back).
    let mut held = std::net::TcpStream::connect(&server.addr).unwrap();
    let head = post_head("Content-Length: 20000\r\n");
    std::io::Write::write_all(&mut held, format!("{head}{}", &padded(20000)[..19_999]).as_bytes()).unwrap();
    health_until(&server.addr, Duration::from_secs(10), |h| h["body_bytes"].as_u64() >= Some(19_999));
    // Bodies past what the server reads with the head (its buffer is 8 KiB).
    let body = padded(12000);
    let requests = [
        (format!("{}{body}", post_head("Content-Length: 12000\r\n")), 503),
        (format!("{}{:x}\r\n{body}\r\n0\r\n\r\n", post_head("Transfer-Encoding: chunked\r\n"), body.len()), 503),
        (format!("{}{}", post_head("Content-Length: 20001\r\n"), padded(20001)), 413),
        (format!("{}{body}", post_head("Transfer-Encoding: gzip\r\n")), 501),
    ];
    for (request, status) in &requests {
        for k in 0..20 {
            assert_eq!(status_after(&server.addr, request.as_bytes()), Some(*status), "try {k} of {status}");
        }
    }
    drop(held);
}

/// A checkpoint newer than the one served that cannot be loaded is named by `/health`'s
/// `warning` while the older model keeps answering; the warning goes once it is deleted, and
/// once a newer checkpoint is served.
#[test]
fn a_newer_checkpoint_that_cannot_be_loaded_is_named_in_health() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    let server = serve(&ckpt, &["--reload-every", "0.1"]);
    assert!(health(&server.addr)["warning"].is_null());
    // A damaged checkpoint of step 9, written atomically (a temporary name, then a rename).
    let corrupt = |step: u64| {
        let tmp = ckpt.join(format!(".tmp-ckpt-{step}"));
        std::fs::create_dir(&tmp).unwrap();
        std::fs::write(tmp.join("manifest.json"), "{ not a manifest").unwrap();
        let path = ckpt.join(format!("ckpt-{step}"));
        std::fs::rename(&tmp, &path).unwrap();
        path
    };
    let bad = corrupt(9);
    let h = health_until(&server.addr, Duration::from_secs(10), |h| h["warning"].is_string());
    let warning = h["warning"].as_str().unwrap();
    assert!(warning.contains(&format!("cannot load the checkpoint {} (step 9)", bad.display())), "{h}");
    assert_eq!((h["step"].as_u64(), h["reloads"].as_u64()), (Some(5), Some(0)), "{h}");
    let mut c = Client::connect(&server.addr, Duration::from_secs(10)).unwrap();
    assert_eq!(scores(&c.post("/score", br#"{"I1": 3}"#).unwrap().body).0, 5);
    std::fs::remove_dir_all(&bad).unwrap();
    health_until(&server.addr, Duration::from_secs(10), |h| h["warning"].is_null());
    // Damaged again; a resumed run then writes step 12, which is served and clears it.
    corrupt(9);
    health_until(&server.addr, Duration::from_secs(10), |h| h["warning"].is_string());
    train(&data, dir.path(), &["--steps", "12", "--resume"]);
    let h = health_until(&server.addr, Duration::from_secs(60), |h| h["step"] == 12);
    assert!(h["warning"].is_null(), "{h}");
}

/// Seconds of CPU the process `pid` has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    let out = std::process::Command::new("getconf").arg("CLK_TCK").output().ok();
    let per_second = out.and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok()).unwrap_or(100.0);
    ticks / per_second
}

/// Sets the soft limit of open files of the process `pid` (with `prlimit`).
fn limit_open_files(pid: u32, limit: usize) {
    let mut set = std::process::Command::new("prlimit");
    assert!(set.arg(format!("--pid={pid}")).arg(format!("--nofile={limit}:")).status().unwrap().success());
}

/// With no file descriptor left (its limit lowered under it with `prlimit`), every accept
/// fails at once: the accept loop pauses between tries instead of spinning, and serves
/// connections again once descriptors are given back.
#[test]
fn failed_accepts_pause_the_accept_loop_instead_of_spinning() {
    use std::io::Read;
    if std::process::Command::new("prlimit").arg("--version").output().is_err() {
        common::skip::cannot_run("prlimit (util-linux) not found");
        return;
    }
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    // One checkpoint: no watcher opening files of its own.
    let server = serve(&ckpt.join("ckpt-5"), &["--read-timeout", "30"]);
    let pid = server.child.id();
    let open: std::collections::HashSet<usize> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    // No new descriptor: the limit is the lowest one not open.
    limit_open_files(pid, (0..).find(|fd| !open.contains(fd)).unwrap());
    // An accept already waiting holds the descriptor of the next connection, which is then
    // closed as it cannot be cloned (or, had none been waiting, stays queued); every accept
    // after it fails at once.
    let mut first = std::net::TcpStream::connect(&server.addr).unwrap();
    first.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let _closed_or_queued = first.read(&mut [0; 16]);
    std::thread::sleep(Duration::from_millis(300));
    let before = cpu_seconds(pid);
    std::thread::sleep(Duration::from_secs(1));
    let used = cpu_seconds(pid) - before;
    assert!(used < 0.25, "the server used {used} s of CPU in 1 s with accepts failing");
    // Descriptors given back: connections are served again.
    limit_open_files(pid, 1024);
    let deadline = Instant::now() + Duration::from_secs(5);
    while health_status(&server.addr) != Some(200) {
        assert!(Instant::now() < deadline, "no connection served once descriptors were given back");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Both per-address bounds count an IPv6 client by its /64 and an IPv4 client by its address,
/// also when it reaches a dual-stack listener as an IPv4-mapped IPv6 address.
#[test]
fn ipv6_clients_are_counted_by_their_prefix_and_mapped_ipv4_ones_by_their_address() {
    use std::net::TcpStream;
    if std::net::TcpListener::bind("[::1]:0").is_err() {
        common::skip::cannot_run("no IPv6 loopback (::1): a second client address is needed");
        return;
    }
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    let server = serve_on("[::]:0", &ckpt, &["--max-connections-per-ip", "2", "--threads", "8"]);
    let port = port_of(&server.addr);
    let (v4, mapped, v6) = (format!("127.0.0.1:{port}"), format!("[::ffff:127.0.0.1]:{port}"), format!("[::1]:{port}"));
    let held: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&v4).unwrap()).collect();
    let r = unasked_response(&mapped, Duration::from_secs(2));
    assert_eq!(r.status, 429, "an IPv4-mapped address is its IPv4 address: {}", r.body);
    assert!(r.error().contains("more than 2 connections from 127.0.0.1;"), "{}", r.body);
    // ::1 is another client; its /64 is held by two connections, then refused by its prefix.
    assert_eq!(health_status(&v6), Some(200));
    std::thread::sleep(Duration::from_millis(300));
    let ipv6: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&v6).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let r = unasked_response(&v6, Duration::from_secs(2));
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(r.error().contains("more than 2 connections from ::/64;"), "{}", r.body);
    drop((held, ipv6));
}

/// Criteo objects are made into the TSV line and featurized as `line`s are: integers and
/// hexadecimal values score alike as JSON numbers or strings, and bad values name the field
/// with the cause the line's format gives.
#[test]
fn criteo_objects_score_as_their_lines_with_numbers_or_strings() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    let server = serve(&ckpt, &[]);
    let mut c = Client::connect(&server.addr, Duration::from_secs(30)).unwrap();
    let text = std::fs::read_to_string(&data).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| !l.is_empty()).take(60).collect();
    let as_lines: Vec<String> = lines.iter().map(|l| serde_json::json!({ "line": l }).to_string()).collect();
    let objects: Vec<serde_json::Value> =
        lines.iter().map(|l| serde_json::from_str(&criteo_line_to_json(l.as_bytes()).unwrap()).unwrap()).collect();
    // Every value as a string; and every value that can be one as a number (hex of digits alone).
    let retyped = |to_string: bool| -> Vec<String> {
        objects
            .iter()
            .map(|o| {
                let mut o = o.clone();
                for (k, v) in o.as_object_mut().unwrap() {
                    let t = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                    let digits = !t.starts_with('0') && t.bytes().all(|b| b.is_ascii_digit());
                    if to_string && k != "label" {
                        *v = t.into();
                    } else if !to_string && digits && !t.is_empty() {
                        *v = serde_json::from_str(&t).unwrap();
                    }
                }
                o.to_string()
            })
            .collect()
    };
    let (strings, numbers) = (retyped(true), retyped(false));
    assert!(strings.iter().any(|s| s.contains(r#""I1":""#)), "integers sent as strings");
    assert!(numbers.iter().any(|s| s.contains(r#""C"#) && s.contains(r#"":1"#)), "some hex sent as numbers");
    let plain: Vec<String> = objects.iter().map(|o| o.to_string()).collect();
    let want = served(&mut c, &as_lines);
    for (what, records) in [("objects", &plain), ("strings", &strings), ("numbers", &numbers)] {
        assert_eq!(served(&mut c, records), want, "{what} score as their lines");
    }
    let mut one = |record: &str| scores(&c.post("/score", record.as_bytes()).unwrap().body).1;
    let line = |fields: &[(usize, &str)]| {
        let mut columns = vec![""; 40];
        columns[0] = "0";
        fields.iter().for_each(|&(k, v)| columns[k] = v);
        serde_json::json!({ "line": columns.join("\t") }).to_string()
    };
    let want = one(&line(&[(1, "3"), (14, "68")]));
    assert_eq!(one(r#"{"I1": "3", "C1": 68}"#), want);
    assert_eq!(one(r#"{"I1": 3, "C1": "68"}"#), want);
    // Errors name the field and the cause.
    let cases = [
        (r#"{"I1": 3, "I1": 4}"#, "record 0: a field given twice in `I1`"),
        (r#"{"I1": 1e400}"#, "record 0: bad_integer in `I1`"),
        (r#"{"I1": 18446744073709551616}"#, "record 0: bad_integer in `I1`"),
        (r#"{"C1": "not hex"}"#, "record 0: bad_hex in `C1`"),
        (r#"{"C1": true}"#, "record 0: a boolean where a string or number belongs in `C1`"),
        (r#"[[1, 2]]"#, "record 0: not a JSON object"),
    ];
    for (body, want) in cases {
        let e = post_error(&mut c, body);
        assert!(e.starts_with(want), "{body}: {e}");
        assert!(!e.contains("field_count"), "{body}: {e}");
    }
}

/// A request in flight when the server is stopped is answered, and counted in the line the
/// server prints as it exits.
#[test]
fn a_request_answered_while_stopping_is_counted_at_exit() {
    use std::io::{Read, Write};
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    let (mut server, rest) = serve_with_output("127.0.0.1:0", &ckpt, &["--read-timeout", "10"]);
    let body = r#"[{"I1": 3}, {"I2": 4}]"#;
    let mut s = std::net::TcpStream::connect(&server.addr).unwrap();
    let head = format!("POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", body.len());
    s.write_all(format!("{head}{}", &body[..body.len() - 1]).as_bytes()).unwrap();
    health_until(&server.addr, Duration::from_secs(10), |h| h["body_bytes"].as_u64() > Some(0));
    std::process::Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    s.write_all(&body.as_bytes()[body.len() - 1..]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    exits_within(&mut server, Duration::from_secs(10));
    let rest = rest.join().unwrap();
    assert!(rest.contains("stopped: 2 records in 1 batches"), "{rest}");
}

/// A checkpoint that failed to load for a reason that passes (here a file of it missing for a
/// while, its identity unchanged) is tried again, and served once it loads.
#[test]
fn a_checkpoint_that_failed_to_load_is_tried_again() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let whole = ["--checkpoint-every", "5", "--checkpoint-deltas", "0", "--keep-checkpoints", "10"];
    let chain = train(&data, dir.path(), &[&["--steps", "10"][..], &whole].concat());
    let served_dir = dir.path().join("served");
    std::fs::create_dir(&served_dir).unwrap();
    publish(&chain.join("ckpt-5"), &served_dir);
    let server = serve(&served_dir, &["--reload-every", "0.1"]);
    // Step 10 published without its largest file.
    let ten = chain.join("ckpt-10");
    let largest = std::fs::read_dir(&ten)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name() != "manifest.json")
        .max_by_key(|e| e.metadata().unwrap().len())
        .unwrap()
        .file_name();
    let aside = dir.path().join("aside");
    publish(&ten, &served_dir);
    std::fs::rename(served_dir.join("ckpt-10").join(&largest), &aside).unwrap();
    let h = health_until(&server.addr, Duration::from_secs(10), |h| h["warning"].is_string());
    assert!(h["warning"].as_str().unwrap().contains("(step 10)"), "{h}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(health(&server.addr)["step"], 5);
    // The file is back: the checkpoint, the same one, loads at a later try.
    std::fs::rename(&aside, served_dir.join("ckpt-10").join(&largest)).unwrap();
    let h = health_until(&server.addr, Duration::from_secs(15), |h| h["step"] == 10);
    assert!(h["warning"].is_null(), "{h}");
}

/// `Connection` is read as a list of options (`close` among them closes), and a request line
/// of another HTTP version than 1.0 or 1.1 is refused.
#[test]
fn connection_options_and_http_versions_are_read_strictly() {
    use std::io::Read;
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let ckpt = train(&data, dir.path(), &["--steps", "5"]);
    let server = serve(&ckpt, &[]);
    // The exchange reads to the end of the connection: it must close after the answer.
    let mut s = std::net::TcpStream::connect(&server.addr).unwrap();
    let r = exchange_on(&mut s, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, close\r\n\r\n");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.head.contains("Connection: close"), "{}", r.head);
    assert_eq!(s.read(&mut [0; 8]).unwrap(), 0, "closed");
    let r = exchange(&server.addr, b"GET /health HTTP/1.junk\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.error().contains("\"HTTP/1.junk\" is not an HTTP version"), "{}", r.body);
    let r = exchange(&server.addr, b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 505, "{}", r.body);
    assert!(r.error().contains("not supported (send HTTP/1.1 or HTTP/1.0)"), "{}", r.body);
}
