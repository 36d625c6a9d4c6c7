//! Streaming deduplication: `drop_duplicates` and
//! `drop_duplicates_within_watermark`, as in Spark Structured Streaming.

use std::collections::HashSet;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMillisecondType;
use arrow_array::{Array, ArrayRef, BooleanArray, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use weir_core::operator::{OperatorContext, OperatorKind, StateContext, StatefulOperator};
use weir_core::state::{KeyedState, StateSchema};
use weir_core::BoxError;

use crate::error::SqlError;

/// The value column of the state: when a key may be forgotten
/// (milliseconds since the Unix epoch), or null for never.
const EXPIRES: &str = "expires_at_ms";

/// Passes the first row of each key and drops later rows with the same key,
/// across batches. The keys are kept in the query's state:
///
/// - `drop_duplicates`: forever, unless the watermark's event-time column is
///   one of the keys; then a key is forgotten once the watermark passes its
///   event time (a later row with it would be late anyway).
/// - `drop_duplicates_within_watermark`: a key is forgotten once the
///   watermark passes its first event time plus the watermark's delay, so
///   duplicates are dropped while they can arrive and the state stays
///   bounded even when their event times differ.
///
/// Null key values are equal to each other.
#[derive(Debug, Clone)]
pub struct DropDuplicates {
    name: String,
    keys: Vec<String>,
    within_watermark: bool,
}

impl DropDuplicates {
    /// Drops rows whose `keys` columns equal those of an earlier row.
    pub fn new<I, S>(keys: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let keys: Vec<String> = keys.into_iter().map(Into::into).collect();
        DropDuplicates {
            name: Self::default_name("dedup", &keys),
            keys,
            within_watermark: false,
        }
    }

    /// Drops duplicates while the watermark allows them to arrive.
    pub fn within_watermark<I, S>(keys: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let keys: Vec<String> = keys.into_iter().map(Into::into).collect();
        DropDuplicates {
            name: Self::default_name("dedup-within-watermark", &keys),
            keys,
            within_watermark: true,
        }
    }

    /// Names the operator (its state's directory in the checkpoint); the
    /// default is made of its kind and keys.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    fn default_name(kind: &str, keys: &[String]) -> String {
        let mut name = kind.to_string();
        for key in keys {
            name.push('-');
            name.extend(
                key.chars()
                    .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }),
            );
        }
        name.truncate(200);
        name
    }

    fn key_indices(&self, input: &Schema) -> Result<Vec<usize>, SqlError> {
        if self.keys.is_empty() {
            return Err(SqlError::NoKeys {
                operator: self.name.clone(),
            });
        }
        self.keys
            .iter()
            .map(|k| {
                input.index_of(k).map_err(|_| SqlError::MissingColumn {
                    operator: self.name.clone(),
                    column: k.clone(),
                    available: input.fields().iter().map(|f| f.name().clone()).collect(),
                })
            })
            .collect()
    }

    /// The expiry of each row: its event time, plus the delay within the
    /// watermark; `None` when keys never expire.
    fn expiries(&self, batch: &RecordBatch, ctx: &OperatorContext) -> Result<Option<Int64Array>, BoxError> {
        let Some(column) = &ctx.event_time_column else {
            return Ok(None);
        };
        if !self.within_watermark && !self.keys.contains(column) {
            return Ok(None);
        }
        let times = batch.column_by_name(column).ok_or_else(|| SqlError::MissingColumn {
            operator: self.name.clone(),
            column: column.clone(),
            available: batch.schema().fields().iter().map(|f| f.name().clone()).collect(),
        })?;
        let millis = arrow_cast_millis(times)?;
        let delay = if self.within_watermark {
            ctx.watermark_delay
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        } else {
            0
        };
        Ok(Some(
            millis.iter().map(|t| t.map(|t| t.saturating_add(delay))).collect(),
        ))
    }
}

fn arrow_cast_millis(times: &ArrayRef) -> Result<arrow_array::TimestampMillisecondArray, BoxError> {
    let cast = datafusion::arrow::compute::cast(times, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
    Ok(cast.as_primitive::<TimestampMillisecondType>().clone())
}

#[async_trait]
impl StatefulOperator for DropDuplicates {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> OperatorKind {
        OperatorKind::Deduplication {
            within_watermark: self.within_watermark,
        }
    }

    fn output_schema(&self, input: &SchemaRef) -> Result<SchemaRef, BoxError> {
        self.key_indices(input)?;
        Ok(input.clone())
    }

    fn state_schema(&self, input: &SchemaRef, _ctx: &StateContext) -> Result<StateSchema, BoxError> {
        let keys: Vec<Field> = self
            .key_indices(input)?
            .into_iter()
            .map(|i| input.field(i).clone())
            .collect();
        let value = Schema::new(vec![Field::new(EXPIRES, DataType::Int64, true)]);
        Ok(StateSchema::new(Arc::new(Schema::new(keys)), Arc::new(value)))
    }

    async fn process(
        &self,
        state: &mut KeyedState,
        input: Vec<RecordBatch>,
        ctx: &OperatorContext,
    ) -> Result<Vec<RecordBatch>, BoxError> {
        let mut output = Vec::with_capacity(input.len());
        let mut seen: HashSet<Box<[u8]>> = HashSet::new();
        for batch in input {
            let indices = self.key_indices(&batch.schema())?;
            let columns: Vec<ArrayRef> = indices.iter().map(|i| batch.column(*i).clone()).collect();
            let keys = state.encode_keys(&columns)?;
            let expiries = self.expiries(&batch, ctx)?;
            let mut keep = Vec::with_capacity(batch.num_rows());
            let mut kept_rows = Vec::new();
            for (i, key) in keys.iter().enumerate() {
                let new = !state.contains_key(key.as_ref()) && seen.insert(key.as_ref().into());
                keep.push(new);
                if new {
                    kept_rows.push(i);
                }
            }
            let kept_expiries: ArrayRef =
                Arc::new(Int64Array::from_iter(kept_rows.iter().map(|i| {
                    expiries.as_ref().and_then(|e| e.is_valid(*i).then(|| e.value(*i)))
                })));
            if let Some(values) = state.encode_values(&[kept_expiries])? {
                for (row, value) in kept_rows.iter().zip(values.iter()) {
                    state.put(keys.row(*row).as_ref(), value.as_ref());
                }
            }
            let filtered = arrow_select::filter::filter_record_batch(&batch, &BooleanArray::from(keep))?;
            if filtered.num_rows() > 0 {
                output.push(filtered);
            }
        }
        // Keys expire only within the watermark, or by an event time among
        // them; otherwise every expiry is null and there is nothing to scan.
        let expires = ctx
            .event_time_column
            .as_ref()
            .is_some_and(|c| self.within_watermark || self.keys.contains(c));
        if let (Some(watermark), true) = (ctx.watermark_ms, expires) {
            evict(state, watermark)?;
        }
        Ok(output)
    }
}

/// Forgets the keys whose expiry the watermark reached. The expiry is the
/// value's one column, so its encoded bytes are compared with the
/// watermark's, without decoding the state; a null expiry (a key kept for
/// good) encodes below every time, its first byte the null mark, and is
/// passed over.
fn evict(state: &mut KeyedState, watermark: i64) -> Result<usize, BoxError> {
    let bounds = state.value_prefix(&[Arc::new(Int64Array::from(vec![Some(watermark), None])) as ArrayRef])?;
    let (bound, null) = (bounds.row(0), bounds.row(1));
    let (bound, null) = (bound.as_ref(), null.as_ref());
    Ok(state.retain(|_, v| !(v.len() >= bound.len() && v[..bound.len()] <= *bound && v[0] != null[0])))
}
