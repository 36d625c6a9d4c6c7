//! A broker and a topic of payments for the benchmarks that read Kafka.

use std::path::Path;
use std::process::Command;

use rdkafka::producer::BaseRecord;
use weir_test_support::kafka;

use crate::service::Started;

/// The broker: the suite's (`WEIR_TEST_KAFKA_BOOTSTRAP`), or one started
/// for this run with `scripts/services/kafka.sh` and stopped when dropped.
pub struct Broker {
    /// Its address.
    pub bootstrap: String,
    _started: Option<Started>,
}

impl Broker {
    /// The suite's broker, or a new one.
    pub fn start() -> Broker {
        if let Ok(bootstrap) = std::env::var("WEIR_TEST_KAFKA_BOOTSTRAP") {
            return Broker {
                bootstrap,
                _started: None,
            };
        }
        let (started, exports) = Started::start("kafka");
        let bootstrap = exports
            .into_iter()
            .find_map(|(k, v)| (k == "WEIR_TEST_KAFKA_BOOTSTRAP").then_some(v))
            .expect("the broker's address");
        Broker {
            bootstrap,
            _started: Some(started),
        }
    }
}

/// A payment of about 200 bytes, as JSON.
pub fn payment(id: u64) -> String {
    let cents = (id * 7919) % 100_000;
    format!(
        r#"{{"event_id":{id},"ts":"2026-01-01T00:{:02}:{:02}Z","account_id":{},"merchant":"merchant-{:05}","amount":{}.{:02},"currency":"EUR","country":"DE","channel":"card-present","status":"authorised"}}"#,
        (id / 60) % 60,
        id % 60,
        id % 100_000,
        id % 20_000,
        cents / 100,
        cents % 100
    )
}

/// The payments' columns, as `weir stream --schema` takes them.
pub const PAYMENT_SCHEMA: &str = "event_id BIGINT NOT NULL, ts TIMESTAMP, account_id BIGINT, merchant STRING, \
                                  amount DECIMAL(18,2), currency STRING, country STRING, channel STRING, status STRING";

/// Writes payments `0..records` round-robin over `partitions` partitions
/// of `topic`; their bytes.
pub fn produce(bootstrap: &str, topic: &str, partitions: i32, records: u64) -> u64 {
    let producer = kafka::producer(
        bootstrap,
        &[
            ("linger.ms", "20"),
            ("batch.size", "1000000"),
            ("queue.buffering.max.kbytes", "262144"),
        ],
    );
    let mut bytes = 0;
    for id in 0..records {
        let value = payment(id);
        bytes += value.len() as u64;
        let partition = (id % partitions as u64) as i32;
        kafka::send(
            &producer,
            BaseRecord::<(), _>::to(topic).partition(partition).payload(&value),
        );
    }
    kafka::flush(&producer);
    bytes
}

/// `weir stream` (the binary `weir`) reading the whole of `topic` from its
/// start into a fresh `format` table `bench.payments` of the embedded
/// catalog under `dir` (checkpoint `dir/chk`), at most `per_batch`
/// records a batch on a 1 s trigger, values as `values` (`raw`, or `json`
/// parsed into [`PAYMENT_SCHEMA`]); it stops after the batches that hold
/// `records`, printing its progress as `progress` says.
#[allow(clippy::too_many_arguments)]
pub fn stream_command(
    weir: &Path,
    dir: &Path,
    bootstrap: &str,
    topic: &str,
    records: u64,
    per_batch: u64,
    format: &str,
    values: &str,
    progress: &str,
) -> Command {
    let schema = dir.join("payment.ddl");
    std::fs::create_dir_all(dir).expect("the run's directory");
    std::fs::write(&schema, PAYMENT_SCHEMA).expect("the schema's file");
    let mut command = Command::new(weir);
    command
        .arg("--lake")
        .arg(dir.join("weir-lake"))
        .args([
            "stream",
            "--from",
            "kafka",
            "--bootstrap-servers",
            bootstrap,
            "--topic",
            topic,
        ])
        .args(["--starting-offsets", "earliest"])
        .args(["--max-offsets-per-trigger", &per_batch.to_string()])
        .args(["--value-format", values]);
    if values == "json" {
        command.arg("--schema").arg(&schema);
    }
    command
        .args(["--to", "bench.payments", "--format", format, "--trigger-interval", "1s"])
        .args(["--max-batches", &records.div_ceil(per_batch).to_string()])
        .args(["--progress", progress, "--checkpoint"])
        .arg(dir.join("chk"))
        .env_remove("WEIR_CONFIG");
    command
}
