//! The online trainer when a topic no longer holds the offsets a run stands at
//! (the topic re-created, the broker's storage lost: here an in-memory tansu
//! broker restarted): the run stops before training anything, naming the
//! partition, its offset and the broker's offsets, unless `--on-offset-reset`
//! says where to restart. See `kafka.rs` for the broker and `CI=true`.
//!
//! A *running* trainer checks the same conditions (on duplicates, out-of-range
//! fetches and every 10 s without records). That path has no end-to-end test
//! here: after an in-memory tansu broker restarts, librdkafka 2.12's consumer
//! crashes in its metadata update (`rd_kafka_metadata_update_op` compares a null
//! topic name) before any check runs, with or without tiderec's checks. The
//! crashed run leaves its last checkpoint, whose resume the test below covers;
//! the broker-restart and outage tests of `kafka.rs` run the running checks and
//! show they take nothing valid for a reset.

mod common;
mod kafka_broker;

use common::{run_err, run_ok, shared_data};
use kafka_broker::*;
use std::time::Duration;

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
