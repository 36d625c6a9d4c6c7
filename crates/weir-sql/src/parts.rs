//! Aggregations of many rows, on every core.
//!
//! weir runs DataFusion on one partition, so a projection or a filter keeps
//! its rows in order. An aggregation of many rows is split instead, by a
//! hash of its group columns, into parts that DataFusion aggregates at the
//! same time, one per worker of the runtime. Every row of a group lands in
//! the same part, in input order, so each group's result is the one a
//! single partition gives (a floating-point sum included), whatever the
//! number of parts: a replay on a machine with other cores computes the
//! same groups. Only the order of the groups in the result differs, and
//! nothing depends on it. One exception: sessions sort a key's events by
//! event time, and events of one key at the same millisecond may be summed
//! in another order when the number of parts differs, so a floating-point
//! sum over them may differ in its last bits between machines (never on a
//! replay on the same machine).

use arrow_array::{RecordBatch, UInt32Array};
use arrow_schema::{ArrowError, SchemaRef};
use datafusion::common::hash_utils::create_hashes;
use tokio::runtime::{Handle, RuntimeFlavor};

use weir_core::maintenance::AbortOnDrop;

use crate::error::SqlError;
use crate::sql::run_on_input;

/// The fewest rows worth a part of their own: below this, splitting the
/// rows costs more than aggregating them on another core saves.
pub(crate) const MIN_PART_ROWS: usize = 65_536;

/// The parts an aggregation of `rows` rows runs in: one per worker of the
/// current runtime, each of at least [`MIN_PART_ROWS`] rows; one outside a
/// multi-threaded runtime.
pub(crate) fn part_count(rows: usize) -> usize {
    let workers = match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => handle.metrics().num_workers(),
        _ => 1,
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    workers.min(cores).min(rows / MIN_PART_ROWS).max(1)
}

/// `batches` split into `parts` by a hash of their columns `columns`: a
/// group's rows all in one part, each part's rows in input order.
pub(crate) fn split(
    batches: &[RecordBatch],
    columns: &[usize],
    parts: usize,
) -> Result<Vec<Vec<RecordBatch>>, ArrowError> {
    // Fixed seeds: the same rows split the same way on every run.
    let seeds = ahash::RandomState::with_seeds(0x77656972, 0x7061727473, 0x67726f7570, 0x6b657973);
    let mut out: Vec<Vec<RecordBatch>> = vec![Vec::new(); parts];
    let mut hashes: Vec<u64> = Vec::new();
    for batch in batches.iter().filter(|b| b.num_rows() > 0) {
        hashes.clear();
        hashes.resize(batch.num_rows(), 0);
        let arrays = columns.iter().map(|&c| batch.column(c));
        create_hashes(arrays, &seeds, &mut hashes).map_err(|e| ArrowError::ExternalError(Box::new(e)))?;
        let mut rows: Vec<Vec<u32>> = vec![Vec::new(); parts];
        for (row, hash) in hashes.iter().enumerate() {
            rows[(hash % parts as u64) as usize].push(row as u32);
        }
        for (part, rows) in out.iter_mut().zip(rows) {
            if !rows.is_empty() {
                part.push(arrow_select::take::take_record_batch(batch, &UInt32Array::from(rows))?);
            }
        }
    }
    Ok(out)
}

/// Runs the aggregation `query` over `rows` of `schema` as the table
/// `input`, grouped by (at least) the columns `columns`: in parts when the
/// rows are many, the parts' results one after the other. With no group
/// column, in one part.
pub(crate) async fn aggregate(
    query: &str,
    columns: &[usize],
    schema: SchemaRef,
    rows: Vec<RecordBatch>,
) -> Result<Vec<RecordBatch>, SqlError> {
    let parts = part_count(rows.iter().map(|b| b.num_rows()).sum());
    aggregate_in(query, columns, schema, rows, parts).await
}

/// [`aggregate`] in `parts` parts.
async fn aggregate_in(
    query: &str,
    columns: &[usize],
    schema: SchemaRef,
    rows: Vec<RecordBatch>,
    parts: usize,
) -> Result<Vec<RecordBatch>, SqlError> {
    if parts <= 1 || columns.is_empty() {
        return run_on_input(query, schema, rows).await;
    }
    let split = split(&rows, columns, parts).map_err(|source| SqlError::Arrow {
        context: "splitting the rows of an aggregation by their groups".into(),
        source,
    })?;
    drop(rows);
    let tasks: Vec<_> = split
        .into_iter()
        .map(|part| {
            let (query, schema) = (query.to_string(), schema.clone());
            AbortOnDrop(tokio::spawn(async move { run_on_input(&query, schema, part).await }))
        })
        .collect();
    // Every part finishes before an error is returned, and a dropped
    // aggregation aborts its parts: none runs on after the batch ended.
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await);
    }
    let mut out = Vec::new();
    for result in results {
        match result {
            Ok(rows) => out.extend(rows?),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {
                return Err(SqlError::Cancelled {
                    query: query.to_string(),
                })
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int64Type};
    use arrow_array::{Float64Array, Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;

    /// Rows of `keys` and `names`, numbered from `first` in `seq`, with a
    /// float `x` whose sum depends on the order it is added in.
    fn rows(keys: &[i64], names: &[&str], first: i64) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("key", DataType::Int64, false),
            Field::new("name", DataType::Utf8, false),
            Field::new("seq", DataType::Int64, false),
            Field::new("x", DataType::Float64, false),
        ]));
        let seq = first..first + keys.len() as i64;
        let x = Float64Array::from_iter_values(seq.clone().map(|s| 0.1 * s as f64 + 1e12 * (s % 7) as f64));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(keys.to_vec())),
                Arc::new(StringArray::from(names.to_vec())),
                Arc::new(Int64Array::from_iter_values(seq)),
                Arc::new(x),
            ],
        )
        .unwrap()
    }

    #[test]
    fn a_group_lands_in_one_part_in_input_order() {
        let keys: Vec<i64> = (0..1000).map(|i| i % 37).collect();
        let names: Vec<&str> = (0..1000).map(|i| ["a", "b", "c"][i % 3]).collect();
        let input = vec![
            rows(&keys[..600], &names[..600], 0),
            rows(&keys[600..], &names[600..], 600),
        ];
        for parts in [1, 2, 3, 8] {
            let split = split(&input, &[0, 1], parts).unwrap();
            assert_eq!(split.len(), parts);
            let total: usize = split.iter().flatten().map(|b| b.num_rows()).sum();
            assert_eq!(total, 1000, "{parts} parts hold every row once");
            let mut part_of = std::collections::HashMap::new();
            for (p, batches) in split.iter().enumerate() {
                let mut last = std::collections::HashMap::new();
                for b in batches {
                    let (k, n, s) = (
                        b.column(0).as_primitive::<Int64Type>(),
                        b.column(1).as_string::<i32>(),
                        b.column(2).as_primitive::<Int64Type>(),
                    );
                    for r in 0..b.num_rows() {
                        let group = (k.value(r), n.value(r).to_string());
                        assert_eq!(*part_of.entry(group.clone()).or_insert(p), p, "{group:?} in one part");
                        let at = s.value(r);
                        if let Some(prev) = last.insert(group.clone(), at) {
                            assert!(prev < at, "{group:?} keeps its input order");
                        }
                    }
                }
            }
            if parts > 1 {
                let used = split.iter().filter(|p| !p.is_empty()).count();
                assert!(used > 1, "{parts} parts: the groups spread over more than one");
            }
        }
    }

    /// Each group's sum, count and float sum (its bits), sorted by group.
    fn totals(batches: &[RecordBatch]) -> Vec<(i64, String, i64, i64, u64)> {
        let mut out = Vec::new();
        for b in batches {
            let (k, n) = (b.column(0).as_primitive::<Int64Type>(), b.column(1).as_string::<i32>());
            let (s, c) = (
                b.column(2).as_primitive::<Int64Type>(),
                b.column(3).as_primitive::<Int64Type>(),
            );
            let x = b.column(4).as_primitive::<Float64Type>();
            for r in 0..b.num_rows() {
                out.push((
                    k.value(r),
                    n.value(r).to_string(),
                    s.value(r),
                    c.value(r),
                    x.value(r).to_bits(),
                ));
            }
        }
        out.sort();
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn parts_give_the_groups_one_part_gives() {
        let keys: Vec<i64> = (0..5000).map(|i| (i * 7919) % 211).collect();
        let names: Vec<&str> = (0..5000).map(|i| ["x", "y"][i % 2]).collect();
        let input = vec![
            rows(&keys[..3000], &names[..3000], 0),
            rows(&keys[3000..], &names[3000..], 3000),
        ];
        let schema = input[0].schema();
        let query = "SELECT key, name, sum(seq), count(*), sum(x) FROM input GROUP BY key, name";
        let one = aggregate_in(query, &[0, 1], schema.clone(), input.clone(), 1)
            .await
            .unwrap();
        let expected = totals(&one);
        assert_eq!(expected.len(), 422, "211 keys by two names");
        assert_eq!(expected.iter().map(|t| t.3).sum::<i64>(), 5000);
        for parts in [2, 3, 5] {
            let split = aggregate_in(query, &[0, 1], schema.clone(), input.clone(), parts)
                .await
                .unwrap();
            // Float sums too, to the bit: each group's rows are added in
            // input order.
            assert_eq!(totals(&split), expected, "{parts} parts");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_part_per_worker_of_at_least_the_minimum_rows() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(part_count(0), 1);
        assert_eq!(part_count(MIN_PART_ROWS - 1), 1);
        assert_eq!(part_count(2 * MIN_PART_ROWS), cores.min(2));
        assert_eq!(
            part_count(100 * MIN_PART_ROWS),
            cores.min(2),
            "no more parts than workers"
        );
    }

    #[tokio::test]
    async fn one_part_on_a_single_threaded_runtime() {
        assert_eq!(part_count(100 * MIN_PART_ROWS), 1);
    }
}
