//! Per-batch progress: one event per batch, as a `tracing` event and as JSON.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::ids::{BatchId, QueryId, QueryName, RunId};
use crate::source::Offset;

/// What one batch did, like Spark's `StreamingQueryProgress`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueryProgress {
    /// The query's id.
    pub query_id: QueryId,
    /// The query's name.
    pub query_name: QueryName,
    /// This run of the query.
    pub run_id: RunId,
    /// The batch.
    pub batch_id: BatchId,
    /// When the batch was planned.
    pub timestamp: DateTime<Utc>,
    /// Whether the batch was planned by an earlier run and replayed.
    pub replayed: bool,
    /// Rows read from the sources.
    pub input_rows: u64,
    /// Rows handed to the sink after the transformation.
    pub output_rows: u64,
    /// Input rows per second since the previous batch started.
    pub input_rows_per_second: f64,
    /// Input rows per second of this batch's own duration.
    pub processed_rows_per_second: f64,
    /// The number of writer partitions.
    pub partitions: usize,
    /// How long each phase took.
    pub durations_ms: PhaseDurations,
    /// The range each source read.
    pub sources: Vec<SourceProgress>,
    /// What the sink did.
    pub sink: SinkProgress,
    /// The batch's event-time watermark, if the query has one and it has
    /// moved from its start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watermark: Option<DateTime<Utc>>,
    /// Rows dropped because their event time was at or before the
    /// watermark: late input rows, and rows a stage emitted that are at or
    /// before the previous batch's watermark at a later stateful operator.
    pub late_rows: u64,
    /// The state of each stateful operator after the batch.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub state: Vec<StateProgress>,
}

/// The state of one stateful operator after a batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StateProgress {
    /// The operator.
    pub operator: String,
    /// Keys in its state.
    pub rows: u64,
    /// Bytes of its keys and values in memory.
    pub bytes: u64,
}

/// Milliseconds spent in each phase of a batch. Reading and writing overlap
/// (rows stream from the source into the writers): `read` is the time spent
/// waiting on the source, `write` the rest of that stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PhaseDurations {
    /// Asking the sources for offsets and writing `offsets/N`.
    pub plan: f64,
    /// Waiting on the sources' rows.
    pub read: f64,
    /// Transforming and writing rows, until every writer finished.
    pub write: f64,
    /// Writing the stateful operators' state to the checkpoint.
    pub state: f64,
    /// The sink's atomic commit.
    pub commit: f64,
    /// Writing `commits/N` and the sources' commit hooks.
    pub record: f64,
    /// The whole batch.
    pub total: f64,
}

/// One source's part of a batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceProgress {
    /// The source's name.
    pub source: String,
    /// Where the batch started (exclusive); `None` at the beginning.
    pub start_offset: Option<Offset>,
    /// Where it ended (inclusive).
    pub end_offset: Offset,
    /// What the source measured while reading, in its own terms (the Kafka
    /// source: records, bytes and lag per partition).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<serde_json::Value>,
}

/// The sink's part of a batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SinkProgress {
    /// The sink, as its identity describes it.
    pub description: String,
    /// The sink's version after the commit, where it has one.
    pub version: Option<i64>,
}

impl QueryProgress {
    /// The progress as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("progress serialises")
    }

    pub(crate) fn emit(&self) {
        tracing::info!(
            query = %self.query_name,
            query_id = %self.query_id,
            batch_id = %self.batch_id,
            input_rows = self.input_rows,
            replayed = self.replayed,
            total_ms = self.durations_ms.total,
            sink_version = self.sink.version,
            progress = %self.to_json(),
            "batch committed"
        );
    }
}
