//! The Kafka sink through the sink conformance suite, with both
//! guarantees: exactly once (the whole suite), and at least once (the cases
//! of sinks without a marker). The suite's rows (the rate source's, or
//! their counts) become records keyed by `event_id`, and the topic is read
//! back with read_committed, as a consumer of an exactly-once sink must
//! read it.
//!
//! Each case has a topic, a marker topic and a transactional id prefix of
//! its own, so cases run at once without fencing each other; the two runs
//! of one case share them, as two runs of one query do.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use weir_core::ids::{QueryId, QueryName};
use weir_core::protocol::{SinkIdentity, SinkMarker};
use weir_core::sink::{
    BatchContext, Close, CommitMessage, CommitOutcome, DataWriter, ModeRefusal, OutputMode, QueryInfo, Sink,
};
use weir_kafka::{Guarantee, KafkaSink};
use weir_test_support::kafka::{admin, read_all};
use weir_test_support::SinkHarness;

use crate::broker;

/// One case's topics on the test broker.
struct KafkaHarness {
    guarantee: Guarantee,
    servers: String,
    topic: String,
    other: String,
    markers: String,
    txn_prefix: String,
}

async fn harness() -> KafkaHarness {
    new_harness(true)
}

/// The Kafka sink's default guarantee through the cases of sinks without
/// a marker.
mod at_least_once {
    use super::KafkaHarness;

    pub(super) async fn harness() -> KafkaHarness {
        super::new_harness(false)
    }

    weir_test_support::sink_conformance_tests!(at_least_once harness);
}

/// A case's harness: topics and ids of its own, exactly once or not.
fn new_harness(exactly_once: bool) -> KafkaHarness {
    // Outside CI without a broker, the cases are skipped by skip_reason.
    let servers = broker::bootstrap().unwrap_or_default();
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let (topic, other) = match servers.is_empty() {
        true => (String::new(), String::new()),
        false => (
            broker::topic(&servers, "conformance", 2),
            broker::topic(&servers, "other", 2),
        ),
    };
    let markers = format!("markers-{unique}");
    let guarantee = match exactly_once {
        true => Guarantee::ExactlyOnce {
            marker_topic: markers.clone(),
        },
        false => Guarantee::AtLeastOnce,
    };
    KafkaHarness {
        guarantee,
        servers,
        topic,
        other,
        markers,
        txn_prefix: format!("weir-{unique}-"),
    }
}

impl KafkaHarness {
    fn sink_to(&self, topic: &str) -> Arc<dyn Sink> {
        Arc::new(AsRecords(
            KafkaSink::new(&self.servers)
                .topic(topic)
                .transactional_id_prefix(&self.txn_prefix)
                .guarantee(self.guarantee.clone()),
        ))
    }
}

#[async_trait]
impl SinkHarness for KafkaHarness {
    async fn sink(&self) -> Arc<dyn Sink> {
        self.sink_to(&self.topic)
    }

    async fn other_sink(&self) -> Arc<dyn Sink> {
        self.sink_to(&self.other)
    }

    /// The topic and its markers deleted, and the topic made again empty.
    async fn recreate_table(&self) {
        broker::delete_topic(&self.servers, &self.topic).await;
        broker::delete_topic(&self.servers, &self.markers).await;
        let admin = admin(&self.servers);
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        // A deleted topic's name is free again once the broker has removed it.
        for _ in 0..300 {
            let made = admin
                .create_topics(&[NewTopic::new(&self.topic, 2, TopicReplication::Fixed(1))], &options)
                .await
                .expect("create topics");
            if made.iter().all(|r| r.is_ok()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{} could not be made again after its deletion", self.topic);
    }

    async fn read_event_ids(&self) -> Vec<i64> {
        let (servers, topic) = (self.servers.clone(), self.topic.clone());
        let records = tokio::task::spawn_blocking(move || read_all(&servers, &topic, "read_committed"))
            .await
            .expect("read the topic");
        records
            .iter()
            .map(|r| {
                let key = r.key.as_deref().expect("a record of the sink has a key");
                key.parse().unwrap_or_else(|e| panic!("key {key:?}: {e}"))
            })
            .collect()
    }

    fn skip_reason(&self) -> Option<String> {
        self.servers
            .is_empty()
            .then(|| "no Kafka broker (WEIR_TEST_KAFKA_BOOTSTRAP)".into())
    }
}

weir_test_support::sink_conformance_tests!(harness);

/// The suite's rows as records: key the row's `event_id`, value the row
/// as JSON; everything else is the Kafka sink's own.
#[derive(Debug)]
struct AsRecords(KafkaSink);

fn records_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Utf8, false),
    ]))
}

fn as_records(batch: &RecordBatch) -> RecordBatch {
    let ids = batch
        .column_by_name("event_id")
        .expect("the suite's rows have event_id")
        .as_primitive::<Int64Type>();
    let keys: StringArray = ids.values().iter().map(|i| Some(i.to_string())).collect();
    let values: StringArray = ids
        .values()
        .iter()
        .map(|i| Some(format!("{{\"event_id\":{i}}}")))
        .collect();
    RecordBatch::try_new(records_schema(), vec![Arc::new(keys), Arc::new(values)]).expect("two string columns")
}

#[async_trait]
impl Sink for AsRecords {
    fn identity(&self) -> SinkIdentity {
        self.0.identity()
    }

    fn check_output_mode(&self, mode: OutputMode) -> Result<(), ModeRefusal> {
        self.0.check_output_mode(mode)
    }

    fn keeps_marker(&self) -> bool {
        self.0.keeps_marker()
    }

    async fn prepare(&self, query: &QueryInfo) -> weir_core::Result<()> {
        let query = QueryInfo {
            schema: records_schema(),
            ..query.clone()
        };
        self.0.prepare(&query).await
    }

    async fn marker(&self, name: &QueryName, known_ids: &[QueryId]) -> weir_core::Result<Option<SinkMarker>> {
        self.0.marker(name, known_ids).await
    }

    fn create_writer(&self, batch: &BatchContext, partition_id: usize) -> weir_core::Result<Box<dyn DataWriter>> {
        let batch = BatchContext {
            schema: records_schema(),
            ..batch.clone()
        };
        Ok(Box::new(RecordsWriter(self.0.create_writer(&batch, partition_id)?)))
    }

    async fn commit(&self, batch: &BatchContext, messages: Vec<CommitMessage>) -> weir_core::Result<CommitOutcome> {
        self.0.commit(batch, messages).await
    }

    async fn abort(&self, batch: &BatchContext, messages: Vec<CommitMessage>) -> weir_core::Result<()> {
        self.0.abort(batch, messages).await
    }

    async fn close(&self, how: Close) -> weir_core::Result<()> {
        self.0.close(how).await
    }
}

struct RecordsWriter(Box<dyn DataWriter>);

#[async_trait]
impl DataWriter for RecordsWriter {
    async fn write(&mut self, batch: RecordBatch) -> weir_core::Result<()> {
        self.0.write(as_records(&batch)).await
    }

    async fn commit(self: Box<Self>) -> weir_core::Result<CommitMessage> {
        self.0.commit().await
    }

    async fn abort(self: Box<Self>) -> weir_core::Result<()> {
        self.0.abort().await
    }
}
