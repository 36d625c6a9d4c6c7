//! The exactly-once sink's markers: one record per committed batch, keyed by
//! query name, in a compacted single-partition topic, written in the
//! batch's own transaction.

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::Consumer as _;
use rdkafka::error::{KafkaError as ClientError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset as KOffset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use weir_core::protocol::SinkMarker;
use weir_core::{BatchId, QueryId, QueryName};

use crate::config::ClientSettings;
use crate::context::{Consumer, Context};
use crate::error::KafkaError;
use crate::offsets::TopicPartition;

/// The value of a marker record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct MarkerRecord {
    pub query_id: QueryId,
    pub batch_id: BatchId,
    pub run_id: String,
}

/// Creates the marker topic unless it exists.
pub(crate) async fn create_topic(settings: &ClientSettings, topic: &str) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> = settings
        .client_config(&[], &[])
        .create()
        .map_err(|e| KafkaError::client("connecting the admin client", e))?;
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact");
    let results = admin
        .create_topics(
            &[new],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        )
        .await
        .map_err(|e| KafkaError::client(format!("creating the marker topic {topic}"), e))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => {
                return Err(KafkaError::client(
                    format!(
                    "creating the marker topic {topic} (or create it yourself: one partition, cleanup.policy=compact)"
                ),
                    ClientError::AdminOp(code),
                ))
            }
        }
    }
    Ok(())
}

/// The last committed marker of `query`, read with read_committed up to
/// the topic's end (its high watermark, not its last stable offset): a
/// marker committed behind another query's open transaction on the shared
/// topic is waited for, not missed.
pub(crate) async fn latest(
    settings: &ClientSettings,
    topic: &str,
    query: &QueryName,
    timeout: Duration,
) -> Result<Option<SinkMarker>, KafkaError> {
    let consumer: Consumer = settings
        .client_config(
            &[],
            &[
                ("isolation.level", "read_committed"),
                ("enable.auto.commit", "false"),
                ("enable.partition.eof", "true"),
                ("group.id", "weir-markers"),
            ],
        )
        .create_with_context(Context::new(settings.bootstrap_servers()))
        .map_err(|e| KafkaError::client("connecting to read the markers", e))?;
    // Its end counts records of open transactions too.
    let ends: Consumer = settings
        .client_config(
            &[],
            &[("isolation.level", "read_uncommitted"), ("group.id", "weir-markers")],
        )
        .create_with_context(Context::new(settings.bootstrap_servers()))
        .map_err(|e| KafkaError::client("connecting to read the markers", e))?;
    let (topic, key) = (topic.to_string(), query.to_string());
    tokio::task::spawn_blocking(move || {
        read_latest(&consumer, &ends, &topic, &key, timeout).map_err(|e| crate::context::explained(&consumer, e))
    })
    .await
    .map_err(|e| KafkaError::Stopped(e.to_string()))?
}

fn read_latest(
    consumer: &Consumer,
    ends: &Consumer,
    topic: &str,
    key: &str,
    timeout: Duration,
) -> Result<Option<SinkMarker>, KafkaError> {
    let tp = TopicPartition {
        topic: topic.to_string(),
        partition: 0,
    };
    let (low, high) = crate::broker::watermarks(ends, &tp, timeout)?;
    if low >= high {
        return Ok(None);
    }
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, KOffset::Offset(low))
        .map_err(|e| KafkaError::client("reading the markers", e))?;
    consumer
        .assign(&tpl)
        .map_err(|e| KafkaError::client("reading the markers", e))?;
    let mut found = None;
    let started = Instant::now();
    loop {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                if m.key() == Some(key.as_bytes()) {
                    let record: MarkerRecord =
                        m.payload()
                            .and_then(|p| serde_json::from_slice(p).ok())
                            .ok_or_else(|| KafkaError::NotAMarker {
                                tp: tp.clone(),
                                offset: m.offset(),
                            })?;
                    found = Some(SinkMarker {
                        query_id: record.query_id,
                        batch_id: record.batch_id,
                    });
                }
                if m.offset() + 1 >= high {
                    break;
                }
            }
            Some(Err(ClientError::PartitionEOF(_))) | None => {
                let position = consumer
                    .position()
                    .map_err(|e| KafkaError::client("reading the markers", e))?
                    .find_partition(topic, 0)
                    .and_then(|e| e.offset().to_raw());
                if position.is_some_and(|p| p >= high) {
                    break;
                }
            }
            Some(Err(e)) => return Err(KafkaError::client("reading the markers", e)),
        }
        if started.elapsed() > timeout {
            let position = consumer
                .position()
                .ok()
                .and_then(|p| p.find_partition(topic, 0).and_then(|e| e.offset().to_raw()))
                .unwrap_or(low);
            return Err(KafkaError::MarkersHeld {
                tp,
                position,
                end: high,
                waited_ms: timeout.as_millis() as u64,
            });
        }
    }
    Ok(found)
}
