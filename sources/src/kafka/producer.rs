//! Writing records into a topic: topic creation and a rate-limited producer
//! behind `tiderec produce`.

use super::KafkaEndpoint;
use crate::SourceError;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn kafka_error(endpoint: &KafkaEndpoint, what: &str, e: impl std::fmt::Display) -> SourceError {
    SourceError::Kafka {
        brokers: endpoint.brokers.clone(),
        topic: endpoint.topic.clone(),
        reason: format!("{what}: {e}"),
    }
}

/// Creates the endpoint's topic with `partitions` partitions; an existing topic is left
/// as it is. Returns the number of partitions the topic has afterwards.
pub fn ensure_topic(endpoint: &KafkaEndpoint, partitions: usize) -> Result<usize, SourceError> {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", &endpoint.brokers).set("log_level", "0");
    // The producer's `--kafka-option`s (security, client id) apply to the admin client too.
    config.extend(endpoint.options.iter().cloned());
    let admin: AdminClient<DefaultClientContext> =
        config.create().map_err(|e| kafka_error(endpoint, "cannot create an admin client", e))?;
    let topic = NewTopic::new(&endpoint.topic, partitions as i32, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(endpoint.broker_timeout));
    let start = Instant::now();
    loop {
        let outcome = futures_executor::block_on(admin.create_topics([&topic], &options));
        match outcome {
            Ok(results) => match results.into_iter().next() {
                Some(Ok(_)) | Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) | None => break,
                Some(Err((_, code))) if start.elapsed() < endpoint.broker_timeout => {
                    eprintln!("kafka {}: creating topic {}: {code}; retrying", endpoint.brokers, endpoint.topic);
                    std::thread::sleep(Duration::from_millis(500));
                }
                Some(Err((_, code))) => return Err(kafka_error(endpoint, "cannot create the topic", code)),
            },
            Err(e) if start.elapsed() < endpoint.broker_timeout => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(kafka_error(endpoint, "cannot create the topic", e)),
        }
    }
    super::consumer::topic_partitions(endpoint)
}

/// Counts deliveries the broker acknowledged and those it failed.
#[derive(Clone, Default)]
struct Deliveries {
    delivered: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    first_failure: Arc<Mutex<Option<String>>>,
}

impl ClientContext for Deliveries {
    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, _fac: &str, _log_message: &str) {}
    fn error(&self, _error: KafkaError, _reason: &str) {}
}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _opaque: ()) {
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut f) = self.first_failure.lock() {
                    f.get_or_insert_with(|| e.to_string());
                }
            }
        }
    }
}

/// A producer that writes records to explicit partitions of one topic, at most
/// `rate` records per second (unlimited when `None`). Every record is acknowledged
/// by the broker (`acks=all`, idempotent) before [`RecordWriter::finish`] returns.
pub struct RecordWriter {
    producer: BaseProducer<Deliveries>,
    deliveries: Deliveries,
    endpoint: KafkaEndpoint,
    rate: Option<f64>,
    start: Instant,
    sent: u64,
}

impl RecordWriter {
    /// Connects to the endpoint (the topic must exist; see [`ensure_topic`]).
    pub fn new(endpoint: &KafkaEndpoint, rate: Option<f64>) -> Result<Self, SourceError> {
        let deliveries = Deliveries::default();
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &endpoint.brokers)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("message.timeout.ms", endpoint.broker_timeout.as_millis().max(1000).to_string())
            .set("log_level", "0");
        config.extend(endpoint.options.iter().cloned());
        let producer: BaseProducer<Deliveries> = config
            .create_with_context(deliveries.clone())
            .map_err(|e| kafka_error(endpoint, "cannot create a producer", e))?;
        Ok(RecordWriter { producer, deliveries, endpoint: endpoint.clone(), rate, start: Instant::now(), sent: 0 })
    }

    /// Queues `payload` for `partition`, waiting while the local queue is full or the rate
    /// limit is reached.
    pub fn send(&mut self, partition: i32, payload: &[u8]) -> Result<(), SourceError> {
        if let Some(rate) = self.rate {
            let due = Duration::from_secs_f64(self.sent as f64 / rate);
            let elapsed = self.start.elapsed();
            if due > elapsed {
                self.producer.poll(Duration::ZERO);
                std::thread::sleep(due - elapsed);
            }
        }
        let mut record = BaseRecord::<(), [u8]>::to(&self.endpoint.topic).partition(partition).payload(payload);
        loop {
            match self.producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => return Err(kafka_error(&self.endpoint, "cannot send a record", e)),
            }
        }
        self.sent += 1;
        if self.sent.is_multiple_of(1024) {
            self.producer.poll(Duration::ZERO);
            self.check_failures()?;
        }
        Ok(())
    }

    fn check_failures(&self) -> Result<(), SourceError> {
        if self.deliveries.failed.load(Ordering::Relaxed) > 0 {
            let first = self.deliveries.first_failure.lock().ok().and_then(|f| f.clone()).unwrap_or_default();
            return Err(kafka_error(
                &self.endpoint,
                "records were not delivered",
                format!("{} failed, first: {first}", self.deliveries.failed.load(Ordering::Relaxed)),
            ));
        }
        Ok(())
    }

    /// Records acknowledged by the broker so far.
    pub fn delivered(&self) -> u64 {
        self.deliveries.delivered.load(Ordering::Relaxed)
    }

    /// Waits until every queued record is acknowledged; returns the records delivered.
    pub fn finish(self) -> Result<u64, SourceError> {
        self.producer
            .flush(self.endpoint.broker_timeout)
            .map_err(|e| kafka_error(&self.endpoint, "cannot deliver the remaining records", e))?;
        self.check_failures()?;
        Ok(self.delivered())
    }
}
