//! The test broker `scripts/services/kafka.sh` starts (feature `kafka`):
//! its address, new topics, and every record of a topic read back by a plain
//! librdkafka consumer, independent of weir's reader.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::ToBytes;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::TopicPartitionList;

/// The broker's address (`WEIR_TEST_KAFKA_BOOTSTRAP`), or `None` with a
/// notice outside CI when no broker runs. In CI one must.
pub fn bootstrap() -> Option<String> {
    crate::service("WEIR_TEST_KAFKA_BOOTSTRAP")
}

/// The broker's SASL listener (`WEIR_TEST_KAFKA_SASL_BOOTSTRAP`; user
/// `weir`, password `weir-secret`), as [`bootstrap`].
pub fn sasl_bootstrap() -> Option<String> {
    crate::service("WEIR_TEST_KAFKA_SASL_BOOTSTRAP")
}

/// The admin client of the broker at `bootstrap`.
pub fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client")
}

/// Runs an admin call to its end, from a runtime or outside one.
pub fn block_on<F: std::future::Future + Send>(future: F) -> F::Output
where
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime")
                .block_on(future)
        })
        .join()
        .expect("the admin call")
    })
}

/// A new topic named `prefix-<unique>` with `partitions` partitions.
pub fn create_topic(bootstrap: &str, prefix: &str, partitions: i32) -> String {
    let name = format!("{prefix}-{}", uuid::Uuid::new_v4().simple());
    let admin = admin(bootstrap);
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let topics = [NewTopic::new(&name, partitions, TopicReplication::Fixed(1))];
    for r in block_on(admin.create_topics(&topics, &options)).expect("create topic") {
        r.expect("topic created");
    }
    name
}

/// A producer with `extra` settings.
pub fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> BaseProducer {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap).set("linger.ms", "5");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    config.create().expect("producer")
}

/// Sends `record`, waiting while the producer's queue is full.
pub fn send<K, P>(producer: &BaseProducer, mut record: BaseRecord<'_, K, P>)
where
    K: ToBytes + ?Sized,
    P: ToBytes + ?Sized,
{
    loop {
        match producer.send(record) {
            Ok(()) => return,
            Err((e, back)) if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) => {
                producer.poll(Duration::from_millis(10));
                record = back;
            }
            Err((e, _)) => panic!("send: {e}"),
        }
    }
}

/// Waits until the broker has every record sent.
pub fn flush(producer: &BaseProducer) {
    producer.flush(Duration::from_secs(60)).expect("flush");
}

/// A record as [`read_all`] reads it, key and value as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub topic: String,
    pub partition: i32,
    pub key: Option<String>,
    pub value: String,
    /// Each header's key and value.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// Every record of `topic` from its beginning to its end, read by a plain
/// consumer with `isolation` (`read_committed` or `read_uncommitted`).
pub fn read_all(bootstrap: &str, topic: &str, isolation: &str) -> Vec<Record> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "weir-test-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .create()
        .expect("consumer");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let mut tpl = TopicPartitionList::new();
    let mut ends = HashMap::new();
    for p in metadata.topics()[0].partitions() {
        let (low, high) = consumer
            .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
            .expect("watermarks");
        if low < high {
            tpl.add_partition_offset(topic, p.id(), rdkafka::Offset::Offset(low))
                .unwrap();
            ends.insert(p.id(), high);
        }
    }
    let mut out = Vec::new();
    if ends.is_empty() {
        return out;
    }
    consumer.assign(&tpl).expect("assign");
    let started = Instant::now();
    while !ends.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "reading {topic} took too long"
        );
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.expect("a record");
            let headers = m.headers().map_or_else(Vec::new, |h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                    .collect()
            });
            out.push(Record {
                topic: topic.to_string(),
                partition: m.partition(),
                key: m.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                value: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                headers,
            });
            if m.offset() + 1 >= ends[&m.partition()] {
                ends.remove(&m.partition());
            }
        }
        // Transaction markers end a partition without a record.
        let position = consumer.position().expect("position");
        ends.retain(|p, end| {
            position
                .find_partition(topic, *p)
                .and_then(|e| e.offset().to_raw())
                .is_none_or(|o| o < *end)
        });
    }
    out
}
