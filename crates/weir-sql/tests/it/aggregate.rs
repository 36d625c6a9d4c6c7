//! Streaming aggregation: each mode's output equals the aggregation of all
//! the input computed at once, through crashes at every point.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Float64Type, Int64Type, TimestampMicrosecondType, TimestampMillisecondType};
use arrow_array::{Int64Array, RecordBatch, TimestampMillisecondArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use weir_core::crash::{CrashPoint, CrashPoints};
use weir_core::prelude::*;
use weir_sql::{
    avg, col, count, count_distinct, max, min, sliding_window, sum, window, Aggregate, GroupKey, StreamSqlExt,
};

/// (window start ms, key) -> (sum, count, min, max).
type Totals = BTreeMap<(i64, i64), (i128, i64, i128, i128)>;

fn add(t: &mut Totals, start: i64, key: i64, amount: i128) {
    let e = t.entry((start, key)).or_insert((0, 0, i128::MAX, i128::MIN));
    e.0 += amount;
    e.1 += 1;
    e.2 = e.2.min(amount);
    e.3 = e.3.max(amount);
}

/// The totals in output rows (window_start, window_end, key, sum, count,
/// min, max, avg); each group at most once unless `latest` (Update mode:
/// the last row of a group is its value).
fn totals(batches: &[RecordBatch], latest: bool) -> Totals {
    let mut t = Totals::new();
    for b in batches {
        let starts: Vec<i64> = match b.column(0).data_type() {
            DataType::Timestamp(TimeUnit::Millisecond, _) => {
                b.column(0).as_primitive::<TimestampMillisecondType>().values().to_vec()
            }
            _ => b
                .column(0)
                .as_primitive::<TimestampMicrosecondType>()
                .values()
                .iter()
                .map(|v| v / 1000)
                .collect(),
        };
        let keys = b.column(2).as_primitive::<Int64Type>();
        let amount = |c: usize, r: usize| -> i128 {
            match b.column(c).data_type() {
                DataType::Decimal128(..) => b.column(c).as_primitive::<Decimal128Type>().value(r),
                _ => b.column(c).as_primitive::<Int64Type>().value(r) as i128,
            }
        };
        let counts = b.column(4).as_primitive::<Int64Type>();
        let avgs = b.column(7).as_primitive::<Float64Type>();
        for (r, start) in starts.iter().copied().enumerate() {
            let value = (amount(3, r), counts.value(r), amount(5, r), amount(6, r));
            let scale = match b.column(3).data_type() {
                DataType::Decimal128(_, s) => 10f64.powi(*s as i32),
                _ => 1.0,
            };
            let expected_avg = value.0 as f64 / scale / value.1 as f64;
            assert!((avgs.value(r) - expected_avg).abs() < 1e-6 * expected_avg.abs().max(1.0));
            let old = t.insert((start, keys.value(r)), value);
            assert!(
                latest || old.is_none(),
                "group {:?} emitted twice",
                (start, keys.value(r))
            );
        }
    }
    t
}

pub(crate) fn event_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("merchant_id", DataType::Int64, false),
        Field::new("amount", DataType::Int64, false),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), false),
    ]))
}

/// (merchant, amount, event time ms)
pub(crate) type Event = (i64, i64, i64);

pub(crate) fn events(rows: &[Event]) -> RecordBatch {
    RecordBatch::try_new(
        event_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| r.2))),
        ],
    )
    .unwrap()
}

/// Ten minutes of payments of five merchants, each chunk's event times out
/// of order by up to 20 seconds, in chunks of 60.
fn payments() -> Vec<Vec<Event>> {
    ten_minutes(7, 1000)
}

/// Pseudo-random numbers that `seed` picks, the same on every run.
fn random(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        seed >> 33
    }
}

/// Ten minutes of events of five keys (amounts below `amounts`), a second
/// apart, each chunk's event times out of order by up to 20 seconds, in
/// chunks of 60; `seed` picks them.
pub(crate) fn ten_minutes(seed: u64, amounts: u64) -> Vec<Vec<Event>> {
    let mut next = random(seed);
    (0..10i64)
        .map(|c| {
            (0..60)
                .map(|i| {
                    let t = c * 60_000 + i * 1000 - (next() % 20_000) as i64;
                    ((next() % 5) as i64, (next() % amounts) as i64, t.max(0))
                })
                .collect()
        })
        .collect()
}

/// The totals of the windows of `size_ms` starting every `slide_ms` over
/// all of `chunks` at once, each event counted in every window that holds
/// it (one, when the windows tumble).
fn golden(chunks: &[Vec<Event>], size_ms: i64, slide_ms: i64) -> Totals {
    let mut t = Totals::new();
    for e in chunks.iter().flatten() {
        let mut start = e.2 - e.2.rem_euclid(slide_ms);
        while start > e.2 - size_ms {
            add(&mut t, start, e.0, e.1 as i128);
            start -= slide_ms;
        }
    }
    t
}

/// The aggregates of the amount whose output rows `totals` reads.
fn amount_totals() -> [Aggregate; 5] {
    [sum("amount"), count(), min("amount"), max("amount"), avg("amount")]
}

/// Each merchant's `amount_totals` per window `by`, with a watermark of
/// 30 seconds.
fn merchant_totals(input: &MemoryStream, by: GroupKey) -> ReadStream {
    read_stream(input.clone())
        .with_watermark("ts", Duration::from_secs(30))
        .group_by([by, col("merchant_id")])
        .agg(amount_totals())
}

fn minute_totals(input: &MemoryStream, chk: &Path, mode: OutputMode) -> StreamWriter {
    merchant_totals(input, window("ts", Duration::from_secs(60)))
        .write_stream()
        .query_name("merchant-minute-totals")
        .checkpoint_location(chk)
        .output_mode(mode)
        .trigger(Trigger::available_now())
}

/// Runs `query` over `chunks`, a run per chunk; the run of chunk
/// `crash_at` crashes at `point`, and the next run starts again from the
/// checkpoint. A last run over an event an hour later closes every window
/// of the chunks. Returns the table and the last run.
async fn through_a_crash(
    chunks: &[Vec<Event>],
    crash_at: usize,
    point: CrashPoint,
    query: impl Fn(&MemoryStream, &Path) -> StreamWriter,
) -> (MemorySink, StreamingQuery) {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let input = MemoryStream::new(event_schema());
    for (i, chunk) in chunks.iter().enumerate() {
        input.add_batch(events(chunk)).unwrap();
        let writer = query(&input, chk.path());
        if i == crash_at {
            let q = writer
                .crash_points(CrashPoints::new().fail_at(point, None))
                .start(table.clone())
                .await
                .unwrap();
            assert!(matches!(q.await_termination().await, Err(Error::InjectedCrash { .. })));
            continue;
        }
        run_on_time(writer, &table).await;
    }
    input.add_batch(events(&[(9, 1, 3_600_000)])).unwrap();
    let q = run_on_time(query(&input, chk.path()), &table).await;
    (table, q)
}

/// Runs `writer` into `table` to the end; none of its rows is late.
async fn run_on_time(writer: StreamWriter, table: &MemorySink) -> StreamingQuery {
    let q = writer.start(table.clone()).await.unwrap();
    q.await_termination().await.unwrap();
    assert_eq!(q.recent_progress().iter().map(|p| p.late_rows).sum::<u64>(), 0);
    q
}

#[tokio::test]
async fn append_emits_each_closed_window_once_with_its_totals_through_crashes() {
    let chunks = payments();
    for point in CrashPoint::ALL {
        let (table, q) = through_a_crash(&chunks, 4, point, |input, chk| {
            minute_totals(input, chk, OutputMode::Append)
        })
        .await;
        assert_eq!(
            totals(&table.batches(), false),
            golden(&chunks, 60_000, 60_000),
            "crash at {point}"
        );
        let state = &q.last_progress().unwrap().state[0];
        assert_eq!(state.rows, 1, "only the open window is kept: {state:?}");
    }
}

fn sliding_totals(input: &MemoryStream, chk: &Path) -> StreamWriter {
    let every_minute = sliding_window("ts", Duration::from_secs(120), Duration::from_secs(60));
    merchant_totals(input, every_minute)
        .write_stream()
        .query_name("merchant-sliding-totals")
        .checkpoint_location(chk)
        .output_mode(OutputMode::Append)
        .trigger(Trigger::available_now())
}

/// Two-minute windows starting every minute: each event is in two windows
/// and counts in both, and each window the watermark closes comes out
/// once, with the totals of every event it holds.
#[tokio::test]
async fn append_emits_each_closed_sliding_window_once_with_every_event_it_holds_through_crashes() {
    let chunks = payments();
    let expected = golden(&chunks, 120_000, 60_000);
    assert_eq!(expected.values().map(|v| v.1).sum::<i64>(), 2 * 600);
    // From the window a minute before the first event's minute to the one
    // starting in the tenth minute.
    let starts: BTreeSet<i64> = expected.keys().map(|k| k.0).collect();
    assert_eq!(starts, (-1..10).map(|m| m * 60_000).collect::<BTreeSet<i64>>());
    for point in CrashPoint::ALL {
        let (table, q) = through_a_crash(&chunks, 4, point, sliding_totals).await;
        assert_eq!(totals(&table.batches(), false), expected, "crash at {point}");
        let state = &q.last_progress().unwrap().state[0];
        assert_eq!(
            state.rows, 2,
            "only the two open windows of the last event are kept: {state:?}"
        );
    }
}

/// Rows per batch of `many_rows`: over twice the 65,536 rows a part of an
/// aggregation needs, so each batch is aggregated in two parts on two
/// cores.
const MANY_ROWS: usize = 150_000;

/// Merchants of `many_rows`.
const MANY_MERCHANTS: u64 = 2_000;

/// Two batches of `MANY_ROWS` events of `MANY_MERCHANTS` merchants, the
/// first over the first 90 seconds and the second over the next 90: the
/// minute from 60 s is in both.
fn many_rows() -> Vec<Vec<Event>> {
    let mut next = random(23);
    let rows = MANY_ROWS as i64;
    (0..2i64)
        .map(|b| {
            (0..rows)
                .map(|i| {
                    let t = b * 90_000 + i * 90_000 / rows;
                    ((next() % MANY_MERCHANTS) as i64, (next() % 500) as i64, t)
                })
                .collect()
        })
        .collect()
}

fn many_row_totals(input: &MemoryStream, chk: &Path) -> StreamWriter {
    read_stream(input.clone())
        .with_watermark("ts", Duration::from_secs(10))
        .group_by([window("ts", Duration::from_secs(60)), col("merchant_id")])
        .agg(amount_totals().into_iter().chain([count_distinct("amount")]))
        .write_stream()
        .query_name("many-row-totals")
        .checkpoint_location(chk)
        .output_mode(OutputMode::Append)
        .trigger(Trigger::available_now())
}

/// (window start ms, merchant) -> distinct amounts, from output rows whose
/// window start is first and merchant third.
fn distinct_amounts(batches: &[RecordBatch]) -> BTreeMap<(i64, i64), i64> {
    let mut out = BTreeMap::new();
    for b in batches {
        let starts = b.column(0).as_primitive::<TimestampMillisecondType>();
        let merchants = b.column(2).as_primitive::<Int64Type>();
        let n = b
            .column_by_name("count_distinct_amount")
            .unwrap()
            .as_primitive::<Int64Type>();
        for r in 0..b.num_rows() {
            out.insert((starts.value(r), merchants.value(r)), n.value(r));
        }
    }
    out
}

/// A batch of more rows than one core should aggregate is aggregated in
/// parts, split by a hash of the window and merchant (on two workers and
/// two cores; on one core, in one part, to the same totals). Through a
/// crash in the second batch, each minute comes out once with the totals
/// and distinct amounts of all its rows, the minute both batches hold
/// merged from the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_of_many_rows_aggregate_in_parts_to_the_totals_of_all_rows_through_crashes() {
    let chunks = many_rows();
    let expected = golden(&chunks, 60_000, 60_000);
    assert_eq!(
        expected.len(),
        3 * MANY_MERCHANTS as usize,
        "every merchant in each of the three minutes"
    );
    let mut distinct: BTreeMap<(i64, i64), BTreeSet<i64>> = BTreeMap::new();
    for e in chunks.iter().flatten() {
        distinct
            .entry((e.2 - e.2.rem_euclid(60_000), e.0))
            .or_default()
            .insert(e.1);
    }
    let expected_distinct: BTreeMap<(i64, i64), i64> = distinct
        .into_iter()
        .map(|(group, amounts)| (group, amounts.len() as i64))
        .collect();
    for point in CrashPoint::ALL {
        let (table, q) = through_a_crash(&chunks, 1, point, many_row_totals).await;
        let batches = table.batches();
        // Compared whole, not printed: the maps hold 6,000 groups.
        assert!(totals(&batches, false) == expected, "totals after a crash at {point}");
        assert!(
            distinct_amounts(&batches) == expected_distinct,
            "distinct amounts after a crash at {point}"
        );
        let state = &q.last_progress().unwrap().state[0];
        assert_eq!(state.rows, 1, "only the last event's window is kept: {state:?}");
    }
}

#[tokio::test]
async fn update_and_complete_end_with_the_totals_of_all_the_input() {
    let chunks = payments();
    for mode in [OutputMode::Update, OutputMode::Complete] {
        let chk = tempfile::tempdir().unwrap();
        let table = MemorySink::new("t");
        let input = MemoryStream::new(event_schema());
        for chunk in &chunks {
            input.add_batch(events(chunk)).unwrap();
            let q = minute_totals(&input, chk.path(), mode)
                .start(table.clone())
                .await
                .unwrap();
            q.await_termination().await.unwrap();
        }
        let latest = mode == OutputMode::Update;
        assert_eq!(
            totals(&table.batches(), latest),
            golden(&chunks, 60_000, 60_000),
            "{mode}"
        );
    }
}

/// The totals of one DataFusion query over `rows` at once: each merchant's
/// sum, count, min and max of the amount per minute of event time.
async fn datafusion_minute_totals(rows: &[Event]) -> Totals {
    use datafusion::prelude::SessionContext;
    let ctx = SessionContext::new();
    ctx.register_batch("events", events(rows)).unwrap();
    let out = ctx
        .sql(
            "SELECT date_bin(INTERVAL '60 seconds', ts, TIMESTAMP '1970-01-01T00:00:00') AS start, merchant_id, \
             sum(amount), count(*), min(amount), max(amount) FROM events GROUP BY 1, 2",
        )
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let mut t = Totals::new();
    for b in &out {
        let start = arrow_cast::cast(b.column(0), &DataType::Timestamp(TimeUnit::Millisecond, None)).unwrap();
        let start = start.as_primitive::<TimestampMillisecondType>();
        let int = |c: usize| b.column(c).as_primitive::<Int64Type>().clone();
        let (merchant, sum, count, min, max) = (int(1), int(2), int(3), int(4), int(5));
        for r in 0..b.num_rows() {
            let value = (
                sum.value(r) as i128,
                count.value(r),
                min.value(r) as i128,
                max.value(r) as i128,
            );
            t.insert((start.value(r), merchant.value(r)), value);
        }
    }
    t
}

/// Through a crash at every point, Complete mode's last result equals one
/// DataFusion query over all the input, and Append mode's windows, once the
/// final watermark closed them, equal that query over the events of the
/// closed windows.
#[tokio::test]
async fn complete_and_append_through_crashes_equal_one_datafusion_query_over_all_the_input() {
    let chunks = payments();
    let mut all: Vec<Event> = chunks.iter().flatten().copied().collect();
    let closed = datafusion_minute_totals(&all).await;
    // The last run's event, an hour later, opens a window of its own.
    all.push((9, 1, 3_600_000));
    let whole = datafusion_minute_totals(&all).await;
    assert_eq!(whole.len(), closed.len() + 1);
    for point in CrashPoint::ALL {
        let (table, _) = through_a_crash(&chunks, 4, point, |input, chk| {
            minute_totals(input, chk, OutputMode::Complete)
        })
        .await;
        assert_eq!(totals(&table.batches(), false), whole, "Complete, crash at {point}");
        let (table, _) = through_a_crash(&chunks, 4, point, |input, chk| {
            minute_totals(input, chk, OutputMode::Append)
        })
        .await;
        assert_eq!(totals(&table.batches(), false), closed, "Append, crash at {point}");
    }
}

#[tokio::test]
async fn late_rows_are_dropped_and_counted_never_half_applied() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let input = MemoryStream::new(event_schema());
    input.add_batch(events(&[(1, 10, 100_000), (1, 5, 130_000)])).unwrap();
    let q = minute_totals(&input, chk.path(), OutputMode::Update)
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    // The watermark is 100 s: 90 s is late (its window 60-120 s closed),
    // 110 s is not.
    input.add_batch(events(&[(1, 1000, 90_000), (1, 7, 110_000)])).unwrap();
    let q = minute_totals(&input, chk.path(), OutputMode::Update)
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    assert_eq!(q.recent_progress()[0].late_rows, 1);
    let t = totals(&table.batches(), true);
    assert_eq!(t[&(60_000, 1)], (17, 2, 7, 10));
    assert_eq!(t[&(120_000, 1)], (5, 1, 5, 5));
}

/// The rate source's totals per second and account, computed at once.
fn rate_totals(rows: u64) -> Totals {
    let rows = RateSource::generate(0, rows);
    let mut expected = Totals::new();
    let ts = rows.column(1).as_primitive::<TimestampMicrosecondType>();
    let accounts = rows.column(2).as_primitive::<Int64Type>();
    let amounts = rows.column(3).as_primitive::<Decimal128Type>();
    for r in 0..rows.num_rows() {
        let ms = ts.value(r) / 1000;
        add(
            &mut expected,
            ms - ms.rem_euclid(1000),
            accounts.value(r),
            amounts.value(r),
        );
    }
    expected
}

#[tokio::test]
async fn the_rate_sources_totals_per_second_and_account_match_a_batch_aggregation() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let q = read_stream(RateSource::rows_per_batch(700).with_total_rows(7000))
        .group_by([window("ts", Duration::from_secs(1)), col("account_id")])
        .agg([sum("amount"), count(), min("amount"), max("amount"), avg("amount")])
        .write_stream()
        .checkpoint_location(chk.path())
        .output_mode(OutputMode::Complete)
        .trigger(Trigger::available_now())
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    assert_eq!(totals(&table.batches(), false), rate_totals(7000));
}

/// Append mode keeps each batch's partial rows of a window apart until the
/// window closes: windows that one batch saw whole, windows split over two
/// or three batches and windows over forty (whose bins were merged on the
/// way) all come out once with the totals of all rows.
#[tokio::test]
async fn append_merges_a_window_split_over_batches_and_passes_a_whole_one() {
    // 2,500 rows: most windows in one batch; 400: in two or three; 50: in
    // forty, more bins than a window keeps before merging them.
    for rows_per_batch in [2500, 400, 25] {
        let chk = tempfile::tempdir().unwrap();
        let table = MemorySink::new("t");
        let q = read_stream(RateSource::rows_per_batch(rows_per_batch).with_total_rows(10_000))
            .with_watermark("ts", Duration::ZERO)
            .group_by([window("ts", Duration::from_secs(1)), col("account_id")])
            .agg([sum("amount"), count(), min("amount"), max("amount"), avg("amount")])
            .write_stream()
            .checkpoint_location(chk.path())
            .output_mode(OutputMode::Append)
            .trigger(Trigger::available_now())
            .start(table.clone())
            .await
            .unwrap();
        q.await_termination().await.unwrap();
        // The last second stays open: the watermark is its last row.
        let mut expected = rate_totals(10_000);
        let last = expected.keys().map(|k| k.0).max().unwrap();
        expected.retain(|k, _| k.0 < last);
        assert_eq!(expected.len(), 9 * 1000);
        assert_eq!(
            totals(&table.batches(), false),
            expected,
            "batches of {rows_per_batch} rows"
        );
        // At most two windows are open, each of at most 16 bins and the
        // batch's own.
        let most = q.recent_progress().iter().map(|p| p.state[0].rows).max().unwrap();
        assert!(most <= 2 * 17, "{most} bins with batches of {rows_per_batch} rows");
    }
}

/// Append keeps its state otherwise than Update: a checkpoint of one is
/// refused by the other when the query starts, before any batch runs.
#[tokio::test]
async fn a_checkpoint_of_one_mode_is_refused_in_the_other() {
    for (first, then) in [
        (OutputMode::Append, OutputMode::Update),
        (OutputMode::Update, OutputMode::Append),
    ] {
        let chk = tempfile::tempdir().unwrap();
        let input = MemoryStream::new(event_schema());
        input.add_batch(events(&payments()[0])).unwrap();
        let table = MemorySink::new("t");
        let q = minute_totals(&input, chk.path(), first)
            .start(table.clone())
            .await
            .unwrap();
        q.await_termination().await.unwrap();
        let rows = table.batches().iter().map(|b| b.num_rows()).sum::<usize>();
        input.add_batch(events(&payments()[1])).unwrap();
        let err = minute_totals(&input, chk.path(), then)
            .start(table.clone())
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("output mode"),
            "{first:?} then {then:?}: {err}"
        );
        assert!(err.to_string().contains("use a new checkpoint"), "{err}");
        assert_eq!(table.batches().iter().map(|b| b.num_rows()).sum::<usize>(), rows);
    }
}

/// An Append-mode aggregation whose aggregates changed finds its bins of
/// other partial rows, and is refused when it starts.
#[tokio::test]
async fn a_changed_append_aggregation_is_refused_when_it_starts() {
    let chk = tempfile::tempdir().unwrap();
    let input = MemoryStream::new(event_schema());
    input.add_batch(events(&payments()[0])).unwrap();
    let table = MemorySink::new("t");
    let q = minute_totals(&input, chk.path(), OutputMode::Append)
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let err = read_stream(input.clone())
        .with_watermark("ts", Duration::from_secs(30))
        .group_by([window("ts", Duration::from_secs(60)), col("merchant_id")])
        .agg([sum("amount")])
        .write_stream()
        .query_name("merchant-minute-totals")
        .checkpoint_location(chk.path())
        .output_mode(OutputMode::Append)
        .trigger(Trigger::available_now())
        .start(table)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("its aggregates"), "{err}");
}

#[tokio::test]
async fn update_emits_only_the_groups_a_batch_changed_and_forgets_closed_windows() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let input = MemoryStream::new(event_schema());
    // Merchants 1 and 2 in the minute from 0 s, merchant 3 in the next.
    input
        .add_batch(events(&[(1, 10, 5_000), (2, 20, 6_000), (3, 30, 65_000)]))
        .unwrap();
    let q = minute_totals(&input, chk.path(), OutputMode::Update)
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let first = table.batches().len();
    assert_eq!(totals(&table.batches(), false).len(), 3);
    // Only merchant 2's first minute changes.
    input.add_batch(events(&[(2, 5, 40_000)])).unwrap();
    let q = minute_totals(&input, chk.path(), OutputMode::Update)
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let batches = table.batches();
    assert_eq!(
        totals(&batches[first..], false),
        Totals::from([((0, 2), (25, 2, 5, 20))]),
        "only the changed group, with its new totals"
    );
    // 200 s moves the watermark to 170 s: both minutes close, and are
    // forgotten (Update emitted their last change already).
    input.add_batch(events(&[(4, 1, 200_000)])).unwrap();
    let q = minute_totals(&input, chk.path(), OutputMode::Update)
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    assert_eq!(q.last_progress().unwrap().state[0].rows, 1, "the open minute of 200 s");
}

#[tokio::test]
async fn a_grouping_that_cannot_run_is_refused_at_start() {
    let cases = [
        (
            read_stream(MemoryStream::new(event_schema()))
                .group_by([sliding_window("ts", Duration::from_secs(10), Duration::from_secs(20))])
                .agg([count()]),
            "rows between windows would be lost",
        ),
        (
            read_stream(MemoryStream::new(event_schema()))
                .group_by([col("merchant_id")])
                .agg([sum("amount"), sum("amount")]),
            "give one an .alias",
        ),
        (
            read_stream(MemoryStream::new(event_schema()))
                .group_by([window("merchant_id", Duration::from_secs(1))])
                .agg([count()]),
            "not a timestamp",
        ),
    ];
    for (stream, expected) in cases {
        let chk = tempfile::tempdir().unwrap();
        let err = stream
            .write_stream()
            .checkpoint_location(chk.path())
            .output_mode(OutputMode::Update)
            .start(MemorySink::new("t"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains(expected), "{err}");
        assert!(!chk.path().join("metadata").exists());
    }
}

/// Each stateful operator drops the rows at or before the watermark, not
/// only the first: a transformation after a deduplication that moves rows
/// back in event time cannot put them into a window Append already
/// emitted.
#[tokio::test]
async fn rows_moved_behind_the_watermark_after_the_first_operator_are_late() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let input = MemoryStream::new(event_schema());
    let query = |input: &MemoryStream| {
        read_stream(input.clone())
            .with_watermark("ts", Duration::from_secs(30))
            .drop_duplicates(["merchant_id", "amount", "ts"])
            // An amount of 1000 is moved three minutes back.
            .sql(
                "SELECT merchant_id, amount, CASE WHEN amount = 1000 THEN ts - INTERVAL '3 minutes' ELSE ts END AS ts \
                 FROM input",
            )
            .group_by([window("ts", Duration::from_secs(60)), col("merchant_id")])
            .agg([sum("amount"), count(), min("amount"), max("amount"), avg("amount")])
            .write_stream()
            .query_name("moved-back")
            .checkpoint_location(chk.path())
            .output_mode(OutputMode::Append)
            .trigger(Trigger::available_now())
    };
    input.add_batch(events(&[(1, 10, 30_000), (1, 5, 130_000)])).unwrap();
    let q = query(&input).start(table.clone()).await.unwrap();
    q.await_termination().await.unwrap();
    // The watermark moved to 100 s: the window 0-60 s was emitted.
    assert_eq!(totals(&table.batches(), false)[&(0, 1)], (10, 1, 10, 10));
    // 220 s passes the deduplication and becomes 40 s, in the window
    // emitted already: late at the aggregation.
    input.add_batch(events(&[(1, 1000, 220_000), (1, 7, 110_000)])).unwrap();
    let q = query(&input).start(table.clone()).await.unwrap();
    q.await_termination().await.unwrap();
    let progress = q.recent_progress();
    assert_eq!(progress[0].late_rows, 1, "{progress:?}");
    assert_eq!(progress.iter().map(|p| p.late_rows).sum::<u64>(), 1);
    // Each window once (totals panics on a second row of a group); the
    // moved row in none.
    let t = totals(&table.batches(), false);
    assert_eq!(t[&(0, 1)], (10, 1, 10, 10));
    assert_eq!(t[&(60_000, 1)], (7, 1, 7, 7));
    assert_eq!(t[&(120_000, 1)], (5, 1, 5, 5));
    assert_eq!(t.len(), 3, "{t:?}");
}
