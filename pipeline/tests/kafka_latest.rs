//! `online --start latest` against a real Kafka-protocol broker (tansu on 127.0.0.1, see
//! `kafka.rs` for the broker and `CI=true`): a run starting at the end of a topic starts
//! after every record it holds, though tansu reports one past the first offset of the
//! topic's last record batch as its high watermark (a burst of records produced
//! together is one batch).

mod common;
mod kafka_broker;

use common::run_ok;
use kafka_broker::*;

#[test]
fn a_run_from_the_latest_offset_until_the_end_trains_nothing() {
    let Some(sample) = criteo_sample() else { return };
    let broker = Broker::start();
    let n = produce(&broker, "clicks", &sample, &["--partitions", "1", "--limit", "1000"]);
    assert_eq!(n, 1000);
    let dir = tempfile::tempdir().unwrap();
    run_ok(&mut online_cmd(&broker, "clicks", dir.path(), 1, &["--start", "latest", "--broker-timeout", "10"]));
    let s = summary(dir.path());
    assert_eq!(s["samples"], 0, "{s}");
    assert_eq!(s["offsets"]["clicks/0"], 1000, "{s}");
}
