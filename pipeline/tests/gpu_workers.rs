//! `--device`: GPU workers through the release binary.
//!
//! Without a GPU (here and in CI) the setting's validation runs: a missing
//! CUDA device stops the run before any work with the device and the reason,
//! a malformed value names the key, and `--device cpu` is the default run
//! exactly. With a GPU (`TIDEREC_REQUIRE_GPU=1` makes its absence a failure)
//! every model trains on one GPU worker as on one CPU worker (its rows on the
//! host, and with `TIDEREC_GPU_ROWS=device` on the device), a CPU and a GPU
//! worker together (and two GPU workers on one GPU) train as one CPU worker,
//! the rows a GPU worker owns on the host and on its device, checkpoints move
//! between the two (one worker, and two with the GPU workers' rows on their devices) — all under plain SGD, where a rounding
//! difference stays one (see [`SGD`]) — the default adaptive optimizers train
//! the same numbers on every GPU run, and with each step replayed as a CUDA
//! graph (`TIDEREC_GPU_GRAPHS=on`) as without, `--precision tf32` and `bf16`
//! train near fp32 on a GPU worker, GPU workers keep the tiered store's hot
//! tier on their devices and train its model (the same store counters as one
//! CPU worker), GPU workers train under the DES partial exchange (their
//! models' partial forms on the device) as one CPU worker, and `bench` takes
//! the same flag.

mod common;
#[path = "../../gpu/tests/common/mod.rs"]
mod gpu;

use common::{metrics, rel_diff, run_err, run_ok, tiderec};
use std::path::Path;
use std::time::{Duration, Instant};
use tiderec_gpu::Device;

/// Synthetic data, small tables, no hold-out: 50 steps of batch 256.
const BASE: &[&str] = &[
    "train",
    "--samples",
    "20480",
    "--batch-size",
    "256",
    "--eval-fraction",
    "0",
    "--buckets",
    "20000",
    "--seed",
    "5",
    "--progress",
    "none",
];

/// Runs `tiderec` with `BASE` and `extra`, which must succeed; returns its metrics (each
/// run's in a file of its own: an existing metrics file is not replaced).
fn train(extra: &[&str], out: &Path, name: &str) -> serde_json::Value {
    train_rows(extra, out, name, "host")
}

/// As [`train`], a GPU worker that trains alone keeping its rows on `rows`
/// (`host`, the default, or `device`: `TIDEREC_GPU_ROWS`).
fn train_rows(extra: &[&str], out: &Path, name: &str, rows: &str) -> serde_json::Value {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let m = out.join(format!("{name}-{run}.json"));
    run_ok(tiderec().env("TIDEREC_GPU_ROWS", rows).args(BASE).args(extra).arg("--metrics-json").arg(&m));
    metrics(&m)
}

/// A CUDA device number this machine does not have, and why opening it fails.
fn missing_device() -> (usize, String) {
    let n = Device::count();
    (n, Device::open(n).expect_err("a device past the count cannot open").to_string())
}

#[test]
fn a_missing_cuda_device_stops_the_run_before_any_work() {
    let (n, reason) = missing_device();
    let start = Instant::now();
    let err = run_err(tiderec().args(BASE).args(["--steps", "50", "--device", &format!("cuda:{n}")]));
    assert!(err.contains("invalid configuration `device`"), "{err}");
    assert!(err.contains(&format!("cuda:{n}: {reason}")), "the device and the reason from Device::open: {err}");
    assert!(start.elapsed() < Duration::from_secs(30), "fails fast: {:?}", start.elapsed());
    // The same through bench, and for the second worker's entry of a list.
    let err = run_err(tiderec().args(["bench", "dlrm", "--steps", "5", "--device", &format!("cuda:{n}")]));
    assert!(err.contains(&format!("cuda:{n}: {reason}")), "{err}");
    let list = format!("cpu,cuda:{n}");
    let err = run_err(tiderec().args(BASE).args(["--steps", "5", "--workers", "2", "--device", &list]));
    assert!(err.contains(&format!("cuda:{n}: {reason}")), "{err}");
}

#[test]
fn a_malformed_device_names_the_key() {
    let err = run_err(tiderec().args(BASE).args(["--steps", "5", "--device", "bogus"]));
    assert!(err.contains("invalid configuration `device`") && err.contains("`bogus`"), "{err}");
    let err = run_err(tiderec().args(BASE).args(["--steps", "5", "--workers", "3", "--device", "cpu,cpu"]));
    assert!(err.contains("`device`") && err.contains("2 entries for 3 workers"), "{err}");
    let tmp = tempfile::tempdir().unwrap();
    let toml = tmp.path().join("run.toml");
    std::fs::write(&toml, "device = \"cuda:x\"\nsteps = 5\n").unwrap();
    let err = run_err(tiderec().args(["train", "--config"]).arg(&toml));
    assert!(err.contains("`device`") && err.contains("`cuda:x`"), "the TOML key too: {err}");
}

#[test]
fn the_partial_exchange_takes_gpu_workers() {
    // Without a GPU the run stops at the missing device, not at the exchange.
    let (n, reason) = missing_device();
    let device = format!("cuda:{n}");
    let partial = ["--steps", "5", "--model", "deepfm", "--exchange", "partial", "--device", &device];
    let err = run_err(tiderec().args(BASE).args(partial));
    assert!(err.contains(&format!("cuda:{n}: {reason}")), "the device and the reason from Device::open: {err}");
    assert!(!err.contains("exchange"), "the exchange is not refused: {err}");
}

/// The models with a DES partial form, by their `--model` names.
const PARTIAL_MODELS: [&str; 4] = ["lr", "fm", "deepfm", "wdl"];

#[test]
fn gpu_workers_train_under_the_partial_exchange() {
    if gpu::device().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for model in PARTIAL_MODELS {
        // On this data `auto` plans partial for most of LR's tables and all of FM's, rows
        // with replicated hot ids for DeepFM's and Wide & Deep's (which a GPU worker
        // among several serves from the host).
        for exchange in ["partial", "auto"] {
            let run = |workers| [&sgd_run("50", workers, model)[..], &["--exchange", exchange]].concat();
            let one = train(&run("1"), tmp.path(), &format!("{model}-{exchange}-cpu"));
            let alone = train(&[&run("1")[..], &["--device", "cuda:0"]].concat(), tmp.path(), "alone");
            assert_close(&one, &alone, &format!("{model}, --exchange {exchange}: cuda:0 vs 1 cpu worker"));
            for list in ["cuda:0,cpu", "cuda:0"] {
                let pair = train(&[&run("2")[..], &["--device", list]].concat(), tmp.path(), "pair");
                let what = format!("{model}, --exchange {exchange}: 2 workers on {list} vs 1 cpu worker");
                assert_close(&one, &pair, &what);
            }
        }
    }
}

#[test]
fn device_cpu_is_the_default_run_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    for workers in ["1", "2"] {
        let plain = train(&["--steps", "20", "--workers", workers], tmp.path(), "plain");
        let cpu = train(&["--steps", "20", "--workers", workers, "--device", "cpu"], tmp.path(), "cpu");
        let list = if workers == "2" { "cpu,cpu" } else { "cpu" };
        let cpus = train(&["--steps", "20", "--workers", workers, "--device", list], tmp.path(), "cpus");
        for key in ["params_l2", "train_loss", "train_loss_mean", "steps"] {
            assert_eq!(plain[key], cpu[key], "{workers} workers: {key}");
            assert_eq!(plain[key], cpus[key], "{workers} workers: {key}");
        }
    }
}

/// Every model with a device form, by its `--model` name.
const MODELS: [&str; 7] = ["dlrm", "lr", "fm", "deepfm", "wdl", "dien", "dien-sum"];

/// `--model NAME`, on synthetic behaviour histories for the sequence models.
fn model_args(model: &str) -> Vec<&str> {
    let mut args = vec!["--model", model];
    if model.starts_with("dien") {
        args.extend(["--data", "synthetic-behavior"]);
    }
    args
}

/// Plain SGD for the dense part and the rows. The adaptive optimizers (Adam,
/// row-wise Adagrad) divide each update by the gradient's running size, so a
/// parameter whose gradient is zero but for one sample (a ReLU unit whose
/// pre-activation sits at 0) moves by a whole learning rate or not at all
/// depending on the last bit of that pre-activation: any change of summation
/// order then moves `params_l2` by ~1e-4 after 50 steps (two CPU kernel
/// choices of the same machine do, see `adaptive_optimizers_train_deterministically_on_a_gpu`).
/// SGD keeps a rounding difference a rounding difference, so it is what the
/// device's arithmetic is compared under.
const SGD: [&str; 4] = ["--optimizer", "sgd", "--sparse-optimizer", "sgd"];

/// The largest relative difference of `params_l2` and the losses allowed
/// between a run with GPU workers and one CPU worker, under [`SGD`].
const TOLERANCE: f64 = 1e-4;

fn assert_close(a: &serde_json::Value, b: &serde_json::Value, what: &str) {
    for key in ["params_l2", "train_loss", "train_loss_mean"] {
        let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
        assert!(x.is_finite() && y.is_finite(), "{what}: {key} {x} vs {y}");
        let d = rel_diff(x, y);
        println!("{what}: {key} {x} vs {y} (rel {d:.2e})");
        assert!(d <= TOLERANCE, "{what}: {key} {x} vs {y} (rel {d:e})");
    }
    assert_eq!(a["steps"], b["steps"], "{what}");
}

/// `--steps N --workers W`, the model and plain SGD.
fn sgd_run<'a>(steps: &'a str, workers: &'a str, model: &'a str) -> Vec<&'a str> {
    [&["--steps", steps, "--workers", workers][..], &model_args(model), &SGD].concat()
}

#[test]
fn one_gpu_worker_trains_every_model_as_one_cpu_worker() {
    if gpu::device().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for model in MODELS {
        let run = sgd_run("50", "1", model);
        let cpu = train(&run, tmp.path(), &format!("{model}-cpu"));
        for rows in ["host", "device"] {
            let gpu = train_rows(&[&run[..], &["--device", "cuda:0"]].concat(), tmp.path(), model, rows);
            assert_close(&cpu, &gpu, &format!("{model}: cuda:0 (rows on the {rows}) vs cpu"));
        }
    }
}

#[test]
fn adaptive_optimizers_train_deterministically_on_a_gpu() {
    if gpu::device().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for model in MODELS {
        let run = [&["--steps", "50", "--workers", "1"][..], &model_args(model)].concat();
        let on_gpu = [&run[..], &["--device", "cuda:0"]].concat();
        let (a, b) = (train(&on_gpu, tmp.path(), "a"), train(&on_gpu, tmp.path(), "b"));
        for key in ["params_l2", "train_loss", "train_loss_mean"] {
            assert_eq!(a[key], b[key], "{model}: two GPU runs differ in {key}");
        }
        // For the record: how far the default (adaptive) optimizers carry a change of
        // summation order, GPU against CPU beside two CPU kernel choices.
        let cpu = train(&run, tmp.path(), "cpu");
        let portable_json = tmp.path().join(format!("{model}-portable.json"));
        let env = ("TIDEREC_MAX_ISA", "portable");
        run_ok(tiderec().env(env.0, env.1).args(BASE).args(&run).arg("--metrics-json").arg(&portable_json));
        let portable = metrics(&portable_json);
        let l2 = |v: &serde_json::Value| v["params_l2"].as_f64().unwrap();
        println!(
            "{model}, default optimizers, params_l2 rel diff: gpu vs cpu {:.2e}, portable cpu kernels vs cpu {:.2e}",
            rel_diff(l2(&a), l2(&cpu)),
            rel_diff(l2(&portable), l2(&cpu))
        );
    }
}

#[test]
fn cuda_graphs_train_the_same_numbers_through_the_trainer() {
    if gpu::device().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // The graphs engage: a benchmark of the same worker reports what it captured and replayed.
    let out = run_ok(tiderec().env("TIDEREC_GPU_GRAPHS", "on").args([
        "bench",
        "dlrm",
        "--device",
        "cuda:0",
        "--batch-size",
        "2048",
        "--steps",
        "10",
        "--warmup",
        "3",
        "--json",
    ]));
    let bench: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bench --json prints one JSON object");
    let counts = &bench["cuda_graphs"];
    let count = |k: &str| counts[k].as_u64().unwrap_or_else(|| panic!("cuda_graphs.{k} in {bench}"));
    assert!(count("captured") > 0 && count("replayed") > 0 && count("failed") == 0, "{counts}");
    for model in ["dlrm", "deepfm"] {
        let ck = tmp.path().join(format!("ck-{model}"));
        let mut runs = Vec::new();
        for graphs in ["off", "on"] {
            let m = tmp.path().join(format!("{model}-graphs-{graphs}.json"));
            let dir = ck.join(graphs);
            run_ok(
                tiderec()
                    .env("TIDEREC_GPU_ROWS", "device")
                    .env("TIDEREC_GPU_GRAPHS", graphs)
                    .args(BASE)
                    .args(["--steps", "50", "--workers", "1", "--device", "cuda:0", "--checkpoint-every", "20"])
                    .args(model_args(model))
                    .arg("--checkpoint-dir")
                    .arg(&dir)
                    .arg("--metrics-json")
                    .arg(&m),
            );
            runs.push(metrics(&m));
        }
        for key in ["params_l2", "train_loss", "train_loss_mean", "steps"] {
            assert_eq!(runs[0][key], runs[1][key], "{model}: {key} with CUDA graphs against without");
        }
    }
}

#[test]
fn a_cpu_and_a_gpu_worker_train_as_one_cpu_worker() {
    if gpu::device().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for model in MODELS {
        let one = train(&sgd_run("50", "1", model), tmp.path(), "one");
        for list in ["cuda:0,cpu", "cpu,cuda:0", "cuda:0"] {
            let on = [&sgd_run("50", "2", model)[..], &["--device", list]].concat();
            // The rows a GPU worker owns on the host (the baseline), then on its
            // device (the default: the device shard serves and updates them).
            for rows in ["host", "device"] {
                let pair = train_rows(&on, tmp.path(), &format!("{model}-pair"), rows);
                assert_close(
                    &one,
                    &pair,
                    &format!("{model}: 2 workers on {list} (rows on the {rows}) vs 1 cpu worker"),
                );
            }
        }
    }
}

#[test]
fn checkpoints_move_between_gpu_and_cpu_workers() {
    if gpu::device().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for model in ["dlrm", "deepfm", "dien"] {
        let straight = train(&sgd_run("60", "1", model), tmp.path(), "straight");
        let runs = [("cuda:0", "cpu", "host"), ("cpu", "cuda:0", "host"), ("cuda:0", "cuda:0", "host")];
        let device_rows = [("cuda:0", "cpu", "device"), ("cpu", "cuda:0", "device"), ("cuda:0", "cuda:0", "device")];
        for (first, then, rows) in runs.into_iter().chain(device_rows) {
            let ck = tmp.path().join(format!("ck-{model}-{first}-{then}-{rows}"));
            let ck = ck.to_str().unwrap();
            let common =
                [&["--workers", "1", "--checkpoint-dir", ck, "--checkpoint-every", "10"][..], &model_args(model), &SGD]
                    .concat();
            train_rows(&[&common[..], &["--steps", "30", "--device", first]].concat(), tmp.path(), "first", rows);
            let again = [&common[..], &["--steps", "60", "--resume", "--device", then]].concat();
            let resumed = train_rows(&again, tmp.path(), "resumed", rows);
            let what = format!("{model}: 30 steps on {first}, 30 on {then} (GPU rows on the {rows}), vs 60 on cpu");
            assert_eq!(resumed["resumed_from_step"], 30, "{what}");
            assert_close(&straight, &resumed, &what);
        }
        // Two workers, each GPU worker's own rows on its device: the device shard's
        // checkpoint export and its restore.
        for (first, then) in [("cuda:0,cpu", "cpu"), ("cpu", "cuda:0")] {
            let ck = tmp.path().join(format!("ck-{model}-two-{first}-{then}"));
            let ck = ck.to_str().unwrap();
            let common =
                [&["--workers", "2", "--checkpoint-dir", ck, "--checkpoint-every", "10"][..], &model_args(model), &SGD]
                    .concat();
            train_rows(&[&common[..], &["--steps", "30", "--device", first]].concat(), tmp.path(), "first", "device");
            let again = [&common[..], &["--steps", "60", "--resume", "--device", then]].concat();
            let resumed = train_rows(&again, tmp.path(), "resumed", "device");
            let what = format!(
                "{model}: 2 workers, 30 steps on {first}, 30 on {then} (GPU rows on the device), vs 60 on 1 cpu worker"
            );
            assert_eq!(resumed["resumed_from_step"], 30, "{what}");
            assert_close(&straight, &resumed, &what);
        }
    }
}

/// The tiered store with re-plans every 5 steps from step 5 (so rows move in
/// and out of the hot tier during a run), a small hot tier and a row budget.
const TIERED: [&str; 10] =
    ["--store", "tiered", "--hot-rows", "512", "--warmup", "5", "--flush-every", "5", "--max-rows", "12000"];

#[test]
fn gpu_workers_keep_the_tiered_stores_hot_tier_on_their_devices() {
    if gpu::device().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    for model in ["dlrm", "deepfm"] {
        // The row budget is per worker: each worker count is compared with CPU workers as many.
        for (workers, list) in [("1", "cuda:0"), ("2", "cuda:0"), ("2", "cuda:0,cpu")] {
            let run = [&sgd_run("50", workers, model)[..], &TIERED].concat();
            let cpu = train(&run, tmp.path(), &format!("{model}-tiered-cpu"));
            let on_gpu = [&run[..], &["--device", list]].concat();
            let gpu = train_rows(&on_gpu, tmp.path(), &format!("{model}-tiered"), "device");
            let what = format!("{model}, tiered store: {workers} worker(s) on {list} vs on cpu");
            assert_close(&cpu, &gpu, &what);
            for key in ["hot_rows", "replans", "moves", "lookups", "hot_hits", "evictions"] {
                assert_eq!(gpu["store"][key], cpu["store"][key], "{what}: the store's {key}");
            }
            assert!(cpu["store"]["moves"].as_u64().unwrap() > 0 && cpu["store"]["evictions"].as_u64().unwrap() > 0);
        }
        let one = train(&[&sgd_run("50", "1", model)[..], &TIERED].concat(), tmp.path(), "one");
        // Checkpoints move between a GPU worker's device tier and a CPU worker.
        let ck = tmp.path().join(format!("ck-{model}-tiered"));
        let ck = ck.to_str().unwrap();
        let common = [&["--workers", "1", "--checkpoint-dir", ck, "--checkpoint-every", "10"][..], &TIERED].concat();
        let first = [&common[..], &model_args(model), &SGD, &["--steps", "30", "--device", "cuda:0"]].concat();
        train_rows(&first, tmp.path(), "tiered-first", "device");
        let again = [&common[..], &model_args(model), &SGD, &["--steps", "50", "--resume"]].concat();
        let resumed = train(&again, tmp.path(), "tiered-resumed");
        assert_eq!(resumed["resumed_from_step"], 30, "{model}");
        assert_close(&one, &resumed, &format!("{model}, tiered store: 30 steps on cuda:0, 20 on cpu"));
    }
}

#[test]
fn bench_takes_the_device_flag() {
    if gpu::device().is_none() {
        return;
    }
    for args in [
        &["bench", "dlrm"][..],
        &["bench", "model", "--model", "deepfm"][..],
        &["bench", "model", "--model", "dien"][..],
    ] {
        let out = run_ok(tiderec().args(args).args(["--steps", "5", "--warmup", "2", "--json", "--device", "cuda:0"]));
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
        assert!(r["samples_per_sec"].as_f64().unwrap() > 0.0, "{r}");
    }
}

/// `--precision tf32` and `bf16` on one GPU worker, its rows on the host and
/// on the device: the GEMMs' rounding changes the run (params L2 differs from
/// fp32's) by less than 1% after 50 SGD steps, two runs agree bit for bit, and
/// the metrics record the precision.
#[test]
fn tf32_and_bf16_train_near_fp32_on_a_gpu_worker() {
    if gpu::device().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let l2 = |v: &serde_json::Value| v["params_l2"].as_f64().unwrap();
    for model in ["dlrm", "deepfm"] {
        for rows in ["host", "device"] {
            let run = [&sgd_run("50", "1", model)[..], &["--device", "cuda:0"]].concat();
            let fp32 = train_rows(&run, tmp.path(), "fp32", rows);
            for p in ["tf32", "bf16"] {
                let with = [&run[..], &["--precision", p]].concat();
                let (a, b) = (train_rows(&with, tmp.path(), p, rows), train_rows(&with, tmp.path(), p, rows));
                let what = format!("{model} {p} (rows on the {rows})");
                let d = rel_diff(l2(&a), l2(&fp32));
                println!("{what}: params L2 {} vs fp32 {}: relative {d:.2e}", l2(&a), l2(&fp32));
                assert_eq!(a["config"]["settings"]["precision"], p, "{what}");
                assert_eq!((l2(&a), &a["train_loss"]), (l2(&b), &b["train_loss"]), "{what}: two runs differ");
                assert!(d > 0.0 && d < 1e-2, "{what}: params L2 {d:.2e} from fp32");
            }
        }
    }
}
