//! The Kafka payments example under SIGKILL: a producer writes payments
//! while the example's three queries are killed at random moments; then
//! every payment is in the Delta table once (deltalake, DuckDB), every
//! high-value one in the Iceberg table once (pyiceberg, DuckDB), and every
//! alert once on the alerts topic for a read_committed consumer.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use rdkafka::producer::BaseRecord;
use weir_test_support::kill::kill_repeatedly;
use weir_test_support::readers::{iceberg, json_ids, python, read};
use weir_test_support::{assert_exactly_once, kafka};

const PAYMENTS: i64 = 20_000;
const KILLS: u32 = 20;

fn cents(id: i64) -> i64 {
    (id * 7919) % 100_000
}

fn produce(kafka: String, topic: String) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let producer = kafka::producer(&kafka, &[]);
        for chunk in (0..PAYMENTS).collect::<Vec<_>>().chunks(250) {
            for id in chunk {
                let c = cents(*id);
                let value = format!(
                    r#"{{"event_id":{id},"ts":{},"account_id":{},"amount":{}.{:02}}}"#,
                    1_767_225_600_000_000 + id * 1000,
                    id % 1000,
                    c / 100,
                    c % 100
                );
                let key = (id % 1000).to_string();
                kafka::send(&producer, BaseRecord::to(&topic).key(&key).payload(&value));
            }
            kafka::flush(&producer);
            std::thread::sleep(Duration::from_millis(80));
        }
    })
}

/// Every event id on `topic`, read with `isolation`.
fn alert_ids(kafka: &str, topic: &str, isolation: &str) -> Vec<i64> {
    kafka::read_all(kafka, topic, isolation)
        .iter()
        .map(|(_, value)| {
            let v: serde_json::Value = serde_json::from_str(value).unwrap();
            v["event_id"].as_i64().unwrap()
        })
        .collect()
}

fn example(lake: &Path, kafka: &str, topic: &str, alerts: &str, markers: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kafka-payments"));
    c.arg("--lake").arg(lake).args([
        "--bootstrap-servers",
        kafka,
        "--topic",
        topic,
        "--alerts-topic",
        alerts,
        "--marker-topic",
        markers,
        "--trigger-interval-ms",
        "200",
    ]);
    c
}

#[test]
fn three_sinks_from_kafka_hold_each_payment_once_through_kills() {
    let Some(kafka) = kafka::bootstrap() else { return };
    if python().is_none() {
        return;
    }
    let (topic, alerts) = (
        kafka::create_topic(&kafka, "payments", 4),
        kafka::create_topic(&kafka, "alerts", 1),
    );
    let markers = format!("markers-{}", uuid::Uuid::new_v4().simple());
    let lake = tempfile::tempdir().unwrap();
    let producer = produce(kafka.clone(), topic.clone());
    let ended = kill_repeatedly(
        || {
            example(lake.path(), &kafka, &topic, &alerts, &markers)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        },
        KILLS,
        300..1500,
    );
    assert_eq!(ended, 0, "without --available-now the example runs until it is stopped");
    producer.join().unwrap();
    let out = example(lake.path(), &kafka, &topic, &alerts, &markers)
        .arg("--available-now")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let want = |from: i64| -> Vec<i64> { (0..PAYMENTS).filter(|i| cents(*i) >= from).collect() };
    let bronze = lake.path().join("warehouse/bronze/payments");
    for reader in ["deltalake", "duckdb"] {
        let got = json_ids(&read(&["ids", reader, bronze.to_str().unwrap()]).expect("readers"));
        assert_exactly_once(&got, 0..PAYMENTS);
    }
    let db = lake.path().join("catalog.db");
    for reader in ["pyiceberg", "duckdb"] {
        let mut got = json_ids(&iceberg(&["ids", reader, db.to_str().unwrap(), "risk.high_value"]).expect("readers"));
        got.sort_unstable();
        assert_eq!(got, want(90_000), "{reader}: the high-value payments, once each");
    }
    let mut committed = alert_ids(&kafka, &alerts, "read_committed");
    committed.sort_unstable();
    assert_eq!(
        committed,
        want(99_000),
        "every alert once for a read_committed consumer"
    );
    let all = alert_ids(&kafka, &alerts, "read_uncommitted");
    assert!(all.len() >= committed.len());
    eprintln!(
        "{KILLS} kills; alerts: {} committed, {} in the log with aborted attempts",
        committed.len(),
        all.len()
    );
}

#[test]
fn produce_fills_the_topic_with_the_rate_sources_payments() {
    let Some(kafka) = kafka::bootstrap() else { return };
    if python().is_none() {
        return;
    }
    let (topic, alerts) = (
        kafka::create_topic(&kafka, "payments", 2),
        kafka::create_topic(&kafka, "alerts", 1),
    );
    let markers = format!("markers-{}", uuid::Uuid::new_v4().simple());
    let lake = tempfile::tempdir().unwrap();
    let out = example(lake.path(), &kafka, &topic, &alerts, &markers)
        .args(["--produce", "3000", "--available-now"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bronze = lake.path().join("warehouse/bronze/payments");
    let got = read(&["ids", "deltalake", bronze.to_str().unwrap()]).expect("readers");
    assert_exactly_once(&json_ids(&got), 0..3000);
    // The amounts came through JSON as the rate source made them.
    assert_eq!(
        got["amount_cents"].as_i64(),
        Some(weir_test_support::readers::rate_amount_cents(3000))
    );
    let mut alerted = alert_ids(&kafka, &alerts, "read_committed");
    alerted.sort_unstable();
    assert_eq!(alerted, (0..3000).filter(|i| cents(*i) >= 99_000).collect::<Vec<_>>());
}
