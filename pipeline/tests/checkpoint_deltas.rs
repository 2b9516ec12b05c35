//! Delta checkpoints through the release binary: a chain of deltas resumes to
//! the model of an uninterrupted run for every store and worker count, re-shards
//! to another worker count, is smaller than whole checkpoints, survives a damaged
//! link by falling back to the last good one, and pruning keeps whole chains.

mod common;

use common::{checkpoint_entries as entries, metrics, rel_diff, run_ok, tiderec};
use std::path::Path;

/// Synthetic data, 40 steps per epoch.
const SYNTHETIC: &[&str] = &[
    "train",
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

/// Checkpoints every 5 steps, every one after the first a delta (no share limit).
const CHAIN: &[&str] = &["--checkpoint-every", "5", "--checkpoint-delta-share", "1000"];

fn train(workers: usize, steps: u64, extra: &[&str], out: &Path) -> (serde_json::Value, String) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let m = out.join(format!("m-{}.json", N.fetch_add(1, Ordering::Relaxed)));
    let mut c = tiderec();
    c.args(SYNTHETIC).args(["--workers", &workers.to_string(), "--steps", &steps.to_string()]).args(extra);
    let o = run_ok(c.arg("--metrics-json").arg(&m));
    (metrics(&m), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn manifest(ck: &Path, step: u64) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(ck.join(format!("ckpt-{step}/manifest.json"))).unwrap()).unwrap()
}

/// Bytes of a checkpoint's shard files.
fn shard_bytes(ck: &Path, step: u64) -> u64 {
    let m = manifest(ck, step);
    let files = m["files"].as_object().unwrap();
    files.iter().filter(|(k, _)| k.starts_with("shard-")).map(|(_, v)| v["bytes"].as_u64().unwrap()).sum()
}

fn store_flags(store: &str) -> Vec<&str> {
    match store {
        "tiered" => vec!["--store", "tiered", "--hot-rows", "3000", "--warmup", "6", "--flush-every", "7"],
        other => vec!["--store", other],
    }
}

#[test]
fn a_delta_chain_resumes_to_the_uninterrupted_model_for_every_store_and_worker_count() {
    for store in ["fixed", "dynamic", "tiered"] {
        for workers in [1usize, 2, 3] {
            let what = format!("{store}, W = {workers}");
            let tmp = tempfile::tempdir().unwrap();
            let ck = tmp.path().join("ck");
            let ck_arg = ck.to_str().unwrap().to_string();
            let flags = store_flags(store);
            let (straight, _) = train(workers, 40, &flags, tmp.path());
            let with_ck = [&flags[..], &["--checkpoint-dir", &ck_arg], CHAIN].concat();
            train(workers, 22, &with_ck, tmp.path());
            // 5 is whole; 10, 15, 20 and the end of the run (22) are deltas, all kept for the newest three.
            assert_eq!(entries(&ck).0, vec![5, 10, 15, 20, 22], "{what}");
            assert!(manifest(&ck, 5)["delta"].is_null(), "{what}");
            assert_eq!(manifest(&ck, 22)["delta"], serde_json::json!({"parent": 20, "base": 5}), "{what}");
            assert!(shard_bytes(&ck, 22) < shard_bytes(&ck, 5), "{what}: a 2-step delta is smaller than the whole");
            let (resumed, stderr) = train(workers, 40, &[&with_ck[..], &["--resume"]].concat(), tmp.path());
            assert_eq!(resumed["resumed_from_step"], 22, "{what}: {stderr}");
            assert_eq!(resumed["params_l2"], straight["params_l2"], "{what}: the chain resumes exactly");
            assert_eq!(resumed["train_loss"], straight["train_loss"], "{what}");
        }
    }
}

#[test]
fn a_chain_of_two_workers_resumes_on_one_and_three() {
    let tmp = tempfile::tempdir().unwrap();
    let (straight, _) = train(2, 40, &[], tmp.path());
    let ck = tmp.path().join("ck");
    train(2, 20, &[&["--checkpoint-dir", ck.to_str().unwrap()][..], CHAIN].concat(), tmp.path());
    assert!(!manifest(&ck, 20)["delta"].is_null());
    for workers in [1, 3] {
        let copy = tmp.path().join(format!("ck{workers}"));
        std::fs::create_dir_all(&copy).unwrap();
        for (step, path) in entries(&ck).0.iter().map(|s| (*s, ck.join(format!("ckpt-{s}")))) {
            let to = copy.join(format!("ckpt-{step}"));
            std::fs::create_dir_all(&to).unwrap();
            for f in std::fs::read_dir(&path).unwrap() {
                let f = f.unwrap();
                std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
            }
        }
        let (resumed, _) = train(workers, 40, &["--checkpoint-dir", copy.to_str().unwrap(), "--resume"], tmp.path());
        assert_eq!(resumed["resumed_from_step"], 20);
        let (a, b) = (straight["params_l2"].as_f64().unwrap(), resumed["params_l2"].as_f64().unwrap());
        assert!(rel_diff(a, b) <= 1e-4, "W = 2 → W = {workers}: params_l2 {a} vs {b}");
    }
}

/// A flipped byte in the middle link makes the later links unusable: the resume says
/// so, naming the link, and continues from the whole checkpoint to the same model.
#[test]
fn a_damaged_delta_in_the_middle_of_a_chain_falls_back_to_the_last_good_link() {
    let tmp = tempfile::tempdir().unwrap();
    let (straight, _) = train(2, 30, &[], tmp.path());
    let ck = tmp.path().join("ck");
    let with_ck = [&["--checkpoint-dir", ck.to_str().unwrap()][..], CHAIN].concat();
    train(2, 15, &with_ck, tmp.path());
    let shard = ck.join("ckpt-10/shard-1.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let at = bytes.len() - 5;
    bytes[at] ^= 0x40;
    std::fs::write(&shard, bytes).unwrap();
    let (resumed, stderr) = train(2, 30, &[&with_ck[..], &["--resume"]].concat(), tmp.path());
    assert!(
        stderr.contains("skipping checkpoint") && stderr.contains("ckpt-10 of its chain cannot be used"),
        "{stderr}"
    );
    assert_eq!(resumed["resumed_from_step"], 5, "{stderr}");
    assert_eq!(resumed["params_l2"], straight["params_l2"]);
}

/// SIGKILL while deltas are being written every 2 steps: the resumed run starts from a
/// delta's chain and ends at the uninterrupted model (nothing lost, nothing trained twice).
#[test]
fn a_run_killed_amid_deltas_resumes_to_the_uninterrupted_model() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let with_ck = [&["--checkpoint-dir", ck.to_str().unwrap(), "--checkpoint-every", "2"][..], &CHAIN[2..]].concat();
    let steps = 40u64;
    let mut c = tiderec();
    c.args(SYNTHETIC).args(["--workers", "2", "--steps", &steps.to_string()]).args(&with_ck);
    let mut child =
        c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().expect("tiderec starts");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !ck.exists() || entries(&ck).0.len() < 3 {
        assert!(std::time::Instant::now() < deadline, "no delta appeared");
        assert!(child.try_wait().unwrap().is_none(), "the run ended before it was killed");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let last = *entries(&ck).0.last().unwrap();
    assert!(last < steps && !manifest(&ck, last)["delta"].is_null(), "killed amid deltas (newest {last})");
    let (resumed, stderr) = train(2, steps, &[&with_ck[..], &["--resume"]].concat(), tmp.path());
    let (straight, _) = train(2, steps, &[], tmp.path());
    assert!(resumed["resumed_from_step"].as_u64().unwrap() >= last, "{stderr}");
    assert_eq!(resumed["params_l2"], straight["params_l2"]);
    assert_eq!(resumed["samples"], straight["samples"], "nothing trained twice");
}

/// A hosts file of two processes on free ports of 127.0.0.1.
fn two_hosts(dir: &Path) -> std::path::PathBuf {
    let port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let hosts = dir.join("hosts.txt");
    std::fs::write(&hosts, format!("127.0.0.1:{}\n127.0.0.1:{}\n", port(), port())).unwrap();
    hosts
}

/// A run of two processes of one worker each, both of which must succeed.
fn train_two_processes(steps: u64, extra: &[&str], dir: &Path) {
    let hosts = two_hosts(dir);
    let children: Vec<_> = (0..2)
        .map(|k| {
            let mut c = tiderec();
            c.args(SYNTHETIC)
                .args(["--workers", "1", "--steps", &steps.to_string()])
                .args(extra)
                .args(["--processes", "2", "--process", &k.to_string(), "--hosts"])
                .arg(&hosts)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("process starts")
        })
        .collect();
    for (k, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "process {k}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn a_chain_written_by_two_processes_resumes_to_the_uninterrupted_model() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let with_ck = [&["--checkpoint-dir", ck.to_str().unwrap()][..], CHAIN].concat();
    train_two_processes(22, &with_ck, tmp.path());
    assert_eq!(entries(&ck).0, vec![5, 10, 15, 20, 22]);
    assert_eq!(manifest(&ck, 22)["delta"], serde_json::json!({"parent": 20, "base": 5}));
    assert_eq!(manifest(&ck, 22)["workers"], 2, "each process wrote its worker's part");
    // Resumed by two threads of one process (the same two workers): the model of an
    // uninterrupted run of two workers.
    let (straight, _) = train(2, 40, &[], tmp.path());
    let (resumed, stderr) = train(2, 40, &[&with_ck[..], &["--resume"]].concat(), tmp.path());
    assert_eq!(resumed["resumed_from_step"], 22, "{stderr}");
    let (a, b) = (straight["params_l2"].as_f64().unwrap(), resumed["params_l2"].as_f64().unwrap());
    assert!(rel_diff(a, b) <= 1e-6, "two processes → two threads: params_l2 {a} vs {b}");
}
