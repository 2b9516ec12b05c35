//! `tiderec bench dlrm --independent`: W single-worker trainers side by side,
//! the machine's ceiling that the scaling benchmark sets the synchronous run
//! against. They exchange nothing, each reports its own stages, together they
//! train the global batch, and a device list is refused. And `--hot-rows K`,
//! which trains the benchmark under the tiered store.

mod common;

use common::{run_err, run_ok, tiderec};

fn bench(extra: &[&str]) -> serde_json::Value {
    let out = run_ok(
        tiderec()
            .args(["bench", "dlrm", "--batch-size", "64", "--steps", "4", "--warmup", "1"])
            .args(["--rows", "1000", "--json"])
            .args(extra),
    );
    serde_json::from_slice(&out.stdout).expect("bench dlrm --json prints one JSON object")
}

#[test]
fn independent_trainers_exchange_nothing_and_each_reports_its_stages() {
    let sync = bench(&["--workers", "2"]);
    let free = bench(&["--workers", "2", "--independent"]);
    assert_eq!(sync["independent"], false, "{sync}");
    assert_eq!(free["independent"], true, "{free}");
    assert!(sync["bytes_per_sample"].as_f64().unwrap() > 0.0, "the synchronous workers exchange: {sync}");
    assert_eq!(free["bytes_per_sample"].as_f64(), Some(0.0), "independent trainers exchange nothing: {free}");
    for r in [&sync, &free] {
        assert_eq!(r["batch_size"], 64, "{r}");
        assert_eq!(r["workers"], 2, "{r}");
        assert!(r["samples_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["stage_ms"].as_array().map(Vec::len), Some(2), "one stage clock per worker: {r}");
    }
    assert_eq!(sync["dense_params"], free["dense_params"], "the same model on each side");
    for t in free["stage_ms"].as_array().unwrap() {
        assert!(t["forward_backward"].as_f64().unwrap() > 0.0, "{t}");
    }
}

#[test]
fn independent_trainers_refuse_a_device_list() {
    let err = run_err(tiderec().args(["bench", "dlrm", "--workers", "2", "--independent", "--device", "cpu,cpu"]));
    assert!(err.contains("`device`") && err.contains("independent"), "{err}");
}

#[test]
fn hot_rows_train_the_benchmark_under_the_tiered_store() {
    let fixed = bench(&["--workers", "2"]);
    let tiered = bench(&["--workers", "2", "--hot-rows", "64", "--zipf", "1.1"]);
    assert_eq!(fixed["store"], "fixed", "{fixed}");
    assert!(fixed.get("hot_rows").is_none(), "{fixed}");
    assert_eq!(tiered["store"], "tiered", "{tiered}");
    assert_eq!(tiered["hot_rows"], 64, "{tiered}");
    assert_eq!(tiered["owned_rows_on_device"], false, "CPU workers: {tiered}");
    assert!(tiered["samples_per_sec"].as_f64().unwrap() > 0.0, "{tiered}");
    let err = run_err(tiderec().args(["bench", "dlrm", "--hot-rows", "0"]));
    assert!(err.contains("hot_rows"), "{err}");
}
