//! The test broker: topics made and changed with the admin client, records
//! produced with ids in their values.

use std::time::Duration;

use arrow_array::{Array, BinaryArray, Int32Array, Int64Array, RecordBatch};
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::TopicPartitionList;

/// The broker's address, or `None` (with a notice) outside CI when no broker
/// runs. In CI one must.
pub fn bootstrap() -> Option<String> {
    let found = std::env::var("WEIR_TEST_KAFKA_BOOTSTRAP").ok();
    assert!(
        found.is_some() || std::env::var_os("CI").is_none(),
        "WEIR_TEST_KAFKA_BOOTSTRAP is not set; scripts/test.sh starts Kafka and sets it"
    );
    if found.is_none() {
        eprintln!("no Kafka broker (WEIR_TEST_KAFKA_BOOTSTRAP); scripts/services/kafka.sh starts one");
    }
    found
}

fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client")
}

/// A new topic with a unique name and `partitions` partitions.
pub async fn topic(bootstrap: &str, prefix: &str, partitions: i32) -> String {
    let name = format!("{prefix}-{}", uuid::Uuid::new_v4().simple());
    let results = admin(bootstrap)
        .create_topics(
            &[NewTopic::new(&name, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .expect("create topic");
    for r in results {
        r.expect("topic created");
    }
    name
}

/// Grows `topic` to `total` partitions.
pub async fn add_partitions(bootstrap: &str, topic: &str, total: usize) {
    for r in admin(bootstrap)
        .create_partitions(&[NewPartitions::new(topic, total)], &AdminOptions::new())
        .await
        .expect("create partitions")
    {
        r.expect("partitions added");
    }
}

/// Deletes `topic`.
pub async fn delete_topic(bootstrap: &str, topic: &str) {
    for r in admin(bootstrap)
        .delete_topics(&[topic], &AdminOptions::new())
        .await
        .expect("delete topic")
    {
        r.expect("topic deleted");
    }
}

/// Deletes the records of `topic`'s `partition` before `offset`, as retention
/// would.
pub async fn delete_records_before(bootstrap: &str, topic: &str, partition: i32, offset: i64) {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset))
        .unwrap();
    admin(bootstrap)
        .delete_records(&tpl, &AdminOptions::new())
        .await
        .expect("delete records");
}

pub fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> BaseProducer {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap).set("linger.ms", "5");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    config.create().expect("producer")
}

/// Sends records with ids `ids` (value `{"id": N}`, key `kN`) to `partition`
/// of `topic`, and waits until the broker has them all.
pub fn produce(producer: &BaseProducer, topic: &str, partition: i32, ids: impl IntoIterator<Item = i64>) {
    for id in ids {
        let value = format!("{{\"id\":{id}}}");
        let key = format!("k{id}");
        let mut record = BaseRecord::to(topic).partition(partition).payload(&value).key(&key);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((e, r)) if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) => {
                    producer.poll(Duration::from_millis(10));
                    record = r;
                }
                Err((e, _)) => panic!("send: {e}"),
            }
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
}

/// Sends `ids` to `partition` of `topic` and flushes, with a new producer.
pub fn send(bootstrap: &str, topic: &str, partition: i32, ids: impl IntoIterator<Item = i64>) {
    produce(&producer(bootstrap, &[]), topic, partition, ids);
}

/// The `id` in each record's value, with its partition and offset.
pub fn records(batches: &[RecordBatch]) -> Vec<(i64, i32, i64)> {
    let mut out = Vec::new();
    for b in batches {
        let value = b
            .column_by_name("value")
            .unwrap()
            .as_any()
            .downcast_ref::<BinaryArray>()
            .unwrap();
        let partition = b
            .column_by_name("partition")
            .unwrap()
            .as_any()
            .downcast_ref::<Int32Array>()
            .unwrap();
        let offset = b
            .column_by_name("offset")
            .unwrap()
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        for i in 0..b.num_rows() {
            assert!(!value.is_null(i));
            let v: serde_json::Value = serde_json::from_slice(value.value(i)).expect("json value");
            out.push((v["id"].as_i64().expect("id"), partition.value(i), offset.value(i)));
        }
    }
    out
}

/// The ids in `batches`.
pub fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    records(batches).into_iter().map(|(id, _, _)| id).collect()
}

/// Every record of `topic` from its beginning to its end, as `(key, value)`
/// strings, read by a plain consumer with `isolation`
/// (`read_committed` or `read_uncommitted`).
pub fn consume_all(bootstrap: &str, topic: &str, isolation: &str) -> Vec<(Option<String>, String)> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "weir-test-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .create()
        .unwrap();
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    let mut tpl = TopicPartitionList::new();
    let mut ends = std::collections::HashMap::new();
    for p in metadata.topics()[0].partitions() {
        let (low, high) = consumer
            .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
            .unwrap();
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
    consumer.assign(&tpl).unwrap();
    let started = std::time::Instant::now();
    while !ends.is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "reading {topic} took too long"
        );
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
            out.push((
                key,
                String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
            ));
            if m.offset() + 1 >= ends[&m.partition()] {
                ends.remove(&m.partition());
            }
        }
        let position = consumer.position().unwrap();
        ends.retain(|p, end| {
            position
                .find_partition(topic, *p)
                .and_then(|e| e.offset().to_raw())
                .is_none_or(|o| o < *end)
        });
    }
    out
}
