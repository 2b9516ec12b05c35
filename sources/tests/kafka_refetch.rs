//! The Kafka reader against librdkafka's mock cluster (`rdkafka::mocking`, in-process,
//! no broker needed): a fetch the broker answers with "offset out of range" while the
//! reader's position is valid stops the partition in librdkafka (`auto.offset.reset`
//! is `error`); the reader's check finds the position valid and fetches the partition
//! again, so the records produced after it are still read.
#![cfg(feature = "kafka")]

use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use std::time::{Duration, Instant};
use tiderec_sources::kafka::consumer::{Fill, PartitionReader, StartAt};
use tiderec_sources::kafka::reset::OnOffsetReset;
use tiderec_sources::kafka::KafkaEndpoint;

const TOPIC: &str = "clicks";

fn produce(brokers: &str, range: std::ops::Range<u32>) {
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    for i in range {
        let payload = format!("record {i}");
        producer.send(BaseRecord::<(), _>::to(TOPIC).payload(&payload).partition(0)).unwrap();
    }
    producer.flush(Duration::from_secs(10)).unwrap();
}

/// Fills `reader` with `n` records of partition 0 (at most `within`), consumes them and
/// returns their offsets and payloads.
fn take(reader: &mut PartitionReader, n: usize, within: Duration) -> Vec<(i64, String)> {
    let deadline = Instant::now() + within;
    let fill = reader.fill(|_| n, || Instant::now() > deadline).unwrap();
    assert_eq!(fill, Fill::Ready, "no {n} records within {within:?}; stats {:?}", reader.stats());
    let got: Vec<(i64, String)> =
        reader.step_records(|_| n).map(|(_, o, bytes)| (o, String::from_utf8_lossy(bytes).into_owned())).collect();
    reader.consume_step(|_| n);
    got
}

fn expected(range: std::ops::Range<u32>) -> Vec<(i64, String)> {
    range.map(|i| (i64::from(i), format!("record {i}"))).collect()
}

#[test]
fn an_out_of_range_fetch_at_a_valid_position_does_not_stop_the_partition() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic(TOPIC, 1, 1).unwrap();
    let brokers = mock.bootstrap_servers();
    produce(&brokers, 0..10);
    let endpoint = KafkaEndpoint {
        brokers: brokers.clone(),
        topic: TOPIC.into(),
        broker_timeout: Duration::from_secs(10),
        options: Vec::new(),
    };
    let mut reader =
        PartitionReader::open(&endpoint, "g", &[0], |_| None, StartAt::Earliest, OnOffsetReset::Fail, false, 1000)
            .unwrap();
    assert_eq!(take(&mut reader, 10, Duration::from_secs(20)), expected(0..10));

    // librdkafka turns the error of its first fetch at a partition's end into an
    // end-of-partition event (dropped: `enable.partition.eof` is false); it sends that
    // fetch within `fetch.wait.max.ms` (50 ms) of the records before it.
    std::thread::sleep(Duration::from_secs(1));
    // The next fetch is answered "out of range" although offset 10 is the partition's end.
    mock.request_errors(RDKafkaApiKey::Fetch, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE]);
    produce(&brokers, 10..20);
    assert_eq!(take(&mut reader, 10, Duration::from_secs(20)), expected(10..20));
    assert_eq!(reader.offsets(), vec![(0, 20)]);
}
