//! A broker and a topic of payments for the benchmarks that read Kafka.

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
