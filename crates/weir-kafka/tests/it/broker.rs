//! The test broker: topics made and changed with the admin client, records
//! produced with ids in their values.

use arrow_array::{Array, BinaryArray, Int32Array, Int64Array, RecordBatch};
use rdkafka::admin::{AdminOptions, NewPartitions};
use rdkafka::producer::{BaseProducer, BaseRecord};
use rdkafka::TopicPartitionList;
use weir_test_support::kafka::{admin, flush};
pub use weir_test_support::kafka::{bootstrap, producer, read_all, sasl_bootstrap};

/// A new topic with a unique name and `partitions` partitions.
pub fn topic(bootstrap: &str, prefix: &str, partitions: i32) -> String {
    weir_test_support::kafka::create_topic(bootstrap, prefix, partitions)
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

/// Sends records with ids `ids` (value `{"id": N}`, key `kN`) to `partition`
/// of `topic`, and waits until the broker has them all.
pub fn produce(producer: &BaseProducer, topic: &str, partition: i32, ids: impl IntoIterator<Item = i64>) {
    for id in ids {
        let value = format!("{{\"id\":{id}}}");
        let key = format!("k{id}");
        weir_test_support::kafka::send(
            producer,
            BaseRecord::to(topic).partition(partition).payload(&value).key(&key),
        );
    }
    flush(producer);
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
