//! The Kafka payments example under SIGKILL: a producer writes payments
//! while the example's three queries are killed at random moments; then
//! every payment is in the Delta table once (deltalake, DuckDB), every
//! high-value one in the Iceberg table once (pyiceberg, DuckDB), and every
//! alert once on the alerts topic for a read_committed consumer.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::TopicPartitionList;
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::{iceberg, json_ids, python, read};

const PAYMENTS: i64 = 20_000;
const KILLS: u32 = 20;

fn cents(id: i64) -> i64 {
    (id * 7919) % 100_000
}

fn create_topics(kafka: &str, names: &[&str], partitions: i32) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", kafka).create().unwrap();
    let topics: Vec<NewTopic> = names
        .iter()
        .map(|n| NewTopic::new(n, partitions, TopicReplication::Fixed(1)))
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for r in rt.block_on(admin.create_topics(&topics, &AdminOptions::new())).unwrap() {
        r.unwrap();
    }
}

fn produce(kafka: String, topic: String) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &kafka)
            .set("linger.ms", "5")
            .create()
            .unwrap();
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
                producer
                    .send(BaseRecord::to(&topic).key(&key).payload(&value))
                    .map_err(|(e, _)| e)
                    .unwrap();
            }
            producer.flush(Duration::from_secs(30)).unwrap();
            std::thread::sleep(Duration::from_millis(80));
        }
    })
}

/// Every event id on `topic`, read with `isolation`.
fn alert_ids(kafka: &str, topic: &str, isolation: &str) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka)
        .set("group.id", "weir-test-reader")
        .set("isolation.level", isolation)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let (low, high) = consumer.fetch_watermarks(topic, 0, Duration::from_secs(10)).unwrap();
    let mut ids = Vec::new();
    if low == high {
        return ids;
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, rdkafka::Offset::Offset(low))
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let started = std::time::Instant::now();
    loop {
        assert!(started.elapsed() < Duration::from_secs(60));
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            let v: serde_json::Value = serde_json::from_slice(m.payload().unwrap()).unwrap();
            ids.push(v["event_id"].as_i64().unwrap());
            if m.offset() + 1 >= high {
                break;
            }
        }
        let pos = consumer.position().unwrap();
        if pos
            .find_partition(topic, 0)
            .and_then(|e| e.offset().to_raw())
            .is_some_and(|o| o >= high)
        {
            break;
        }
    }
    ids
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
    let Some(kafka) = std::env::var("WEIR_TEST_KAFKA_BOOTSTRAP").ok() else {
        assert!(std::env::var_os("CI").is_none(), "scripts/test.sh starts Kafka");
        return;
    };
    if python().is_none() {
        return;
    }
    let run = uuid::Uuid::new_v4().simple().to_string();
    let (topic, alerts, markers) = (
        format!("payments-{run}"),
        format!("alerts-{run}"),
        format!("markers-{run}"),
    );
    create_topics(&kafka, &[&topic], 4);
    create_topics(&kafka, &[&alerts], 1);
    let lake = tempfile::tempdir().unwrap();
    let producer = produce(kafka.clone(), topic.clone());
    let (mut killed, mut seed) = (0, 0x9e37_79b9_u64);
    while killed < KILLS {
        let mut child = example(lake.path(), &kafka, &topic, &alerts, &markers)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        std::thread::sleep(Duration::from_millis(300 + (seed >> 33) % 1200));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            killed += 1;
        }
        let status = child.wait().unwrap();
        assert!(status.code().is_none(), "the example stopped by itself: {status}");
    }
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
        "{killed} kills; alerts: {} committed, {} in the log with aborted attempts",
        committed.len(),
        all.len()
    );
}
