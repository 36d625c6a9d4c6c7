//! The errors of weir-kafka.

use rdkafka::error::{KafkaError as ClientError, RDKafkaErrorCode};

use crate::offsets::TopicPartition;

/// What can go wrong reading Kafka. Each variant names the topic and
/// partition involved; [`KafkaError::retryable`] says whether reading again
/// can help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaError {
    /// The Kafka client failed (the broker refused or did not answer).
    #[error("{context}: {source}")]
    Client {
        /// What weir was doing.
        context: String,
        #[source]
        source: ClientError,
    },

    /// Records the batch must read are no longer on the broker (retention
    /// deleted them, or the topic was deleted or recreated). Nothing was
    /// committed; `fail_on_data_loss(false)` skips what is gone and reports it.
    #[error("data loss in {tp}: offsets {from}..{until} are planned for this batch, but {reason}. Nothing of this batch was committed; to skip what is gone, run with fail_on_data_loss(false) (the skip is reported in the batch's progress)")]
    DataLoss {
        /// The partition.
        tp: TopicPartition,
        /// The first offset that cannot be read.
        from: i64,
        /// The first offset after those.
        until: i64,
        /// What the broker said.
        reason: String,
    },

    /// A topic the query reads was deleted.
    #[error("topic {topic} was deleted while the query read it (partitions {partitions:?} still had offsets to read from). Nothing of this batch was committed; to go on without it, run with fail_on_data_loss(false)")]
    TopicDeleted {
        /// The topic.
        topic: String,
        /// Its partitions the query knew.
        partitions: Vec<i32>,
    },

    /// A partition gave no record and did not move for the poll timeout.
    #[error("{tp}: no record arrived for {waited_ms} ms at offset {position} while the batch reads up to {until}; the broker may be down. Nothing of this batch was committed; a retry reads the same range")]
    Stalled {
        /// The partition.
        tp: TopicPartition,
        /// Where the consumer stood.
        position: i64,
        /// Where the batch ends.
        until: i64,
        /// How long it waited.
        waited_ms: u64,
    },

    /// The marker topic's committed markers could not all be read in time:
    /// an open transaction (another query's batch, or a producer that
    /// stopped, which the broker aborts after its transaction timeout)
    /// holds back what read_committed consumers see.
    #[error("marker topic {tp}: read up to offset {position} of {end} in {waited_ms} ms; an open transaction on it (another query's batch, or a producer that stopped and that the broker aborts after its transaction.timeout.ms) holds the rest back. Nothing was written; starting again later reads the markers")]
    MarkersHeld {
        /// The marker partition.
        tp: TopicPartition,
        /// How far the markers were read.
        position: i64,
        /// The topic's end, records of open transactions included.
        end: i64,
        /// How long it waited.
        waited_ms: u64,
    },

    /// A record's value does not parse into the source's value schema.
    #[error("the value of the record at {tp} offset {offset} does not parse: {reason}. Nothing of this batch was committed; to keep such records in a column of their own instead, set on_bad_record to a dead-letter column")]
    BadRecord {
        /// The record's partition.
        tp: TopicPartition,
        /// The record's offset.
        offset: i64,
        /// What the parser said.
        reason: String,
    },

    /// The brokers refused the client's credentials.
    #[error("the brokers {brokers} refused the client's credentials: {reason}. Check sasl.mechanism, sasl.username and sasl.password (not shown)")]
    Authentication {
        /// The brokers.
        brokers: String,
        /// What librdkafka said (it never includes the password).
        reason: String,
    },

    /// A starting offset names a topic or partition that does not exist.
    #[error("starting offsets name {tp}, which does not exist; name partitions the topic has, or leave it out to start it at the default")]
    UnknownPartition {
        /// The partition.
        tp: TopicPartition,
    },

    /// A topic the query subscribes to does not exist.
    #[error("topic {topic} does not exist on the cluster; create it first (weir does not create the topics it reads)")]
    UnknownTopic {
        /// The topic.
        topic: String,
    },

    /// An offset in the checkpoint is not the form this source writes.
    #[error("offset {offset} is not a Kafka offset of the form {{\"topic\": {{\"0\": 42}}}}; the checkpoint was written by another source")]
    NotAnOffset {
        /// The offset as recorded.
        offset: String,
    },

    /// An option of the source is invalid.
    #[error("invalid option {option}: {reason}")]
    InvalidOption {
        /// The option.
        option: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// The rows a Kafka sink gets cannot become records.
    #[error("the Kafka sink's rows: {reason}")]
    Columns {
        /// What is wrong with them.
        reason: String,
    },

    /// The broker did not take a record the sink sent.
    #[error("a record for topic {topic} was not delivered: {source}")]
    Delivery {
        /// The record's topic.
        topic: String,
        #[source]
        source: ClientError,
    },

    /// A transaction of the exactly-once sink failed; it was aborted, so
    /// read_committed consumers see none of its records.
    #[error("transaction {transactional_id}: {context}: {source}")]
    Transaction {
        /// The producer's transactional id.
        transactional_id: String,
        /// What the sink was doing.
        context: &'static str,
        #[source]
        source: ClientError,
    },

    /// Another producer with this sink's transactional id started (a second
    /// run of the same query): this one was fenced and stopped.
    #[error("transaction {transactional_id}: a newer producer with the same transactional id (another run of query {query_name}) fenced this one; this run stopped without committing. Run one copy of a query at a time")]
    Fenced {
        /// The producer's transactional id.
        transactional_id: String,
        /// The query.
        query_name: String,
    },

    /// A record in the marker topic under this query's name is not a weir
    /// marker: something else writes the topic.
    #[error("the record at {tp} offset {offset} has this query's name as its key but is not a weir marker; give the sink a marker topic of its own")]
    NotAMarker {
        /// The marker topic's partition.
        tp: TopicPartition,
        /// The record's offset.
        offset: i64,
    },

    /// The rows cannot be put into Arrow columns.
    #[error("building the batch's columns: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),

    /// The reading thread stopped unexpectedly.
    #[error("the Kafka reader stopped: {0}")]
    Stopped(String),
}

impl KafkaError {
    pub(crate) fn client(context: impl Into<String>, source: ClientError) -> Self {
        KafkaError::Client {
            context: context.into(),
            source,
        }
    }

    /// Whether trying again can help: a broker that did not answer, a leader
    /// that moved, a stalled fetch. Lost data, a missing topic and invalid
    /// options stay as they are.
    pub fn retryable(&self) -> bool {
        match self {
            KafkaError::Client { source, .. } => client_retryable(source),
            KafkaError::Stalled { .. } | KafkaError::MarkersHeld { .. } | KafkaError::Stopped(_) => true,
            KafkaError::Delivery { source, .. } => client_retryable(source) || is_timeout(source),
            KafkaError::Transaction { source, .. } => match source {
                ClientError::Transaction(e) => e.is_retriable() || (e.txn_requires_abort() && !e.is_fatal()),
                other => client_retryable(other),
            },
            _ => false,
        }
    }
}

fn is_timeout(e: &ClientError) -> bool {
    matches!(e.rdkafka_error_code(), Some(RDKafkaErrorCode::MessageTimedOut))
}

fn client_retryable(e: &ClientError) -> bool {
    use RDKafkaErrorCode as C;
    match e.rdkafka_error_code() {
        Some(code) => matches!(
            code,
            C::OperationTimedOut
                | C::RequestTimedOut
                | C::BrokerTransportFailure
                | C::AllBrokersDown
                | C::BrokerNotAvailable
                | C::LeaderNotAvailable
                | C::NotLeaderForPartition
                | C::NetworkException
                | C::NotCoordinator
                | C::CoordinatorNotAvailable
                | C::CoordinatorLoadInProgress
                | C::NotEnoughReplicas
                | C::NotEnoughReplicasAfterAppend
                | C::KafkaStorageError
                | C::FetchSessionIdNotFound
                | C::InvalidFetchSessionEpoch
                | C::UnknownLeaderEpoch
                | C::OffsetNotAvailable
                | C::Resolve
                | C::TimedOutQueue
        ),
        None => false,
    }
}

impl From<KafkaError> for weir_core::Error {
    fn from(e: KafkaError) -> Self {
        weir_core::Error::source("kafka", e.retryable(), e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp() -> TopicPartition {
        TopicPartition {
            topic: "payments".into(),
            partition: 3,
        }
    }

    #[test]
    fn a_timeout_is_retried_and_lost_data_is_not() {
        let timeout = KafkaError::client(
            "fetching watermarks",
            ClientError::MetadataFetch(RDKafkaErrorCode::OperationTimedOut),
        );
        assert!(timeout.retryable());
        let unknown = KafkaError::client(
            "fetching watermarks",
            ClientError::MetadataFetch(RDKafkaErrorCode::UnknownTopicOrPartition),
        );
        assert!(!unknown.retryable());
        let lost = KafkaError::DataLoss {
            tp: tp(),
            from: 10,
            until: 20,
            reason: "the partition now starts at 20".into(),
        };
        assert!(!lost.retryable());
        let msg = lost.to_string();
        assert!(
            msg.contains("payments-3") && msg.contains("10..20") && msg.contains("fail_on_data_loss(false)"),
            "{msg}"
        );
        assert!(!weir_core::Error::from(lost).retryable());
        let stalled = KafkaError::Stalled {
            tp: tp(),
            position: 5,
            until: 9,
            waited_ms: 1000,
        };
        assert!(weir_core::Error::from(stalled).retryable());
    }
}
