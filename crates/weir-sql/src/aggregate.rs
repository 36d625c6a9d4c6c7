//! Streaming aggregation: `group_by(keys).agg(aggregates)`, by plain
//! columns, by event-time windows and by sessions, in Append, Update and
//! Complete modes.
//!
//! Each batch, DataFusion folds the batch's rows into one partial row per
//! group (a sum, a count, ...); those are merged with the groups' partial
//! rows in the state (a second, small aggregation), and the merged rows go
//! back into the state. What the mode emits is made from partial rows: an
//! average is its sum over its count.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{
    Array, ArrayRef, Float64Array, Int64Array, RecordBatch, TimestampMicrosecondArray, TimestampMillisecondArray,
    TimestampNanosecondArray, TimestampSecondArray,
};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use datafusion::arrow::compute::{cast, cast_with_options, CastOptions};
use weir_core::operator::{OperatorContext, OperatorKind, StateContext, StatefulOperator};
use weir_core::state::{KeyedState, StateSchema};
use weir_core::{BoxError, OutputMode};

use crate::bins;
use crate::error::SqlError;
use crate::parts;
use crate::session::{self, SessionWindow, EVENT_MS, SESSION_END, SESSION_START};
use crate::sql::planned_schema;
use crate::window::{Window, WINDOW_END, WINDOW_START};
use crate::{quoted, INPUT};
use weir_core::sync::Recover;

/// A key of a `group_by`: a column, or the window an event time falls in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupKey {
    /// The values of a column.
    Column(String),
    /// Event-time windows of a timestamp column.
    Window(Window),
    /// Sessions of events of a timestamp column.
    Session(SessionWindow),
}

impl From<&str> for GroupKey {
    fn from(name: &str) -> Self {
        GroupKey::Column(name.to_string())
    }
}

impl From<String> for GroupKey {
    fn from(name: String) -> Self {
        GroupKey::Column(name)
    }
}

/// Groups by the column `name`.
pub fn col(name: impl Into<String>) -> GroupKey {
    GroupKey::Column(name.into())
}

/// Groups by tumbling windows of `size` over the timestamp `column`: the
/// output gets `window_start` and `window_end` columns.
pub fn window(column: impl Into<String>, size: Duration) -> GroupKey {
    GroupKey::Window(Window {
        column: column.into(),
        size,
        slide: size,
    })
}

/// Groups by windows of `size` starting every `slide` (a row falls in
/// each window that holds its event time).
pub fn sliding_window(column: impl Into<String>, size: Duration, slide: Duration) -> GroupKey {
    GroupKey::Window(Window {
        column: column.into(),
        size,
        slide,
    })
}

/// Groups by sessions over the timestamp `column`: a session of a key
/// lasts while its events follow each other within `gap` (an event at `t`
/// keeps it open until `t + gap`). The output gets `session_start` and
/// `session_end` columns. Sessions merge, so their aggregation works in
/// Append mode (each session once, when the watermark passed its end) and
/// Complete mode, not in Update mode.
pub fn session_window(column: impl Into<String>, gap: Duration) -> GroupKey {
    GroupKey::Session(SessionWindow {
        column: column.into(),
        gap,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Func {
    Sum,
    Count,
    Min,
    Max,
    Avg,
    CountDistinct,
}

/// One aggregate of a `group_by`: `sum("amount")`, `count()`, ...
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregate {
    func: Func,
    column: Option<String>,
    alias: Option<String>,
}

/// The sum of `column` (null when every value is null).
pub fn sum(column: impl Into<String>) -> Aggregate {
    Aggregate::new(Func::Sum, Some(column.into()))
}

/// The number of rows.
pub fn count() -> Aggregate {
    Aggregate::new(Func::Count, None)
}

/// The number of non-null values of `column`.
pub fn count_of(column: impl Into<String>) -> Aggregate {
    Aggregate::new(Func::Count, Some(column.into()))
}

/// The least value of `column`.
pub fn min(column: impl Into<String>) -> Aggregate {
    Aggregate::new(Func::Min, Some(column.into()))
}

/// The greatest value of `column`.
pub fn max(column: impl Into<String>) -> Aggregate {
    Aggregate::new(Func::Max, Some(column.into()))
}

/// The mean of `column`, as a double.
pub fn avg(column: impl Into<String>) -> Aggregate {
    Aggregate::new(Func::Avg, Some(column.into()))
}

/// The number of distinct non-null values of `column`. Its state is the
/// group's distinct values themselves, so it grows with them: bound it by
/// windows a watermark closes.
pub fn count_distinct(column: impl Into<String>) -> Aggregate {
    Aggregate::new(Func::CountDistinct, Some(column.into()))
}

impl Aggregate {
    fn new(func: Func, column: Option<String>) -> Self {
        Aggregate {
            func,
            column,
            alias: None,
        }
    }

    /// Names the output column (default: `sum_amount`, `count`, ...).
    pub fn alias(mut self, name: impl Into<String>) -> Self {
        self.alias = Some(name.into());
        self
    }

    /// The name of partial `j` in the state: the function and column are
    /// in it, so a changed aggregate does not take over another's state.
    fn partial_name(&self, i: usize, j: usize) -> String {
        let column: String = self
            .column
            .as_deref()
            .unwrap_or("rows")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
            .collect();
        format!("__p{i}_{j}_{:?}_{column}", self.func).to_lowercase()
    }

    fn output_name(&self) -> String {
        if let Some(a) = &self.alias {
            return a.clone();
        }
        let f = match self.func {
            Func::Sum => "sum",
            Func::Count => "count",
            Func::Min => "min",
            Func::Max => "max",
            Func::Avg => "avg",
            Func::CountDistinct => "count_distinct",
        };
        match &self.column {
            Some(c) => format!("{f}_{c}"),
            None => f.to_string(),
        }
    }

    /// What the aggregate `i` reads, as a column `__a{i}` of the rows
    /// (each aggregate its own, so no two partial expressions are alike).
    fn argument(&self, i: usize) -> Option<String> {
        let c = quoted(self.column.as_deref()?);
        Some(match self.func {
            Func::Avg => format!("CAST({c} AS DOUBLE) AS \"__a{i}\""),
            _ => format!("{c} AS \"__a{i}\""),
        })
    }

    /// The partial aggregates of aggregate `i` (SQL over its argument) and
    /// how partials merge (SQL over the partial `$`).
    fn partials(&self, i: usize) -> Vec<(String, &'static str)> {
        let a = format!("\"__a{i}\"");
        match (self.func, &self.column) {
            (Func::Count, None) => vec![("count(*)".into(), "sum($)")],
            (Func::Count, Some(_)) => vec![(format!("count({a})"), "sum($)")],
            (Func::Sum, Some(_)) => vec![(format!("sum({a})"), "sum($)")],
            (Func::Min, Some(_)) => vec![(format!("min({a})"), "min($)")],
            (Func::Max, Some(_)) => vec![(format!("max({a})"), "max($)")],
            (Func::Avg, Some(_)) => vec![(format!("sum({a})"), "sum($)"), (format!("count({a})"), "sum($)")],
            // The group's distinct values, sorted; merged as their union.
            (Func::CountDistinct, Some(_)) => vec![(
                format!("array_agg(DISTINCT {a} ORDER BY {a}) FILTER (WHERE {a} IS NOT NULL)"),
                "array_sort(array_distinct(flatten(array_agg($) FILTER (WHERE $ IS NOT NULL))))",
            )],
            (_, None) => unreachable!("only count has no column"),
        }
    }
}

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
    fn key_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.window.iter().map(|_| WINDOW_START.to_string()).collect();
        names.extend(self.keys.iter().cloned());
        names.extend(self.session.iter().map(|_| SESSION_START.to_string()));
        names
    }

    /// The columns of `schema` whose values keep a group's rows together
    /// when an aggregation is split (see `parts`): the keys with the
    /// window's start; a session's keys alone, since its rows make one
    /// session or several only together.
    fn split_columns(&self, schema: &Schema) -> Vec<usize> {
        let names = match self.session {
            Some(_) => self.keys.clone(),
            None => self.key_names(),
        };
        names.iter().filter_map(|n| schema.index_of(n).ok()).collect()
    }

    /// Runs the aggregation `query` over `rows` of `schema`, on every core
    /// when they are many.
    async fn aggregate(
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

    /// The event-time column of the window or sessions.
    fn event_column(&self) -> Option<&str> {
        self.window
            .as_ref()
            .map(|w| w.column.as_str())
            .or(self.session.as_ref().map(|s| s.column.as_str()))
    }

    fn partial_sql(&self) -> String {
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

    fn merge_sql(&self) -> String {
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
    fn assigned_schema(&self, input: &Schema) -> SchemaRef {
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

    fn partial_schema(&self, input: &Schema) -> Result<SchemaRef, SqlError> {
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
    fn finish(&self, partial: &RecordBatch, input: &Schema, output: &SchemaRef) -> Result<RecordBatch, BoxError> {
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
    fn planned_partial_schema(&self, input: &SchemaRef) -> Result<SchemaRef, SqlError> {
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
    fn output_schema_of(&self, input: &Schema, partial: &Schema) -> Result<SchemaRef, BoxError> {
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

    /// Removes the groups whose window the watermark closed (its end at
    /// or before the watermark) and returns their partial rows, sorted by
    /// key. The key's first column is the window's start, so these are the
    /// keys before the start `watermark - size + 1`: found by comparing
    /// encoded bytes, without decoding the state.
    fn take_closed(&self, state: &mut KeyedState, watermark: i64) -> Result<Option<RecordBatch>, BoxError> {
        let Some(w) = &self.window else {
            return Ok(None);
        };
        let Some(first_open) = watermark.checked_sub(w.size_ms()).and_then(|s| s.checked_add(1)) else {
            return Ok(None);
        };
        let bound = state.key_prefix(&[Arc::new(Int64Array::from(vec![first_open])) as ArrayRef])?;
        Ok(Some(state.take_before(bound.row(0).as_ref())?))
    }

    /// The partial rows of `input`: one per group, window start first.
    async fn partial_rows(
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

    /// Whether the state is kept in bins (see `bins`): in Append mode,
    /// where the watermark closes the windows.
    fn binned(&self, mode: OutputMode, event_time: Option<&str>) -> bool {
        mode == OutputMode::Append
            && self
                .window
                .as_ref()
                .is_some_and(|w| event_time == Some(w.column.as_str()))
    }

    /// The final partial rows of closed windows taken from bins: a window
    /// one batch saw is final as it is; the partial rows of the windows
    /// several batches saw are merged, in one aggregation (the window's
    /// start is a group column).
    async fn merge_bins(&self, taken: &RecordBatch, partial_schema: &SchemaRef) -> Result<RecordBatch, BoxError> {
        let (mut rows, mut several) = (Vec::new(), Vec::new());
        for window in bins::windows(taken, partial_schema)? {
            if window.bins == 1 {
                rows.extend(window.rows);
            } else {
                several.extend(window.rows);
            }
        }
        if !several.is_empty() {
            let merged = self
                .aggregate(&self.merge_sql(), partial_schema.clone(), several)
                .await?;
            rows.push(conform(partial_schema, &merged)?);
        }
        Ok(arrow_select::concat::concat_batches(partial_schema, &rows)?)
    }

    /// Merges the bins of each window of `starts` (those batch `batch` added
    /// to) that holds too many into one bin of the batch, so a window keeps
    /// a bounded number of batches' rows.
    async fn merge_crowded(
        &self,
        state: &mut KeyedState,
        starts: &[i64],
        batch: weir_core::BatchId,
        partial_schema: &SchemaRef,
    ) -> Result<(), BoxError> {
        for keys in bins::crowded(state, starts)? {
            let keys: Vec<&[u8]> = keys.iter().map(|k| &**k).collect();
            let taken = state.batch_of(&keys)?;
            for key in &keys {
                state.remove(key);
            }
            let merged = self.merge_bins(&taken, partial_schema).await?;
            bins::put(state, &merged, batch)?;
        }
        Ok(())
    }

    /// A batch of a session aggregation: the batch's sessions are merged
    /// with the open sessions of their groups, then Append mode emits (and
    /// forgets) the sessions the watermark ended and Complete mode every
    /// session.
    async fn process_sessions(
        &self,
        state: &mut KeyedState,
        input: Vec<RecordBatch>,
        ctx: &OperatorContext,
        partial_schema: &SchemaRef,
        output_schema: &SchemaRef,
    ) -> Result<Vec<RecordBatch>, BoxError> {
        let n = self.key_names().len();
        if input.iter().any(|b| b.num_rows() > 0) {
            let rows = self.partial_rows(input, &ctx.input_schema, partial_schema).await?;
            let rows = match session::take_sessions_of(state, &rows, self.keys.len())? {
                Some(held) => {
                    let held = held.with_schema(partial_schema.clone())?;
                    let merged = self
                        .aggregate(&self.merge_sql(), partial_schema.clone(), vec![held, rows])
                        .await?;
                    conform(partial_schema, &merged)?
                }
                None => rows,
            };
            let keys = state.encode_keys(&rows.columns()[..n])?;
            if let Some(values) = state.encode_values(&rows.columns()[n..])? {
                for (k, v) in keys.iter().zip(values.iter()) {
                    state.put(k.data(), v);
                }
            }
        }
        let done = match (ctx.output_mode, ctx.watermark_ms) {
            (OutputMode::Complete, _) => state.sorted()?,
            (_, Some(watermark)) => session::take_ended(state, watermark)?,
            (_, None) => return Ok(Vec::new()),
        };
        let done = done.with_schema(partial_schema.clone())?;
        let mut output = vec![self.finish(&done, &ctx.input_schema, output_schema)?];
        output.retain(|b| b.num_rows() > 0);
        Ok(output)
    }

    /// Folds `input` into the state's partial rows; returns the groups it
    /// changed, with their new partial rows.
    async fn fold(
        &self,
        state: &mut KeyedState,
        input: Vec<RecordBatch>,
        input_schema: &Schema,
        partial_schema: &SchemaRef,
    ) -> Result<RecordBatch, BoxError> {
        let nkeys = self.key_names().len();
        let batch = self.partial_rows(input, input_schema, partial_schema).await?;
        let keys = state.encode_keys(&batch.columns()[..nkeys])?;
        // Groups new to the state take the batch's partial row as it is;
        // only the groups the state holds are merged with their old rows.
        let (held, new): (Vec<usize>, Vec<usize>) =
            (0..batch.num_rows()).partition(|&i| state.contains_key(keys.row(i).data()));
        let (rows, keys) = if held.is_empty() {
            (batch, keys)
        } else {
            let held_keys: Vec<&[u8]> = held.iter().map(|&i| keys.row(i).data()).collect();
            let old = state.batch_of(&held_keys)?.with_schema(partial_schema.clone())?;
            let take = |rows: &[usize]| {
                let indices = arrow_array::UInt32Array::from_iter_values(rows.iter().map(|&i| i as u32));
                arrow_select::take::take_record_batch(&batch, &indices)
            };
            let merged = self
                .aggregate(&self.merge_sql(), partial_schema.clone(), vec![old, take(&held)?])
                .await?;
            let rows = conform(partial_schema, &[take(&new)?, conform(partial_schema, &merged)?])?;
            let keys = state.encode_keys(&rows.columns()[..nkeys])?;
            (rows, keys)
        };
        if let Some(values) = state.encode_values(&rows.columns()[nkeys..])? {
            for (k, v) in keys.iter().zip(values.iter()) {
                state.put(k.data(), v);
            }
        }
        Ok(rows)
    }
}

/// `batches` as one batch of `schema`: partial types are the state's, so
/// columns DataFusion widened are cast back (failing on a value that does
/// not fit).
fn conform(schema: &SchemaRef, batches: &[RecordBatch]) -> Result<RecordBatch, BoxError> {
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
        if self.session.is_some() {
            return self
                .process_sessions(state, input, ctx, &partial_schema, &output_schema)
                .await;
        }
        if self.binned(ctx.output_mode, ctx.event_time_column.as_deref()) {
            if input.iter().any(|b| b.num_rows() > 0) {
                let rows = self.partial_rows(input, &ctx.input_schema, &partial_schema).await?;
                let starts = bins::put(state, &rows, ctx.batch_id)?;
                self.merge_crowded(state, &starts, ctx.batch_id, &partial_schema)
                    .await?;
            }
            let mut output = Vec::new();
            if let Some(taken) = ctx
                .watermark_ms
                .map(|wm| self.take_closed(state, wm))
                .transpose()?
                .flatten()
            {
                let closed = self.merge_bins(&taken, &partial_schema).await?;
                output.push(self.finish(&closed, &ctx.input_schema, &output_schema)?);
            }
            output.retain(|b| b.num_rows() > 0);
            return Ok(output);
        }
        // Append keeps bins (above); the keyed state serves Update and
        // Complete.
        if ctx.output_mode == OutputMode::Append {
            return Err(SqlError::InvalidAggregation {
                operator: self.name.clone(),
                reason: "Append mode needs a watermark on the event-time column of the window".into(),
            }
            .into());
        }
        let mut merged: Option<RecordBatch> = None;
        if input.iter().any(|b| b.num_rows() > 0) {
            merged = Some(self.fold(state, input, &ctx.input_schema, &partial_schema).await?);
        }
        let mut output = Vec::new();
        match ctx.output_mode {
            OutputMode::Complete => {
                // Complete keeps and emits every group.
                let all = state.sorted()?.with_schema(partial_schema.clone())?;
                output.push(self.finish(&all, &ctx.input_schema, &output_schema)?);
            }
            _ => {
                if let Some(rows) = &merged {
                    output.push(self.finish(rows, &ctx.input_schema, &output_schema)?);
                }
                // Update emitted a closed window's last change: a window the
                // watermark closed (on its own column) is forgotten.
                let closes = self
                    .window
                    .as_ref()
                    .is_some_and(|w| ctx.event_time_column.as_deref() == Some(&w.column));
                if let (Some(wm), true) = (ctx.watermark_ms, closes) {
                    self.take_closed(state, wm)?;
                }
            }
        }
        output.retain(|b| b.num_rows() > 0);
        Ok(output)
    }
}
