//! The rules of stateful queries, as the error a query that breaks one
//! gets (a leaf: the engine's error type holds it).

use crate::sink::mode::OutputMode;

/// A rule of stateful queries that a query breaks, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueryRule {
    /// Complete mode hands the sink the whole result every trigger; without
    /// an aggregation the whole result is every row ever read.
    #[error("Complete mode needs an aggregation: without one the whole result is every row the query ever read. Use Append to add each trigger's rows, or aggregate first")]
    CompleteWithoutAggregation,
    /// An aggregation's group can change while rows for it may still
    /// arrive; Append emits a group only once it cannot change, which only
    /// a watermark on the event time it groups by tells.
    #[error("Append mode with the aggregation {operator:?} needs a watermark on the event-time column of its window: without one no group is ever final, so nothing would be emitted. Group by a window of a timestamp column and add with_watermark(column, delay) before it, or use Update or Complete")]
    AppendAggregationWithoutWatermark {
        /// The aggregation.
        operator: String,
    },
    /// Sessions merge, and a merged session has a new start: the row
    /// Update mode emitted for a session before it merged would stay.
    #[error("Update mode with the session aggregation {operator:?}: a session that later merges with another gets a new start, and the row emitted for it before would stay beside the merged one. Use Append (with a watermark on the sessions' column) to emit each session once it ended, or Complete")]
    UpdateWithSessions {
        /// The aggregation.
        operator: String,
    },
    /// A deduplication that forgets keys behind the watermark needs one.
    #[error("{operator:?} keeps each key until the watermark passes it, and the query has no watermark. Add with_watermark(column, delay) before it, or use drop_duplicates")]
    DedupWithinWatermarkWithoutWatermark {
        /// The deduplication.
        operator: String,
    },
    /// In Update and Complete modes an aggregation emits groups that may
    /// change again; an operator after it would take each change for a new
    /// row.
    #[error("the stateful operator {after:?} comes after the aggregation {aggregation:?}, which works in Append mode only: in {mode} mode the aggregation emits groups that change again, and {after:?} would take each change for a new row")]
    OperatorAfterAggregation {
        /// The mode asked for.
        mode: OutputMode,
        /// The aggregation.
        aggregation: String,
        /// The operator after it.
        after: String,
    },
    /// A watermark after the operator it should bound comes too late.
    #[error("the watermark on {column:?} is set after the stateful operator {operator:?}; set with_watermark before the operators it bounds")]
    WatermarkAfterOperator {
        /// The watermark's event-time column.
        column: String,
        /// The operator before it.
        operator: String,
    },
}
