//! `--exchange` as a user runs it: every strategy trains the model of `rows`
//! on real Criteo rows, in threads and in two processes on 127.0.0.1.

mod common;

use common::{metrics, rel_diff, run_err, run_ok, shared_data, tiderec};
use std::net::TcpListener;
use std::path::Path;

/// `--plan-steps 3`, for the exchanges that plan (a setting the others refuse).
const PLAN: [&str; 2] = ["--plan-steps", "3"];

fn args(data: &Path) -> Vec<String> {
    let mut a: Vec<String> = [
        "train",
        "--model",
        "fm",
        "--steps",
        "20",
        "--batch-size",
        "400",
        "--eval-fraction",
        "0",
        "--buckets",
        "50000",
        "--seed",
        "3",
        "--progress",
        "none",
    ]
    .map(String::from)
    .to_vec();
    a.push("--data".into());
    a.push(format!("criteo:{}", data.display()));
    a
}

#[test]
fn every_exchange_trains_the_rows_model_on_real_criteo_rows() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let run = |exchange: &str, workers: &str| {
        let m = dir.path().join(format!("{exchange}-{workers}.json"));
        let out = run_ok(
            tiderec()
                .args(args(&data))
                .args(["--exchange", exchange, "--workers", workers, "--metrics-json"])
                .arg(&m)
                .args(if matches!(exchange, "replicated" | "auto") { &PLAN[..] } else { &[] }),
        );
        (metrics(&m), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // (File data is split across workers by byte ranges, so W = 1 sees other global batches;
    // worker-count equivalence on identical batches is tested in tiderec-operators.)
    let (rows2, _) = run("rows", "2");
    let mut bytes = Vec::new();
    for exchange in ["partial", "replicated", "auto"] {
        let (m, stderr) = run(exchange, "2");
        for key in ["params_l2", "train_loss"] {
            let (b, c) = (rows2[key].as_f64().unwrap(), m[key].as_f64().unwrap());
            assert!(rel_diff(b, c) <= 1e-5, "{exchange} {key}: rows {b} vs {c}");
        }
        if exchange != "partial" {
            assert!(stderr.contains("exchange plan"), "{exchange}: the plan is printed at start: {stderr}");
        }
        bytes.push((exchange, m["bytes_per_sample"].as_f64().unwrap()));
    }
    // Partial results replace the rows of 26 one-hot fields: far fewer bytes.
    let rows_bytes = rows2["bytes_per_sample"].as_f64().unwrap();
    let partial_bytes = bytes[0].1;
    assert!(partial_bytes < 0.6 * rows_bytes, "partial {partial_bytes} vs rows {rows_bytes} bytes/sample");
}

/// DeepFM's partial results (FM sums plus the first layer's share) train the
/// rows model on real rows, in threads and in two processes.
#[test]
fn deepfm_partial_results_train_the_rows_model_on_real_criteo_rows() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let run = |exchange: &str, extra: &[&str]| {
        let m = dir.path().join(format!("deepfm-{exchange}-{}.json", extra.len()));
        let mut a = args(&data);
        a[2] = "deepfm".into();
        run_ok(
            tiderec()
                .args(a)
                .args(["--deep", "32,16", "--exchange", exchange, "--workers", "2", "--metrics-json"])
                .arg(&m)
                .args(extra),
        );
        metrics(&m)
    };
    let rows = run("rows", &[]);
    let partial = run("partial", &[]);
    for key in ["params_l2", "train_loss"] {
        let (b, c) = (rows[key].as_f64().unwrap(), partial[key].as_f64().unwrap());
        assert!(rel_diff(b, c) <= 1e-5, "{key}: rows {b} vs partial {c}");
    }
    assert_ne!(rows["bytes_per_sample"], partial["bytes_per_sample"]);
}

/// `--exchange-table` forces single tables after the plan: the printed plan
/// shows them, and the model is still the rows model.
#[test]
fn per_table_overrides_change_the_plan_not_the_model() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let m = dir.path().join(format!("override-{}.json", extra.len()));
        let out = run_ok(tiderec().args(args(&data)).args(["--workers", "2", "--metrics-json"]).arg(&m).args(extra));
        (metrics(&m), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (rows, _) = run(&[]);
    let (forced, stderr) =
        run(&["--exchange", "auto", "--exchange-table", "0=rows,1=replicated,2=partial", "--plan-steps", "3"]);
    let choice = |t: usize| {
        stderr
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&t.to_string()))
            .map(|l| l.split("  ").filter(|x| !x.trim().is_empty()).last().unwrap_or("").trim().to_string())
            .unwrap_or_default()
    };
    assert_eq!(choice(0), "rows", "{stderr}");
    assert!(choice(1).starts_with("rows + ") && choice(1).ends_with(" replicated"), "{stderr}");
    assert_eq!(choice(2), "partial", "{stderr}");
    for key in ["params_l2", "train_loss"] {
        let (a, b) = (rows[key].as_f64().unwrap(), forced[key].as_f64().unwrap());
        assert!(rel_diff(a, b) <= 1e-5, "{key}: rows {a} vs overridden {b}");
    }
    // Under `rows`, a partial table needs no plan: nothing is printed, and only that table's bytes change.
    let (one, stderr) = run(&["--exchange-table", "3=partial"]);
    assert!(!stderr.contains("exchange plan"), "{stderr}");
    assert!(rel_diff(rows["params_l2"].as_f64().unwrap(), one["params_l2"].as_f64().unwrap()) <= 1e-5);
    assert_ne!(rows["bytes_per_sample"], one["bytes_per_sample"]);
}

#[test]
fn two_processes_with_the_planned_exchange_equal_two_threads() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (TcpListener::bind("127.0.0.1:0").unwrap(), TcpListener::bind("127.0.0.1:0").unwrap());
    let ports = (a.local_addr().unwrap().port(), b.local_addr().unwrap().port());
    drop((a, b));
    let hosts = dir.path().join("hosts.txt");
    std::fs::write(&hosts, format!("127.0.0.1:{}\n127.0.0.1:{}\n", ports.0, ports.1)).unwrap();
    let m_proc = dir.path().join("procs.json");
    let children: Vec<_> = (0..2)
        .map(|i| {
            let mut c = tiderec();
            c.args(args(&data))
                .args(["--exchange", "auto", "--workers", "1", "--processes", "2", "--process", &i.to_string()])
                .args(PLAN)
                .arg("--hosts")
                .arg(&hosts);
            if i == 0 {
                c.arg("--metrics-json").arg(&m_proc);
            }
            c.stderr(std::process::Stdio::null()).spawn().expect("process starts")
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a cluster process failed");
    }
    let m_threads = dir.path().join("threads.json");
    run_ok(
        tiderec()
            .args(args(&data))
            .args(["--exchange", "auto", "--workers", "2", "--metrics-json"])
            .arg(&m_threads)
            .args(PLAN),
    );
    let (procs, threads) = (metrics(&m_proc), metrics(&m_threads));
    // Both plan from the same rows, so they run the same arithmetic in the same order.
    assert_eq!(procs["params_l2"], threads["params_l2"]);
    assert_eq!(procs["train_loss"], threads["train_loss"]);
    assert_eq!(procs["bytes_per_sample"], threads["bytes_per_sample"]);
}

#[test]
fn bad_exchange_settings_fail_naming_the_key() {
    for (extra, key) in [
        (vec!["--exchange", "partial", "--model", "dlrm"], "exchange"),
        (vec!["--exchange", "partial", "--model", "wdl", "--crosses", "0:1"], "exchange"),
        (vec!["--exchange", "sideways"], "exchange"),
        (vec!["--exchange", "replicated", "--replicate", "1.5"], "replicate"),
        (vec!["--exchange", "auto", "--plan-steps", "0"], "plan_steps"),
        (vec!["--exchange", "replicated", "--store", "dynamic"], "exchange"),
        (vec!["--exchange-table", "26=rows"], "exchange_tables"),
        (vec!["--exchange-table", "0=sideways"], "exchange_tables"),
        (vec!["--exchange-table", "0:rows"], "exchange_tables"),
        (vec!["--exchange-table", "1=rows,1=partial"], "exchange_tables"),
        (vec!["--exchange-table", "0=partial", "--model", "dlrm"], "exchange_tables"),
        (vec!["--exchange-table", "0=replicated", "--store", "tiered"], "exchange_tables"),
    ] {
        let err = run_err(tiderec().args(["train", "--samples", "1000"]).args(&extra));
        assert!(err.contains(key), "{extra:?}: expected `{key}` in {err}");
    }
    // The online trainer has no file to plan from: refused before it contacts a broker.
    let err = run_err(
        tiderec()
            .args(["online", "--brokers", "127.0.0.1:1", "--topic", "t", "--group", "g"])
            .args(["--exchange", "auto"]),
    );
    assert!(err.contains("exchange") && err.contains("rows or partial"), "{err}");
    let err = run_err(
        tiderec()
            .args(["online", "--brokers", "127.0.0.1:1", "--topic", "t", "--group", "g"])
            .args(["--exchange-table", "0=replicated"]),
    );
    assert!(err.contains("exchange_tables") && err.contains("rows or partial"), "{err}");
}

/// `bench exchange --processes 2` splits the same two workers over two processes:
/// every strategy sends the same bytes and trains the same model as with two threads.
#[test]
fn the_exchange_bench_over_two_processes_measures_what_two_threads_do() {
    for model in ["fm", "deepfm"] {
        exchange_bench_in_processes_and_threads(model);
    }
}

fn exchange_bench_in_processes_and_threads(model: &str) {
    let run = |processes: &str| {
        let out = run_ok(
            tiderec()
                .args(["bench", "exchange", "--model", model, "--deep", "32,16", "--workers", "2"])
                .args(["--processes", processes, "--steps", "3", "--warmup", "1", "--batch-size", "512"])
                .args(["--rows", "20000", "--json"]),
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("one JSON object")
    };
    let (threads, processes) = (run("1"), run("2"));
    assert_eq!(processes["processes"], 2);
    let strategies = |v: &serde_json::Value| v["strategies"].as_array().unwrap().clone();
    assert_eq!(strategies(&threads).len(), 4, "rows, partial, replicated, auto");
    for (t, p) in strategies(&threads).iter().zip(&strategies(&processes)) {
        assert_eq!(t["strategy"], p["strategy"]);
        assert_eq!(t["bytes_per_sample"], p["bytes_per_sample"], "{model} {}", t["strategy"]);
        assert_eq!(t["l2_rel_diff"], p["l2_rel_diff"], "{model} {}", t["strategy"]);
        assert!(t["l2_rel_diff"].as_f64().unwrap() <= 1e-5, "{model} {}: the same model as rows", t["strategy"]);
        assert!(p["samples_per_sec"].as_f64().unwrap() > 0.0);
    }
}
