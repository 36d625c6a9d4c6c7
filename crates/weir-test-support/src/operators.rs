//! A small stateful operator for tests of the engine and the sinks: the
//! number of rows of each value of one Int64 column, written with the
//! engine's [`KeyedState`] the way any operator crate would.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use weir_core::operator::{OperatorContext, OperatorKind, StateContext, StatefulOperator};
use weir_core::state::{KeyedState, StateSchema};
use weir_core::{BoxError, OutputMode};

/// `SELECT column, count(*) AS count GROUP BY column`, kept across batches:
/// Complete mode emits every group, Update the groups this batch changed.
#[derive(Debug, Clone)]
pub struct CountByKey {
    name: String,
    column: String,
}

impl CountByKey {
    /// Counts the rows of each value of the Int64 `column`.
    pub fn new(name: impl Into<String>, column: impl Into<String>) -> Self {
        CountByKey {
            name: name.into(),
            column: column.into(),
        }
    }

    fn schema(&self) -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new(&self.column, DataType::Int64, false),
            Field::new("count", DataType::Int64, false),
        ]))
    }

    fn output(&self, state: &KeyedState, keys: &[&[u8]]) -> Result<RecordBatch, BoxError> {
        // The state's columns are the output's: the key, then its count.
        Ok(state.batch_of(keys)?.with_schema(self.schema())?)
    }
}

#[async_trait::async_trait]
impl StatefulOperator for CountByKey {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> OperatorKind {
        OperatorKind::Aggregation {
            event_time: None,
            sessions: false,
        }
    }

    fn output_schema(&self, input: &SchemaRef) -> Result<SchemaRef, BoxError> {
        match input.field_with_name(&self.column)?.data_type() {
            DataType::Int64 => Ok(self.schema()),
            other => Err(format!("CountByKey counts an Int64 column, {} is {other}", self.column).into()),
        }
    }

    fn key_columns(&self, _input: &SchemaRef) -> Option<Vec<String>> {
        Some(vec![self.column.clone()])
    }

    fn state_schema(&self, _input: &SchemaRef, _ctx: &StateContext) -> Result<StateSchema, BoxError> {
        let key = Arc::new(Schema::new(vec![Field::new(&self.column, DataType::Int64, false)]));
        let value = Arc::new(Schema::new(vec![Field::new("count", DataType::Int64, false)]));
        Ok(StateSchema::new(key, value))
    }

    async fn process(
        &self,
        state: &mut KeyedState,
        input: Vec<RecordBatch>,
        ctx: &OperatorContext,
    ) -> Result<Vec<RecordBatch>, BoxError> {
        let mut added: HashMap<Box<[u8]>, i64> = HashMap::new();
        for batch in &input {
            let column = batch
                .column_by_name(&self.column)
                .ok_or("the counted column is missing")?;
            let keys = state.encode_keys(std::slice::from_ref(column))?;
            for key in keys.iter() {
                *added.entry(key.as_ref().into()).or_default() += 1;
            }
        }
        let mut touched: Vec<Box<[u8]>> = added.keys().cloned().collect();
        touched.sort_unstable();
        let old: Vec<i64> = {
            let present: Vec<&[u8]> = touched.iter().filter_map(|k| state.get(k)).collect();
            let decoded = state.decode_values(present)?;
            let mut counts = decoded
                .first()
                .map(|a| a.as_primitive::<Int64Type>().values().to_vec())
                .unwrap_or_default()
                .into_iter();
            touched
                .iter()
                .map(|k| {
                    if state.contains_key(k) {
                        counts.next().unwrap_or(0)
                    } else {
                        0
                    }
                })
                .collect()
        };
        let new: ArrayRef = Arc::new(Int64Array::from_iter_values(
            touched.iter().zip(old).map(|(k, old)| old + added[k]),
        ));
        if let Some(values) = state.encode_values(&[new])? {
            for (key, value) in touched.iter().zip(values.iter()) {
                state.put(key, value.as_ref());
            }
        }
        let keys: Vec<&[u8]> = match ctx.output_mode {
            OutputMode::Complete => {
                let mut all: Vec<&[u8]> = state.iter().map(|(k, _)| k).collect();
                all.sort_unstable();
                all
            }
            OutputMode::Update => touched.iter().map(|k| &**k).collect(),
            other => return Err(format!("CountByKey has no {other} mode").into()),
        };
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![self.output(state, &keys)?])
    }
}

/// The rate source (`rows_per_batch` rows a batch) with its ids taken
/// modulo `groups`, counted by group with [`CountByKey`] in `event_id` and
/// `count`: with more rows a batch than groups, every batch changes groups
/// earlier batches wrote, which Update mode must replace.
pub fn counted_groups(rows_per_batch: u64, groups: i64) -> weir_core::ReadStream {
    weir_core::read_stream(weir_core::source::RateSource::rows_per_batch(rows_per_batch))
        .map_batches(move |batch| {
            let ids: Int64Array = batch.column(0).as_primitive::<Int64Type>().unary(|id| id % groups);
            let mut columns = batch.columns().to_vec();
            columns[0] = Arc::new(ids);
            Ok(RecordBatch::try_new(batch.schema(), columns)?)
        })
        .with_operator(CountByKey::new("groups", "event_id"))
}

/// `[group, count]` of every group of the ids `0..rows`, as
/// [`counted_groups`] counts them, sorted.
pub fn expected_group_counts(rows: i64, groups: i64) -> Vec<Vec<i64>> {
    (0..groups)
        .map(|g| vec![g, (0..rows).filter(|id| id % groups == g).count() as i64])
        .filter(|r| r[1] > 0)
        .collect()
}

/// The error of a query that must fail, whether at its start or as it runs.
pub async fn query_error(started: weir_core::Result<weir_core::StreamingQuery>) -> weir_core::Error {
    match started {
        Ok(q) => q.await_termination().await.expect_err("the query fails"),
        Err(e) => e,
    }
}
