//! Partitions that no longer hold what a run stands at: detection and policy.
//!
//! A run stands at an offset of every partition it reads: the records below it
//! were trained on (or are buffered for training). That position means something
//! only while the broker holds the same log. It does not when
//!
//! * the position is **past the partition's end**: the topic was deleted and
//!   re-created with fewer records, the broker lost its storage, an in-memory
//!   broker restarted;
//! * the position is **below the oldest record**: retention deleted records
//!   before they were trained on;
//! * the record just below the position is **another record** than the one the
//!   run consumed: the topic was re-created and refilled past the position.
//!
//! The last case is seen through a [`fingerprint`] of the last record consumed
//! from each partition, which checkpoints keep beside the offset. Whatever the
//! case, [`OnOffsetReset`] decides: by default the run stops with
//! [`SourceError::OffsetReset`], naming the partition, the position and the
//! broker's offsets, before anything is trained past it; `earliest` or `latest`
//! restart the partition at its oldest record or at its end, and say so on
//! stderr. Nothing is ever skipped or re-read silently.

use super::KafkaEndpoint;
pub use crate::offset_reset::OnOffsetReset;
use crate::SourceError;

/// Where a checkpoint left one partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resume {
    /// The first offset not trained on.
    pub next: i64,
    /// [`fingerprint`] of the record at `next − 1`, when the checkpoint kept it.
    pub last_record: Option<u64>,
}

/// The fingerprint of a record's payload: xxh3-64 (stable across builds and machines).
pub fn fingerprint(payload: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(payload)
}

/// A fingerprint as checkpoints write it: 16 lowercase hex digits.
pub fn fingerprint_hex(fp: u64) -> String {
    format!("{fp:016x}")
}

/// A fingerprint read back from [`fingerprint_hex`]; `None` for anything else.
pub fn parse_fingerprint(text: &str) -> Option<u64> {
    (text.len() == 16).then(|| u64::from_str_radix(text, 16).ok()).flatten()
}

/// The offsets the broker holds of one partition: `low..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The oldest offset (low watermark).
    pub low: i64,
    /// One past the last offset.
    pub end: i64,
}

/// Why a partition does not hold `position` (`None`: it does). `expected` is the
/// fingerprint of the record at `position − 1` the run consumed and `found` the
/// fingerprint of the record the broker holds there (`None`: not looked at, or
/// not there any more).
pub fn mismatch(position: i64, bounds: Bounds, expected: Option<u64>, found: Option<u64>) -> Option<String> {
    if position > bounds.end {
        return Some(format!(
            "offset {position} is past the partition's end, {}: the topic was re-created or the broker lost records",
            bounds.end
        ));
    }
    if position < bounds.low {
        return Some(format!(
            "the oldest record left is {}: records {position}..{} were deleted before they were trained on",
            bounds.low, bounds.low
        ));
    }
    match (expected, found) {
        (Some(e), Some(f)) if e != f => {
            Some(format!("the record at offset {} is not the one trained on: the topic was re-created", position - 1))
        }
        _ => None,
    }
}

/// Applies `policy` to a partition found not to hold `position` for `reason`:
/// the offset to restart at, or the error that stops the run.
pub fn decide(
    policy: OnOffsetReset,
    endpoint: &KafkaEndpoint,
    partition: i32,
    position: i64,
    bounds: Bounds,
    reason: String,
) -> Result<i64, SourceError> {
    let restart = match policy {
        OnOffsetReset::Fail => {
            return Err(SourceError::OffsetReset {
                brokers: endpoint.brokers.clone(),
                topic: endpoint.topic.clone(),
                partition,
                offset: position,
                low: bounds.low,
                end: bounds.end,
                reason,
            })
        }
        OnOffsetReset::Earliest => bounds.low,
        OnOffsetReset::Latest => bounds.end,
    };
    eprintln!(
        "warning: kafka {} topic `{}` partition {partition}: {reason}; --on-offset-reset {policy}: \
         restarting at offset {restart} (the broker holds {}..{})",
        endpoint.brokers, endpoint.topic, bounds.low, bounds.end
    );
    Ok(restart)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const B: Bounds = Bounds { low: 10, end: 100 };

    fn endpoint() -> KafkaEndpoint {
        KafkaEndpoint {
            brokers: "127.0.0.1:1".into(),
            topic: "t".into(),
            broker_timeout: Duration::from_secs(1),
            options: Vec::new(),
        }
    }

    #[test]
    fn positions_inside_the_log_with_the_same_record_match() {
        for position in [10, 50, 100] {
            assert_eq!(mismatch(position, B, None, None), None);
            assert_eq!(mismatch(position, B, Some(7), Some(7)), None);
            assert_eq!(mismatch(position, B, Some(7), None), None);
        }
    }

    #[test]
    fn past_the_end_below_the_start_and_another_record_are_named() {
        assert!(mismatch(101, B, None, None).unwrap().contains("past the partition's end, 100"));
        assert!(mismatch(9, B, None, None).unwrap().contains("records 9..10 were deleted"));
        assert!(mismatch(50, B, Some(7), Some(8)).unwrap().contains("record at offset 49 is not the one"));
    }

    #[test]
    fn the_policy_fails_or_restarts_at_either_end() {
        let e = decide(OnOffsetReset::Fail, &endpoint(), 3, 150, B, "gone".into()).unwrap_err().to_string();
        for part in ["partition 3", "offset 150", "10..100", "gone", "--on-offset-reset"] {
            assert!(e.contains(part), "{e}");
        }
        assert_eq!(decide(OnOffsetReset::Earliest, &endpoint(), 3, 150, B, "gone".into()).unwrap(), 10);
        assert_eq!(decide(OnOffsetReset::Latest, &endpoint(), 3, 150, B, "gone".into()).unwrap(), 100);
    }

    #[test]
    fn policies_and_fingerprints_read_back() {
        for p in [OnOffsetReset::Fail, OnOffsetReset::Earliest, OnOffsetReset::Latest] {
            assert_eq!(p.to_string().parse::<OnOffsetReset>(), Ok(p));
        }
        assert!("never".parse::<OnOffsetReset>().unwrap_err().contains("fail, earliest or latest"));
        let fp = fingerprint(b"1\t2\t3");
        assert_eq!(parse_fingerprint(&fingerprint_hex(fp)), Some(fp));
        assert_eq!(parse_fingerprint("xyz"), None);
    }
}
