//! Stateful operators: the contract between the engine, which keeps their
//! state exactly once in the checkpoint, and the operators themselves
//! (deduplication, aggregations), which live in other crates.
//!
//! A [`BatchTransform`] sees the whole micro-batch and keeps nothing (SQL
//! over the batch). An operator sees the whole micro-batch at once, and its state as a
//! [`KeyedState`](crate::state::KeyedState) the engine restored for it: the
//! state after the batch before. It must be a pure function of that state,
//! the batch's rows and the [`OperatorContext`], so that a replayed batch
//! gives the same output and the same state.

pub(crate) mod query_rule;
mod rules;

use std::fmt;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;

pub use query_rule::QueryRule;
pub use rules::{check_query_mode, has_aggregation, OperatorFacts, QueryShape};

use crate::error::BoxError;
use crate::ids::BatchId;
use crate::sink::OutputMode;
use crate::state::{KeyedState, StateSchema};

/// What a stateful operator does, for the output-mode rules.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OperatorKind {
    /// Groups rows and folds each group into a value.
    Aggregation {
        /// The event-time column whose windows (or sessions) it groups by:
        /// when the watermark is on that column, the watermark closes
        /// windows, and Append mode can emit them.
        event_time: Option<String>,
        /// Whether its groups are sessions, which merge: a group emitted
        /// once can become part of another with a new key, so Update mode,
        /// which replaces a group's row by its key, would keep both.
        sessions: bool,
    },
    /// Passes the first row of each key and drops the rest.
    Deduplication {
        /// Whether keys are forgotten once the watermark passes them.
        within_watermark: bool,
    },
}

/// What an operator knows of the batch it runs in.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct OperatorContext {
    /// The batch.
    pub batch_id: BatchId,
    /// The schema of the operator's input rows (also when a batch brings
    /// none).
    pub input_schema: SchemaRef,
    /// The output mode of the query.
    pub output_mode: OutputMode,
    /// The watermark's event-time column, if the query has one.
    pub event_time_column: Option<String>,
    /// The event-time watermark of this batch in milliseconds since the
    /// Unix epoch (recorded in `offsets/N`, so a replay sees the same), if
    /// the query has a watermark. Rows at or before it are late; the engine
    /// dropped them before the first operator, and before a later one
    /// those at or before the previous batch's watermark.
    pub watermark_ms: Option<i64>,
    /// How far behind the latest event time the watermark stays, if the
    /// query has a watermark.
    pub watermark_delay: Option<std::time::Duration>,
}

/// What an operator may lay its state out by, besides its input's schema:
/// the query's output mode and watermark column. Both are fixed for the
/// life of a checkpoint; a query restarted with another output mode may
/// find its operators' state laid out otherwise, and is then refused.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StateContext {
    /// The output mode of the query.
    pub output_mode: OutputMode,
    /// The watermark's event-time column, if the query has one.
    pub event_time_column: Option<String>,
}

impl StateContext {
    /// The context of a query in `output_mode` with a watermark on
    /// `event_time_column`, if any.
    pub fn new(output_mode: OutputMode, event_time_column: Option<String>) -> Self {
        StateContext {
            output_mode,
            event_time_column,
        }
    }
}

/// A stateful operator of a streaming query.
#[async_trait]
pub trait StatefulOperator: Send + Sync + fmt::Debug {
    /// The operator's name: unique within the query and stable across runs,
    /// because it names the operator's state in the checkpoint.
    fn name(&self) -> &str;

    /// What the operator does.
    fn kind(&self) -> OperatorKind;

    /// The schema of the rows it emits for input rows of `input`.
    fn output_schema(&self, input: &SchemaRef) -> Result<SchemaRef, BoxError>;

    /// The schema of its state (key and value columns) for input rows of
    /// `input`, in a query of `ctx`.
    fn state_schema(&self, input: &SchemaRef, ctx: &StateContext) -> Result<StateSchema, BoxError>;

    /// The output columns that name a group (an aggregation's window start
    /// and grouping columns), for input rows of `input`: in Update mode a
    /// table sink replaces the row with the same values in them. `None` for
    /// an operator whose rows are not keyed.
    fn key_columns(&self, _input: &SchemaRef) -> Option<Vec<String>> {
        None
    }

    /// Runs one micro-batch: folds `input` into `state` and returns the
    /// rows the output mode emits. `input` may be empty (a batch the
    /// engine runs because the watermark moved).
    async fn process(
        &self,
        state: &mut KeyedState,
        input: Vec<RecordBatch>,
        ctx: &OperatorContext,
    ) -> Result<Vec<RecordBatch>, BoxError>;
}

/// A stateless transformation of the whole micro-batch (a SQL query over
/// the batch's rows): it must be a pure function of its input, so a
/// replayed batch gives the same rows.
#[async_trait]
pub trait BatchTransform: Send + Sync + fmt::Debug {
    /// The schema of the rows it returns for input rows of `input`.
    fn output_schema(&self, input: &SchemaRef) -> Result<SchemaRef, BoxError>;

    /// Transforms the rows of batch `batch_id` (all of them at once).
    async fn transform(&self, input: Vec<RecordBatch>, batch_id: BatchId) -> Result<Vec<RecordBatch>, BoxError>;
}
