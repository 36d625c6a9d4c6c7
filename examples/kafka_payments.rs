//! One stream of payments from Kafka, three sinks, each with its own
//! checkpoint, on the embedded default lake (`--lake DIR`, default
//! `./weir-lake`):
//!
//! - `lake.bronze.payments`: every payment, landed in a Delta table;
//! - `lake.risk.high_value`: payments of 900.00 or more, in an Iceberg table
//!   partitioned by day;
//! - the alerts topic: payments of 990.00 or more as JSON keyed by account,
//!   written exactly once for read_committed consumers (one Kafka
//!   transaction per batch).
//!
//! Payments are JSON objects `{"event_id", "ts", "account_id", "amount"}`
//! on the payments topic. `--produce N` first writes payments with ids
//! `0..N` (amounts as the rate source makes them), so the example can be
//! tried on an empty topic:
//!
//! ```text
//! cargo run --release -p weir-examples --bin kafka-payments -- \
//!     --bootstrap-servers 127.0.0.1:9092 --produce 10000 --available-now
//! ```
//!
//! Without `--available-now` the three queries run every `--trigger-interval`
//! (default 1s) until Ctrl-C.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Int64Type};
use arrow_array::{BooleanArray, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use weir::catalog::{Catalogs, Config};
use weir::kafka::{Guarantee, KafkaSink, KafkaSource, StartingOffsets, ValueColumns};
use weir::prelude::*;

const BRONZE: &str = "lake.bronze.payments";
const RISK: &str = "lake.risk.high_value";
/// Cents from which a payment is high-value, and from which it raises an
/// alert.
const HIGH_VALUE: i128 = 90_000;
const ALERT: i128 = 99_000;

struct Options {
    lake: PathBuf,
    servers: String,
    topic: String,
    alerts: String,
    markers: String,
    produce: u64,
    available_now: bool,
    interval: Duration,
}

fn options() -> Result<Options, BoxError> {
    let mut o = Options {
        lake: PathBuf::from("weir-lake"),
        servers: "127.0.0.1:9092".into(),
        topic: "payments".into(),
        alerts: "payment-alerts".into(),
        markers: weir::kafka::DEFAULT_MARKER_TOPIC.into(),
        produce: 0,
        available_now: false,
        interval: Duration::from_secs(1),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--lake" => o.lake = PathBuf::from(value()?),
            "--bootstrap-servers" => o.servers = value()?,
            "--topic" => o.topic = value()?,
            "--alerts-topic" => o.alerts = value()?,
            "--marker-topic" => o.markers = value()?,
            "--produce" => o.produce = value()?.parse()?,
            "--trigger-interval-ms" => o.interval = Duration::from_millis(value()?.parse()?),
            "--available-now" => o.available_now = true,
            _ => {
                return Err("usage: kafka-payments [--lake DIR] [--bootstrap-servers HOSTS] [--topic T] \
                            [--alerts-topic T] [--marker-topic T] [--produce N] [--trigger-interval-ms MS] [--available-now]"
                    .into())
            }
        }
    }
    Ok(o)
}

/// Payment `id`'s amount in cents, as the rate source makes it.
fn cents(id: i64) -> i64 {
    (id * 7919) % 100_000
}

/// Writes payments `0..n` to the topic, spread over its partitions.
fn produce(o: &Options) -> Result<(), BoxError> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &o.servers)
        .set("linger.ms", "5")
        .create()?;
    for id in 0..o.produce as i64 {
        let (c, ts) = (cents(id), 1_767_225_600_000_000 + id * 1000);
        let value = format!(
            r#"{{"event_id":{id},"ts":{ts},"account_id":{},"amount":{}.{:02}}}"#,
            id % 1000,
            c / 100,
            c % 100
        );
        let key = (id % 1000).to_string();
        let mut record = BaseRecord::to(&o.topic).key(&key).payload(&value);
        while let Err((e, back)) = producer.send(record) {
            if e.rdkafka_error_code() != Some(rdkafka::types::RDKafkaErrorCode::QueueFull) {
                return Err(e.into());
            }
            producer.poll(Duration::from_millis(10));
            record = back;
        }
    }
    producer.flush(Duration::from_secs(60))?;
    println!("produced {} payments to {}", o.produce, o.topic);
    Ok(())
}

/// The payments topic, read from its beginning, values parsed.
fn payments(o: &Options) -> Result<ReadStream, BoxError> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("event_id", DataType::Int64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            false,
        ),
        Field::new("account_id", DataType::Int64, false),
        Field::new("amount", DataType::Decimal128(18, 2), false),
    ]));
    let source = KafkaSource::subscribe(&o.servers, [o.topic.as_str()])
        .starting_offsets(StartingOffsets::Earliest)
        .max_offsets_per_trigger(50_000)
        .value_columns(ValueColumns::json(schema))?;
    Ok(read_stream(source))
}

/// The payments of `batch` whose amount is at least `cents`.
fn at_least(batch: RecordBatch, cents: i128) -> Result<RecordBatch, BoxError> {
    let amounts = batch
        .column_by_name("amount")
        .ok_or("no amount")?
        .as_primitive::<Decimal128Type>();
    let keep: BooleanArray = amounts.iter().map(|a| Some(a.is_some_and(|a| a >= cents))).collect();
    Ok(arrow_select::filter::filter_record_batch(&batch, &keep)?)
}

/// Alerts as Kafka records: key the account, value the payment as JSON.
fn as_alerts(batch: RecordBatch) -> Result<RecordBatch, BoxError> {
    let batch = at_least(batch, ALERT)?;
    let ids = batch
        .column_by_name("event_id")
        .ok_or("no event_id")?
        .as_primitive::<Int64Type>();
    let accounts = batch
        .column_by_name("account_id")
        .ok_or("no account_id")?
        .as_primitive::<Int64Type>();
    let amounts = batch
        .column_by_name("amount")
        .ok_or("no amount")?
        .as_primitive::<Decimal128Type>();
    let keys: StringArray = accounts.values().iter().map(|a| Some(a.to_string())).collect();
    let values: StringArray = (0..batch.num_rows())
        .map(|i| {
            let c = amounts.value(i);
            Some(format!(
                r#"{{"event_id":{},"account_id":{},"amount":{}.{:02}}}"#,
                ids.value(i),
                accounts.value(i),
                c / 100,
                c % 100
            ))
        })
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Utf8, false),
    ]));
    Ok(RecordBatch::try_new(schema, vec![Arc::new(keys), Arc::new(values)])?)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter("warn")
        .with_writer(std::io::stderr)
        .init();
    let o = options()?;
    if o.produce > 0 {
        produce(&o)?;
    }
    let catalogs = Catalogs::new(Config::embedded(&o.lake));
    let checkpoints = o.lake.join("checkpoints");
    let trigger = || {
        if o.available_now {
            Trigger::available_now()
        } else {
            Trigger::processing_time(o.interval)
        }
    };

    let bronze = payments(&o)?
        .write_stream()
        .checkpoint_location(checkpoints.join("payments-bronze"))
        .trigger(trigger())
        .to_table_in(&catalogs, BRONZE, TableOptions::new())
        .await?;
    let risk = payments(&o)?
        .map_batches(|b| at_least(b, HIGH_VALUE))
        .write_stream()
        .checkpoint_location(checkpoints.join("payments-risk"))
        .trigger(trigger())
        .to_table_in(
            &catalogs,
            RISK,
            TableOptions::new()
                .format(TableFormat::Iceberg)
                .partition_by(["day(ts)"]),
        )
        .await?;
    let alerts = payments(&o)?
        .map_batches(as_alerts)
        .write_stream()
        .query_name("payments-alerts")
        .checkpoint_location(checkpoints.join("payments-alerts"))
        .trigger(trigger())
        .start(
            KafkaSink::new(&o.servers)
                .topic(&o.alerts)
                .guarantee(Guarantee::ExactlyOnce {
                    marker_topic: o.markers.clone(),
                }),
        )
        .await?;

    let queries = [bronze, risk, alerts];
    if !o.available_now {
        tokio::signal::ctrl_c().await?;
        for q in &queries {
            q.stop();
        }
    }
    for q in &queries {
        q.await_termination().await?;
        if let Some(p) = q.last_progress() {
            println!("{}: batch {} committed", q.name(), p.batch_id);
        }
    }
    Ok(())
}
