//! One worker's partitions of a topic, read one step at a time (see the
//! [module docs](super)).

use super::reset::{self, fingerprint, Bounds, OnOffsetReset, Resume};
use super::{offset_key, KafkaEndpoint};
use crate::SourceError;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where a partition without a checkpointed offset starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartAt {
    /// The oldest record still in the partition.
    Earliest,
    /// The partition's end when the run starts: only new records.
    Latest,
}

/// The outcome of [`PartitionReader::fill`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// Every owned partition holds its quota (or all it has left before its end).
    Ready,
    /// The caller asked to stop while records were still missing.
    Stopped,
}

/// Counters of one reader.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReaderStats {
    /// Records received from the broker.
    pub received: u64,
    /// Records handed out and consumed.
    pub consumed: u64,
    /// Records the broker sent again after a reconnect (dropped: already buffered).
    pub duplicates_dropped: u64,
    /// Broker errors seen (each retried).
    pub broker_errors: u64,
}

/// Broker errors librdkafka reports outside of `poll` (connections, metadata).
#[derive(Clone, Default)]
struct ErrorLog(Arc<Mutex<Option<(Instant, String)>>>);

impl ClientContext for ErrorLog {
    fn error(&self, error: KafkaError, reason: &str) {
        if let Ok(mut last) = self.0.lock() {
            *last = Some((Instant::now(), format!("{error}: {reason}")));
        }
    }
    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, _fac: &str, _log_message: &str) {}
}

impl ConsumerContext for ErrorLog {}

struct Part {
    partition: i32,
    /// Offset of the first record not yet consumed (what a checkpoint stores).
    next: i64,
    /// Offset the broker should send next (one past the last buffered record).
    expect: i64,
    /// The partition's end for a bounded run.
    end: Option<i64>,
    /// Buffered records: `(offset, payload)`.
    queue: VecDeque<(i64, Vec<u8>)>,
    paused: bool,
    /// [`fingerprint`] of the record at `next − 1`, when known.
    last: Option<u64>,
    /// The consumer's position in the partition may still be the one from before the
    /// partition was assigned again at an earlier offset (see
    /// [`PartitionReader::await_positions`]): it is not used until a record of the new
    /// assignment arrives.
    stale_position: bool,
}

impl Part {
    fn exhausted(&self) -> bool {
        self.end.is_some_and(|e| self.expect >= e)
    }
    fn done(&self) -> bool {
        self.exhausted() && self.queue.is_empty()
    }

    /// Fetches the partition again from `restart` (the partition's bounded end becomes at
    /// least `end`). With `keep_buffered` the records buffered so far stay and are
    /// consumed first: they were fetched from the same log and are not trained on yet
    /// (only records from the fetch position on are gone). Otherwise the log itself
    /// changed: they are dropped, and the partition's position is `restart` with no
    /// record known before it.
    fn restart(&mut self, restart: i64, end: i64, keep_buffered: bool) {
        if keep_buffered && !self.queue.is_empty() {
            self.expect = restart;
        } else {
            self.queue.clear();
            (self.next, self.expect, self.last) = (restart, restart, None);
        }
        if self.end.is_some() {
            self.end = Some(end.max(restart));
        }
    }

    /// Consumes the first `n` buffered records (at most all of them); returns how many.
    /// Once none is left buffered, the position is the offset fetched next: the offsets
    /// between hold no record (a transaction marker, a compacted tail, records deleted
    /// after a restart that kept the buffered ones), and no record stands before it.
    fn consume(&mut self, n: usize) -> usize {
        let n = n.min(self.queue.len());
        for (o, payload) in self.queue.drain(..n) {
            self.next = o + 1;
            self.last = Some(fingerprint(&payload));
        }
        if self.queue.is_empty() && self.expect > self.next {
            (self.next, self.last) = (self.expect, None);
        }
        n
    }
}

/// The partitions of one topic that one worker owns (see the [module docs](super)).
pub struct PartitionReader {
    consumer: BaseConsumer<ErrorLog>,
    errors: ErrorLog,
    endpoint: KafkaEndpoint,
    parts: Vec<Part>,
    max_buffered: usize,
    stats: ReaderStats,
    outage_since: Option<Instant>,
    last_logged: Option<Instant>,
    /// Consumer group (the probes of partition ends use it too).
    group: String,
    on_reset: OnOffsetReset,
    /// The partitions' bounds should be checked (a duplicate or an out-of-range fetch was seen).
    check_due: bool,
    /// librdkafka stopped fetching a partition: an out-of-range fetch (or a log truncation
    /// found through leader epochs) under `auto.offset.reset=error` leaves it stopped until
    /// it is assigned again, and the error does not say which partition. Once a check in
    /// which every partition answered finds every position valid, every partition is
    /// assigned again at the offset it expects next (see [`PartitionReader::check_positions`]).
    refetch_due: bool,
    /// Since when they must be checked before any record is handed out: records arrived
    /// again after an outage (the broker behind the address may have changed), and until
    /// every partition has answered. Past `broker_timeout` unanswered, the run fails.
    check_owed: Option<Instant>,
    /// When the bounds were last checked, and when a record last arrived.
    last_check: Instant,
    last_record: Instant,
}

/// How long the reader waits for records before checking that every partition still
/// holds its position (a restarted in-memory broker sends nothing and reports nothing).
const STALL_CHECK: Duration = Duration::from_secs(10);
/// The least time between two checks triggered by duplicates or out-of-range fetches.
const CHECK_GAP: Duration = Duration::from_secs(1);
/// The longest time between two checks while records flow: a topic re-created with more
/// records than the reader's position sends records without any other sign (such a
/// topic is noticed only while the record before the position is still the old log's).
const PERIODIC_CHECK: Duration = Duration::from_secs(30);

fn kafka_error(endpoint: &KafkaEndpoint, what: &str, e: impl std::fmt::Display) -> SourceError {
    SourceError::Kafka {
        brokers: endpoint.brokers.clone(),
        topic: endpoint.topic.clone(),
        reason: format!("{what}: {e}"),
    }
}

/// The librdkafka properties the reader sets itself and depends on, each with why
/// `--kafka-option` may not change it (see [`check_options`]).
pub const OWN_OPTIONS: &[(&str, &str)] = &[
    ("group.id", "tiderec sets it from --group"),
    ("bootstrap.servers", "tiderec sets it from --brokers"),
    ("metadata.broker.list", "tiderec sets it from --brokers"),
    (
        "auto.offset.reset",
        "it must stay `error`: a position the broker no longer holds is then seen and handled as \
         --on-offset-reset says, instead of librdkafka moving the position silently",
    ),
    (
        "enable.partition.eof",
        "it must stay false: the reader waits at a partition's end, and an end-of-partition event would \
         count as a broker error",
    ),
    ("enable.auto.commit", "it must stay false: offsets are committed only once a checkpoint holding them is durable"),
    ("auto.commit.enable", "it must stay false: offsets are committed only once a checkpoint holding them is durable"),
    (
        "enable.auto.offset.store",
        "it must stay false: offsets are committed only once a checkpoint holding them is durable",
    ),
];

/// Refuses `--kafka-option`s that set one of [`OWN_OPTIONS`] (a configuration error of
/// `kafka_option` naming the property and why); any other property is left to librdkafka.
pub fn check_options(options: &[(String, String)]) -> Result<(), SourceError> {
    for (key, value) in options {
        if let Some((_, why)) = OWN_OPTIONS.iter().find(|(own, _)| *own == key.trim()) {
            return Err(SourceError::config(
                "kafka_option",
                format!("`{key}={value}` is refused: `{}` is the reader's own ({why})", key.trim()),
            ));
        }
    }
    Ok(())
}

fn client_config(endpoint: &KafkaEndpoint, group: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &endpoint.brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "error")
        // Records up to the high watermark, not the last stable offset: tiderec's producers
        // are not transactional, and brokers that misreport the stable offset (tansu 0.6)
        // would otherwise hold back the last record batch. `--kafka-option
        // isolation.level=read_committed` restores Kafka's default for transactional topics.
        .set("isolation.level", "read_uncommitted")
        .set("socket.timeout.ms", "10000")
        .set("reconnect.backoff.ms", "100")
        .set("reconnect.backoff.max.ms", "2000")
        // librdkafka's own prefetch per partition, bounded (backpressure before ours).
        .set("queued.max.messages.kbytes", "16384")
        .set("fetch.wait.max.ms", "50")
        .set("log_level", "0");
    for (k, v) in &endpoint.options {
        c.set(k, v);
    }
    c
}

/// Retries `op` with exponential backoff until it succeeds or `timeout` passes.
fn with_retries<T>(
    endpoint: &KafkaEndpoint,
    what: &str,
    mut op: impl FnMut() -> Result<T, KafkaError>,
) -> Result<T, SourceError> {
    let start = Instant::now();
    let mut wait = Duration::from_millis(50);
    let mut logged = false;
    loop {
        match op() {
            Ok(v) => return Ok(v),
            Err(e) if start.elapsed() + wait < endpoint.broker_timeout => {
                if !logged && start.elapsed() > Duration::from_secs(2) {
                    eprintln!(
                        "kafka {}: {what} failed ({e}); retrying for up to {:?}",
                        endpoint.brokers, endpoint.broker_timeout
                    );
                    logged = true;
                }
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Err(kafka_error(endpoint, what, e)),
        }
    }
}

/// The number of partitions of the endpoint's topic (retried until `broker_timeout`).
pub fn topic_partitions(endpoint: &KafkaEndpoint) -> Result<usize, SourceError> {
    let consumer: BaseConsumer<ErrorLog> = client_config(endpoint, "tiderec-metadata")
        .create_with_context(ErrorLog::default())
        .map_err(|e| kafka_error(endpoint, "cannot create a consumer", e))?;
    let timeout = Duration::from_secs(5).min(endpoint.broker_timeout);
    let n = with_retries(endpoint, "fetching the topic's metadata", || {
        let md = consumer.fetch_metadata(Some(&endpoint.topic), timeout)?;
        match md.topics().first() {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(t.partitions().len()),
            Some(t) => Err(KafkaError::MetadataFetch(
                t.error().map(Into::into).unwrap_or(rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition),
            )),
            None => Err(KafkaError::MetadataFetch(rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition)),
        }
    })?;
    Ok(n)
}

/// The longest [`probe_end`] takes records after the first: a record batch arrives
/// in one fetch, well within it.
const PROBE_WINDOW: Duration = Duration::from_secs(1);

/// The end of partition `p` (one past its last offset) when the broker reports `high`.
///
/// A Kafka broker's high watermark is exact; some Kafka-protocol brokers (tansu 0.6)
/// report one past the *first* offset of the last record batch instead. Reading the
/// record batch that holds offset `high − 1` and taking one past its last record gives
/// the end with both: fetches return whole batches, which arrive together. Records
/// are taken until none came for 200 ms, or for at most [`PROBE_WINDOW`] after the
/// first: under steady production records of later batches keep coming, and the end
/// found is then a little past the end at the call (never before it) instead of a
/// probe that never returns.
///
/// The last offset may hold no record the application sees: a transaction's commit or
/// abort marker, which librdkafka reads and skips. The consumer's position (one past
/// the last offset it read, marker included) then says how far the log goes: once it
/// is past `high − 1`, the end is the larger of the two. A broker that sends neither
/// fails the probe after `broker_timeout`.
fn probe_end(endpoint: &KafkaEndpoint, group: &str, p: i32, high: i64) -> Result<i64, SourceError> {
    let consumer = consumer_at(endpoint, group, p, high - 1)?;
    let start = Instant::now();
    let mut end = None::<i64>;
    let (mut first_seen, mut last_seen) = (Instant::now(), Instant::now());
    loop {
        if end.is_some() && first_seen.elapsed() > PROBE_WINDOW {
            break;
        }
        match consumer.poll(Duration::from_millis(20)) {
            Some(Ok(m)) if m.partition() == p => {
                if end.is_none() {
                    first_seen = Instant::now();
                }
                end = Some(end.unwrap_or(high).max(m.offset() + 1));
                last_seen = Instant::now();
            }
            Some(_) => {}
            None if end.is_some() && last_seen.elapsed() > Duration::from_millis(200) => break,
            None if end.is_none() => match position(&consumer, &endpoint.topic, p) {
                Some(pos) if pos > high - 1 => return Ok(pos.max(high)),
                _ if start.elapsed() > endpoint.broker_timeout => {
                    return Err(kafka_error(
                        endpoint,
                        &format!("partition {p}"),
                        format!("the broker reports records up to offset {high} but sends none"),
                    ))
                }
                _ => {}
            },
            None => {}
        }
    }
    // Records, then a marker after the last of them.
    Ok(end.unwrap_or(high).max(position(&consumer, &endpoint.topic, p).unwrap_or(high)))
}

/// The consumer's position in partition `p` of `topic`: one past the last offset it has
/// read (records handed out and markers skipped alike); `None` before it read any.
fn position(consumer: &BaseConsumer<ErrorLog>, topic: &str, p: i32) -> Option<i64> {
    offset_in(&consumer.position().ok()?, topic, p)
}

/// The offset `list` holds for partition `p` of `topic`, when it is one.
fn offset_in(list: &TopicPartitionList, topic: &str, p: i32) -> Option<i64> {
    match list.find_partition(topic, p)?.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

/// A consumer of `group` reading partition `p` from `offset`.
fn consumer_at(
    endpoint: &KafkaEndpoint,
    group: &str,
    p: i32,
    offset: i64,
) -> Result<BaseConsumer<ErrorLog>, SourceError> {
    let consumer: BaseConsumer<ErrorLog> = client_config(endpoint, group)
        .create_with_context(ErrorLog::default())
        .map_err(|e| kafka_error(endpoint, "cannot create a consumer", e))?;
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(&endpoint.topic, p, Offset::Offset(offset))
        .and_then(|_| consumer.assign(&list))
        .map_err(|e| kafka_error(endpoint, &format!("cannot read partition {p} at offset {offset}"), e))?;
    Ok(consumer)
}

/// The [`fingerprint`] of the record at `offset` of partition `p` (`None`: the broker
/// sent no record there within a few seconds, e.g. it was compacted away).
fn fingerprint_at(endpoint: &KafkaEndpoint, group: &str, p: i32, offset: i64) -> Result<Option<u64>, SourceError> {
    let consumer = consumer_at(endpoint, group, p, offset)?;
    let deadline = Instant::now() + endpoint.broker_timeout.min(Duration::from_secs(10));
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(m)) if m.partition() == p && m.offset() == offset => {
                return Ok(Some(fingerprint(m.payload().unwrap_or_default())))
            }
            Some(Ok(m)) if m.partition() == p && m.offset() > offset => return Ok(None),
            _ => {}
        }
    }
    Ok(None)
}

/// The offsets partition `p` holds, as far as a run standing at `position` needs to
/// know: the end is the watermark when that is at or past `position`, else probed
/// (some brokers report less than the end; see [`probe_end`]).
fn bounds(
    endpoint: &KafkaEndpoint,
    consumer: &BaseConsumer<ErrorLog>,
    group: &str,
    p: i32,
    position: i64,
) -> Result<Bounds, SourceError> {
    let timeout = Duration::from_secs(5).min(endpoint.broker_timeout);
    let (low, high) = with_retries(endpoint, &format!("reading the offsets of partition {p}"), || {
        consumer.fetch_watermarks(&endpoint.topic, p, timeout)
    })?;
    Ok(Bounds { low, end: end_from(endpoint, group, p, (low, high), position)? })
}

/// The end of partition `p` with watermarks `(low, high)`, as far as a reader at
/// `position` needs it: `high` when that is at or past `position` (or the partition is
/// empty), else probed ([`probe_end`]). `i64::MAX` asks for the exact end.
fn end_from(
    endpoint: &KafkaEndpoint,
    group: &str,
    p: i32,
    (low, high): (i64, i64),
    position: i64,
) -> Result<i64, SourceError> {
    match high >= position || high <= low {
        true => Ok(high),
        false => probe_end(endpoint, group, p, high),
    }
}

/// Where a resumed partition starts: the checkpoint's offset when the broker still
/// holds it and the record before it is the one trained on, else what `policy` says.
/// Returns the offset and the fingerprint of the record before it, when known.
fn resume_at(
    endpoint: &KafkaEndpoint,
    consumer: &BaseConsumer<ErrorLog>,
    group: &str,
    p: i32,
    resume: Resume,
    policy: OnOffsetReset,
) -> Result<(i64, Option<u64>), SourceError> {
    let mut b = bounds(endpoint, consumer, group, p, resume.next)?;
    let before = resume.next - 1;
    let found = match resume.last_record {
        Some(_) if before >= b.low && resume.next <= b.end => fingerprint_at(endpoint, group, p, before)?,
        _ => None,
    };
    match reset::mismatch(resume.next, b, resume.last_record, found) {
        None => Ok((resume.next, resume.last_record)),
        Some(reason) => {
            if policy == OnOffsetReset::Latest {
                b.end = b.end.max(end_from(endpoint, group, p, (b.low, b.end), i64::MAX)?);
            }
            Ok((reset::decide(policy, endpoint, p, resume.next, b, reason)?, None))
        }
    }
}

impl PartitionReader {
    /// Assigns `partitions` (ascending) of the endpoint's topic to a new consumer of
    /// `group`, starting each where `start(p)` says when it was checkpointed (checked
    /// against the broker; `on_reset` decides when it no longer holds that position,
    /// see [`reset`]) and at `start_at` otherwise. With `until_end`, each partition
    /// ends at its end offset as of now. At most `max_buffered` records are buffered
    /// per partition.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        endpoint: &KafkaEndpoint,
        group: &str,
        partitions: &[i32],
        start: impl Fn(i32) -> Option<Resume>,
        start_at: StartAt,
        on_reset: OnOffsetReset,
        until_end: bool,
        max_buffered: usize,
    ) -> Result<Self, SourceError> {
        check_options(&endpoint.options)?;
        let errors = ErrorLog::default();
        let consumer: BaseConsumer<ErrorLog> = client_config(endpoint, group)
            .create_with_context(errors.clone())
            .map_err(|e| kafka_error(endpoint, "cannot create a consumer", e))?;
        let timeout = Duration::from_secs(5).min(endpoint.broker_timeout);
        let mut parts = Vec::with_capacity(partitions.len());
        let mut assignment = TopicPartitionList::new();
        for &p in partitions {
            let (low, high) = with_retries(endpoint, &format!("reading the offsets of partition {p}"), || {
                consumer.fetch_watermarks(&endpoint.topic, p, timeout)
            })?;
            if std::env::var_os("TIDEREC_DEBUG_KAFKA").is_some() {
                eprintln!("partition {p}: watermarks {low}..{high}");
            }
            let resume = start(p);
            // The partition's end as of now (probed: the watermark may fall short of it),
            // for a bounded run and for a start at the end.
            let end_now = match until_end || (resume.is_none() && start_at == StartAt::Latest) {
                true => Some(end_from(endpoint, group, p, (low, high), i64::MAX)?),
                false => None,
            };
            let (next, last) = match resume {
                Some(resume) => resume_at(endpoint, &consumer, group, p, resume, on_reset)?,
                None if start_at == StartAt::Earliest => (low, None),
                None => (end_now.unwrap_or(high), None),
            };
            assignment
                .add_partition_offset(&endpoint.topic, p, Offset::Offset(next))
                .map_err(|e| kafka_error(endpoint, "cannot assign partitions", e))?;
            let end = end_now.filter(|_| until_end).map(|e| e.max(next));
            parts.push(Part {
                partition: p,
                next,
                expect: next,
                end,
                queue: VecDeque::new(),
                paused: false,
                last,
                stale_position: false,
            });
        }
        consumer.assign(&assignment).map_err(|e| kafka_error(endpoint, "cannot assign partitions", e))?;
        Ok(PartitionReader {
            consumer,
            errors,
            endpoint: endpoint.clone(),
            parts,
            max_buffered: max_buffered.max(1),
            stats: ReaderStats::default(),
            outage_since: None,
            last_logged: None,
            group: group.to_string(),
            on_reset,
            check_due: false,
            refetch_due: false,
            check_owed: None,
            last_check: Instant::now(),
            last_record: Instant::now(),
        })
    }

    /// The partitions this reader owns, ascending.
    pub fn partitions(&self) -> Vec<i32> {
        self.parts.iter().map(|p| p.partition).collect()
    }

    /// `(partition, next offset)`: the first record of each partition not yet consumed.
    pub fn offsets(&self) -> Vec<(i32, i64)> {
        self.parts.iter().map(|p| (p.partition, p.next)).collect()
    }

    /// Whether every partition has reached its end (bounded runs only).
    pub fn at_end(&self) -> bool {
        self.parts.iter().all(Part::done)
    }

    /// Counters so far.
    pub fn stats(&self) -> ReaderStats {
        self.stats
    }

    /// Whether [`Self::fill`] would return at once (every partition holds its quota or is exhausted).
    pub fn is_ready(&self, quota: impl Fn(i32) -> usize) -> bool {
        self.parts.iter().all(|p| p.queue.len() >= quota(p.partition) || p.exhausted())
    }

    /// Blocks until every owned partition holds `quota(p)` records or all it has
    /// before its end, or until `stop()` returns true (checked every 100 ms).
    /// Errors once the broker has been unreachable for longer than `broker_timeout`
    /// while records are still missing.
    pub fn fill(&mut self, quota: impl Fn(i32) -> usize, stop: impl Fn() -> bool) -> Result<Fill, SourceError> {
        loop {
            // Records are handed out only once a check they are owed has run.
            if self.is_ready(&quota) && self.check_owed.is_none() {
                return Ok(Fill::Ready);
            }
            if stop() {
                return Ok(Fill::Stopped);
            }
            self.poll_once(Duration::from_millis(100))?;
        }
    }

    fn poll_once(&mut self, timeout: Duration) -> Result<(), SourceError> {
        let mut got = 0usize;
        let mut next_timeout = timeout;
        let mut changed = None;
        // Drain what is queued without waiting, then wait at most `timeout` once.
        while let Some(result) = self.consumer.poll(next_timeout) {
            next_timeout = Duration::ZERO;
            match result {
                Ok(m) => {
                    got += 1;
                    let Some(i) = self.parts.iter().position(|p| p.partition == m.partition()) else { continue };
                    let part = &mut self.parts[i];
                    // librdkafka hands out no record of an assignment it has replaced.
                    part.stale_position = false;
                    let offset = m.offset();
                    if offset < part.expect {
                        self.stats.duplicates_dropped += 1;
                        let payload = m.payload().unwrap_or_default();
                        if offset == part.next - 1 && part.last.is_some_and(|h| h != fingerprint(payload)) {
                            let reason = format!(
                                "the broker sent another record at offset {offset} than the one trained on: \
                                 the topic was re-created or the broker lost its storage"
                            );
                            changed = Some((i, reason));
                            break;
                        }
                        self.check_due = true;
                        continue;
                    }
                    if part.end.is_some_and(|e| offset >= e) {
                        // Past the end of a bounded run: not ours to train on.
                        part.expect = part.end.unwrap_or(offset);
                        continue;
                    }
                    part.queue.push_back((offset, m.payload().unwrap_or_default().to_vec()));
                    part.expect = offset + 1;
                    self.stats.received += 1;
                }
                Err(e)
                    if matches!(
                        e.rdkafka_error_code(),
                        Some(RDKafkaErrorCode::OffsetOutOfRange | RDKafkaErrorCode::AutoOffsetReset)
                    ) =>
                {
                    (self.check_due, self.refetch_due) = (true, true);
                }
                Err(e) => {
                    self.stats.broker_errors += 1;
                    self.note_error(&e.to_string())?;
                }
            }
            if got >= 4096 {
                break;
            }
        }
        if got > 0 {
            self.last_record = Instant::now();
            if let Some(since) = self.outage_since.take() {
                eprintln!(
                    "kafka {}: receiving again after {:.1} s",
                    self.endpoint.brokers,
                    since.elapsed().as_secs_f64()
                );
                // The broker behind the address may have changed: check before training on.
                self.check_owed.get_or_insert_with(Instant::now);
            }
        } else if let Some((at, reason)) = self.errors.0.lock().ok().and_then(|mut e| e.take()) {
            if at.elapsed() < Duration::from_secs(5) {
                self.stats.broker_errors += 1;
                self.note_error(&reason)?;
            }
        }
        if let Some((i, reason)) = changed {
            self.reset_partition(i, self.parts[i].expect, reason, false)?;
        } else {
            self.skip_to_position();
        }
        let stalled = self.last_record.elapsed() >= STALL_CHECK && self.last_check.elapsed() >= STALL_CHECK;
        let periodic = self.last_check.elapsed() >= PERIODIC_CHECK;
        if self.check_owed.is_some()
            || (self.check_due && self.last_check.elapsed() >= CHECK_GAP)
            || stalled
            || periodic
        {
            self.check_positions()?;
        }
        self.apply_backpressure();
        Ok(())
    }

    /// Moves the fetch offset of every bounded partition short of its end to the consumer's
    /// position, up to the end: offsets librdkafka read without handing out a record (a
    /// transaction marker) hold nothing to train on, and a partition whose log ends with
    /// one is exhausted only once it is past it. Called once what was received is drained,
    /// so the position is never past a record not yet buffered.
    fn skip_to_position(&mut self) {
        if !self.parts.iter().any(|p| p.end.is_some_and(|e| p.expect < e)) {
            return;
        }
        let Ok(list) = self.consumer.position() else { return };
        for part in self.parts.iter_mut().filter(|p| !p.stale_position) {
            let Some(end) = part.end.filter(|&e| part.expect < e) else { continue };
            let Some(pos) = offset_in(&list, &self.endpoint.topic, part.partition) else { continue };
            part.expect = part.expect.max(pos.min(end));
        }
    }

    /// Checks that every partition still holds the position the reader stands at, and
    /// the record consumed last (its fingerprint; see [`reset`]); a partition that does
    /// not is restarted or fails the run, as `--on-offset-reset` says. A broker that
    /// cannot answer is left to the outage handling; once every partition has answered,
    /// an outage noted before is over (a quiet topic sends no record to say so).
    ///
    /// A partition librdkafka stopped fetching after an out-of-range fetch (`refetch_due`)
    /// holds a valid position when the check finds nothing wrong (the leader caught up,
    /// records arrived since): every partition is then assigned again where it stands,
    /// once every partition has answered (a restart assigns them all anyway). Records the
    /// broker sends again below those offsets are dropped as duplicates.
    fn check_positions(&mut self) -> Result<(), SourceError> {
        self.check_due = false;
        let mut unchecked = false;
        for i in 0..self.parts.len() {
            let position = self.parts[i].expect;
            let (p, timeout) = (self.parts[i].partition, Duration::from_secs(2));
            let Ok((low, high)) = self.consumer.fetch_watermarks(&self.endpoint.topic, p, timeout) else {
                unchecked = true;
                continue;
            };
            let end = end_from(&self.endpoint, &self.group, p, (low, high), position)?;
            if let Some(reason) = reset::mismatch(position, Bounds { low, end }, None, None) {
                // Below the oldest record: retention deleted records from the fetch position
                // on, and those buffered before it are still the log's. Past the end: the
                // broker no longer holds what was fetched.
                self.reset_partition(i, position, reason, position < low)?;
                continue;
            }
            // The record before the first one not consumed yet: still the one trained on?
            let (next, last) = (self.parts[i].next, self.parts[i].last);
            if let Some(expected) = last.filter(|_| next > low && next <= end) {
                let found = fingerprint_at(&self.endpoint, &self.group, p, next - 1)?;
                if let Some(reason) = reset::mismatch(next, Bounds { low, end }, Some(expected), found) {
                    self.reset_partition(i, next, reason, false)?;
                }
            }
        }
        self.last_check = Instant::now();
        if !unchecked {
            self.broker_answered();
            if self.refetch_due {
                self.assign_all()?;
            }
        }
        // A stopped partition is checked again until every partition answers.
        self.check_due |= self.refetch_due;
        // A check owed before records are handed out stays owed until every partition answered.
        match self.check_owed {
            Some(since) if unchecked && since.elapsed() > self.endpoint.broker_timeout => Err(kafka_error(
                &self.endpoint,
                "checking the partitions after an outage",
                format!(
                    "not every partition answered for {:.0} s (--broker-timeout); no record since the outage was trained",
                    since.elapsed().as_secs_f64()
                ),
            )),
            Some(_) if unchecked => Ok(()),
            _ => {
                self.check_owed = None;
                Ok(())
            }
        }
    }

    /// Restarts partition `i`, found not to hold `position`, where `--on-offset-reset`
    /// says (or fails the run), and fetches it again from there. Its buffered records
    /// are kept with `keep_buffered` (records were deleted from the fetch position on:
    /// those buffered are still valid and not trained on) and dropped otherwise (the log
    /// changed); see [`Part::restart`].
    fn reset_partition(
        &mut self,
        i: usize,
        position: i64,
        reason: String,
        keep_buffered: bool,
    ) -> Result<(), SourceError> {
        let p = self.parts[i].partition;
        let timeout = Duration::from_secs(5).min(self.endpoint.broker_timeout);
        let (low, high) = with_retries(&self.endpoint, &format!("reading the offsets of partition {p}"), || {
            self.consumer.fetch_watermarks(&self.endpoint.topic, p, timeout)
        })?;
        let end = end_from(&self.endpoint, &self.group, p, (low, high), i64::MAX)?;
        let restart = reset::decide(self.on_reset, &self.endpoint, p, position, Bounds { low, end }, reason)?;
        self.parts[i].restart(restart, end, keep_buffered);
        self.assign_all()
    }

    /// Assigns every partition again at the offset it expects next (resumed, and fetched
    /// even where librdkafka had stopped fetching it).
    fn assign_all(&mut self) -> Result<(), SourceError> {
        self.refetch_due = false;
        let before = self.consumer.position().ok();
        let mut assignment = TopicPartitionList::new();
        for part in &mut self.parts {
            part.paused = false;
            assignment
                .add_partition_offset(&self.endpoint.topic, part.partition, Offset::Offset(part.expect))
                .map_err(|e| kafka_error(&self.endpoint, "cannot assign partitions", e))?;
        }
        self.consumer.assign(&assignment).map_err(|e| kafka_error(&self.endpoint, "cannot assign partitions", e))?;
        self.await_positions(before);
        Ok(())
    }

    /// librdkafka forgets a partition's position when it stops fetching it for a new
    /// assignment, which happens soon after `assign` returns; until then the position is
    /// the one of the assignment before. Where that lies past the offset the partition is
    /// now fetched from (a restart at an earlier offset), waits up to a second for it to
    /// be forgotten (no record is handed out meanwhile, so nothing else moves it); a
    /// partition still waiting is marked [`Part::stale_position`] until a record arrives.
    fn await_positions(&mut self, before: Option<TopicPartitionList>) {
        let topic = &self.endpoint.topic;
        let ahead = |list: &TopicPartitionList, part: &Part| {
            offset_in(list, topic, part.partition).is_some_and(|o| o > part.expect)
        };
        for part in &mut self.parts {
            part.stale_position = before.as_ref().is_none_or(|list| ahead(list, part));
        }
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.parts.iter().any(|p| p.stale_position) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
            let Ok(now) = self.consumer.position() else { return };
            for part in self.parts.iter_mut().filter(|p| p.stale_position) {
                part.stale_position = ahead(&now, part);
            }
        }
    }

    /// The broker answered for every partition: an outage noted before is over, so a
    /// later error starts a new one rather than failing the run for the time between.
    fn broker_answered(&mut self) {
        if let Some(since) = self.outage_since.take() {
            eprintln!(
                "kafka {}: the broker answers again after {:.1} s",
                self.endpoint.brokers,
                since.elapsed().as_secs_f64()
            );
            // (This check, answered for every partition, is also the one records that come
            // back after an outage owe before they are trained on.)
        }
    }

    fn note_error(&mut self, reason: &str) -> Result<(), SourceError> {
        let since = *self.outage_since.get_or_insert_with(Instant::now);
        if self.last_logged.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
            eprintln!("kafka {}: {reason}; retrying", self.endpoint.brokers);
            self.last_logged = Some(Instant::now());
        }
        if since.elapsed() > self.endpoint.broker_timeout {
            return Err(kafka_error(
                &self.endpoint,
                "broker unreachable",
                format!("{reason} (for {:.0} s)", since.elapsed().as_secs_f64()),
            ));
        }
        Ok(())
    }

    /// Pauses partitions whose buffer is full and resumes those drained below half.
    fn apply_backpressure(&mut self) {
        let (mut pause, mut resume) = (TopicPartitionList::new(), TopicPartitionList::new());
        for p in &mut self.parts {
            if !p.paused && p.queue.len() >= self.max_buffered {
                pause.add_partition(&self.endpoint.topic, p.partition);
                p.paused = true;
            } else if p.paused && p.queue.len() < self.max_buffered / 2 {
                resume.add_partition(&self.endpoint.topic, p.partition);
                p.paused = false;
            }
        }
        if pause.count() > 0 {
            let _ = self.consumer.pause(&pause);
        }
        if resume.count() > 0 {
            let _ = self.consumer.resume(&resume);
        }
    }

    /// The records of the next step: the first `quota(p)` buffered records of every
    /// owned partition, in partition then offset order, as `(partition, offset, payload)`.
    /// Nothing is consumed until [`Self::consume_step`].
    pub fn step_records(&self, quota: impl Fn(i32) -> usize) -> impl Iterator<Item = (i32, i64, &[u8])> {
        self.parts.iter().flat_map(move |p| {
            p.queue.iter().take(quota(p.partition)).map(move |(o, bytes)| (p.partition, *o, bytes.as_slice()))
        })
    }

    /// Marks the records of [`Self::step_records`] (same `quota`) as trained on.
    pub fn consume_step(&mut self, quota: impl Fn(i32) -> usize) {
        for p in &mut self.parts {
            let n = p.consume(quota(p.partition));
            self.stats.consumed += n as u64;
        }
        self.apply_backpressure();
    }

    /// `(partition, records behind the partition's end)` for every owned partition.
    /// Asks the broker (bounded by a short timeout); a partition it cannot answer for is left out.
    pub fn lag(&self) -> Vec<(i32, i64)> {
        self.parts
            .iter()
            .filter_map(|p| {
                let (_, high) = self
                    .consumer
                    .fetch_watermarks(&self.endpoint.topic, p.partition, Duration::from_millis(200))
                    .ok()?;
                Some((p.partition, (high - p.next).max(0)))
            })
            .collect()
    }

    /// Commits `offsets` (partition → next offset) to the consumer group, for monitoring
    /// tools. Training never reads them back: the checkpoint holds the offsets it resumes from.
    pub fn commit(&self, offsets: &[(i32, i64)]) -> Result<(), SourceError> {
        let mut list = TopicPartitionList::new();
        for &(p, o) in offsets {
            list.add_partition_offset(&self.endpoint.topic, p, Offset::Offset(o))
                .map_err(|e| kafka_error(&self.endpoint, "cannot commit offsets", e))?;
        }
        self.consumer
            .commit(&list, CommitMode::Sync)
            .map_err(|e| kafka_error(&self.endpoint, "cannot commit offsets", e))
    }

    /// The manifest keys and next offsets of the owned partitions, with the
    /// [`fingerprint`] of the record before each offset when known.
    pub fn offset_entries(&self) -> Vec<(String, i64, Option<u64>)> {
        self.parts.iter().map(|p| (offset_key(&self.endpoint.topic, p.partition), p.next, p.last)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(next: i64, expect: i64, end: Option<i64>) -> Part {
        let queue = (next..expect).map(|o| (o, o.to_string().into_bytes())).collect();
        Part { partition: 0, next, expect, end, queue, paused: false, last: Some(7), stale_position: false }
    }

    #[test]
    fn records_buffered_before_deleted_ones_are_kept_and_the_fetch_goes_on_at_the_oldest() {
        // Buffered 100..150, fetching at 150; retention deleted everything below 170.
        let mut p = part(100, 150, None);
        p.restart(170, 400, true);
        assert_eq!((p.next, p.expect, p.last), (100, 170, Some(7)), "the buffered records come first");
        assert_eq!(p.queue.iter().map(|(o, _)| *o).collect::<Vec<_>>(), (100..150).collect::<Vec<_>>());
        // Nothing buffered: the position itself moves, with no record known before it.
        let mut p = part(150, 150, Some(300));
        p.restart(170, 400, true);
        assert_eq!((p.next, p.expect, p.last, p.queue.len(), p.end), (170, 170, None, 0, Some(400)));
    }

    #[test]
    fn once_the_kept_records_are_consumed_the_position_is_the_restart() {
        // Buffered 100..150, restarted at 170 keeping them: a checkpoint taken once they
        // are consumed stores 170 (150..170 were deleted), with no record known before it.
        let mut p = part(100, 150, None);
        p.restart(170, 400, true);
        assert_eq!(p.consume(30), 30);
        assert_eq!((p.next, p.last.is_some()), (130, true), "records still buffered");
        assert_eq!(p.consume(100), 20);
        assert_eq!((p.next, p.expect, p.last, p.queue.len()), (170, 170, None, 0));
        // Consumed up to the offset fetched next: the record before it is known.
        let mut p = part(100, 150, None);
        assert_eq!(p.consume(50), 50);
        assert_eq!((p.next, p.last), (150, Some(fingerprint(b"149"))));
    }

    #[test]
    fn a_changed_log_drops_the_buffered_records() {
        let mut p = part(100, 150, Some(150));
        p.restart(0, 80, false);
        assert_eq!((p.next, p.expect, p.last, p.queue.len(), p.end), (0, 0, None, 0, Some(80)));
    }

    #[test]
    fn options_the_reader_depends_on_are_refused_naming_the_key() {
        let opts = |k: &str, v: &str| vec![("socket.timeout.ms".to_string(), "5000".to_string()), (k.into(), v.into())];
        for (key, value) in [
            ("auto.offset.reset", "earliest"),
            ("enable.partition.eof", "true"),
            ("enable.auto.offset.store", "true"),
            ("enable.auto.commit", "true"),
            ("group.id", "other"),
            ("bootstrap.servers", "10.0.0.1:9092"),
        ] {
            let e = check_options(&opts(key, value)).unwrap_err().to_string();
            assert!(e.contains("`kafka_option`") && e.contains(&format!("`{key}={value}`")), "{e}");
        }
        assert!(check_options(&opts("auto.offset.reset", "latest"))
            .unwrap_err()
            .to_string()
            .contains("--on-offset-reset"));
        assert!(check_options(&opts("group.id", "g")).unwrap_err().to_string().contains("--group"));
        // What tiderec leaves to the user, such as the isolation level, is accepted.
        assert!(check_options(&opts("isolation.level", "read_committed")).is_ok());
        assert!(check_options(&[]).is_ok());
    }
}
