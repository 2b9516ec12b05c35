//! Kafka topics as a training source (feature `kafka`, through librdkafka).
//!
//! The online trainer reads a topic as a set of partitions, each an ordered
//! log of records. A training step takes a fixed **quota** of records from
//! every partition ([`step_quotas`]), so the records of step `t` are the
//! records at offsets `[o_p(t), o_p(t) + q_p)` of every partition `p`: what
//! a step trains on depends on the data and the starting offsets, never on
//! when the records arrived. A worker whose partitions have not yet
//! received their quota waits for them; at the end of a bounded run
//! (`until_end`) a partition contributes what it has left up to the end it
//! had when the run started.
//!
//! * [`consumer::PartitionReader`] holds the partitions one worker owns
//!   ([`partition_owner`]), buffers a bounded number of records per
//!   partition (pausing a partition that runs ahead: backpressure), and
//!   hands out one step at a time. Offsets advance only when the caller
//!   says the step was trained ([`consumer::PartitionReader::consume_step`]),
//!   so records read before a crash are read again after it, and a
//!   checkpoint's offsets are exactly the records its weights have seen.
//! * [`reset`] notices a partition that no longer holds the position a run
//!   stands at (past its end, below its start, another record before it: a
//!   re-created topic, a broker that lost its storage) and stops the run
//!   unless `--on-offset-reset` says where to restart.
//! * [`producer`] replays a file into a topic (`tiderec produce`) and creates
//!   topics.
//!
//! A broker that is down or restarting is retried with backoff by librdkafka
//! and by the reader, which logs each outage once; no record is skipped or
//! read twice, because the reader checks every record's offset against the
//! one it expects. An outage lasts from the first error until records arrive
//! or every partition answers a check of its position (a quiet topic gets one
//! every 10 s); only an outage longer than the endpoint's `broker_timeout`
//! fails the reader, never errors that far apart.
//!
//! The reader depends on some librdkafka properties of its own
//! ([`consumer::OWN_OPTIONS`]: no automatic offset reset, commit or store, no
//! end-of-partition events, its group and brokers); a user's option that sets
//! one is refused ([`consumer::check_options`]).

pub mod consumer;
pub mod producer;
pub mod reset;

use std::time::Duration;

/// Where a Kafka source or sink connects.
#[derive(Clone, Debug)]
pub struct KafkaEndpoint {
    /// `host:port[,host:port…]`.
    pub brokers: String,
    /// The topic.
    pub topic: String,
    /// How long to keep retrying an unreachable broker before giving up.
    pub broker_timeout: Duration,
    /// librdkafka properties set after tiderec's own (`--kafka-option KEY=VALUE`).
    pub options: Vec<(String, String)>,
}

/// The global worker that owns `partition` among `workers`.
pub fn partition_owner(partition: i32, workers: usize) -> usize {
    partition as usize % workers
}

/// Records each partition contributes to one step of `batch_size` records:
/// `batch_size / partitions`, the remainder going to the lowest partitions.
pub fn step_quotas(batch_size: usize, partitions: usize) -> Vec<usize> {
    let base = batch_size / partitions.max(1);
    let extra = batch_size % partitions.max(1);
    (0..partitions).map(|p| base + usize::from(p < extra)).collect()
}

/// The key of a partition in a checkpoint manifest's `kafka_offsets`.
pub fn offset_key(topic: &str, partition: i32) -> String {
    format!("{topic}/{partition}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_sum_to_the_batch() {
        for (b, p) in [(128, 4), (130, 4), (3, 8), (1024, 1)] {
            let q = step_quotas(b, p);
            assert_eq!(q.len(), p);
            assert_eq!(q.iter().sum::<usize>(), b);
            assert!(q.iter().max().unwrap() - q.iter().min().unwrap() <= 1);
        }
    }

    #[test]
    fn partitions_spread_over_workers() {
        let owners: Vec<usize> = (0..6).map(|p| partition_owner(p, 4)).collect();
        assert_eq!(owners, vec![0, 1, 2, 3, 0, 1]);
    }
}
