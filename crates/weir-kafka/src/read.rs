//! Reading a batch's ranges: one consumer, each partition on a queue of its
//! own, polled on a blocking thread until every partition reaches the end
//! of its range, the records handed on as Arrow record batches.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::Consumer as _;
use rdkafka::error::KafkaError as ClientError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::{Offset as KOffset, TopicPartitionList};
use serde_json::json;
use tokio::sync::mpsc;
use weir_core::source::BatchStream;

use crate::broker::{self, At};
use crate::columns::RecordColumns;
use crate::context::{Consumer, Context};
use crate::decode::ValueDecoder;
use crate::error::KafkaError;
use crate::offsets::{PartitionOffsets, PartitionRange, TopicPartition};
use weir_core::sync::Recover;

/// Rows per record batch handed on.
const CHUNK_ROWS: usize = 8192;
/// Key and value bytes per record batch handed on.
const CHUNK_BYTES: usize = 8 << 20;
/// The wait when no partition queue has a record.
const IDLE: Duration = Duration::from_millis(10);
/// Records taken from one partition's queue before the next partition's.
const TURN: usize = 1024;

/// What one batch reads and how.
pub(crate) struct ReadPlan {
    /// The client that asks where partitions begin and end: not the
    /// reader, whose connection may hold a fetch waiting for new records
    /// (`fetch.wait.max.ms`) that a request behind it would wait out.
    pub client: Arc<Consumer>,
    pub ranges: Vec<PartitionRange>,
    /// Every partition the query reads, with where the batch starts in it:
    /// assigned together, so a partition without records in one batch
    /// stays assigned for the next.
    pub positions: Vec<(TopicPartition, i64)>,
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

type Key = (String, i32);

/// The source's consumer and where it stands, kept between batches. Each
/// assigned partition has a queue of its own, so what the consumer fetched
/// ahead for one partition waits in librdkafka, within its limits
/// (`queued.max.messages.kbytes`), until a batch reads it; when a batch
/// starts where the last one ended, nothing is assigned or fetched again
/// (a new assignment's first fetch may take librdkafka a second).
pub(crate) struct Reader {
    consumer: Arc<Consumer>,
    queues: HashMap<Key, PartitionQueue<Context>>,
    /// Records taken off the consumer but not read yet: one past the end
    /// of the batch reading it (after offsets that deliver nothing, such as
    /// transaction markers), and those a partition fetched into the
    /// consumer's own queue before it had a queue of its own.
    peeked: HashMap<Key, VecDeque<OwnedMessage>>,
    /// Per assigned partition: `(lo, hi)`, the queue delivers from `hi` on
    /// (after the peeked record), and nothing readable lies in `lo..hi`.
    at: HashMap<Key, (i64, i64)>,
}

impl Reader {
    pub(crate) fn new(consumer: Consumer) -> Self {
        Reader {
            consumer: Arc::new(consumer),
            queues: HashMap::new(),
            peeked: HashMap::new(),
            at: HashMap::new(),
        }
    }

    /// Whether the consumer can go on to read `key` from `from` as it is.
    fn continues(&self, key: &Key, from: i64) -> bool {
        let Some((lo, hi)) = self.at.get(key) else { return false };
        let next = self.peeked.get(key).and_then(|q| q.front()).map_or(*hi, |m| m.offset());
        (*lo..=next).contains(&from)
    }

    /// Forgets where the consumer stands: the next read assigns afresh.
    fn reset(&mut self) {
        self.queues.clear();
        self.peeked.clear();
        self.at.clear();
    }
}

/// Reads `plan` on a blocking thread; `done` gets the read's metrics before
/// the stream ends. One read at a time per reader.
pub(crate) fn spawn<F>(reader: Arc<Mutex<Reader>>, plan: ReadPlan, done: F) -> BatchStream
where
    F: FnOnce(serde_json::Value) + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<weir_core::Result<RecordBatch>>(2);
    let tx = match plan.values.clone() {
        Some(values) => decoding(values, tx),
        None => tx,
    };
    tokio::task::spawn_blocking(move || {
        let mut reader = reader.lock().recover();
        match read(&mut reader, &plan, &tx) {
            Ok(metrics) => done(metrics),
            Err(stop) => {
                // Where the consumer stands is unknown now.
                reader.reset();
                if let Stop::Failed(e) = stop {
                    let _ = tx.blocking_send(Err(crate::context::explained(&reader.consumer, e).into()));
                }
            }
        }
    });
    Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

/// Decodes the reader's raw chunks on a thread of its own, in order, into
/// `out`, so parsing one chunk overlaps reading the next; the sender the
/// reader sends its raw chunks to. After a chunk that does not decode, the
/// rest is dropped and the reader stops as if the stream were closed.
fn decoding(
    values: Arc<ValueDecoder>,
    out: mpsc::Sender<weir_core::Result<RecordBatch>>,
) -> mpsc::Sender<weir_core::Result<RecordBatch>> {
    let (tx, mut raw) = mpsc::channel::<weir_core::Result<RecordBatch>>(2);
    tokio::task::spawn_blocking(move || {
        while let Some(item) = raw.blocking_recv() {
            let decoded = item.and_then(|batch| values.decode(&batch).map_err(Into::into));
            let failed = decoded.is_err();
            if out.blocking_send(decoded).is_err() || failed {
                return;
            }
        }
    });
    tx
}

/// What a record of a partition being read means for the batch.
enum Taken {
    /// Read into the batch; the partition goes on.
    More,
    /// The partition's range is read.
    Done,
}

/// Takes record `m` of `key` into the batch or keeps it for the next.
fn take(reader: &mut Reader, cols: &mut RecordColumns, key: &Key, until: i64, m: &OwnedMessage) -> Option<Taken> {
    let o = m.offset();
    if reader.at.get(key).is_some_and(|(lo, _)| o < *lo) {
        return None; // delivered again: read already
    }
    if o >= until {
        reader.peeked.entry(key.clone()).or_default().push_front(m.clone());
        if let Some(at) = reader.at.get_mut(key) {
            at.1 = o + 1;
        }
        return Some(Taken::Done);
    }
    cols.push(m);
    reader.at.insert(key.clone(), (o + 1, o + 1));
    Some(if o + 1 >= until { Taken::Done } else { Taken::More })
}

fn read(
    reader: &mut Reader,
    plan: &ReadPlan,
    tx: &mpsc::Sender<weir_core::Result<RecordBatch>>,
) -> Result<serde_json::Value, Stop> {
    let mut partitions = Vec::new();
    let mut lost = Vec::new();
    // Per partition with records to read: (from, until).
    let mut wanted: HashMap<Key, (i64, i64)> = HashMap::new();
    let mut parts: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for r in &plan.ranges {
        parts.entry(r.tp.topic.clone()).or_default().push(r.tp.partition);
    }
    let lows = broker::offsets(&plan.client, &parts, At::Earliest, plan.request_timeout)?;
    let highs = broker::offsets(&plan.client, &parts, At::Latest, plan.request_timeout)?;
    for r in &plan.ranges {
        let bound = |o: &PartitionOffsets| {
            o.get(&r.tp.topic, r.tp.partition)
                .ok_or_else(|| KafkaError::Stopped(format!("the cluster did not say where {} begins and ends", r.tp)))
        };
        let (low, high) = (bound(&lows)?, bound(&highs)?);
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
            wanted.insert((r.tp.topic.clone(), r.tp.partition), (from, until));
        }
    }

    let mut cols = RecordColumns::new(plan.schema.clone(), plan.headers);
    let (mut records, mut bytes) = (0u64, 0u64);
    start(reader, plan, &wanted)?;
    let mut pending: HashMap<Key, i64> = HashMap::new();
    for (key, (_, until)) in &wanted {
        let mut done = false;
        while let Some(m) = reader.peeked.get_mut(key).and_then(VecDeque::pop_front) {
            if let Some(Taken::Done) = take(reader, &mut cols, key, *until, &m) {
                done = true;
                break;
            }
        }
        if !done {
            pending.insert(key.clone(), *until);
        }
    }

    let mut progress = Instant::now();
    while !pending.is_empty() {
        let mut got = false;
        let keys: Vec<(Key, i64)> = pending.iter().map(|(k, u)| (k.clone(), *u)).collect();
        for (key, until) in keys {
            let turn = read_turn(reader, &mut cols, &key, until)?;
            if turn.taken > 0 {
                got = true;
                progress = Instant::now();
            }
            if turn.done {
                pending.remove(&key);
            }
            if cols.rows() >= CHUNK_ROWS || cols.bytes() >= CHUNK_BYTES {
                records += cols.rows() as u64;
                bytes += cols.bytes() as u64;
                send(tx, cols.finish().map_err(KafkaError::from)?)?;
            }
        }
        if got || pending.is_empty() {
            continue;
        }
        // Nothing queued: serve the consumer's own events while waiting.
        if let Some(m) = poll_consumer(reader, IDLE) {
            // Fetched before its partition had a queue of its own.
            let key = (m.topic().to_string(), m.partition());
            if let Some(until) = pending.get(&key).copied() {
                progress = Instant::now();
                if let Some(Taken::Done) = take(reader, &mut cols, &key, until, &m) {
                    pending.remove(&key);
                }
            } else if reader.at.contains_key(&key) {
                reader.peeked.entry(key).or_default().push_back(m);
            }
            continue;
        }
        let positions = reader
            .consumer
            .position()
            .map_err(|e| KafkaError::client("reading the consumer's position", e))?;
        for elem in positions.elements() {
            let key = (elem.topic().to_string(), elem.partition());
            // Transaction markers and aborted records take offsets that
            // deliver nothing: the position passes them.
            if let (Some(until), KOffset::Offset(o)) = (pending.get(&key).copied(), elem.offset()) {
                if o >= until {
                    progress = Instant::now();
                    if let Some(at) = reader.at.get_mut(&key) {
                        at.1 = o;
                    }
                    pending.remove(&key);
                }
            }
        }
        if progress.elapsed() > plan.poll_timeout {
            return Err(stalled(&positions, &pending, plan.poll_timeout).into());
        }
    }
    if cols.rows() > 0 {
        records += cols.rows() as u64;
        bytes += cols.bytes() as u64;
        send(tx, cols.finish().map_err(KafkaError::from)?)?;
    }
    Ok(json!({
        "records": records,
        "bytes": bytes,
        "partitions": partitions,
        "lost": lost,
    }))
}

/// What one turn on a partition's queue did.
struct Turn {
    /// Records taken off the queue.
    taken: usize,
    /// The partition's range is read.
    done: bool,
}

/// Takes up to [`TURN`] records of `key` off its queue, straight into the
/// batch's columns, until the range ends at `until`; the record past the
/// end is kept for the next batch. Where the partition stands is updated
/// once per turn, not per record.
fn read_turn(reader: &mut Reader, cols: &mut RecordColumns, key: &Key, until: i64) -> Result<Turn, KafkaError> {
    let queue = reader.queues.get(key).expect("every wanted partition has a queue");
    let mut lo = reader.at.get(key).map_or(i64::MIN, |(lo, _)| *lo);
    let (mut taken, mut read, mut past) = (0, None, None);
    while taken < TURN {
        match queue.poll(Duration::ZERO) {
            Some(Ok(m)) => {
                taken += 1;
                let o = m.offset();
                if o < lo {
                    continue; // delivered again: read already
                }
                if o >= until {
                    past = Some(m.detach());
                    break;
                }
                cols.push(&m);
                read = Some(o);
                lo = o + 1;
                if lo >= until {
                    break;
                }
            }
            None | Some(Err(ClientError::PartitionEOF(_))) => break,
            Some(Err(e)) => {
                return Err(KafkaError::client(format!("reading records of {}-{}", key.0, key.1), e));
            }
        }
    }
    if let Some(o) = read {
        reader.at.insert(key.clone(), (o + 1, o + 1));
    }
    let done = lo >= until || past.is_some();
    if let Some(m) = past {
        if let Some(at) = reader.at.get_mut(key) {
            at.1 = m.offset() + 1;
        }
        reader.peeked.entry(key.clone()).or_default().push_front(m);
    }
    Ok(Turn { taken, done })
}

/// Readies the consumer for `wanted`: as it stands if every partition goes
/// on where it is, else every partition of the plan assigned afresh where
/// the batch starts in it, each on a queue of its own.
fn start(reader: &mut Reader, plan: &ReadPlan, wanted: &HashMap<Key, (i64, i64)>) -> Result<(), KafkaError> {
    if wanted.iter().all(|(key, (from, _))| reader.continues(key, *from)) {
        return Ok(());
    }
    reader.reset();
    let mut tpl = TopicPartitionList::new();
    let mut starts: HashMap<Key, i64> = plan
        .positions
        .iter()
        .map(|(tp, o)| ((tp.topic.clone(), tp.partition), *o))
        .collect();
    for (key, (from, _)) in wanted {
        starts.insert(key.clone(), *from);
    }
    for ((topic, partition), from) in &starts {
        tpl.add_partition_offset(topic, *partition, KOffset::Offset(*from))
            .map_err(|e| KafkaError::client("planning the read", e))?;
    }
    reader
        .consumer
        .assign(&tpl)
        .map_err(|e| KafkaError::client("assigning the batch's partitions", e))?;
    for (key, from) in starts {
        let queue = reader
            .consumer
            .split_partition_queue(&key.0, key.1)
            .ok_or_else(|| KafkaError::Stopped(format!("no queue for {}-{}", key.0, key.1)))?;
        reader.queues.insert(key.clone(), queue);
        reader.at.insert(key, (from, from));
    }
    // What a partition fetched before its queue was split off went to the
    // consumer's queue: kept for the partition.
    while let Some(m) = poll_consumer(reader, Duration::ZERO) {
        let key = (m.topic().to_string(), m.partition());
        if reader.at.contains_key(&key) {
            reader.peeked.entry(key).or_default().push_back(m);
        }
    }
    Ok(())
}

/// A record from the consumer's own queue, serving its events meanwhile;
/// errors there may be of partitions no batch reads now (an idle one whose
/// start retention removed): logged. A partition being read reports its own
/// on its queue, and a stall ends the wait.
fn poll_consumer(reader: &Reader, timeout: Duration) -> Option<OwnedMessage> {
    match reader.consumer.poll(timeout) {
        Some(Ok(m)) => Some(m.detach()),
        None | Some(Err(ClientError::PartitionEOF(_))) => None,
        Some(Err(e)) => {
            tracing::warn!(error = %e, "Kafka consumer");
            None
        }
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

fn stalled(positions: &TopicPartitionList, pending: &HashMap<Key, i64>, waited: Duration) -> KafkaError {
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
        until: pending[key],
        waited_ms: waited.as_millis() as u64,
    }
}

fn send(tx: &mpsc::Sender<weir_core::Result<RecordBatch>>, batch: RecordBatch) -> Result<(), Stop> {
    tx.blocking_send(Ok(batch)).map_err(|_| Stop::Closed)
}
