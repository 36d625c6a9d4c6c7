//! Checking rows exactly once, and rows that make large files.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::RecordBatch;

/// The `event_id` column of every batch, in order.
pub fn event_ids(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            let col = b
                .column_by_name("event_id")
                .expect("rows have an event_id column")
                .as_primitive::<Int64Type>();
            col.values().to_vec()
        })
        .collect()
}

/// Asserts that `ids` is whole batches of `rows` rows of the rate source
/// (event ids `0..n * rows`, each once) and returns `n`: what a reader must
/// see while batches land (invariant I2).
#[track_caller]
pub fn assert_whole_batches(ids: &[i64], rows: u64) -> u64 {
    assert_eq!(
        ids.len() as u64 % rows,
        0,
        "a reader saw part of a batch: {} rows",
        ids.len()
    );
    let batches = ids.len() as u64 / rows;
    assert_exactly_once(ids, 0..(batches * rows) as i64);
    batches
}

/// Asserts that `ids` holds each of `expected` exactly once and nothing else,
/// naming the missing, repeated and unexpected ids.
#[track_caller]
pub fn assert_exactly_once(ids: &[i64], expected: std::ops::Range<i64>) {
    let mut counts: BTreeMap<i64, usize> = BTreeMap::new();
    for id in ids {
        *counts.entry(*id).or_default() += 1;
    }
    let missing: Vec<i64> = expected
        .clone()
        .filter(|id| !counts.contains_key(id))
        .take(20)
        .collect();
    let repeated: Vec<(i64, usize)> = counts
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, n)| (*id, *n))
        .take(20)
        .collect();
    let unexpected: Vec<i64> = counts
        .keys()
        .filter(|id| !expected.contains(id))
        .copied()
        .take(20)
        .collect();
    assert!(
        missing.is_empty() && repeated.is_empty() && unexpected.is_empty(),
        "expected ids {expected:?} exactly once in {} rows; missing (first 20): {missing:?}; repeated (id, times): {repeated:?}; unexpected: {unexpected:?}",
        ids.len()
    );
    assert_eq!(ids.len(), (expected.end - expected.start) as usize);
}

/// The rate source, `rows` per batch, with a `payload` column of 64 hex
/// characters that barely compress, so files grow large with few rows.
pub fn with_payload(rows: u64) -> weir_core::prelude::ReadStream {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use weir_core::prelude::*;
    read_stream(RateSource::rows_per_batch(rows)).map_batches(|b| {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let payload: arrow_array::StringArray = ids
            .iter()
            .map(|id| {
                let mut x = id.unwrap_or(0) as u64 ^ 0x9E37_79B9_7F4A_7C15;
                let mut s = String::with_capacity(64);
                for _ in 0..4 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    s.push_str(&format!("{x:016x}"));
                }
                Some(s)
            })
            .collect();
        let mut fields: Vec<arrow_schema::Field> = b.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(arrow_schema::Field::new("payload", arrow_schema::DataType::Utf8, true));
        let mut columns = b.columns().to_vec();
        columns.push(Arc::new(payload));
        Ok(RecordBatch::try_new(
            Arc::new(arrow_schema::Schema::new(fields)),
            columns,
        )?)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_sets_pass() {
        assert_exactly_once(&[2, 0, 1], 0..3);
    }

    #[test]
    #[should_panic(expected = "repeated (id, times): [(1, 2)]")]
    fn duplicates_fail() {
        assert_exactly_once(&[0, 1, 1], 0..2);
    }

    #[test]
    #[should_panic(expected = "missing (first 20): [2]")]
    fn gaps_fail() {
        assert_exactly_once(&[0, 1], 0..3);
    }
}
