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
//! Payments are the rate source's rows (`event_id`, `ts`, `account_id`,
//! `amount`) as JSON objects on the payments topic. `--produce N` first
//! writes those of ids `0..N`, so the example can be tried on an empty
//! topic:
//!
//! ```text
//! cargo run --release -p weir-examples --bin kafka-payments -- \
//!     --bootstrap-servers 127.0.0.1:9092 --produce 10000 --available-now
//! ```
//!
//! Without `--available-now` the three queries run every `--trigger-interval`
//! (default 1s) until Ctrl-C.

#[path = "payment_rules.rs"]
mod payment_rules;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Int64Type};
use arrow_array::{RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use weir::catalog::{Catalogs, Config};
use weir::kafka::{Guarantee, KafkaSink, KafkaSource, StartingOffsets, ValueColumns};
use weir::prelude::*;

use crate::payment_rules::{at_least, ALERT, BRONZE, HIGH_VALUE, RISK};

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

/// Writes the rate source's payments `0..n` to the topic as JSON lines,
/// keyed by account.
fn produce(o: &Options) -> Result<(), BoxError> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &o.servers)
        .set("linger.ms", "5")
        .create()?;
    for from in (0..o.produce).step_by(10_000) {
        let rows = RateSource::generate(from, (from + 10_000).min(o.produce));
        let mut lines = arrow_json::LineDelimitedWriter::new(Vec::new());
        lines.write(&rows)?;
        lines.finish()?;
        let accounts = rows
            .column_by_name("account_id")
            .ok_or("no account_id")?
            .as_primitive::<Int64Type>();
        for (value, account) in lines.into_inner().split(|b| *b == b'\n').zip(accounts.values()) {
            let key = account.to_string();
            let mut record = BaseRecord::to(&o.topic).key(&key).payload(value);
            while let Err((e, back)) = producer.send(record) {
                if e.rdkafka_error_code() != Some(rdkafka::types::RDKafkaErrorCode::QueueFull) {
                    return Err(e.into());
                }
                producer.poll(Duration::from_millis(10));
                record = back;
            }
        }
    }
    producer.flush(Duration::from_secs(60))?;
    println!("produced {} payments to {}", o.produce, o.topic);
    Ok(())
}

/// The payments topic, read from its beginning, values parsed.
fn payments(o: &Options) -> Result<ReadStream, BoxError> {
    // The rate source's columns.
    let schema = RateSource::output_schema();
    let source = KafkaSource::subscribe(&o.servers, [o.topic.as_str()])
        .starting_offsets(StartingOffsets::Earliest)
        .max_offsets_per_trigger(50_000)
        .value_columns(ValueColumns::json(schema))?;
    Ok(read_stream(source))
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
