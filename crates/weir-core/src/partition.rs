//! Hive-style partitions, as Delta tables and file sinks lay them out: a
//! row's partition values as strings and their `col=value` directories.

use std::collections::HashMap;
use std::fmt::Write as _;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Date32Type, Decimal128Type, Int16Type, Int32Type, Int64Type, Int8Type, TimestampMicrosecondType,
};
use arrow_array::{Array, ArrayRef, RecordBatch, UInt32Array};
use arrow_schema::{DataType, TimeUnit};

/// The directory name Delta and Hive use for a null partition value.
pub const NULL_PARTITION: &str = "__HIVE_DEFAULT_PARTITION__";

/// Whether weir can partition by a column of this type.
pub fn supported(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::Utf8
            | DataType::LargeUtf8
            | DataType::Utf8View
            | DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Date32
            | DataType::Boolean
            | DataType::Timestamp(TimeUnit::Microsecond, _)
            | DataType::Decimal128(_, _)
    )
}

/// The partition value of row `i`, as the Delta log writes it (`None` for
/// null; an empty string is null too, as in Spark).
pub fn value_at(array: &ArrayRef, i: usize) -> Option<String> {
    if array.is_null(i) {
        return None;
    }
    let value = match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().value(i).to_string(),
        DataType::LargeUtf8 => array.as_string::<i64>().value(i).to_string(),
        DataType::Utf8View => array.as_string_view().value(i).to_string(),
        DataType::Int8 => array.as_primitive::<Int8Type>().value(i).to_string(),
        DataType::Int16 => array.as_primitive::<Int16Type>().value(i).to_string(),
        DataType::Int32 => array.as_primitive::<Int32Type>().value(i).to_string(),
        DataType::Int64 => array.as_primitive::<Int64Type>().value(i).to_string(),
        DataType::Date32 => {
            let days = array.as_primitive::<Date32Type>().value(i);
            chrono::NaiveDate::from_num_days_from_ce_opt(days + 719_163)?
                .format("%Y-%m-%d")
                .to_string()
        }
        DataType::Boolean => array.as_boolean().value(i).to_string(),
        // The Delta protocol's forms: a UTC instant in ISO 8601 with its
        // `Z`, which no reader can take for local time; a timestamp without
        // a zone as `2026-01-01 10:00:00.000000`.
        DataType::Timestamp(TimeUnit::Microsecond, zone) => {
            let micros = array.as_primitive::<TimestampMicrosecondType>().value(i);
            let at = chrono::DateTime::from_timestamp_micros(micros)?;
            match zone {
                Some(_) => at.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
                None => at.naive_utc().format("%Y-%m-%d %H:%M:%S%.6f").to_string(),
            }
        }
        DataType::Decimal128(_, _) => array.as_primitive::<Decimal128Type>().value_as_string(i),
        _ => return None,
    };
    (!value.is_empty()).then_some(value)
}

/// Escapes a partition value for a directory name, as Hive and Spark do,
/// and a space too (as Spark on Windows does): a Delta log names a file by
/// a URI of its path, and a space in a folder's name would reach the log
/// as a space, which the protocol's readers (Delta Lake on Spark) refuse.
/// Readers of the directories unescape `%20` as any other escape.
pub fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        let special = c.is_ascii_control()
            || matches!(
                c,
                ' ' | '"' | '#' | '%' | '\'' | '*' | '/' | ':' | '=' | '?' | '\\' | '{' | '[' | ']' | '^'
            );
        if special {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The directory of a partition: `a=1/b=x`.
pub fn directory(columns: &[String], values: &[Option<String>]) -> String {
    columns
        .iter()
        .zip(values)
        .map(|(c, v)| {
            format!(
                "{}={}",
                escape(c),
                v.as_deref().map(escape).unwrap_or_else(|| NULL_PARTITION.into())
            )
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The partition values of a part of a batch, in partition column order.
pub type PartitionKey = Vec<Option<String>>;

/// Splits `batch` by the values of the partition columns `keys` (indices
/// into the batch), keeping row order within each part.
pub fn split(
    batch: &RecordBatch,
    keys: &[usize],
) -> Result<Vec<(PartitionKey, RecordBatch)>, arrow_schema::ArrowError> {
    if keys.is_empty() {
        return Ok(vec![(Vec::new(), batch.clone())]);
    }
    let columns: Vec<&ArrayRef> = keys.iter().map(|k| batch.column(*k)).collect();
    let mut groups: HashMap<Vec<Option<String>>, Vec<u32>> = HashMap::new();
    let mut order = Vec::new();
    for row in 0..batch.num_rows() {
        let key: Vec<Option<String>> = columns.iter().map(|c| value_at(c, row)).collect();
        let rows = groups.entry(key.clone()).or_insert_with(|| {
            order.push(key);
            Vec::new()
        });
        rows.push(row as u32);
    }
    if order.len() == 1 {
        return Ok(vec![(order.pop().unwrap_or_default(), batch.clone())]);
    }
    order
        .into_iter()
        .map(|key| {
            let indices = UInt32Array::from(groups.remove(&key).unwrap_or_default());
            Ok((key, arrow_select::take::take_record_batch(batch, &indices)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{Field, Schema};

    use super::*;

    #[test]
    fn directories_escape_like_hive() {
        assert_eq!(escape("a/b:c=d%"), "a%2Fb%3Ac%3Dd%25");
        assert_eq!(escape("10:00 utc"), "10%3A00%20utc");
        assert_eq!(escape("zürich"), "zürich", "non-ASCII stays (the log's URI escapes it)");
        assert_eq!(
            directory(&["day".into(), "kind".into()], &[Some("2026-11-29".into()), None]),
            "day=2026-11-29/kind=__HIVE_DEFAULT_PARTITION__"
        );
    }

    #[test]
    fn values_are_written_in_the_delta_protocols_forms() {
        use arrow_array::{Decimal128Array, TimestampMicrosecondArray};
        let instant: ArrayRef =
            Arc::new(TimestampMicrosecondArray::from(vec![1_767_225_600_000_123]).with_timezone("UTC"));
        assert_eq!(value_at(&instant, 0).as_deref(), Some("2026-01-01T00:00:00.000123Z"));
        let local: ArrayRef = Arc::new(TimestampMicrosecondArray::from(vec![1_767_225_600_000_123]));
        assert_eq!(value_at(&local, 0).as_deref(), Some("2026-01-01 00:00:00.000123"));
        let price: ArrayRef = Arc::new(
            Decimal128Array::from(vec![-150, 5])
                .with_precision_and_scale(10, 2)
                .unwrap(),
        );
        assert_eq!(value_at(&price, 0).as_deref(), Some("-1.50"));
        assert_eq!(value_at(&price, 1).as_deref(), Some("0.05"));
        assert_eq!(escape("2026-01-01T00:00:00.000123Z"), "2026-01-01T00%3A00%3A00.000123Z");
    }

    #[test]
    fn split_groups_rows_by_value() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("k", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3, 4])),
                Arc::new(StringArray::from(vec![Some("a"), None, Some("a"), Some("")])),
            ],
        )
        .unwrap();
        let parts = split(&batch, &[1]).unwrap();
        assert_eq!(parts.len(), 2, "an empty string is null");
        assert_eq!(parts[0].0, vec![Some("a".to_string())]);
        let ids = parts[0].1.column(0).as_primitive::<Int64Type>().values().to_vec();
        assert_eq!(ids, vec![1, 3]);
        let ids = parts[1].1.column(0).as_primitive::<Int64Type>().values().to_vec();
        assert_eq!(ids, vec![2, 4]);
    }
}
