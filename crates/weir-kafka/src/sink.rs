//! `KafkaSink`: rows into records, at least once, or exactly once for
//! read_committed consumers with one transaction per batch.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Schema};
use async_trait::async_trait;
use rdkafka::error::{KafkaError as ClientError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use serde::{Deserialize, Serialize};
use uuid::Uuid;
use weir_core::protocol::{decide_commit, CommitDecision, SinkIdentity, SinkMarker};
use weir_core::sink::{BatchContext, CommitMessage, CommitOutcome, DataWriter, OutputMode, QueryInfo, Sink};
use weir_core::{QueryId, QueryName};

use crate::config::ClientSettings;
use crate::error::KafkaError;
use crate::marker::{self, MarkerRecord};
use weir_core::sync::Recover;

/// What a Kafka sink promises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guarantee {
    /// Every row is written at least once: a batch running at a crash is
    /// written again when replayed. The producer is idempotent, so its own
    /// retries add no duplicates. The default, as Spark's Kafka sink.
    AtLeastOnce,
    /// Each batch is one Kafka transaction holding its records and a marker
    /// (query id, batch id) in the marker topic; a replayed batch whose
    /// marker is committed is skipped. Consumers reading with
    /// `isolation.level=read_committed` see every row exactly once.
    ExactlyOnce {
        /// The topic of markers (created, compacted, if missing).
        marker_topic: String,
    },
}

/// Writes rows to Kafka: `value` (string or binary, required), and where
/// present `key` (string or binary), `topic` (string), `partition` (int32;
/// null lets the partitioner choose) and `headers` (a list of `{key:
/// string, value: binary}`). A topic set with [`KafkaSink::topic`] overrides
/// the column.
///
/// With [`Guarantee::ExactlyOnce`] the transactional id is
/// `weir-<query name>` (or the prefix given by
/// [`KafkaSink::transactional_id_prefix`]): a second run of the same query
/// fences the first, whose next commit fails. What is not promised:
/// consumers reading with read_uncommitted see the records of aborted
/// attempts too; a batch must commit within `transaction.timeout.ms`
/// (default 60 s) or the broker aborts it and the batch is replayed.
#[derive(Debug, Clone)]
pub struct KafkaSink {
    settings: ClientSettings,
    topic: Option<String>,
    guarantee: Guarantee,
    txn_prefix: String,
    timeout: Duration,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    producer: Option<FutureProducer>,
    txn: Txn,
    /// The attempt whose transaction is open.
    open: Option<Uuid>,
    marker: Option<SinkMarker>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("txn", &self.txn)
            .field("open", &self.open)
            .field("marker", &self.marker)
            .finish_non_exhaustive()
    }
}

/// Whose transactions the producer runs, for its errors.
#[derive(Debug, Clone, Default)]
struct Txn {
    transactional_id: String,
    query_name: String,
}

impl Txn {
    fn fenced(&self) -> KafkaError {
        KafkaError::Fenced {
            transactional_id: self.transactional_id.clone(),
            query_name: self.query_name.clone(),
        }
    }

    /// `e` from a transaction call while doing `context`.
    fn error(&self, context: &'static str, e: ClientError) -> KafkaError {
        if e.rdkafka_error_code().is_some_and(fenced_code) {
            return self.fenced();
        }
        KafkaError::Transaction {
            transactional_id: self.transactional_id.clone(),
            context,
            source: e,
        }
    }
}

/// What one writer sent.
#[derive(Debug, Serialize, Deserialize)]
struct Sent {
    records: u64,
    bytes: u64,
}

/// The default topic of the exactly-once sink's markers.
pub const DEFAULT_MARKER_TOPIC: &str = "weir-sink-markers";

impl KafkaSink {
    /// A sink writing through `bootstrap_servers`, at least once.
    pub fn new(bootstrap_servers: &str) -> Self {
        KafkaSink {
            settings: ClientSettings::new(bootstrap_servers),
            topic: None,
            guarantee: Guarantee::AtLeastOnce,
            txn_prefix: "weir-".into(),
            timeout: Duration::from_secs(60),
            state: Arc::default(),
        }
    }

    /// Every row goes to this topic, whatever a `topic` column says.
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// Exactly once for read_committed consumers, with markers in
    /// [`DEFAULT_MARKER_TOPIC`].
    pub fn exactly_once(mut self) -> Self {
        self.guarantee = Guarantee::ExactlyOnce {
            marker_topic: DEFAULT_MARKER_TOPIC.into(),
        };
        self
    }

    /// The guarantee (default [`Guarantee::AtLeastOnce`]).
    pub fn guarantee(mut self, guarantee: Guarantee) -> Self {
        self.guarantee = guarantee;
        self
    }

    /// The prefix of the transactional id before the query name (default
    /// `weir-`), for clusters whose ACLs grant transactional ids by prefix.
    pub fn transactional_id_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.txn_prefix = prefix.into();
        self
    }

    /// A producer setting passed to librdkafka (`compression.type`,
    /// `linger.ms`, `security.protocol`, `sasl.*`, ...). Secrets never appear
    /// in logs or `Debug`.
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.set(key, value);
        self
    }

    fn name(&self) -> String {
        format!("kafka {}", self.topic.as_deref().unwrap_or("(topic column)"))
    }

    fn err(&self, batch: Option<&BatchContext>, e: KafkaError) -> weir_core::Error {
        match batch {
            Some(b) => batch_error(&self.name(), b.query_id, b.batch_id, e),
            None => weir_core::Error::sink(self.name(), None, e.retryable(), e),
        }
    }

    fn producer(&self) -> Result<FutureProducer, KafkaError> {
        self.state
            .lock()
            .recover()
            .producer
            .clone()
            .ok_or_else(|| KafkaError::Stopped("the sink was not prepared".into()))
    }

    fn check_schema(&self, schema: &Schema) -> Result<(), KafkaError> {
        let bad = |reason: String| Err(KafkaError::Columns { reason });
        let bytes = |t: &DataType| {
            matches!(
                t,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary | DataType::LargeBinary
            )
        };
        match schema.field_with_name("value") {
            Ok(f) if bytes(f.data_type()) => {}
            Ok(f) => {
                return bad(format!(
                    "column value is {}; make it a string or binary (e.g. to_json of the row)",
                    f.data_type()
                ))
            }
            Err(_) => return bad("there is no column value; the sink writes each row's value column".into()),
        }
        if let Ok(f) = schema.field_with_name("key") {
            if !bytes(f.data_type()) {
                return bad(format!("column key is {}; make it a string or binary", f.data_type()));
            }
        }
        match schema.field_with_name("topic") {
            Ok(f) if f.data_type() != &DataType::Utf8 && self.topic.is_none() => {
                return bad(format!("column topic is {}; make it a string", f.data_type()))
            }
            Err(_) if self.topic.is_none() => {
                return bad("no topic: set KafkaSink::topic or give the rows a topic column".into())
            }
            _ => {}
        }
        if let Ok(f) = schema.field_with_name("partition") {
            if f.data_type() != &DataType::Int32 {
                return bad(format!("column partition is {}; make it an int32", f.data_type()));
            }
        }
        Ok(())
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&FutureProducer) -> Result<T, KafkaError> + Send + 'static,
    ) -> Result<T, KafkaError> {
        let producer = self.producer()?;
        tokio::task::spawn_blocking(move || f(&producer))
            .await
            .map_err(|e| KafkaError::Stopped(e.to_string()))?
    }

    /// Begins the transaction of `attempt` unless it is open.
    fn begin(&self, attempt: Uuid) -> Result<(), KafkaError> {
        let mut state = self.state.lock().recover();
        if !matches!(self.guarantee, Guarantee::ExactlyOnce { .. }) || state.open == Some(attempt) {
            return Ok(());
        }
        let producer = state
            .producer
            .clone()
            .ok_or_else(|| KafkaError::Stopped("the sink was not prepared".into()))?;
        if state.open.take().is_some() {
            // An attempt that never reached commit or abort.
            producer
                .abort_transaction(self.timeout)
                .map_err(|e| state.txn.error("aborting an unfinished transaction", e))?;
        }
        producer
            .begin_transaction()
            .map_err(|e| state.txn.error("beginning a transaction", e))?;
        state.open = Some(attempt);
        Ok(())
    }

    async fn commit_transaction(&self, ctx: &BatchContext) -> Result<(), KafkaError> {
        let Guarantee::ExactlyOnce { marker_topic } = &self.guarantee else {
            return Ok(());
        };
        self.begin(ctx.attempt_id)?;
        let record = MarkerRecord {
            query_id: ctx.query_id,
            batch_id: ctx.batch_id,
            run_id: ctx.run_id.to_string(),
        };
        let key = ctx.query_name.to_string();
        let value = serde_json::to_vec(&record).expect("a marker serialises");
        let delivery = self
            .producer()?
            .send_result(FutureRecord::to(marker_topic).partition(0).key(&key).payload(&value))
            .map_err(|(e, _)| KafkaError::Delivery {
                topic: marker_topic.clone(),
                source: e,
            })?;
        await_delivery(marker_topic, delivery).await?;
        let timeout = self.timeout;
        let state = self.state.clone();
        self.blocking(move |p| {
            // A commit that timed out may be called again; it is idempotent.
            let mut tries = 0;
            loop {
                match p.commit_transaction(timeout) {
                    Ok(()) => break,
                    Err(ClientError::Transaction(e)) if e.is_retriable() && tries < 5 => tries += 1,
                    Err(e) => {
                        let mut state = state.lock().recover();
                        let err = state.txn.error("committing the batch's transaction", e);
                        if !matches!(err, KafkaError::Fenced { .. }) {
                            let _ = p.abort_transaction(timeout);
                        }
                        state.open = None;
                        return Err(err);
                    }
                }
            }
            state.lock().recover().open = None;
            Ok(())
        })
        .await
    }
}

/// The engine's error for `e` in a batch of the query: a fenced producer
/// means another run of the same query took the transactional id, which the
/// engine calls a concurrent run; anything else is the sink's error.
fn batch_error(sink: &str, query_id: QueryId, batch_id: weir_core::BatchId, e: KafkaError) -> weir_core::Error {
    match e {
        KafkaError::Fenced { transactional_id, .. } => weir_core::Error::ConcurrentRun {
            query_id,
            batch_id,
            detail: format!("{sink}: a newer producer with the transactional id {transactional_id} (another run of this query) fenced this one, and this run stopped without committing the batch; the run that fenced it keeps it"),
        },
        e => weir_core::Error::sink(sink, Some(batch_id), e.retryable(), e),
    }
}

fn fenced_code(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch | RDKafkaErrorCode::Fenced
    )
}

async fn await_delivery(topic: &str, delivery: DeliveryFuture) -> Result<(), KafkaError> {
    match delivery.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => Err(KafkaError::Delivery {
            topic: topic.to_string(),
            source: e,
        }),
        Err(_) => Err(KafkaError::Stopped("the producer went away before delivering".into())),
    }
}

#[async_trait]
impl Sink for KafkaSink {
    fn identity(&self) -> SinkIdentity {
        SinkIdentity::new("kafka", self.topic.as_deref().unwrap_or("(topic column)"))
    }

    fn check_output_mode(&self, mode: OutputMode) -> Result<(), weir_core::sink::ModeRefusal> {
        match mode {
            // Update: each changed group is a record; a reader keeps the
            // latest record of each key (a compacted topic does too).
            OutputMode::Append | OutputMode::Update => Ok(()),
            OutputMode::Complete => Err(weir_core::sink::ModeRefusal::AppendOnly("a Kafka topic")),
        }
    }

    fn keeps_marker(&self) -> bool {
        matches!(self.guarantee, Guarantee::ExactlyOnce { .. })
    }

    async fn prepare(&self, query: &QueryInfo) -> weir_core::Result<()> {
        self.check_schema(&query.schema).map_err(|e| self.err(None, e))?;
        let mut config = self.settings.client_config(&[("enable.idempotence", "true")], &[]);
        let txn_id = format!("{}{}", self.txn_prefix, query.query_name);
        if let Guarantee::ExactlyOnce { marker_topic } = &self.guarantee {
            config.set("transactional.id", &txn_id);
            marker::create_topic(&self.settings, marker_topic)
                .await
                .map_err(|e| self.err(None, e))?;
        }
        let producer: FutureProducer = config.create().map_err(|e| {
            self.err(
                None,
                KafkaError::client(format!("connecting to {}", self.settings.bootstrap_servers()), e),
            )
        })?;
        {
            let mut state = self.state.lock().recover();
            state.producer = Some(producer);
            state.txn = Txn {
                transactional_id: txn_id.clone(),
                query_name: query.query_name.to_string(),
            };
        }
        if let Guarantee::ExactlyOnce { marker_topic } = &self.guarantee {
            // Fences every older producer of this query and aborts what it
            // left open, so the markers read next are final.
            let timeout = self.timeout;
            let txn = self.state.lock().recover().txn.clone();
            self.blocking(move |p| {
                p.init_transactions(timeout)
                    .map_err(|e| txn.error("starting the producer's transactions", e))
            })
            .await
            .map_err(|e| self.err(None, e))?;
            let found = marker::latest(&self.settings, marker_topic, &query.query_name, self.timeout)
                .await
                .map_err(|e| self.err(None, e))?;
            tracing::info!(transactional_id = %txn_id, marker = ?found, "Kafka sink: transactions started");
            self.state.lock().recover().marker = found;
        }
        Ok(())
    }

    /// The query's last committed marker: the one `prepare` read after
    /// fencing older producers, or, on a sink not prepared, the marker
    /// topic's last committed one for `name`.
    async fn marker(&self, name: &QueryName, _known_ids: &[QueryId]) -> weir_core::Result<Option<SinkMarker>> {
        let Guarantee::ExactlyOnce { marker_topic } = &self.guarantee else {
            return Ok(None);
        };
        let prepared = {
            let state = self.state.lock().recover();
            state.producer.is_some().then_some(state.marker)
        };
        match prepared {
            Some(marker) => Ok(marker),
            None => marker::latest(&self.settings, marker_topic, name, self.timeout)
                .await
                .map_err(|e| self.err(None, e)),
        }
    }

    fn create_writer(&self, batch: &BatchContext, partition_id: usize) -> weir_core::Result<Box<dyn DataWriter>> {
        self.begin(batch.attempt_id).map_err(|e| self.err(Some(batch), e))?;
        Ok(Box::new(KafkaWriter {
            producer: self.producer().map_err(|e| self.err(Some(batch), e))?,
            topic: self.topic.clone(),
            partition_id,
            pending: VecDeque::new(),
            sent: Sent { records: 0, bytes: 0 },
            sink: self.name(),
            query_id: batch.query_id,
            batch_id: batch.batch_id,
            txn: self.state.lock().recover().txn.clone(),
        }))
    }

    async fn commit(&self, batch: &BatchContext, _messages: Vec<CommitMessage>) -> weir_core::Result<CommitOutcome> {
        let known = self.state.lock().recover().marker;
        let decision =
            decide_commit(known, batch.commit_facts()).map_err(|r| weir_core::Error::Refused(Box::new(r)))?;
        if let CommitDecision::AlreadyCommitted(m) = decision {
            return Ok(CommitOutcome::AlreadyCommitted(m));
        }
        self.commit_transaction(batch)
            .await
            .map_err(|e| self.err(Some(batch), e))?;
        if self.keeps_marker() {
            self.state.lock().recover().marker = Some(SinkMarker {
                query_id: batch.query_id,
                batch_id: batch.batch_id,
            });
        }
        Ok(CommitOutcome::Committed { version: None })
    }

    async fn abort(&self, batch: &BatchContext, _messages: Vec<CommitMessage>) -> weir_core::Result<()> {
        let open = self.state.lock().recover().open;
        if open != Some(batch.attempt_id) {
            return Ok(());
        }
        let timeout = self.timeout;
        let state = self.state.clone();
        self.blocking(move |p| {
            let result = p.abort_transaction(timeout);
            let mut state = state.lock().recover();
            state.open = None;
            result.map_err(|e| state.txn.error("aborting the batch's transaction", e))
        })
        .await
        .map_err(|e| self.err(Some(batch), e))
    }
}

/// Sends one partition's rows as records.
struct KafkaWriter {
    producer: FutureProducer,
    topic: Option<String>,
    partition_id: usize,
    pending: VecDeque<(String, DeliveryFuture)>,
    sent: Sent,
    sink: String,
    query_id: QueryId,
    batch_id: weir_core::BatchId,
    /// For a fenced producer's error.
    txn: Txn,
}

/// Deliveries awaited at most before sending more.
const IN_FLIGHT: usize = 100_000;

impl KafkaWriter {
    fn err(&self, e: KafkaError) -> weir_core::Error {
        // A fenced producer fails its deliveries as purged: name the cause.
        let e = match self.producer.client().fatal_error() {
            Some((code, _)) if fenced_code(code) => self.txn.fenced(),
            _ => e,
        };
        batch_error(&self.sink, self.query_id, self.batch_id, e)
    }

    async fn oldest(&mut self) -> Result<(), KafkaError> {
        match self.pending.pop_front() {
            Some((topic, d)) => await_delivery(&topic, d).await,
            None => {
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(())
            }
        }
    }
}

fn bytes_at(column: Option<&ArrayRef>, i: usize) -> Option<&[u8]> {
    let c = column?;
    if c.is_null(i) {
        return None;
    }
    Some(match c.data_type() {
        DataType::Utf8 => c.as_string::<i32>().value(i).as_bytes(),
        DataType::LargeUtf8 => c.as_string::<i64>().value(i).as_bytes(),
        DataType::Binary => c.as_binary::<i32>().value(i),
        DataType::LargeBinary => c.as_binary::<i64>().value(i),
        _ => return None,
    })
}

fn headers_at(column: Option<&ArrayRef>, i: usize) -> Option<OwnedHeaders> {
    let list = column?.as_list_opt::<i32>()?;
    if list.is_null(i) {
        return None;
    }
    let entries = list.value(i);
    let entries = entries.as_struct_opt()?;
    let (keys, values) = (entries.column(0), entries.column(1));
    let mut headers = OwnedHeaders::new_with_capacity(entries.len());
    for j in 0..entries.len() {
        let key = bytes_at(Some(keys), j).map(String::from_utf8_lossy).unwrap_or_default();
        headers = headers.insert(Header {
            key: &key,
            value: bytes_at(Some(values), j),
        });
    }
    Some(headers)
}

#[async_trait]
impl DataWriter for KafkaWriter {
    async fn write(&mut self, batch: RecordBatch) -> weir_core::Result<()> {
        let value = batch.column_by_name("value");
        let key = batch.column_by_name("key");
        let headers = batch.column_by_name("headers");
        let topics = batch
            .column_by_name("topic")
            .and_then(|c| c.as_string_opt::<i32>().cloned());
        let partitions = batch
            .column_by_name("partition")
            .and_then(|c| c.as_primitive_opt::<arrow_array::types::Int32Type>().cloned());
        for i in 0..batch.num_rows() {
            let topic = match (&self.topic, &topics) {
                (Some(t), _) => t.clone(),
                (None, Some(col)) if col.is_valid(i) => col.value(i).to_string(),
                _ => {
                    return Err(self.err(KafkaError::Columns {
                        reason: format!("row {i} has no topic and the sink sets none"),
                    }))
                }
            };
            let payload = bytes_at(value, i);
            let k = bytes_at(key, i);
            let mut record = FutureRecord::<[u8], [u8]>::to(&topic);
            if let Some(p) = payload {
                record = record.payload(p);
            }
            if let Some(k) = k {
                record = record.key(k);
            }
            if let Some(p) = partitions.as_ref().filter(|p| p.is_valid(i)) {
                record = record.partition(p.value(i));
            }
            if let Some(h) = headers_at(headers, i) {
                record = record.headers(h);
            }
            self.sent.bytes += (payload.map_or(0, <[u8]>::len) + k.map_or(0, <[u8]>::len)) as u64;
            loop {
                match self.producer.send_result(record) {
                    Ok(delivery) => {
                        self.pending.push_back((topic.clone(), delivery));
                        break;
                    }
                    Err((e, back)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                        record = back;
                        self.oldest().await.map_err(|e| self.err(e))?;
                    }
                    Err((e, _)) => return Err(self.err(KafkaError::Delivery { topic, source: e })),
                }
            }
            self.sent.records += 1;
            while self.pending.len() > IN_FLIGHT {
                self.oldest().await.map_err(|e| self.err(e))?;
            }
        }
        Ok(())
    }

    async fn commit(mut self: Box<Self>) -> weir_core::Result<CommitMessage> {
        while !self.pending.is_empty() {
            self.oldest().await.map_err(|e| self.err(e))?;
        }
        CommitMessage::new(self.partition_id, &self.sent)
    }

    async fn abort(self: Box<Self>) -> weir_core::Result<()> {
        // Records already sent stay sent: at least once, they may be read;
        // exactly once, the transaction's abort hides them.
        Ok(())
    }
}
