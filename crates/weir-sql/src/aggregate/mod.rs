//! Streaming aggregation: `group_by(keys).agg(aggregates)`, by plain
//! columns, by event-time windows and by sessions, in Append, Update and
//! Complete modes.
//!
//! Each batch, DataFusion folds the batch's rows into one partial row per
//! group (a sum, a count, ...); those are merged with the groups' partial
//! rows in the state (a second, small aggregation), and the merged rows go
//! back into the state. What the mode emits is made from partial rows: an
//! average is its sum over its count.
//!
//! A batch passes this module's files in order: `mod.rs` picks the path by
//! what the mode keeps, `append.rs` (Append's bins, which the watermark
//! closes), `merged.rs` (Update's and Complete's merged groups) or
//! `sessions.rs`; each asks `plan.rs` for the batch's partial rows and the
//! rows it emits. `spec.rs` holds what a query names: keys and aggregates.

mod append;
mod merged;
mod plan;
mod sessions;
mod spec;

use std::sync::Arc;

use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use arrow_schema::{Schema, SchemaRef};
use async_trait::async_trait;
use weir_core::operator::{OperatorContext, OperatorKind, StateContext, StatefulOperator};
use weir_core::state::{KeyedState, StateSchema};
use weir_core::BoxError;

pub use spec::{
    avg, col, count, count_distinct, count_of, max, min, session_window, sliding_window, sum, window, Aggregate,
    GroupKey,
};

use crate::bins;
use crate::session::{self, SessionWindow, SESSION_END, SESSION_START};
use crate::window::{Window, WINDOW_END, WINDOW_START};

/// A streaming `group_by(keys).agg(aggregates)`; see the module docs.
#[derive(Debug, Clone)]
pub struct Aggregation {
    name: String,
    window: Option<Window>,
    session: Option<SessionWindow>,
    keys: Vec<String>,
    aggregates: Vec<Aggregate>,
    /// Why the grouping cannot run, reported when the query starts.
    invalid: Option<String>,
    /// The partial rows' schema last planned, and the input it was planned
    /// for: a batch's input is the same as the last one's.
    planned: Arc<std::sync::Mutex<Option<(SchemaRef, SchemaRef)>>>,
}

/// What a batch through an aggregation emits.
type Emitted = Result<Vec<RecordBatch>, BoxError>;

/// A batch on its way through an aggregation: its rows, the operator's
/// context, and the schemas planned for its input (the state's partial
/// rows, the rows emitted).
struct BatchIn<'a> {
    input: Vec<RecordBatch>,
    ctx: &'a OperatorContext,
    partial_schema: &'a SchemaRef,
    output_schema: &'a SchemaRef,
}

impl Aggregation {
    /// Groups by `keys` (at most one window) and computes `aggregates`.
    pub fn new(keys: Vec<GroupKey>, aggregates: Vec<Aggregate>) -> Self {
        let mut window: Option<Window> = None;
        let mut session: Option<SessionWindow> = None;
        let mut columns = Vec::new();
        let mut invalid = None;
        for key in keys {
            if !matches!(key, GroupKey::Column(_)) && (window.is_some() || session.is_some()) {
                invalid = Some("group by at most one window or session".to_string());
            }
            match key {
                GroupKey::Column(c) => columns.push(c),
                GroupKey::Window(w) => {
                    invalid = invalid.or_else(|| w.invalid());
                    window = Some(w);
                }
                GroupKey::Session(s) => {
                    invalid = invalid.or_else(|| s.invalid());
                    session = Some(s);
                }
            }
        }
        if session.is_some() {
            if let Some(c) = columns.iter().find(|c| session::RESERVED.contains(&c.as_str())) {
                invalid = invalid.or(Some(format!(
                    "the key column {c:?} has a name sessions use for their own; rename it first"
                )));
            }
        }
        if aggregates.is_empty() {
            invalid = invalid.or(Some("name at least one aggregate in agg([...])".to_string()));
        }
        let mut outputs: Vec<String> = aggregates.iter().map(Aggregate::output_name).collect();
        outputs.extend(columns.iter().cloned());
        if window.is_some() {
            outputs.extend([WINDOW_START.to_string(), WINDOW_END.to_string()]);
        }
        if session.is_some() {
            outputs.extend([SESSION_START.to_string(), SESSION_END.to_string()]);
        }
        outputs.sort();
        if let Some(twice) = outputs.windows(2).find(|w| w[0] == w[1]) {
            invalid = invalid.or(Some(format!(
                "two output columns are named {:?}; give one an .alias(..)",
                twice[0]
            )));
        }
        let mut name = String::from("aggregate");
        if let Some(w) = &window {
            name.push_str(&format!("-window-{}-{}ms", w.column, w.size.as_millis()));
            if w.slide != w.size {
                name.push_str(&format!("-every-{}ms", w.slide.as_millis()));
            }
        }
        if let Some(s) = &session {
            name.push_str(&format!("-session-{}-{}ms", s.column, s.gap.as_millis()));
        }
        for c in &columns {
            name.push('-');
            name.push_str(c);
        }
        let name: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') {
                    c
                } else {
                    '_'
                }
            })
            .take(200)
            .collect();
        Aggregation {
            name,
            window,
            session,
            keys: columns,
            aggregates,
            invalid,
            planned: Arc::default(),
        }
    }

    /// Names the operator (its state's directory in the checkpoint).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The key columns of the partial rows: a window's start first (so
    /// closed windows are a range of keys), a session's start last (so a
    /// key's sessions share a prefix). A session's end follows its start.
    pub(super) fn key_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.window.iter().map(|_| WINDOW_START.to_string()).collect();
        names.extend(self.keys.iter().cloned());
        names.extend(self.session.iter().map(|_| SESSION_START.to_string()));
        names
    }

    /// The columns of `schema` whose values keep a group's rows together
    /// when an aggregation is split (see `parts`): the keys with the
    /// window's start; a session's keys alone, since its rows make one
    /// session or several only together.
    pub(super) fn split_columns(&self, schema: &Schema) -> Vec<usize> {
        let names = match self.session {
            Some(_) => self.keys.clone(),
            None => self.key_names(),
        };
        names.iter().filter_map(|n| schema.index_of(n).ok()).collect()
    }

    /// The event-time column of the window or sessions.
    pub(super) fn event_column(&self) -> Option<&str> {
        self.window
            .as_ref()
            .map(|w| w.column.as_str())
            .or(self.session.as_ref().map(|s| s.column.as_str()))
    }

    /// Removes the groups whose window the watermark closed (its end at
    /// or before the watermark) and returns their partial rows, sorted by
    /// key. The key's first column is the window's start, so these are the
    /// keys before the start `watermark - size + 1`: found by comparing
    /// encoded bytes, without decoding the state.
    pub(super) fn take_closed(&self, state: &mut KeyedState, watermark: i64) -> Result<Option<RecordBatch>, BoxError> {
        let Some(w) = &self.window else {
            return Ok(None);
        };
        let Some(first_open) = watermark.checked_sub(w.size_ms()).and_then(|s| s.checked_add(1)) else {
            return Ok(None);
        };
        let bound = state.key_prefix(&[Arc::new(Int64Array::from(vec![first_open])) as ArrayRef])?;
        Ok(Some(state.take_before(bound.row(0).as_ref())?))
    }
}

#[async_trait]
impl StatefulOperator for Aggregation {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> OperatorKind {
        OperatorKind::Aggregation {
            event_time: self.event_column().map(str::to_string),
            sessions: self.session.is_some(),
        }
    }

    fn output_schema(&self, input: &SchemaRef) -> Result<SchemaRef, BoxError> {
        let partial = self.partial_schema(input)?;
        self.output_schema_of(input, &partial)
    }

    fn key_columns(&self, _input: &SchemaRef) -> Option<Vec<String>> {
        // A window's start names it (its end follows from the start).
        Some(self.key_names())
    }

    fn state_schema(&self, input: &SchemaRef, ctx: &StateContext) -> Result<StateSchema, BoxError> {
        let partial = self.partial_schema(input)?;
        if self.binned(ctx.output_mode, ctx.event_time_column.as_deref()) {
            return Ok(bins::state_schema(&partial));
        }
        let n = self.key_names().len();
        let key: Vec<_> = partial.fields()[..n].to_vec();
        let value: Vec<_> = partial.fields()[n..].to_vec();
        Ok(StateSchema::new(
            Arc::new(Schema::new(key)),
            Arc::new(Schema::new(value)),
        ))
    }

    async fn process(
        &self,
        state: &mut KeyedState,
        input: Vec<RecordBatch>,
        ctx: &OperatorContext,
    ) -> Result<Vec<RecordBatch>, BoxError> {
        let partial_schema = self.planned_partial_schema(&ctx.input_schema)?;
        let output_schema = self.output_schema_of(&ctx.input_schema, &partial_schema)?;
        let batch = BatchIn {
            input,
            ctx,
            partial_schema: &partial_schema,
            output_schema: &output_schema,
        };
        if self.session.is_some() {
            return self.process_sessions(state, batch).await;
        }
        if self.binned(ctx.output_mode, ctx.event_time_column.as_deref()) {
            return self.process_binned(state, batch).await;
        }
        self.process_merged(state, batch).await
    }
}
