//! The Kafka payments example under SIGKILL: a producer writes payments
//! while the example's three queries are killed at random moments; then
//! every payment is in the Delta table once (deltalake, DuckDB), every
//! high-value one in the Iceberg table once (pyiceberg, DuckDB), and every
//! alert once on the alerts topic for a read_committed consumer.

use std::process::Command;
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

/// One run of the example: its topics on the test broker and its lake.
struct Run {
    kafka: String,
    topic: String,
    alerts: String,
    markers: String,
    lake: tempfile::TempDir,
}

impl Run {
    /// New topics (payments in `partitions` partitions), or `None` when the
    /// broker or the readers are missing outside CI.
    fn new(partitions: i32) -> Option<Run> {
        let kafka = kafka::bootstrap()?;
        python()?;
        Some(Run {
            topic: kafka::create_topic(&kafka, "payments", partitions),
            alerts: kafka::create_topic(&kafka, "alerts", 1),
            markers: format!("markers-{}", uuid::Uuid::new_v4().simple()),
            lake: tempfile::tempdir().unwrap(),
            kafka,
        })
    }

    fn example(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_kafka-payments"));
        c.arg("--lake").arg(self.lake.path()).args([
            "--bootstrap-servers",
            &self.kafka,
            "--topic",
            &self.topic,
            "--alerts-topic",
            &self.alerts,
            "--marker-topic",
            &self.markers,
            "--trigger-interval-ms",
            "200",
        ]);
        c
    }

    /// Every alert's event id, for a consumer reading with `isolation`.
    fn alert_ids(&self, isolation: &str) -> Vec<i64> {
        let mut ids: Vec<i64> = kafka::read_all(&self.kafka, &self.alerts, isolation)
            .iter()
            .map(|r| {
                let v: serde_json::Value = serde_json::from_str(&r.value).unwrap();
                v["event_id"].as_i64().unwrap()
            })
            .collect();
        ids.sort_unstable();
        ids
    }

    fn bronze(&self) -> String {
        self.lake.path().join("warehouse/bronze/payments").display().to_string()
    }
}

/// The ids below `n` whose amount is at least `cents`.
fn at_least(n: i64, cents_from: i64) -> Vec<i64> {
    (0..n).filter(|i| cents(*i) >= cents_from).collect()
}

#[test]
fn three_sinks_from_kafka_hold_each_payment_once_through_kills() {
    let Some(run) = Run::new(4) else { return };
    let producer = produce(run.kafka.clone(), run.topic.clone());
    let ended = kill_repeatedly(|| run.example(), KILLS, 300..1500);
    assert_eq!(ended, 0, "without --available-now the example runs until it is stopped");
    producer.join().unwrap();
    let out = run.example().arg("--available-now").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    for reader in ["deltalake", "duckdb"] {
        let got = json_ids(&read(&["ids", reader, &run.bronze()]).expect("readers"));
        assert_exactly_once(&got, 0..PAYMENTS);
    }
    let db = run.lake.path().join("catalog.db");
    for reader in ["pyiceberg", "duckdb"] {
        let mut got = json_ids(&iceberg(&["ids", reader, db.to_str().unwrap(), "risk.high_value"]).expect("readers"));
        got.sort_unstable();
        assert_eq!(
            got,
            at_least(PAYMENTS, 90_000),
            "{reader}: the high-value payments, once each"
        );
    }
    let committed = run.alert_ids("read_committed");
    assert_eq!(
        committed,
        at_least(PAYMENTS, 99_000),
        "every alert once for a read_committed consumer"
    );
    let all = run.alert_ids("read_uncommitted");
    assert!(all.len() >= committed.len());
    eprintln!(
        "{KILLS} kills; alerts: {} committed, {} in the log with aborted attempts",
        committed.len(),
        all.len()
    );
}

#[test]
fn produce_fills_the_topic_with_the_rate_sources_payments() {
    let Some(run) = Run::new(2) else { return };
    let out = run
        .example()
        .args(["--produce", "3000", "--available-now"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got = read(&["ids", "deltalake", &run.bronze()]).expect("readers");
    assert_exactly_once(&json_ids(&got), 0..3000);
    // The amounts came through JSON as the rate source made them.
    assert_eq!(
        got["amount_cents"].as_i64(),
        Some(weir_test_support::readers::rate_amount_cents(3000))
    );
    assert_eq!(run.alert_ids("read_committed"), at_least(3000, 99_000));
}
