//! `count_distinct`: each value once per group, across the batches that
//! bring it, without nulls, in every output mode.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, TimestampMillisecondType};
use arrow_array::{Int64Array, RecordBatch, TimestampMillisecondArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use weir_core::crash::{CrashPoint, CrashPoints};
use weir_core::prelude::*;
use weir_sql::{col, count_distinct, window, StreamSqlExt};

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("merchant_id", DataType::Int64, false),
        Field::new("customer", DataType::Int64, true),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), false),
    ]))
}

/// (merchant, customer, event time in seconds)
fn visits(rows: &[(i64, Option<i64>, i64)]) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.1))),
            Arc::new(TimestampMillisecondArray::from_iter_values(
                rows.iter().map(|r| r.2 * 1000),
            )),
        ],
    )
    .unwrap()
}

/// Three batches: customers recur within a window across batches, and a
/// null customer is no customer.
fn batches() -> Vec<RecordBatch> {
    vec![
        visits(&[
            (1, Some(1), 10),
            (1, Some(2), 20),
            (1, Some(1), 30),
            (2, None, 10),
            (1, Some(3), 70),
        ]),
        visits(&[
            (1, Some(1), 40),
            (1, Some(4), 50),
            (2, Some(5), 55),
            (1, Some(3), 80),
            (2, None, 85),
        ]),
        // An hour later: closes both minutes.
        visits(&[(9, Some(9), 3600)]),
    ]
}

/// (window start s, merchant) -> distinct customers, the latest row of each
/// group (Update and Complete emit a group again as it changes).
fn counts(output: &[RecordBatch]) -> BTreeMap<(i64, i64), i64> {
    let mut out = BTreeMap::new();
    for b in output {
        let starts = b.column(0).as_primitive::<TimestampMillisecondType>();
        let merchants = b.column(2).as_primitive::<Int64Type>();
        let n = b.column(3).as_primitive::<Int64Type>();
        for r in 0..b.num_rows() {
            out.insert((starts.value(r) / 1000, merchants.value(r)), n.value(r));
        }
    }
    out
}

fn query(input: &MemoryStream, chk: &std::path::Path, mode: OutputMode) -> StreamWriter {
    read_stream(input.clone())
        .with_watermark("ts", Duration::from_secs(60))
        .group_by([window("ts", Duration::from_secs(60)), col("merchant_id")])
        .agg([count_distinct("customer").alias("customers")])
        .write_stream()
        .query_name("customers")
        .checkpoint_location(chk)
        .output_mode(mode)
        .trigger(Trigger::available_now())
}

#[tokio::test]
async fn count_distinct_counts_each_value_once_per_group_across_batches_and_crashes() {
    let expected = BTreeMap::from([((0, 1), 3), ((0, 2), 1), ((60, 1), 1), ((60, 2), 0)]);
    for mode in [OutputMode::Append, OutputMode::Update, OutputMode::Complete] {
        for point in [None, Some(CrashPoint::AfterStateWritten)] {
            let chk = tempfile::tempdir().unwrap();
            let table = MemorySink::new("t");
            let input = MemoryStream::new(schema());
            for (i, batch) in batches().into_iter().enumerate() {
                input.add_batch(batch).unwrap();
                let mut writer = query(&input, chk.path(), mode);
                if let (1, Some(point)) = (i, point) {
                    writer = writer.crash_points(CrashPoints::new().fail_at(point, None));
                    let q = writer.start(table.clone()).await.unwrap();
                    assert!(matches!(q.await_termination().await, Err(Error::InjectedCrash { .. })));
                    writer = query(&input, chk.path(), mode);
                }
                let q = writer.start(table.clone()).await.unwrap();
                q.await_termination().await.unwrap();
            }
            // The hour's window is still open: Append has not emitted it.
            let mut want = expected.clone();
            if mode != OutputMode::Append {
                want.insert((3600, 9), 1);
            }
            assert_eq!(counts(&table.batches()), want, "{mode:?}, crash {point:?}");
        }
    }
}
