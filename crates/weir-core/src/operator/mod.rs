//! Stateful operators: the contract between the engine, which keeps their
//! state exactly once in the checkpoint, and the operators themselves
//! (deduplication, aggregations), which live in other crates.
//!
//! An operator sees the whole micro-batch at once, and its state as a
//! [`KeyedState`](crate::state::KeyedState) the engine restored for it: the
//! state after the batch before. It must be a pure function of that state,
//! the batch's rows and the [`OperatorContext`], so that a replayed batch
//! gives the same output and the same state.

mod rules;

use std::fmt;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

pub use rules::{check_query_mode, ModeRule, OperatorFacts, QueryShape};

use crate::error::BoxError;
use crate::ids::BatchId;
use crate::sink::OutputMode;
use crate::state::{KeyedState, StateSchema};

/// What a stateful operator does, for the output-mode rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OperatorKind {
    /// Groups rows and folds each group into a value.
    Aggregation {
        /// Whether one of the grouping keys is a window of the watermark's
        /// event-time column, so the watermark closes groups.
        event_time_window: bool,
    },
    /// Passes the first row of each key and drops the rest.
    Deduplication {
        /// Whether keys are forgotten once the watermark passes them.
        within_watermark: bool,
    },
}

/// What an operator knows of the batch it runs in.
#[derive(Debug, Clone)]
pub struct OperatorContext {
    /// The batch.
    pub batch_id: BatchId,
    /// The output mode of the query.
    pub output_mode: OutputMode,
    /// The watermark's event-time column, if the query has one.
    pub event_time_column: Option<String>,
    /// The event-time watermark of this batch in milliseconds since the
    /// Unix epoch (recorded in `offsets/N`, so a replay sees the same), if
    /// the query has a watermark. Rows at or before it are late; the engine
    /// dropped them before the first operator.
    pub watermark_ms: Option<i64>,
}

/// A stateful operator of a streaming query.
pub trait StatefulOperator: Send + Sync + fmt::Debug {
    /// The operator's name: unique within the query and stable across runs,
    /// because it names the operator's state in the checkpoint.
    fn name(&self) -> &str;

    /// What the operator does.
    fn kind(&self) -> OperatorKind;

    /// The schema of the rows it emits for input rows of `input`.
    fn output_schema(&self, input: &SchemaRef) -> Result<SchemaRef, BoxError>;

    /// The schema of its state (key and value columns) for input rows of
    /// `input`.
    fn state_schema(&self, input: &SchemaRef) -> Result<StateSchema, BoxError>;

    /// Runs one micro-batch: folds `input` into `state` and returns the
    /// rows the output mode emits. `input` may be empty (a batch the
    /// engine runs because the watermark moved).
    fn process(
        &self,
        state: &mut KeyedState,
        input: Vec<RecordBatch>,
        ctx: &OperatorContext,
    ) -> Result<Vec<RecordBatch>, BoxError>;
}
