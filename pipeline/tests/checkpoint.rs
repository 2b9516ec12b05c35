//! Checkpoints and `--resume` through the release binary: an interrupted run
//! (stopped, killed, or its newest checkpoint damaged) ends with the model of
//! an uninterrupted one.

mod common;

use common::{checkpoint_entries as entries, metrics, rel_diff, run_err, run_ok, shared_data, tiderec};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Synthetic data, 40 steps per epoch, two epochs: 60 steps cross an epoch boundary.
const SYNTHETIC: &[&str] = &[
    "train",
    "--epochs",
    "2",
    "--samples",
    "10240",
    "--batch-size",
    "256",
    "--eval-fraction",
    "0",
    "--buckets",
    "20000",
    "--seed",
    "11",
    "--progress",
    "none",
];

fn train_cmd(base: &[&str], workers: usize, steps: u64, extra: &[&str]) -> Command {
    let mut c = tiderec();
    c.args(base).args(["--workers", &workers.to_string(), "--steps", &steps.to_string()]).args(extra);
    c
}

/// Runs a training that must succeed; returns its metrics and stderr.
fn train(base: &[&str], workers: usize, steps: u64, extra: &[&str], out: &Path) -> (serde_json::Value, String) {
    let m = out.join(format!("m-{}.json", rand_suffix()));
    let o = run_ok(train_cmd(base, workers, steps, extra).arg("--metrics-json").arg(&m));
    (metrics(&m), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// The metadata of a safetensors file (its header's `__metadata__`).
fn shard_metadata(path: &Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header["__metadata__"].clone()
}

fn dir_arg(dir: &Path) -> String {
    dir.to_str().expect("utf-8 temp path").to_string()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

fn assert_same_run(straight: &serde_json::Value, resumed: &serde_json::Value, tolerance: f64, what: &str) {
    for key in ["params_l2", "train_loss", "train_loss_mean"] {
        let (a, b) = (straight[key].as_f64().unwrap(), resumed[key].as_f64().unwrap());
        assert!(rel_diff(a, b) <= tolerance, "{what}: {key} straight {a} vs resumed {b} (rel {:e})", rel_diff(a, b));
    }
    for key in ["steps", "samples", "epochs"] {
        assert_eq!(straight[key], resumed[key], "{what}: {key}");
    }
}

/// 60 steps straight vs 30 steps with checkpoints, then `--resume` to 60.
fn stop_and_resume(base: &[&str], what: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = dir_arg(&ck);
    let (straight, _) = train(base, 2, 60, &[], tmp.path());
    let (first, _) = train(base, 2, 30, &["--checkpoint-dir", &ck_arg, "--checkpoint-every", "10"], tmp.path());
    assert_eq!(first["checkpoints_written"], 3, "{what}: steps 10, 20, 30");
    assert_eq!(entries(&ck).0, vec![10, 20, 30]);
    let (resumed, _) =
        train(base, 2, 60, &["--checkpoint-dir", &ck_arg, "--checkpoint-every", "10", "--resume"], tmp.path());
    assert_eq!(resumed["resumed_from_step"], 30, "{what}");
    assert_same_run(&straight, &resumed, 1e-6, what);
    // The checkpoint written at the end of the run continues it again: nothing left to do.
    let (again, _) = train(base, 2, 60, &["--checkpoint-dir", &ck_arg, "--resume"], tmp.path());
    assert_eq!(again["resumed_from_step"], 60);
    assert_eq!(again["params_l2"], resumed["params_l2"]);
}

#[test]
fn stopped_and_resumed_run_equals_an_uninterrupted_one_on_synthetic_data() {
    stop_and_resume(SYNTHETIC, "synthetic");
}

/// A tiered store's frequencies and hot plan travel in the checkpoint: the resumed run
/// serves from the restored hot tier at once, so its hits add up with the first half's
/// to the uninterrupted run's (step 30 is no plan boundary: plans at 6, 13, 20, 27, …).
#[test]
fn a_resumed_tiered_store_keeps_its_hot_plan() {
    let tmp = tempfile::tempdir().unwrap();
    let ck_arg = dir_arg(&tmp.path().join("ck"));
    let tiered = ["--store", "tiered", "--hot-rows", "3000", "--warmup", "6", "--flush-every", "7"];
    let (straight, _) = train(SYNTHETIC, 2, 60, &tiered, tmp.path());
    let (first, _) = train(SYNTHETIC, 2, 30, &[&tiered[..], &["--checkpoint-dir", &ck_arg]].concat(), tmp.path());
    let (resumed, _) =
        train(SYNTHETIC, 2, 60, &[&tiered[..], &["--checkpoint-dir", &ck_arg, "--resume"]].concat(), tmp.path());
    assert_eq!(resumed["resumed_from_step"], 30);
    assert_same_run(&straight, &resumed, 1e-6, "tiered");
    let hits = |v: &serde_json::Value, k: &str| v["store"][k].as_u64().unwrap();
    for k in ["hot_hits", "cold_hits", "misses", "lookups"] {
        assert_eq!(hits(&first, k) + hits(&resumed, k), hits(&straight, k), "{k}");
    }
    assert!(hits(&resumed, "hot_hits") > 0 && hits(&resumed, "hot_rows") == hits(&straight, "hot_rows"));
}

/// A checkpoint carries each row's last-use step and the admission sketch: a
/// resumed store evicts by TTL and by row budget, and admits by count, exactly the
/// rows the uninterrupted run does (restored rows would otherwise look used at the
/// restore, and ids seen before it unseen), so the two runs train the same
/// parameters bit for bit and their evictions, admissions and misses add up.
#[test]
fn a_resumed_store_evicts_and_admits_the_rows_the_uninterrupted_one_does() {
    let stores: [(&[&str], &str); 3] = [
        (&["--store", "dynamic", "--ttl-steps", "8", "--flush-every", "5"], "evictions"),
        (
            &["--store", "tiered", "--hot-rows", "512", "--warmup", "5", "--flush-every", "5", "--max-rows", "6000"],
            "evictions",
        ),
        (&["--store", "dynamic", "--admit-count", "3"], "rejections"),
    ];
    for (store, happens) in stores {
        let what = store.join(" ");
        let tmp = tempfile::tempdir().unwrap();
        let ck_arg = dir_arg(&tmp.path().join("ck"));
        let (straight, _) = train(SYNTHETIC, 2, 60, store, tmp.path());
        // Checkpoints at 10 (whole), 20 and 30 (deltas, however many rows they hold): the
        // resume reads the chain.
        let every = ["--checkpoint-dir", &ck_arg, "--checkpoint-every", "10", "--checkpoint-delta-share", "100"];
        let (first, _) = train(SYNTHETIC, 2, 30, &[store, &every].concat(), tmp.path());
        let manifest = std::fs::read_to_string(tmp.path().join("ck/ckpt-30/manifest.json")).unwrap();
        let manifest: serde_json::Value = serde_json::from_str(&manifest).unwrap();
        assert_eq!(manifest["delta"]["parent"], 20, "{what}: ckpt-30 is a delta");
        let shard = shard_metadata(&tmp.path().join("ck/ckpt-30/shard-0.safetensors"));
        let admits = store.contains(&"--admit-count");
        assert_eq!(shard["admission_changes"].as_str(), admits.then_some("true"), "{what}: the sketch's changes only");
        let (resumed, _) =
            train(SYNTHETIC, 2, 60, &[store, &["--checkpoint-dir", &ck_arg, "--resume"]].concat(), tmp.path());
        assert_eq!(resumed["resumed_from_step"], 30, "{what}");
        assert_eq!(resumed["params_l2"], straight["params_l2"], "{what}: the same parameters bit for bit");
        let count = |v: &serde_json::Value, k: &str| v["store"][k].as_u64().unwrap();
        assert!(count(&resumed, happens) > 0, "{what}: {happens} after the resume");
        for k in ["evictions", "admissions", "misses", "lookups"] {
            assert_eq!(count(&first, k) + count(&resumed, k), count(&straight, k), "{what}: {k}");
        }
    }
}

#[test]
fn stopped_and_resumed_run_equals_an_uninterrupted_one_on_criteo() {
    let Some(data) = shared_data("criteo/sample.train") else { return };
    let data = format!("criteo:{}", data.display());
    // 10,000 rows: 40 steps of 256 per epoch, so step 30 is mid-epoch and 60 is in the second epoch.
    let base = [
        "train",
        "--data",
        &data,
        "--epochs",
        "2",
        "--batch-size",
        "256",
        "--eval-fraction",
        "0",
        "--buckets",
        "20000",
        "--seed",
        "11",
        "--progress",
        "none",
    ];
    stop_and_resume(&base, "criteo");
}

/// Every file under `dir`, by path relative to it, with its bytes (the writer's lock file,
/// which names its pid, aside).
fn files(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else if !tiderec::dir_lock::is_lock_file(&e.file_name().to_string_lossy()) {
                let rel = e.path().strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                out.insert(rel, std::fs::read(e.path()).unwrap());
            }
        }
    }
    out
}

#[test]
fn background_writes_give_the_files_of_synchronous_ones_while_training_goes_on() {
    let tmp = tempfile::tempdir().unwrap();
    let mut runs = Vec::new();
    for mode in ["async", "sync"] {
        let ck = tmp.path().join(mode);
        let mut args =
            vec!["--checkpoint-dir", ck.to_str().unwrap(), "--checkpoint-every", "7", "--keep-checkpoints", "20"];
        if mode == "sync" {
            args.push("--checkpoint-sync");
        }
        let (m, _) = train(SYNTHETIC, 2, 60, &args, tmp.path());
        // Steps 7, 14, …, 56, the end of the first epoch (40) and of the run (60).
        assert_eq!(m["checkpoints_written"], 10, "{mode}");
        assert_eq!(entries(&ck), (vec![7, 14, 21, 28, 35, 40, 42, 49, 56, 60], vec![]), "{mode}");
        runs.push((m, files(&ck)));
    }
    let ((background, async_files), (blocking, sync_files)) = (&runs[0], &runs[1]);
    // Training went on while each checkpoint was being written: a checkpoint becomes
    // durable at the earliest after the step that follows it (two rounds: shards, commit).
    assert!(background["checkpoint_overlap_steps"].as_u64().unwrap() >= 8, "{background}");
    assert_eq!(blocking["checkpoint_overlap_steps"], 0, "{blocking}");
    assert_eq!(background["params_l2"], blocking["params_l2"]);
    // The same cut: every file equal byte for byte (ids, rows, optimizer slots, manifests).
    assert_eq!(async_files.keys().collect::<Vec<_>>(), sync_files.keys().collect::<Vec<_>>());
    assert!(async_files.len() >= 40, "manifest, dense and two shards per checkpoint: {}", async_files.len());
    for (name, bytes) in async_files {
        assert!(bytes == &sync_files[name], "{name} differs between background and synchronous writes");
    }
}

#[test]
fn a_two_worker_checkpoint_resumes_on_one_and_three_workers() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let (straight, _) = train(SYNTHETIC, 2, 60, &[], tmp.path());
    train(SYNTHETIC, 2, 30, &["--checkpoint-dir", &dir_arg(&ck), "--checkpoint-every", "15"], tmp.path());
    for workers in [1, 3] {
        let copy = tmp.path().join(format!("ck{workers}"));
        copy_dir(&ck, &copy);
        let (resumed, _) =
            train(SYNTHETIC, workers, 60, &["--checkpoint-dir", &dir_arg(&copy), "--resume"], tmp.path());
        assert_eq!(resumed["resumed_from_step"], 30);
        assert_eq!(resumed["workers"], workers);
        let (a, b) = (straight["params_l2"].as_f64().unwrap(), resumed["params_l2"].as_f64().unwrap());
        assert!(rel_diff(a, b) <= 1e-4, "W = 2 → W = {workers}: params_l2 {a} vs {b}");
        assert_eq!(straight["steps"], resumed["steps"]);
    }
}

#[test]
fn a_killed_run_resumes_to_the_uninterrupted_result() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = dir_arg(&ck);
    let steps = 200; // five epochs of 40 steps: a few seconds, checkpoints every 5 steps
    let five_epochs: Vec<&str> = [&["train", "--epochs", "5"], &SYNTHETIC[3..]].concat();
    let base = &five_epochs[..];
    let mut child = train_cmd(base, 2, steps, &["--checkpoint-dir", &ck_arg, "--checkpoint-every", "5"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("tiderec starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !ck.exists() || entries(&ck).0.is_empty() {
        assert!(Instant::now() < deadline, "no checkpoint appeared");
        assert!(child.try_wait().unwrap().is_none(), "the run ended before a checkpoint appeared");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(child.try_wait().unwrap().is_none(), "the run must still be going when it is killed");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let (written, _) = entries(&ck);
    let last = *written.last().unwrap();
    assert!(last < steps, "killed before the end (newest checkpoint {last})");
    let (resumed, _) = train(base, 2, steps, &["--checkpoint-dir", &ck_arg, "--resume"], tmp.path());
    let (straight, _) = train(base, 2, steps, &[], tmp.path());
    assert!(resumed["resumed_from_step"].as_u64().unwrap() >= last);
    assert_same_run(&straight, &resumed, 1e-6, "killed");
    // What the killed writer left half-done is gone once the resumed run wrote its own.
    assert!(entries(&ck).1.is_empty(), "leftovers: {:?}", entries(&ck).1);
}

#[test]
fn a_damaged_newest_checkpoint_is_skipped_with_a_warning() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    train(SYNTHETIC, 2, 30, &["--checkpoint-dir", &dir_arg(&ck), "--checkpoint-every", "10"], tmp.path());
    let (straight, _) = train(SYNTHETIC, 2, 60, &[], tmp.path());
    type Damage = fn(&Path);
    let flip: Damage = |c| {
        let f = c.join("shard-1.safetensors");
        let mut b = std::fs::read(&f).unwrap();
        let i = b.len() / 2;
        b[i] ^= 0x01;
        std::fs::write(&f, b).unwrap();
    };
    let no_manifest: Damage = |c| std::fs::remove_file(c.join("manifest.json")).unwrap();
    for (name, damage, reason) in [
        ("flip", flip, "checksum mismatch in shard-1.safetensors"),
        ("manifest", no_manifest, "manifest.json is missing"),
    ] {
        let copy = tmp.path().join(name);
        copy_dir(&ck, &copy);
        damage(&copy.join("ckpt-30"));
        let copy_arg = dir_arg(&copy);
        let args = ["--checkpoint-dir", &copy_arg, "--resume", "--checkpoint-every", "10", "--keep-checkpoints", "9"];
        let (resumed, stderr) = train(SYNTHETIC, 2, 60, &args, tmp.path());
        let warning = stderr.lines().find(|l| l.starts_with("warning: skipping checkpoint")).unwrap_or_default();
        assert!(warning.contains("ckpt-30") && warning.contains(reason), "{name}: {stderr}");
        assert_eq!(resumed["resumed_from_step"], 20, "{name}: falls back to the previous checkpoint");
        assert_same_run(&straight, &resumed, 1e-6, name);
        // The damaged checkpoint was replaced by a good one when the resumed run passed step 30.
        assert_eq!(entries(&copy).0, vec![10, 20, 30, 40, 50, 60], "{name}");
        for later in [40, 50, 60] {
            std::fs::remove_dir_all(copy.join(format!("ckpt-{later}"))).unwrap();
        }
        let (again, stderr) = train(SYNTHETIC, 2, 30, &["--checkpoint-dir", &copy_arg, "--resume"], tmp.path());
        assert_eq!(again["resumed_from_step"], 30, "{name}: {stderr}");
        assert!(!stderr.contains("warning"), "{name}: {stderr}");
    }
}

#[test]
fn only_the_newest_checkpoints_are_kept() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = dir_arg(&ck);
    train(
        SYNTHETIC,
        2,
        30,
        &[
            "--checkpoint-dir",
            &ck_arg,
            "--checkpoint-every",
            "5",
            "--keep-checkpoints",
            "2",
            "--checkpoint-deltas",
            "0",
        ],
        tmp.path(),
    );
    assert_eq!(entries(&ck), (vec![25, 30], vec![]));
    // The default keeps three (whole checkpoints here; deltas keep their chains, see checkpoint_deltas.rs).
    let ck3 = tmp.path().join("ck3");
    let whole = ["--checkpoint-every", "5", "--checkpoint-deltas", "0"];
    train(SYNTHETIC, 2, 30, &[&["--checkpoint-dir", &dir_arg(&ck3)][..], &whole].concat(), tmp.path());
    assert_eq!(entries(&ck3), (vec![20, 25, 30], vec![]));
}

#[test]
fn resuming_needs_the_same_model_and_a_usable_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = dir_arg(&ck);
    train(SYNTHETIC, 2, 10, &["--checkpoint-dir", &ck_arg], tmp.path());
    let e = run_err(&mut train_cmd(SYNTHETIC, 2, 20, &["--checkpoint-dir", &ck_arg, "--resume", "--top", "256,1"]));
    assert!(e.contains("ckpt-10") && e.contains("model.top: [512,256,1] in the checkpoint, [256,1] now"), "{e}");
    let e = run_err(&mut train_cmd(SYNTHETIC, 2, 20, &["--checkpoint-dir", &ck_arg, "--resume", "--lr", "0.01"]));
    assert!(e.contains("dense_hp.lr: 0.001 in the checkpoint, 0.01 now"), "{e}");
    let seed_12: Vec<&str> = SYNTHETIC.iter().map(|&a| if a == "11" { "12" } else { a }).collect();
    let e = run_err(&mut train_cmd(&seed_12, 2, 20, &["--checkpoint-dir", &ck_arg, "--resume"]));
    assert!(e.contains("seed: 11 in the checkpoint, 12 now"), "{e}");
    // A fresh run does not mix its checkpoints with another run's.
    let e = run_err(&mut train_cmd(SYNTHETIC, 2, 20, &["--checkpoint-dir", &ck_arg]));
    assert!(e.contains("checkpoint_dir") && e.contains("--resume"), "{e}");
    // An unusable directory stops the run before training, naming the path.
    let file = tmp.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let bad = format!("{}/ck", file.display());
    let e = run_err(&mut train_cmd(SYNTHETIC, 2, 20, &["--checkpoint-dir", &bad]));
    assert!(e.contains("checkpoint_dir") && e.contains("plain-file"), "{e}");
    let e = run_err(&mut train_cmd(SYNTHETIC, 2, 20, &["--resume"]));
    assert!(e.contains("resume") && e.contains("--checkpoint-dir"), "{e}");
    // --resume on an empty directory starts fresh, with a warning.
    let empty = tmp.path().join("empty");
    let (fresh, stderr) = train(SYNTHETIC, 2, 20, &["--checkpoint-dir", &dir_arg(&empty), "--resume"], tmp.path());
    assert!(stderr.contains("no valid checkpoint"), "{stderr}");
    assert!(fresh["resumed_from_step"].is_null());
    let (plain, _) = train(SYNTHETIC, 2, 20, &[], tmp.path());
    assert_eq!(fresh["params_l2"], plain["params_l2"]);
}

/// A free TCP port on 127.0.0.1.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn two_processes_write_one_checkpoint_that_two_threads_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let ck_arg = dir_arg(&ck);
    let hosts = tmp.path().join("hosts.txt");
    std::fs::write(&hosts, format!("127.0.0.1:{}\n127.0.0.1:{}\n", free_port(), free_port())).unwrap();
    let children: Vec<_> = (0..2)
        .map(|i| {
            train_cmd(SYNTHETIC, 1, 30, &["--checkpoint-dir", &ck_arg, "--checkpoint-every", "10"])
                .args(["--processes", "2", "--process", &i.to_string(), "--hosts"])
                .arg(&hosts)
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("process starts")
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success(), "a cluster process failed");
    }
    assert_eq!(entries(&ck), (vec![10, 20, 30], vec![]));
    let (resumed, _) = train(SYNTHETIC, 2, 60, &["--checkpoint-dir", &ck_arg, "--resume"], tmp.path());
    let (straight, _) = train(SYNTHETIC, 2, 60, &[], tmp.path());
    assert_eq!(resumed["resumed_from_step"], 30);
    assert_same_run(&straight, &resumed, 1e-6, "two processes → two threads");
}

#[test]
fn a_full_disk_stops_the_run_with_an_error_naming_the_file() {
    // Needs a small file system: a 30 MB tmpfs, which only root may mount; skipped otherwise.
    let Some(small) = common::small_fs::SmallFs::mount("30M") else { return };
    let ck = small.path().join("ck");
    let args = ["--checkpoint-dir", &dir_arg(&ck), "--checkpoint-every", "5", "--keep-checkpoints", "5"];
    let e = run_err(&mut train_cmd(SYNTHETIC, 2, 40, &args));
    assert!(e.contains("No space left on device") && e.contains(".safetensors"), "{e}");
    // What was complete stays usable; the half-written directory is gone.
    let (steps, other) = entries(&ck);
    assert!(!steps.is_empty() && other.is_empty(), "{steps:?} {other:?}");
}
