//! `weir stream --from kafka` on the real broker: a producer writes while the
//! command is killed at random moments; every id lands once, read back by
//! the format's Python reader and by DuckDB.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::BaseRecord;
pub(crate) use weir_test_support::kafka::bootstrap;
use weir_test_support::kill::kill_repeatedly;
use weir_test_support::readers::{iceberg, json_ids, rate_amount_cents, read};
use weir_test_support::{assert_exactly_once, kafka};

use crate::common::{failure, lake_with_readers, last_committed, ok, weir};

const RECORDS: i64 = 20_000;
const PARTITIONS: i32 = 4;
const KILLS: u32 = 30;

/// Writes payments with ids `ids` as JSON, spread over the partitions,
/// `chunk` at a time with `pause` between chunks.
pub(crate) fn produce_payments(kafka: &str, topic: &str, ids: std::ops::Range<i64>, chunk: usize, pause: Duration) {
    let producer = kafka::producer(kafka, &[]);
    for chunk in ids.collect::<Vec<_>>().chunks(chunk) {
        for id in chunk {
            let cents = (id * 7919) % 100_000;
            let value = format!(
                "{{\"event_id\":{id},\"amount\":{}.{:02},\"merchant\":\"m{}\"}}",
                cents / 100,
                cents % 100,
                id % 17
            );
            let partition = (*id % PARTITIONS as i64) as i32;
            kafka::send(
                &producer,
                BaseRecord::<(), _>::to(topic).partition(partition).payload(&value),
            );
        }
        kafka::flush(&producer);
        std::thread::sleep(pause);
    }
}

/// The columns of those payments, in DDL, in a file under `dir`.
pub(crate) fn payment_schema(dir: &Path) -> String {
    let schema = dir.join("payment.ddl");
    std::fs::write(
        &schema,
        "event_id BIGINT NOT NULL, amount DECIMAL(18,2), merchant STRING",
    )
    .unwrap();
    schema.to_str().unwrap().to_string()
}

/// Writes ids `0..RECORDS` in the background, a few hundred at a time.
fn produce(kafka: String, topic: String, done: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        produce_payments(&kafka, &topic, 0..RECORDS, 200, Duration::from_millis(60));
        done.store(true, Ordering::SeqCst);
    })
}

fn stream_args<'a>(kafka: &'a str, topic: &'a str, table: &'a str, format: &'a str, schema: &'a str) -> Vec<&'a str> {
    vec![
        "stream",
        "--from",
        "kafka",
        "--bootstrap-servers",
        kafka,
        "--topic",
        topic,
        "--starting-offsets",
        "earliest",
        "--max-offsets-per-trigger",
        "500",
        "--value-format",
        "json",
        "--schema",
        schema,
        "--keep-kafka-columns",
        "partition,offset",
        "--to",
        table,
        "--format",
        format,
        "--checkpoint",
        "chk",
        "--progress",
        "none",
    ]
}

/// Streams the topic into `table`, killing the command `KILLS` times at
/// moments of a fixed pseudo-random sequence while the producer writes; then
/// drains it with `--available-now`.
fn stream_through_kills(lake: &Path, kafka: &str, table: &str, format: &str) {
    let topic = create_topic(kafka, table);
    let schema = payment_schema(lake);
    let args = stream_args(kafka, &topic, table, format, &schema);
    let done = Arc::new(AtomicBool::new(false));
    let producer = produce(kafka.to_string(), topic.clone(), done.clone());
    kill_repeatedly(
        || {
            let mut weir = weir(lake);
            weir.args(&args);
            weir
        },
        KILLS,
        80..780,
    );
    producer.join().unwrap();
    assert!(done.load(Ordering::SeqCst));
    let before = last_committed(lake, "chk");
    eprintln!("{format}: {KILLS} kills, batches 0..={before:?} committed before the drain");
    // The kills fell on a working stream, not on idle or starting ones.
    assert!(
        before.is_some_and(|b| b >= 20),
        "only batches 0..={before:?} committed between kills"
    );
    let mut drain = args.clone();
    drain.push("--available-now");
    ok(lake, &drain);
}

#[test]
fn kafka_into_delta_lands_every_id_once_through_thirty_kills() {
    let Some(kafka) = bootstrap() else { return };
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    stream_through_kills(lake, &kafka, "bronze.payments", "delta");
    let table = lake.join("weir-lake/warehouse/bronze/payments");
    for reader in ["deltalake", "duckdb"] {
        let out = read(&["ids", reader, table.to_str().unwrap()]).expect("readers present");
        assert_exactly_once(&json_ids(&out), 0..RECORDS);
        assert_eq!(
            out["amount_cents"].as_i64(),
            Some(rate_amount_cents(RECORDS)),
            "{reader}"
        );
    }
}

#[test]
fn kafka_into_iceberg_lands_every_id_once_through_thirty_kills() {
    let Some(kafka) = bootstrap() else { return };
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    stream_through_kills(lake, &kafka, "bronze.payments", "iceberg");
    let db = lake.join("weir-lake/catalog.db");
    for reader in ["pyiceberg", "duckdb"] {
        let out = iceberg(&["ids", reader, db.to_str().unwrap(), "bronze.payments"]).expect("readers present");
        assert_exactly_once(&json_ids(&out), 0..RECORDS);
        assert_eq!(
            out["amount_cents"].as_i64(),
            Some(rate_amount_cents(RECORDS)),
            "{reader}"
        );
    }
}

#[test]
fn kafka_options_that_cannot_work_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path();
    let base = ["stream", "--from", "kafka", "--to", "bronze.k", "--checkpoint", "chk"];
    let e = failure(lake, &base);
    assert!(e.contains("--bootstrap-servers"), "{e}");
    let with = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(&["--bootstrap-servers", "127.0.0.1:1"]);
        a.extend_from_slice(extra);
        failure(lake, &a)
    };
    assert!(with(&[]).contains("--topic"));
    assert!(with(&["--topic", "t", "--value-format", "json"]).contains("--schema FILE"));
    assert!(with(&["--topic", "t", "--keep-kafka-columns", "offset"]).contains("need --value-format json"));
    let e = with(&["--topic", "t", "--kafka-option", "sasl.password:hunter2"]);
    assert!(e.contains("key=value") && !e.contains("hunter2"), "{e}");
    let e = with(&["--topic", "t", "--starting-offsets", "{\"t\": [1]}"]);
    assert!(e.contains("{\"topic\": {\"0\": 42}}"), "{e}");
}

/// A new topic of [`PARTITIONS`] partitions.
pub(crate) fn create_topic(kafka: &str, prefix: &str) -> String {
    kafka::create_topic(kafka, prefix, PARTITIONS)
}
