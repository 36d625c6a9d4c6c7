//! The aggregation's two DataFusion plans (a batch's rows into partial
//! rows per group; partial rows merged), its schemas, and the rows it
//! emits, made from partial rows (an average is its sum over its count).

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{
    Array, ArrayRef, Float64Array, Int64Array, RecordBatch, TimestampMicrosecondArray, TimestampMillisecondArray,
    TimestampNanosecondArray, TimestampSecondArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::compute::{cast, cast_with_options, CastOptions};
use weir_core::sync::Recover;
use weir_core::BoxError;

use super::spec::Func;
use super::Aggregation;
use crate::error::SqlError;
use crate::parts;
use crate::session::{self, EVENT_MS, SESSION_END, SESSION_START};
use crate::sql::planned_schema;
use crate::window::{WINDOW_END, WINDOW_START};
use crate::{quoted, INPUT};

impl Aggregation {
    /// Runs the aggregation `query` over `rows` of `schema`, on every core
    /// when they are many.
    pub(super) async fn aggregate(
        &self,
        query: &str,
        schema: SchemaRef,
        rows: Vec<RecordBatch>,
    ) -> Result<Vec<RecordBatch>, BoxError> {
        let columns = self.split_columns(&schema);
        parts::aggregate(query, &columns, schema, rows)
            .await
            .map_err(SqlError::boxed)
    }

    pub(super) fn partial_sql(&self) -> String {
        if let Some(s) = &self.session {
            let (mut carried, mut aggregates) = (Vec::new(), Vec::new());
            for (i, agg) in self.aggregates.iter().enumerate() {
                carried.extend(agg.argument(i));
                for (j, (expr, _)) in agg.partials(i).into_iter().enumerate() {
                    aggregates.push(format!("{expr} AS {}", quoted(&agg.partial_name(i, j))));
                }
            }
            let t = quoted(EVENT_MS);
            let keys: Vec<String> = self.keys.iter().map(|k| quoted(k)).collect();
            return session::sessions_sql(&keys, &t, &format!("{t} + {}", s.gap_ms()), &carried, &aggregates);
        }
        let keys: Vec<String> = self.key_names().iter().map(|k| quoted(k)).collect();
        let mut arguments = keys.clone();
        let mut select = keys.clone();
        for (i, agg) in self.aggregates.iter().enumerate() {
            arguments.extend(agg.argument(i));
            for (j, (expr, _)) in agg.partials(i).into_iter().enumerate() {
                select.push(format!("{expr} AS {}", quoted(&agg.partial_name(i, j))));
            }
        }
        format!(
            "SELECT {} FROM (SELECT {} FROM {INPUT}) GROUP BY {}",
            select.join(", "),
            arguments.join(", "),
            keys.join(", ")
        )
    }

    pub(super) fn merge_sql(&self) -> String {
        if self.session.is_some() {
            let (mut carried, mut aggregates) = (Vec::new(), Vec::new());
            for (i, agg) in self.aggregates.iter().enumerate() {
                for (j, (_, merge)) in agg.partials(i).into_iter().enumerate() {
                    let p = quoted(&agg.partial_name(i, j));
                    aggregates.push(format!("{} AS {p}", merge.replace('$', &p)));
                    carried.push(p);
                }
            }
            let keys: Vec<String> = self.keys.iter().map(|k| quoted(k)).collect();
            let (start, end) = (quoted(SESSION_START), quoted(SESSION_END));
            return session::sessions_sql(&keys, &start, &end, &carried, &aggregates);
        }
        let keys: Vec<String> = self.key_names().iter().map(|k| quoted(k)).collect();
        let mut select = keys.clone();
        for (i, agg) in self.aggregates.iter().enumerate() {
            for (j, (_, merge)) in agg.partials(i).into_iter().enumerate() {
                let p = quoted(&agg.partial_name(i, j));
                select.push(format!("{} AS {p}", merge.replace('$', &p)));
            }
        }
        format!("SELECT {} FROM {INPUT} GROUP BY {}", select.join(", "), keys.join(", "))
    }

    /// The schema the partial rows are computed over (window start first).
    pub(super) fn assigned_schema(&self, input: &Schema) -> SchemaRef {
        let mut fields = Vec::new();
        if self.window.is_some() {
            fields.push(Arc::new(Field::new(WINDOW_START, DataType::Int64, false)));
        }
        if self.session.is_some() {
            fields.push(Arc::new(Field::new(EVENT_MS, DataType::Int64, true)));
        }
        fields.extend(input.fields().iter().cloned());
        Arc::new(Schema::new(fields))
    }

    pub(super) fn partial_schema(&self, input: &Schema) -> Result<SchemaRef, SqlError> {
        if let Some(reason) = &self.invalid {
            return Err(SqlError::InvalidAggregation {
                operator: self.name.clone(),
                reason: reason.clone(),
            });
        }
        if self.key_names().is_empty() {
            return Err(SqlError::NoKeys {
                operator: self.name.clone(),
            });
        }
        if let Some(column) = self.event_column() {
            match input.field_with_name(column).map(|f| f.data_type()) {
                Ok(DataType::Timestamp(..)) => {}
                Ok(other) => {
                    return Err(SqlError::InvalidAggregation {
                        operator: self.name.clone(),
                        reason: format!("the window's column {column:?} is {other}, not a timestamp"),
                    })
                }
                Err(_) => {
                    return Err(SqlError::MissingColumn {
                        operator: self.name.clone(),
                        column: column.to_string(),
                        available: input.fields().iter().map(|f| f.name().clone()).collect(),
                    })
                }
            }
        }
        planned_schema(&self.partial_sql(), &[(INPUT, self.assigned_schema(input))])
    }

    /// The output rows of `partial` rows (keys, then partials).
    pub(super) fn finish(
        &self,
        partial: &RecordBatch,
        input: &Schema,
        output: &SchemaRef,
    ) -> Result<RecordBatch, BoxError> {
        let mut columns: Vec<ArrayRef> = Vec::new();
        let millis = |c: usize| partial.column(c).as_primitive::<Int64Type>().values().to_vec();
        let nkeys = self.keys.len();
        let (at, mut p, times) = match (&self.window, &self.session) {
            (Some(w), _) => {
                let starts = millis(0);
                let ends: Vec<i64> = starts.iter().map(|s| s + w.size_ms()).collect();
                (1, 1 + nkeys, Some((&w.column, starts, ends)))
            }
            (None, Some(s)) => (0, nkeys + 2, Some((&s.column, millis(nkeys), millis(nkeys + 1)))),
            (None, None) => (0, nkeys, None),
        };
        if let Some((column, starts, ends)) = times {
            let ty = input.field_with_name(column)?.data_type().clone();
            columns.push(timestamps(&starts, &ty)?);
            columns.push(timestamps(&ends, &ty)?);
        }
        for i in 0..nkeys {
            columns.push(partial.column(at + i).clone());
        }
        for agg in &self.aggregates {
            match agg.func {
                Func::Avg => {
                    let sums = cast(partial.column(p), &DataType::Float64)?;
                    let counts = partial.column(p + 1).as_primitive::<Int64Type>();
                    let sums = sums.as_primitive::<arrow_array::types::Float64Type>();
                    let avgs: Float64Array = (0..partial.num_rows())
                        .map(|r| {
                            (counts.value(r) > 0 && sums.is_valid(r)).then(|| sums.value(r) / counts.value(r) as f64)
                        })
                        .collect();
                    columns.push(Arc::new(avgs));
                    p += 2;
                }
                Func::CountDistinct => {
                    columns.push(Arc::new(list_lengths(partial.column(p))?));
                    p += 1;
                }
                _ => {
                    columns.push(partial.column(p).clone());
                    p += 1;
                }
            }
        }
        Ok(RecordBatch::try_new(output.clone(), columns)?)
    }

    /// [`Aggregation::partial_schema`], planned again only when the input's
    /// schema differs from the last batch's.
    pub(super) fn planned_partial_schema(&self, input: &SchemaRef) -> Result<SchemaRef, SqlError> {
        let mut planned = self.planned.lock().recover();
        if let Some((last, partial)) = planned.as_ref() {
            if last == input {
                return Ok(partial.clone());
            }
        }
        let partial = self.partial_schema(input)?;
        *planned = Some((input.clone(), partial.clone()));
        Ok(partial)
    }

    /// The output's schema, from the input's and the partial rows'.
    pub(super) fn output_schema_of(&self, input: &Schema, partial: &Schema) -> Result<SchemaRef, BoxError> {
        let mut fields: Vec<Field> = Vec::new();
        let nkeys = self.keys.len();
        let (at, mut p, names) = match (&self.window, &self.session) {
            (Some(w), _) => (1, 1 + nkeys, Some((&w.column, WINDOW_START, WINDOW_END))),
            (None, Some(s)) => (0, nkeys + 2, Some((&s.column, SESSION_START, SESSION_END))),
            (None, None) => (0, nkeys, None),
        };
        if let Some((column, start, end)) = names {
            let ty = input.field_with_name(column)?.data_type().clone();
            fields.push(Field::new(start, ty.clone(), false));
            fields.push(Field::new(end, ty, false));
        }
        for i in 0..nkeys {
            fields.push(partial.field(at + i).clone());
        }
        for agg in &self.aggregates {
            let name = agg.output_name();
            match agg.func {
                Func::Avg => {
                    fields.push(Field::new(name, DataType::Float64, true));
                    p += 2;
                }
                Func::CountDistinct => {
                    fields.push(Field::new(name, DataType::Int64, false));
                    p += 1;
                }
                _ => {
                    fields.push(partial.field(p).as_ref().clone().with_name(name));
                    p += 1;
                }
            }
        }
        Ok(Arc::new(Schema::new(fields)))
    }

    /// The partial rows of `input`: one per group, window start first.
    pub(super) async fn partial_rows(
        &self,
        input: Vec<RecordBatch>,
        input_schema: &Schema,
        partial_schema: &SchemaRef,
    ) -> Result<RecordBatch, BoxError> {
        let assigned: Vec<RecordBatch> = match (&self.window, &self.session) {
            (Some(w), _) => input.iter().map(|b| w.assign(b)).collect::<Result<_, _>>()?,
            (None, Some(s)) => input.iter().map(|b| s.assign(b)).collect::<Result<_, _>>()?,
            (None, None) => input,
        };
        let partials = self
            .aggregate(&self.partial_sql(), self.assigned_schema(input_schema), assigned)
            .await?;
        conform(partial_schema, &partials)
    }
}

/// `batches` as one batch of `schema`: partial types are the state's, so
/// columns DataFusion widened are cast back (failing on a value that does
/// not fit).
pub(super) fn conform(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<RecordBatch, BoxError> {
    let batches = batches
        .iter()
        .map(|b| {
            let columns = b
                .columns()
                .iter()
                .zip(schema.fields())
                .map(|(c, f)| exact_cast(c, f.data_type()))
                .collect::<Result<Vec<_>, _>>()?;
            RecordBatch::try_new(schema.clone(), columns)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(arrow_select::concat::concat_batches(schema, &batches)?)
}

/// `array` as `data_type`, failing (never nulling) on a value that does not
/// fit: a sum past its decimal precision is an error, not a silent restart.
fn exact_cast(array: &ArrayRef, data_type: &DataType) -> Result<ArrayRef, arrow_schema::ArrowError> {
    if array.data_type() == data_type {
        return Ok(array.clone());
    }
    cast_with_options(
        array,
        data_type,
        &CastOptions {
            safe: false,
            ..Default::default()
        },
    )
}

/// The number of values in each list of `lists` (0 for a null list: a
/// group whose values were all null).
fn list_lengths(lists: &ArrayRef) -> Result<Int64Array, SqlError> {
    let lengths = |n: usize, len: &dyn Fn(usize) -> i64, valid: &dyn Fn(usize) -> bool| {
        Int64Array::from_iter_values((0..n).map(|r| if valid(r) { len(r) } else { 0 }))
    };
    match lists.data_type() {
        DataType::List(_) => {
            let l = lists.as_list::<i32>();
            Ok(lengths(l.len(), &|r| l.value_length(r) as i64, &|r| l.is_valid(r)))
        }
        DataType::LargeList(_) => {
            let l = lists.as_list::<i64>();
            Ok(lengths(l.len(), &|r| l.value_length(r), &|r| l.is_valid(r)))
        }
        other => Err(SqlError::Arrow {
            context: "count_distinct".into(),
            source: arrow_schema::ArrowError::SchemaError(format!("its partial is {other}, not a list")),
        }),
    }
}

/// Window starts (milliseconds) as timestamps of `data_type`.
fn timestamps(millis: &[i64], data_type: &DataType) -> Result<ArrayRef, SqlError> {
    let (unit, tz) = match data_type {
        DataType::Timestamp(unit, tz) => (*unit, tz.clone()),
        other => {
            return Err(SqlError::Arrow {
                context: "window columns".into(),
                source: arrow_schema::ArrowError::SchemaError(format!("{other} is not a timestamp")),
            })
        }
    };
    let values = millis.iter().copied();
    Ok(match unit {
        TimeUnit::Second => {
            Arc::new(TimestampSecondArray::from_iter_values(values.map(|m| m / 1000)).with_timezone_opt(tz))
        }
        TimeUnit::Millisecond => Arc::new(TimestampMillisecondArray::from_iter_values(values).with_timezone_opt(tz)),
        TimeUnit::Microsecond => {
            Arc::new(TimestampMicrosecondArray::from_iter_values(values.map(|m| m * 1000)).with_timezone_opt(tz))
        }
        TimeUnit::Nanosecond => {
            Arc::new(TimestampNanosecondArray::from_iter_values(values.map(|m| m * 1_000_000)).with_timezone_opt(tz))
        }
    })
}
