//! The online trainer when a topic no longer holds the offsets a run stands at
//! (the topic re-created, the broker's storage lost: here an in-memory tansu
//! broker restarted): the run stops before training anything, naming the
//! partition, its offset and the broker's offsets, unless `--on-offset-reset`
//! says where to restart. See `kafka.rs` for the broker and `CI=true`.
//!
//! A *running* trainer checks the same conditions, the record before its position
//! included (on duplicates, out-of-range fetches, 10 s without records, the first
//! records after an outage and every 30 s); the second and third tests cover it. A TCP proxy
//! stands in front of two in-memory brokers that both advertise the proxy's port, so
//! the trainer only ever connects to the proxy. The trainer, without `--until-end`,
//! trains all that broker A holds and waits for more; broker B gets a re-created
//! topic with fewer records; then the proxy closes every connection, refuses new ones
//! for 3 s and sends them to B. By default the trainer stops with the error naming the
//! partition, its offset, the broker's offsets and the flag, having trained nothing
//! of B and kept its last checkpoint; with `--on-offset-reset earliest` it warns,
//! trains B's records from offset 0 and stops on SIGTERM with B's offsets. When B's
//! topic holds more records than the trainer's offset, only the record before that
//! offset differs; the check after the outage finds it before B's records are trained.
//!
//! Two more cases: two workers resuming where partition 0's offset is past its end while
//! partition 1 is quiet end at once naming partition 0 (the failing worker tells the one
//! waiting for records); and a quiet trainer behind the proxy survives two short outages
//! further apart than `--broker-timeout` (an outage ends once every partition answers).
//!
//! librdkafka 2.12 sometimes crashes (SIGSEGV) right after such a switch, before any
//! check runs: a fetch response from B carries a "current leader" tag under a zero
//! topic id, and librdkafka's handling of that tag (`rd_kafka_metadata_update_op`)
//! then looks the topic up by a null name. It happens when the trainer's first fetches
//! from B still name the old topic (its id is B's no longer); once a metadata refresh
//! has taught librdkafka the new topic it does not, so the test refreshes metadata
//! every 100 ms (`--kafka-option topic.metadata.refresh.interval.ms=100`) and starts a
//! case again when the trainer died of that crash (at most 6 attempts). An in-memory
//! broker restarted on the same port, answering before the topic is created again,
//! makes librdkafka crash the same way; the crashed run leaves its last checkpoint,
//! whose resume the first test covers.

mod common;
mod kafka_broker;

use common::{run_err, run_ok, shared_data};
use kafka_broker::*;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[test]
fn a_resumed_run_on_a_recreated_topic_stops_unless_a_reset_is_accepted() {
    let (Some(sample), Some(other)) = (criteo_sample(), shared_data("criteo/sample_test.txt")) else { return };
    let mut broker = Broker::start();
    produce(&broker, "clicks", &sample, &["--partitions", "2", "--limit", "4000"]);
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("run");
    run_ok(&mut online_cmd(&broker, "clicks", &dir, 1, &[]));
    let trained = final_model(&dir);
    assert_eq!(trained.offsets.values().sum::<i64>(), 4000);

    // The in-memory broker restarts empty; the topic is re-created with fewer records.
    broker.restart(Duration::from_millis(200));
    produce(&broker, "clicks", &other, &["--partitions", "2", "--repeat", "10"]);
    let err = run_err(&mut online_cmd(&broker, "clicks", &dir, 1, &["--resume"]));
    for part in ["topic `clicks` partition", "past the partition's end", "--on-offset-reset"] {
        assert!(err.contains(part), "missing `{part}` in: {err}");
    }
    assert_eq!(final_model(&dir).step, trained.step, "nothing was trained or checkpointed");

    // More records than were trained on, but other ones: the record before the offset differs.
    produce(&broker, "clicks", &other, &["--partitions", "2", "--repeat", "90"]);
    let err = run_err(&mut online_cmd(&broker, "clicks", &dir, 1, &["--resume"]));
    assert!(err.contains("is not the one trained on"), "{err}");
    assert_eq!(final_model(&dir).step, trained.step);

    // Accepted: every partition restarts at its oldest record and all 10,000 are trained.
    let out = run_ok(&mut online_cmd(&broker, "clicks", &dir, 1, &["--resume", "--on-offset-reset", "earliest"]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--on-offset-reset earliest: restarting at offset 0"), "{stderr}");
    let s = summary(&dir);
    assert_eq!(s["samples_this_run"], 10_000, "{s}");
    assert_eq!(final_model(&dir).offsets.values().sum::<i64>(), 10_000);
}

/// A worker whose partition fails the check on `--resume` ends the run at once, naming the
/// partition, even while another worker waits for records of a quiet partition.
#[test]
fn a_failed_partition_ends_the_run_while_another_worker_waits_for_records() {
    let Some(sample) = criteo_sample() else { return };
    let mut broker = Broker::start();
    // 4,001 records: 2,001 in partition 0 (read by worker 0), 2,000 in partition 1 (worker 1).
    produce(&broker, "clicks", &sample, &["--partitions", "2", "--limit", "4001"]);
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("run");
    run_ok(&mut online_cmd(&broker, "clicks", &dir, 2, &[]));
    assert_eq!(final_model(&dir).offsets, [("clicks/0".to_string(), 2001), ("clicks/1".to_string(), 2000)].into());

    // Re-created with the first 4,000 of the same records: partition 1 holds what was trained
    // on (the same record before offset 2,000) and nothing after it; partition 0 ends at 2,000.
    broker.restart(Duration::from_millis(200));
    produce(&broker, "clicks", &sample, &["--partitions", "2", "--limit", "4000"]);
    std::fs::create_dir_all(&dir).unwrap();
    let stderr = dir.join("stderr.txt");
    let started = Instant::now();
    // No --until-end: worker 1 would wait for records of partition 1 for ever.
    let child = running_online_cmd(&broker.addr(), "clicks", &dir, 2, &["--resume"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let mut trainer = Trainer { child, stderr, metrics_port: 0 };
    let status = loop {
        if let Some(status) = trainer.child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "still running after 30 s: {}", trainer.stderr());
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = trainer.stderr();
    assert!(started.elapsed() < Duration::from_secs(20), "ended only after {:?}: {err}", started.elapsed());
    assert!(status.code().is_some_and(|c| c != 0), "a clear failure, not {status}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for part in ["topic `clicks` partition 0", "offset 2001 is past the partition's end, 2000", "--on-offset-reset"] {
        assert!(err.contains(part), "missing `{part}` in: {err}");
    }
    assert_eq!(final_model(&dir).offsets.values().sum::<i64>(), 4001, "nothing was trained or checkpointed");
}

/// A TCP proxy on 127.0.0.1 in front of the brokers, which advertise its port: every
/// connection a client opens, bootstrap or from metadata, goes through it. A connection
/// goes to the broker routed for the client id of its first request (librdkafka's
/// `client.id`), or else to the current upstream; [`Proxy::switch`] changes the upstream
/// and closes every open connection, so that clients reconnect to the new broker at the
/// address they know.
struct Proxy {
    port: u16,
    state: Arc<Mutex<ProxyState>>,
    closed: Arc<AtomicBool>,
}

struct ProxyState {
    upstream: u16,
    routes: BTreeMap<String, u16>,
    /// Both sockets of every connection opened so far (shut down on a switch).
    open: Vec<TcpStream>,
}

impl Proxy {
    fn start() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(ProxyState { upstream: 0, routes: BTreeMap::new(), open: Vec::new() }));
        let closed = Arc::new(AtomicBool::new(false));
        let (st, cl) = (state.clone(), closed.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if cl.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let st = st.clone();
                std::thread::spawn(move || Proxy::serve(client, &st));
            }
        });
        Proxy { port, state, closed }
    }

    /// Connections to broker port `to` from now on; every open connection is closed.
    fn switch(&self, to: u16) {
        let mut st = self.state.lock().unwrap();
        st.upstream = to;
        for s in st.open.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Connections whose first request names `client_id` go to broker port `to`.
    fn route(&self, client_id: &str, to: u16) {
        self.state.lock().unwrap().routes.insert(client_id.to_string(), to);
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn serve(mut client: TcpStream, state: &Mutex<ProxyState>) {
        // The first request: length, api key, api version, correlation id, client id.
        let mut len = [0u8; 4];
        if client.read_exact(&mut len).is_err() {
            return;
        }
        let mut request = vec![0u8; i32::from_be_bytes(len).max(0) as usize];
        if client.read_exact(&mut request).is_err() {
            return;
        }
        let client_id = request.get(8..10).and_then(|n| {
            let n = i16::from_be_bytes([n[0], n[1]]);
            request.get(10..10 + n.max(0) as usize).map(|id| String::from_utf8_lossy(id).into_owned())
        });
        let upstream = {
            let mut st = state.lock().unwrap();
            let port = client_id.and_then(|id| st.routes.get(&id).copied()).unwrap_or(st.upstream);
            let Ok(upstream) = TcpStream::connect(("127.0.0.1", port)) else { return };
            st.open.extend([client.try_clone().unwrap(), upstream.try_clone().unwrap()]);
            upstream
        };
        let (mut up_w, mut client_r) = (upstream.try_clone().unwrap(), client.try_clone().unwrap());
        let forward = std::thread::spawn(move || {
            if up_w.write_all(&len).and_then(|_| up_w.write_all(&request)).is_ok() {
                let _ = std::io::copy(&mut client_r, &mut up_w);
            }
            let _ = up_w.shutdown(Shutdown::Both);
            let _ = client_r.shutdown(Shutdown::Both);
        });
        let (mut up_r, mut client_w) = (upstream, client);
        let _ = std::io::copy(&mut up_r, &mut client_w);
        let _ = up_r.shutdown(Shutdown::Both);
        let _ = client_w.shutdown(Shutdown::Both);
        let _ = forward.join();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
        self.switch(0);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// A trainer process, killed on drop, its stderr in a file.
struct Trainer {
    child: Child,
    stderr: PathBuf,
    metrics_port: u16,
}

impl Trainer {
    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits (at most 120 s) for the trainer's Prometheus endpoint to count `samples`
    /// trained; the trainer's exit status if it exits first.
    fn wait_for_samples(&mut self, samples: u64) -> Option<ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let expect = format!("tiderec_samples_total {samples}\n");
        loop {
            let body = http_get(self.metrics_port, "/metrics").unwrap_or_default();
            if body.contains(&expect) {
                return None;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            assert!(Instant::now() < deadline, "not {samples} samples after 120 s: {body} {}", self.stderr());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (at most 120 s) for the trainer to exit.
    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the trainer still runs after 120 s: {}", self.stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Trainer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `{clicks/0: n, clicks/1: n}`.
fn both_at(n: i64) -> BTreeMap<String, i64> {
    [("clicks/0".to_string(), n), ("clicks/1".to_string(), n)].into()
}

/// The brokers behind the proxy and the trainer: broker A's `clicks` (2 partitions of
/// 2,048 records, 64 steps of 64 records) fully trained by a trainer running without
/// `--until-end` (`extra` its flags), then the proxy switched to broker B, where
/// `clicks` was re-created beforehand with `b_records` other records (half per partition).
struct Switched {
    _a: Broker,
    _b: Broker,
    _proxy: Proxy,
    trainer: Trainer,
    _base: tempfile::TempDir,
    dir: PathBuf,
    /// `(step, offsets)` of the newest durable checkpoint before the switch.
    kept: (u64, BTreeMap<String, i64>),
}

/// `(step, offsets)` of the newest checkpoint in `dir/ckpt` (none damaged).
fn newest_checkpoint(dir: &Path) -> (u64, BTreeMap<String, i64>) {
    let m = final_model(dir);
    (m.step, m.offsets)
}

fn switch_under_a_running_trainer(extra: &[&str], b_records: u64) -> Option<Switched> {
    let (Some(sample), Some(other)) = (criteo_sample(), shared_data("criteo/sample_test.txt")) else { return None };
    let proxy = Proxy::start();
    let a = Broker::start_advertising(proxy.port);
    proxy.switch(a.port());
    produce(&a, "clicks", &sample, &["--partitions", "2", "--limit", "4096"]);
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("run");
    std::fs::create_dir_all(&dir).unwrap();
    let stderr = dir.join("stderr.txt");
    let metrics_port = free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    // Metadata refreshed every 100 ms: librdkafka learns the re-created topic's id soon
    // after the switch (see the module docs).
    let mut flags = vec!["--checkpoint-every", "8", "--metrics-addr", &metrics];
    flags.extend(["--kafka-option", "topic.metadata.refresh.interval.ms=100"]);
    flags.extend(extra);
    let f = std::fs::File::create(&stderr).unwrap();
    let child =
        running_online_cmd(&proxy.addr(), "clicks", &dir, 1, &flags).stdout(Stdio::null()).stderr(f).spawn().unwrap();
    let mut trainer = Trainer { child, stderr, metrics_port };

    // Everything is trained, then the trainer waits for more.
    if let Some(status) = trainer.wait_for_samples(4096) {
        panic!("the trainer exited ({status}) before training 4096 samples: {}", trainer.stderr());
    }
    // Broker B: `clicks` re-created with other records. Its producer's
    // connections are routed to B by their client id; the trainer's still go to A.
    let b = Broker::start_advertising(proxy.port);
    proxy.route("tiderec-test-producer-b", b.port());
    // The 99 lines of `other`, repeated.
    let (repeat, limit) = ((b_records / 99 + 1).to_string(), b_records.to_string());
    let b_flags = ["--partitions", "2", "--repeat", &repeat, "--limit", &limit];
    let b_flags = [&b_flags[..], &["--kafka-option", "client.id=tiderec-test-producer-b"]].concat();
    assert_eq!(produce(&b, "clicks", &other, &b_flags), b_records);
    let kept = newest_checkpoint(&dir);
    // 3 s without a broker (connections refused), then broker B.
    proxy.switch(0);
    std::thread::sleep(Duration::from_secs(3));
    proxy.switch(b.port());
    Some(Switched { _a: a, _b: b, _proxy: proxy, trainer, _base: base, dir, kept })
}

/// Whether `status` is librdkafka's crash after the switch (see the module docs).
fn librdkafka_crashed(status: ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(11)
}

/// Attempts of one case: a run that librdkafka crashes is started again.
const ATTEMPTS: usize = 6;

/// A run with the default `--on-offset-reset` switched to a broker B of `b_records`
/// other records, and how its trainer ended (a case librdkafka crashed is started again).
fn stopped_after_switch(b_records: u64) -> Option<(Switched, ExitStatus)> {
    let mut attempts = 0;
    loop {
        let mut run = switch_under_a_running_trainer(&[], b_records)?;
        let status = run.trainer.wait();
        attempts += 1;
        if !librdkafka_crashed(status) || attempts == ATTEMPTS {
            return Some((run, status));
        }
        eprintln!("librdkafka crashed after the switch (attempt {attempts}); again");
    }
}

#[test]
fn a_running_trainer_on_a_recreated_topic_stops_unless_a_reset_is_accepted() {
    // By default: the run stops, naming the partition, its offset, the broker's offsets
    // and the flag, and keeps its last checkpoint.
    let Some((run, status)) = stopped_after_switch(2048) else { return };
    let err = run.trainer.stderr();
    assert!(status.code().is_some_and(|c| c != 0), "a clear failure, not {status}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    for part in [
        "topic `clicks` partition",
        "offset 2048 is past the partition's end, 1024",
        "the run stands at offset 2048; the broker holds offsets 0..1024",
        "--on-offset-reset earliest",
    ] {
        assert!(err.contains(part), "missing `{part}` in: {err}");
    }
    // The newest checkpoint is still the one of before the switch: nothing of the new
    // topic was trained. (An idle trainer makes its last checkpoint durable at its next
    // step or when it stops, so this one may be a few steps before 64.)
    let (step, offsets) = newest_checkpoint(&run.dir);
    assert_eq!((step, &offsets), (run.kept.0, &run.kept.1));
    assert!(step <= 64 && offsets.values().all(|&o| o == 32 * step as i64), "{step} {offsets:?}");
    drop(run);

    // Accepted: the running trainer restarts both partitions at their oldest record and
    // trains the new topic's 2,048 records, then stops on SIGTERM.
    let mut attempts = 0;
    let mut run = loop {
        let Some(mut run) = switch_under_a_running_trainer(&["--on-offset-reset", "earliest"], 2048) else { return };
        attempts += 1;
        match run.trainer.wait_for_samples(4096 + 2048) {
            None => break run,
            Some(status) if librdkafka_crashed(status) && attempts < ATTEMPTS => {
                eprintln!("librdkafka crashed after the switch (attempt {attempts}); again");
            }
            Some(status) => {
                panic!("the trainer exited ({status}) before training 6144 samples: {}", run.trainer.stderr())
            }
        }
    };
    let pid = run.trainer.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = run.trainer.wait();
    let err = run.trainer.stderr();
    assert!(status.success(), "SIGTERM exits 0, not {status}: {err}");
    assert!(err.contains("--on-offset-reset earliest: restarting at offset 0 (the broker holds 0..1024)"), "{err}");
    let s = summary(&run.dir);
    assert_eq!((s["samples"].as_u64(), s["samples_this_run"].as_u64()), (Some(6144), Some(6144)), "{s}");
    let last = final_model(&run.dir);
    assert_eq!((last.step, last.samples), (96, 6144));
    assert_eq!(last.offsets, both_at(1024));
}

/// An outage is over once the broker answers again, records or not: a trainer on a quiet
/// topic that sees two short outages further apart than `--broker-timeout` goes on.
#[test]
fn a_quiet_trainer_survives_short_outages_further_apart_than_the_broker_timeout() {
    let Some(sample) = criteo_sample() else { return };
    let proxy = Proxy::start();
    let broker = Broker::start_advertising(proxy.port);
    proxy.switch(broker.port());
    produce(&broker, "clicks", &sample, &["--partitions", "2", "--limit", "2048"]);
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("run");
    std::fs::create_dir_all(&dir).unwrap();
    let stderr = dir.join("stderr.txt");
    let metrics_port = free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let flags = ["--broker-timeout", "6", "--metrics-addr", &metrics];
    let child = running_online_cmd(&proxy.addr(), "clicks", &dir, 1, &flags)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    let mut trainer = Trainer { child, stderr, metrics_port };
    if let Some(status) = trainer.wait_for_samples(2048) {
        panic!("the trainer exited ({status}) before training 2048 samples: {}", trainer.stderr());
    }
    // Two outages of 1 s (every connection closed, new ones refused), 15 s apart: each
    // alone is well within --broker-timeout, but not the time from the first to the second.
    for _ in 0..2 {
        proxy.switch(0);
        std::thread::sleep(Duration::from_secs(1));
        proxy.switch(broker.port());
        std::thread::sleep(Duration::from_secs(15));
        if let Ok(Some(status)) = trainer.child.try_wait() {
            panic!("the trainer exited ({status}) after a 1 s outage: {}", trainer.stderr());
        }
    }
    let err = trainer.stderr();
    assert!(err.contains("retrying"), "the outages were seen: {err}");
    // Still training: new records are trained on, and SIGTERM ends the run cleanly.
    produce(&broker, "clicks", &sample, &["--limit", "2048"]);
    if let Some(status) = trainer.wait_for_samples(4096) {
        panic!("the trainer exited ({status}) before training 4096 samples: {}", trainer.stderr());
    }
    let pid = trainer.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    let status = trainer.wait();
    assert!(status.success(), "SIGTERM exits 0, not {status}: {}", trainer.stderr());
    assert_eq!(final_model(&dir).offsets, both_at(2048));
}

#[test]
fn a_running_trainer_on_a_topic_recreated_with_more_records_stops() {
    // 3,072 other records per partition: the trainer's offset 2,048 exists on broker B, so
    // nothing but the record before it tells the topics apart. The check after the broker
    // came back finds it before a record of B is trained.
    let Some((run, status)) = stopped_after_switch(6144) else { return };
    let err = run.trainer.stderr();
    assert!(status.code().is_some_and(|c| c != 0), "a clear failure, not {status}: {err}");
    for part in [
        "topic `clicks` partition",
        "the record at offset 2047 is not the one trained on",
        "the run stands at offset 2048; the broker holds offsets 0..3072",
        "--on-offset-reset earliest",
    ] {
        assert!(err.contains(part), "missing `{part}` in: {err}");
    }
    assert_eq!(newest_checkpoint(&run.dir), run.kept, "nothing of the new topic was trained");
}
