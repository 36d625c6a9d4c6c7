//! Reading a batch's ranges: one consumer assigned to exactly the planned
//! offsets, polled on a blocking thread until every partition reaches the end
//! of its range, the records handed on as Arrow record batches.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use rdkafka::consumer::Consumer as _;
use rdkafka::error::KafkaError as ClientError;
use rdkafka::message::Message;
use rdkafka::{Offset as KOffset, TopicPartitionList};
use serde_json::json;
use tokio::sync::mpsc;
use weir_core::source::BatchStream;

use crate::columns::RecordColumns;
use crate::context::Consumer;
use crate::decode::ValueDecoder;
use crate::error::KafkaError;
use crate::offsets::{PartitionRange, TopicPartition};

/// Rows per record batch handed on.
const CHUNK_ROWS: usize = 8192;
/// Key and value bytes per record batch handed on.
const CHUNK_BYTES: usize = 8 << 20;
const POLL: Duration = Duration::from_millis(100);

/// What one batch reads and how.
#[derive(Debug)]
pub(crate) struct ReadPlan {
    pub ranges: Vec<PartitionRange>,
    pub schema: SchemaRef,
    pub headers: bool,
    pub values: Option<Arc<ValueDecoder>>,
    pub fail_on_data_loss: bool,
    pub poll_timeout: Duration,
    pub request_timeout: Duration,
}

enum Stop {
    /// The batch's stream was dropped: nobody wants the rest.
    Closed,
    Failed(KafkaError),
}

impl From<KafkaError> for Stop {
    fn from(e: KafkaError) -> Self {
        Stop::Failed(e)
    }
}

/// Reads `plan` on a blocking thread; `done` gets the read's metrics before
/// the stream ends. One read at a time per reader.
pub(crate) fn spawn<F>(reader: Arc<Mutex<Consumer>>, plan: ReadPlan, done: F) -> BatchStream
where
    F: FnOnce(serde_json::Value) + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<weir_core::Result<RecordBatch>>(2);
    tokio::task::spawn_blocking(move || {
        let consumer = match reader.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        match read(&consumer, &plan, &tx) {
            Ok(metrics) => done(metrics),
            Err(Stop::Closed) => {}
            Err(Stop::Failed(e)) => {
                let _ = tx.blocking_send(Err(consumer.context().explain(e).into()));
            }
        }
        if let Err(e) = consumer.unassign() {
            tracing::debug!(error = %e, "unassigning the Kafka reader");
        }
    });
    Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

struct Pending {
    until: i64,
}

fn read(
    consumer: &Consumer,
    plan: &ReadPlan,
    tx: &mpsc::Sender<weir_core::Result<RecordBatch>>,
) -> Result<serde_json::Value, Stop> {
    let mut partitions = Vec::new();
    let mut lost = Vec::new();
    let mut pending: HashMap<(String, i32), Pending> = HashMap::new();
    let mut tpl = TopicPartitionList::new();
    for r in &plan.ranges {
        let (low, high) = consumer
            .fetch_watermarks(&r.tp.topic, r.tp.partition, plan.request_timeout)
            .map_err(|e| KafkaError::client(format!("reading where {} begins and ends", r.tp), e))?;
        let (mut from, mut until) = (r.from, r.until);
        if from < low {
            let gone = (from, low.min(until));
            lose(
                plan,
                &r.tp,
                gone,
                format!("the partition now begins at {low} (retention or a deletion removed the rest)"),
                &mut lost,
            )?;
            from = low;
        }
        if high < until {
            let gone = (from.max(high), until);
            lose(
                plan,
                &r.tp,
                gone,
                format!("the partition now ends at {high}"),
                &mut lost,
            )?;
            until = high;
        }
        partitions.push(json!({
            "topic": r.tp.topic,
            "partition": r.tp.partition,
            "from": r.from,
            "until": r.until,
            "lag": (high - r.until).max(0),
        }));
        if from < until {
            tpl.add_partition_offset(&r.tp.topic, r.tp.partition, KOffset::Offset(from))
                .map_err(|e| KafkaError::client("planning the read", e))?;
            pending.insert((r.tp.topic.clone(), r.tp.partition), Pending { until });
        }
    }

    let mut cols = RecordColumns::new(plan.schema.clone(), plan.headers);
    let (mut records, mut bytes) = (0u64, 0u64);
    if !pending.is_empty() {
        consumer
            .assign(&tpl)
            .map_err(|e| KafkaError::client("assigning the batch's partitions", e))?;
        consumer
            .resume(&tpl)
            .map_err(|e| KafkaError::client("resuming the batch's partitions", e))?;
    }
    let mut progress = Instant::now();
    while !pending.is_empty() {
        let mut check_positions = false;
        match consumer.poll(POLL) {
            None | Some(Err(ClientError::PartitionEOF(_))) => check_positions = true,
            Some(Ok(m)) => {
                let key = (m.topic().to_string(), m.partition());
                if let Some(p) = pending.get(&key) {
                    progress = Instant::now();
                    if m.offset() < p.until {
                        cols.push(&m);
                    }
                    if m.offset() + 1 >= p.until {
                        finish(consumer, &mut pending, &key)?;
                    }
                }
            }
            Some(Err(e)) => return Err(KafkaError::client("reading records", e).into()),
        }
        if check_positions {
            let positions = consumer
                .position()
                .map_err(|e| KafkaError::client("reading the consumer's position", e))?;
            for elem in positions.elements() {
                let key = (elem.topic().to_string(), elem.partition());
                // Transaction markers and aborted records take offsets that
                // deliver nothing: the position passes them.
                if let (Some(p), KOffset::Offset(o)) = (pending.get(&key), elem.offset()) {
                    if o >= p.until {
                        progress = Instant::now();
                        finish(consumer, &mut pending, &key)?;
                    }
                }
            }
            if progress.elapsed() > plan.poll_timeout {
                return Err(stalled(&positions, &pending, plan.poll_timeout).into());
            }
        }
        if cols.rows() >= CHUNK_ROWS || cols.bytes() >= CHUNK_BYTES {
            records += cols.rows() as u64;
            bytes += cols.bytes() as u64;
            send(tx, chunk(plan, &mut cols)?)?;
        }
    }
    if cols.rows() > 0 {
        records += cols.rows() as u64;
        bytes += cols.bytes() as u64;
        send(tx, chunk(plan, &mut cols)?)?;
    }
    Ok(json!({
        "records": records,
        "bytes": bytes,
        "partitions": partitions,
        "lost": lost,
    }))
}

/// The records collected so far, in the query's columns.
fn chunk(plan: &ReadPlan, cols: &mut RecordColumns) -> Result<RecordBatch, KafkaError> {
    let raw = cols.finish()?;
    match &plan.values {
        Some(values) => values.decode(&raw),
        None => Ok(raw),
    }
}

/// Records a range that is gone, or fails the batch on it.
fn lose(
    plan: &ReadPlan,
    tp: &TopicPartition,
    (from, until): (i64, i64),
    reason: String,
    lost: &mut Vec<serde_json::Value>,
) -> Result<(), KafkaError> {
    if plan.fail_on_data_loss {
        return Err(KafkaError::DataLoss {
            tp: tp.clone(),
            from,
            until,
            reason,
        });
    }
    tracing::warn!(%tp, from, until, reason, "records are gone before the query read them; skipping them (fail_on_data_loss is off)");
    lost.push(json!({"topic": tp.topic, "partition": tp.partition, "from": from, "until": until, "reason": reason}));
    Ok(())
}

fn finish(
    consumer: &Consumer,
    pending: &mut HashMap<(String, i32), Pending>,
    key: &(String, i32),
) -> Result<(), KafkaError> {
    pending.remove(key);
    let mut one = TopicPartitionList::new();
    one.add_partition(&key.0, key.1);
    consumer
        .pause(&one)
        .map_err(|e| KafkaError::client("pausing a finished partition", e))
}

fn stalled(positions: &TopicPartitionList, pending: &HashMap<(String, i32), Pending>, waited: Duration) -> KafkaError {
    let mut keys: Vec<&(String, i32)> = pending.keys().collect();
    keys.sort();
    let key = keys[0];
    let position = positions
        .find_partition(&key.0, key.1)
        .and_then(|e| e.offset().to_raw())
        .unwrap_or(-1);
    KafkaError::Stalled {
        tp: TopicPartition {
            topic: key.0.clone(),
            partition: key.1,
        },
        position,
        until: pending[key].until,
        waited_ms: waited.as_millis() as u64,
    }
}

fn send(tx: &mpsc::Sender<weir_core::Result<RecordBatch>>, batch: RecordBatch) -> Result<(), Stop> {
    tx.blocking_send(Ok(batch)).map_err(|_| Stop::Closed)
}
