//! Per-file column statistics for the `stats` of an add action, which
//! readers use to skip files. Bounds are written only where they are exact
//! or conservative: a bound that is wrong would make a reader skip rows.

use arrow_arith::aggregate;
use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Schema, TimeUnit};
use chrono::{DateTime, NaiveDate};
use serde_json::{json, Map, Value};

/// Strings longer than this get a truncated lower bound and no upper bound.
const MAX_STRING_BOUND: usize = 32;

#[derive(Debug, Clone, PartialEq, PartialOrd)]
enum Bound {
    Int(i64),
    Float(f64),
    Str(String),
    Date(i32),
    /// Microseconds since the epoch, UTC.
    Ts(i64),
}

#[derive(Debug)]
struct ColumnStats {
    index: usize,
    name: String,
    nulls: i64,
    min: Option<Bound>,
    max: Option<Bound>,
    /// False once a value makes bounds unsafe (NaN).
    bounds_ok: bool,
}

/// Statistics of one data file, updated batch by batch.
#[derive(Debug)]
pub(crate) struct FileStats {
    num_records: i64,
    columns: Vec<ColumnStats>,
}

impl FileStats {
    /// Statistics for the named columns, or else the first `indexed`
    /// top-level columns; nested columns get none.
    pub(crate) fn new(schema: &Schema, indexed: usize, only: Option<&[String]>) -> Self {
        let columns = schema
            .fields()
            .iter()
            .enumerate()
            .filter(|(i, f)| match only {
                Some(names) => names.iter().any(|n| n == f.name()),
                None => *i < indexed,
            })
            .filter(|(_, f)| !f.data_type().is_nested())
            .map(|(index, f)| ColumnStats {
                index,
                name: f.name().clone(),
                nulls: 0,
                min: None,
                max: None,
                bounds_ok: true,
            })
            .collect();
        FileStats {
            num_records: 0,
            columns,
        }
    }

    pub(crate) fn num_records(&self) -> i64 {
        self.num_records
    }

    pub(crate) fn update(&mut self, batch: &RecordBatch) {
        self.num_records += batch.num_rows() as i64;
        for col in &mut self.columns {
            let array = batch.column(col.index);
            col.nulls += array.null_count() as i64;
            if !col.bounds_ok {
                continue;
            }
            match bounds(array) {
                Some(Ok((lo, hi))) => {
                    if col.min.as_ref().is_none_or(|m| lo < *m) {
                        col.min = Some(lo);
                    }
                    if col.max.as_ref().is_none_or(|m| hi > *m) {
                        col.max = Some(hi);
                    }
                }
                Some(Err(())) => {
                    col.bounds_ok = false;
                    col.min = None;
                    col.max = None;
                }
                None => {}
            }
        }
    }

    /// The `stats` JSON of the add action.
    pub(crate) fn to_json(&self) -> String {
        let (mut mins, mut maxs, mut nulls) = (Map::new(), Map::new(), Map::new());
        for col in &self.columns {
            nulls.insert(col.name.clone(), json!(col.nulls));
            if let Some(v) = col.min.as_ref().and_then(lower_json) {
                mins.insert(col.name.clone(), v);
            }
            if let Some(v) = col.max.as_ref().and_then(upper_json) {
                maxs.insert(col.name.clone(), v);
            }
        }
        json!({
            "numRecords": self.num_records,
            "minValues": mins,
            "maxValues": maxs,
            "nullCount": nulls,
        })
        .to_string()
    }
}

/// The min and max of an array's non-null values: `None` for a type without
/// bounds or an all-null array, `Err` when bounds would be unsafe.
fn bounds(array: &ArrayRef) -> Option<Result<(Bound, Bound), ()>> {
    macro_rules! ints {
        ($t:ty) => {{
            let a = array.as_primitive::<$t>();
            Some(Ok((
                Bound::Int(aggregate::min(a)? as i64),
                Bound::Int(aggregate::max(a)? as i64),
            )))
        }};
    }
    macro_rules! floats {
        ($t:ty) => {{
            let a = array.as_primitive::<$t>();
            // NaN and infinities have no place in JSON bounds.
            if a.iter().flatten().any(|v| !v.is_finite()) {
                return Some(Err(()));
            }
            Some(Ok((
                Bound::Float(aggregate::min(a)? as f64),
                Bound::Float(aggregate::max(a)? as f64),
            )))
        }};
    }
    macro_rules! timestamps {
        ($t:ty, $to_micros:expr) => {{
            let a = array.as_primitive::<$t>();
            let f = $to_micros;
            Some(Ok((Bound::Ts(f(aggregate::min(a)?)), Bound::Ts(f(aggregate::max(a)?)))))
        }};
    }
    match array.data_type() {
        DataType::Int8 => ints!(Int8Type),
        DataType::Int16 => ints!(Int16Type),
        DataType::Int32 => ints!(Int32Type),
        DataType::Int64 => ints!(Int64Type),
        DataType::UInt8 => ints!(UInt8Type),
        DataType::UInt16 => ints!(UInt16Type),
        DataType::UInt32 => ints!(UInt32Type),
        DataType::Float32 => floats!(Float32Type),
        DataType::Float64 => floats!(Float64Type),
        DataType::Date32 => {
            let a = array.as_primitive::<Date32Type>();
            Some(Ok((Bound::Date(aggregate::min(a)?), Bound::Date(aggregate::max(a)?))))
        }
        DataType::Utf8 => {
            let a = array.as_string::<i32>();
            Some(Ok((
                Bound::Str(aggregate::min_string(a)?.into()),
                Bound::Str(aggregate::max_string(a)?.into()),
            )))
        }
        DataType::LargeUtf8 => {
            let a = array.as_string::<i64>();
            Some(Ok((
                Bound::Str(aggregate::min_string(a)?.into()),
                Bound::Str(aggregate::max_string(a)?.into()),
            )))
        }
        // Timestamps without a time zone are timestamp_ntz: no bounds.
        DataType::Timestamp(unit, Some(_)) => match unit {
            TimeUnit::Second => timestamps!(TimestampSecondType, |v: i64| v * 1_000_000),
            TimeUnit::Millisecond => timestamps!(TimestampMillisecondType, |v: i64| v * 1_000),
            TimeUnit::Microsecond => timestamps!(TimestampMicrosecondType, |v: i64| v),
            TimeUnit::Nanosecond => timestamps!(TimestampNanosecondType, |v: i64| v.div_euclid(1_000)),
        },
        _ => None,
    }
}

fn lower_json(b: &Bound) -> Option<Value> {
    Some(match b {
        Bound::Str(s) => json!(s.chars().take(MAX_STRING_BOUND).collect::<String>()),
        // Milliseconds, rounded down: still a lower bound.
        Bound::Ts(us) => json!(ts_json(us.div_euclid(1000))?),
        other => plain_json(other)?,
    })
}

fn upper_json(b: &Bound) -> Option<Value> {
    Some(match b {
        Bound::Str(s) if s.chars().count() > MAX_STRING_BOUND => return None,
        // Milliseconds, rounded up: still an upper bound.
        Bound::Ts(us) => json!(ts_json((us + 999).div_euclid(1000))?),
        other => plain_json(other)?,
    })
}

fn plain_json(b: &Bound) -> Option<Value> {
    Some(match b {
        Bound::Int(v) => json!(v),
        Bound::Float(v) => json!(v),
        Bound::Str(s) => json!(s),
        Bound::Date(d) => json!(NaiveDate::from_num_days_from_ce_opt(d + 719_163)?
            .format("%Y-%m-%d")
            .to_string()),
        Bound::Ts(_) => return None,
    })
}

fn ts_json(millis: i64) -> Option<String> {
    Some(
        DateTime::from_timestamp_millis(millis)?
            .format("%Y-%m-%dT%H:%M:%S%.3fZ")
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Float64Array, Int64Array, StringArray, TimestampMicrosecondArray};
    use arrow_schema::Field;

    use super::*;

    #[test]
    fn bounds_across_batches_and_nulls() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("x", DataType::Float64, true),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
        ]));
        let mut stats = FileStats::new(&schema, 32, None);
        let batch = |ids: Vec<Option<i64>>, names: Vec<Option<&str>>, xs: Vec<f64>, ts: Vec<i64>| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int64Array::from(ids)),
                    Arc::new(StringArray::from(names)),
                    Arc::new(Float64Array::from(xs)),
                    Arc::new(TimestampMicrosecondArray::from(ts).with_timezone("UTC")),
                ],
            )
            .unwrap()
        };
        stats.update(&batch(
            vec![Some(5), None],
            vec![Some("m"), Some("b")],
            vec![1.5, 2.0],
            vec![1_500, 2_000],
        ));
        let long = "z".repeat(40);
        stats.update(&batch(
            vec![Some(-3), Some(9)],
            vec![None, Some(&long)],
            vec![f64::NAN, 0.0],
            vec![999, 2_001],
        ));
        let json: Value = serde_json::from_str(&stats.to_json()).unwrap();
        assert_eq!(json["numRecords"], 4);
        assert_eq!(
            (json["minValues"]["id"].clone(), json["maxValues"]["id"].clone()),
            (json!(-3), json!(9))
        );
        assert_eq!(json["nullCount"]["id"], 1);
        assert_eq!(json["minValues"]["name"], "b");
        assert!(
            json["maxValues"].get("name").is_none(),
            "a long max string has no safe bound"
        );
        assert!(json["minValues"].get("x").is_none(), "NaN makes float bounds unsafe");
        assert_eq!(json["minValues"]["ts"], "1970-01-01T00:00:00.000Z");
        assert_eq!(
            json["maxValues"]["ts"], "1970-01-01T00:00:00.003Z",
            "rounded up to the millisecond"
        );
    }
}
