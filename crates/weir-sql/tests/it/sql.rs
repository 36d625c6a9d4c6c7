//! SQL over micro-batches and deduplication, end to end through weir-core's
//! driver into an exactly-once memory table.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, TimestampMillisecondType};
use arrow_array::{Int64Array, RecordBatch, TimestampMillisecondArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use weir_core::crash::{CrashPoint, CrashPoints};
use weir_core::prelude::*;
use weir_sql::StreamSqlExt;
use weir_test_support::{assert_exactly_once, event_ids};

fn column(batches: &[RecordBatch], name: &str) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.column_by_name(name)
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

async fn run(writer: StreamWriter, sink: &MemorySink) -> StreamingQuery {
    let q = writer.start(sink.clone()).await.unwrap();
    q.await_termination().await.unwrap();
    q
}

#[tokio::test]
async fn sql_sees_each_batch_as_the_table_input() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let stream = read_stream(RateSource::rows_per_batch(100).with_total_rows(300))
        .filter("event_id % 3 = 0")
        .with_column("double", "event_id * 2")
        .select(["event_id", "double", "account_id"]);
    assert_eq!(
        stream
            .schema()
            .unwrap()
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect::<Vec<_>>(),
        ["event_id", "double", "account_id"]
    );
    let q = run(
        stream
            .write_stream()
            .checkpoint_location(chk.path())
            .trigger(Trigger::available_now()),
        &table,
    )
    .await;
    assert_eq!(q.recent_progress().len(), 3);
    let rows = table.batches();
    let ids = event_ids(&rows);
    assert_exactly_once(&ids.iter().map(|i| i / 3).collect::<Vec<_>>(), 0..100);
    assert!(ids.iter().all(|i| i % 3 == 0));
    let doubles = column(&rows, "double");
    assert!(ids.iter().zip(&doubles).all(|(i, d)| *d == i * 2));
}

#[tokio::test]
async fn a_query_that_does_not_fit_the_stream_fails_at_start() {
    let chk = tempfile::tempdir().unwrap();
    let err = read_stream(RateSource::rows_per_batch(10))
        .sql("SELECT no_such_column FROM input")
        .write_stream()
        .checkpoint_location(chk.path())
        .start(MemorySink::new("t"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("does not fit the stream's rows"), "{err}");
    assert!(err.to_string().contains("no_such_column"), "{err}");
    assert!(!chk.path().join("metadata").exists());
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("event_id", DataType::Int64, false),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), false),
    ]))
}

/// Rows with the given (id, event time in seconds).
fn rows(rows: &[(i64, i64)]) -> RecordBatch {
    RecordBatch::try_new(
        schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(TimestampMillisecondArray::from_iter_values(
                rows.iter().map(|r| r.1 * 1000),
            )),
        ],
    )
    .unwrap()
}

fn deduplicated(input: &MemoryStream, chk: &std::path::Path) -> StreamWriter {
    read_stream(input.clone())
        .drop_duplicates(["event_id"])
        .write_stream()
        .query_name("dedup")
        .checkpoint_location(chk)
        .trigger(Trigger::available_now())
}

#[tokio::test]
async fn drop_duplicates_passes_each_key_once_across_batches_and_crashes() {
    for point in CrashPoint::ALL {
        let chk = tempfile::tempdir().unwrap();
        let table = MemorySink::new("t");
        let input = MemoryStream::new(schema());
        input.add_batch(rows(&[(1, 0), (2, 0), (1, 0)])).unwrap();
        run(deduplicated(&input, chk.path()), &table).await;
        // Batch 1 repeats 1 and 2 and brings 3 twice; it crashes at `point`.
        input.add_batch(rows(&[(2, 0), (3, 0), (1, 0), (3, 0)])).unwrap();
        let q = deduplicated(&input, chk.path())
            .crash_points(CrashPoints::new().fail_at(point, Some(BatchId(1))))
            .start(table.clone())
            .await
            .unwrap();
        assert!(matches!(q.await_termination().await, Err(Error::InjectedCrash { .. })));
        input.add_batch(rows(&[(4, 0), (3, 0)])).unwrap();
        let q = run(deduplicated(&input, chk.path()), &table).await;
        assert_exactly_once(&event_ids(&table.batches()), 1..5);
        let state = &q.last_progress().unwrap().state;
        assert_eq!(
            (state[0].operator.as_str(), state[0].rows),
            ("dedup-event_id", 4),
            "{point}"
        );
    }
}

fn within(input: &MemoryStream, chk: &std::path::Path) -> StreamWriter {
    read_stream(input.clone())
        .with_watermark("ts", Duration::from_secs(10))
        .drop_duplicates_within_watermark(["event_id"])
        .write_stream()
        .query_name("within")
        .checkpoint_location(chk)
        .trigger(Trigger::available_now())
}

#[tokio::test]
async fn drop_duplicates_within_watermark_keeps_a_key_for_the_delay_then_forgets_it() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let input = MemoryStream::new(schema());
    let step = |rows_: &[(i64, i64)]| {
        input.add_batch(rows(rows_)).unwrap();
        within(&input, chk.path())
    };
    // Id 1 first at 100 s: kept until the watermark reaches 110 s (the
    // event time plus the ten-second delay). The watermark becomes 95 s.
    run(step(&[(1, 100), (1, 105)]), &table).await;
    // Id 3 moves the watermark to 105 s: past id 1's event time, not past
    // its expiry.
    run(step(&[(3, 115)]), &table).await;
    // So id 1 (at 109 s, not late) is still a duplicate.
    let q = run(step(&[(1, 109)]), &table).await;
    assert_eq!(
        q.last_progress().unwrap().watermark.unwrap().timestamp_millis(),
        105_000
    );
    let mut ids = event_ids(&table.batches());
    ids.sort_unstable();
    assert_eq!(ids, [1, 3]);
    // Id 2 at 125 s moves the watermark to 115 s: id 1 is forgotten, id 3
    // (expiring at 125 s) and id 2 stay.
    let q = run(step(&[(2, 125)]), &table).await;
    let last = q.last_progress().unwrap();
    assert_eq!(last.watermark.unwrap().timestamp_millis(), 115_000);
    assert_eq!(last.state[0].rows, 2);
    // Id 1 once more, after it was forgotten: a new row (at 120 s, not late).
    run(step(&[(1, 120), (3, 121)]), &table).await;
    let mut ids = event_ids(&table.batches());
    ids.sort_unstable();
    assert_eq!(ids, [1, 1, 2, 3]);
}

/// Batches for `within` (id, event time in seconds), a run each: repeats
/// within a batch and across batches, keys forgotten and then passed
/// again, late rows.
fn within_batches() -> Vec<Vec<(i64, i64)>> {
    vec![
        // Passes 1 (held until the watermark reaches 110 s) and 2 (111 s).
        // The watermark becomes 95 s.
        vec![(1, 100), (1, 105), (2, 101)],
        // Passes 3 (held until 125 s) alone. The watermark becomes 105 s.
        vec![(3, 115), (2, 108), (1, 109)],
        // Id 1 is still held; 4 passes once. The watermark becomes 111 s:
        // 1 and 2 are forgotten.
        vec![(1, 112), (4, 120), (4, 121)],
        // Id 1 passes again; 2 at 109 s is late; 3 is still held; 5 passes.
        // The watermark becomes 120 s.
        vec![(1, 118), (2, 109), (3, 119), (5, 130)],
        // The watermark becomes 130 s: 3, 1 (held until 128 s) and 4 (130 s)
        // are forgotten; 5 and 6 stay.
        vec![(6, 140)],
        // Ids 3 and 4 pass again; 6 is still held; 5 at 129 s is late.
        vec![(3, 131), (4, 135), (6, 141), (5, 129)],
    ]
}

/// (id, event time in seconds) of each row, sorted.
fn ids_and_times(batches: &[RecordBatch]) -> Vec<(i64, i64)> {
    let mut rows: Vec<(i64, i64)> = batches
        .iter()
        .flat_map(|b| {
            let ids = b.column_by_name("event_id").unwrap().as_primitive::<Int64Type>();
            let times = b
                .column_by_name("ts")
                .unwrap()
                .as_primitive::<TimestampMillisecondType>();
            (0..b.num_rows())
                .map(|r| (ids.value(r), times.value(r) / 1000))
                .collect::<Vec<_>>()
        })
        .collect();
    rows.sort_unstable();
    rows
}

/// What `within` leaves in a table after `within_batches`, a run each:
/// its rows (as `ids_and_times`), the late rows the runs counted and the
/// keys held at the end. With `crash` = (batch, point), the run of that
/// batch crashes at the point and is started again.
async fn within_through(crash: Option<(usize, CrashPoint)>) -> (Vec<(i64, i64)>, u64, u64) {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let input = MemoryStream::new(schema());
    let mut late = 0;
    let mut held = 0;
    for (i, batch) in within_batches().iter().enumerate() {
        input.add_batch(rows(batch)).unwrap();
        if let Some((_, point)) = crash.filter(|(at, _)| *at == i) {
            let q = within(&input, chk.path())
                .crash_points(CrashPoints::new().fail_at(point, None))
                .start(table.clone())
                .await
                .unwrap();
            assert!(matches!(q.await_termination().await, Err(Error::InjectedCrash { .. })));
        }
        let q = run(within(&input, chk.path()), &table).await;
        late += q.recent_progress().iter().map(|p| p.late_rows).sum::<u64>();
        held = q.last_progress().unwrap().state[0].rows;
    }
    (ids_and_times(&table.batches()), late, held)
}

/// A crash at any point of a batch that holds keys, forgets them or passes
/// a forgotten key again leaves the rows of a run without it: each first
/// row of a key once per stay in the state, late rows in none.
#[tokio::test]
async fn drop_duplicates_within_watermark_passes_the_rows_of_a_straight_run_through_crashes() {
    let expected: [(i64, i64); 9] = [
        (1, 100),
        (1, 118),
        (2, 101),
        (3, 115),
        (3, 131),
        (4, 120),
        (4, 135),
        (5, 130),
        (6, 140),
    ];
    // Held at the end: 3 and 4 until 141 s and 145 s, 5 and 6 until 140 s
    // and 150 s, past the watermark of 131 s.
    assert_eq!(within_through(None).await, (expected.to_vec(), 2, 4));
    // Batch 2's run forgets ids 1 and 2; batch 3's passes 1 again and drops
    // a late row.
    for crash_at in [2, 3] {
        for point in CrashPoint::ALL {
            let (passed, _, held) = within_through(Some((crash_at, point))).await;
            assert_eq!(passed, expected, "crash in batch {crash_at} at {point}");
            assert_eq!(held, 4, "crash in batch {crash_at} at {point}");
        }
    }
}

#[tokio::test]
async fn within_watermark_without_a_watermark_is_refused() {
    let chk = tempfile::tempdir().unwrap();
    let err = read_stream(MemoryStream::new(schema()))
        .drop_duplicates_within_watermark(["event_id"])
        .write_stream()
        .checkpoint_location(chk.path())
        .start(MemorySink::new("t"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("has no watermark"), "{err}");
}

#[tokio::test]
async fn json_payloads_parse_into_columns_that_sql_reads() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let payment = Arc::new(Schema::new(vec![
        Field::new("merchant_id", DataType::Int64, false),
        Field::new("amount", DataType::Float64, false),
    ]));
    // Each row a JSON object as a Kafka value would hold it.
    let stream = read_stream(RateSource::rows_per_batch(50).with_total_rows(150))
        .sql(
            "SELECT event_id, concat('{\"merchant_id\": ', CAST(event_id % 4 AS VARCHAR), ', \"amount\": 2.5}') \
             AS value FROM input",
        )
        .parse_json(weir_sql::FromJson::new("value", payment).flatten())
        .filter("merchant_id = 3");
    run(
        stream
            .write_stream()
            .checkpoint_location(chk.path())
            .trigger(Trigger::available_now()),
        &table,
    )
    .await;
    let rows = table.batches();
    let ids = column(&rows, "event_id");
    assert_eq!(ids, (0..150).filter(|i| i % 4 == 3).collect::<Vec<_>>());
    assert_eq!(column(&rows, "merchant_id"), vec![3; ids.len()]);
}

#[tokio::test]
async fn a_malformed_payload_stops_the_query_before_its_batch_is_committed() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let payment = Arc::new(Schema::new(vec![Field::new("merchant_id", DataType::Int64, true)]));
    let stream = read_stream(RateSource::rows_per_batch(50).with_total_rows(150))
        // Row 120 (batch 2) is not JSON.
        .sql(
            "SELECT event_id, CASE WHEN event_id = 120 THEN 'oops' ELSE '{\"merchant_id\": 1}' END AS value \
             FROM input",
        )
        .from_json("value", payment);
    let q = stream
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::available_now())
        .start(table.clone())
        .await
        .unwrap();
    let err = q.await_termination().await.expect_err("malformed");
    assert!(err.to_string().contains("row 20"), "{err}");
    // Batches 0 and 1 landed, batch 2 did not.
    assert_eq!(column(&table.batches(), "event_id"), (0..100).collect::<Vec<_>>());
}

#[test]
fn with_column_replaces_a_column_in_its_place_and_adds_a_new_one_last() {
    let names = |stream: ReadStream| -> Vec<String> {
        stream
            .schema()
            .unwrap()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    };
    let rate = || read_stream(RateSource::rows_per_batch(10));
    let replaced = rate().with_column("account_id", "account_id % 10");
    assert_eq!(names(replaced), ["event_id", "ts", "account_id", "amount"]);
    let added = rate().with_column("double", "event_id * 2");
    assert_eq!(names(added), ["event_id", "ts", "account_id", "amount", "double"]);
}
