//! Session windows: each mode's output equals the sessions of all the input
//! computed at once, through crashes at every point.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, TimestampMillisecondType};
use arrow_array::{Array, RecordBatch, TimestampMillisecondArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use weir_core::crash::{CrashPoint, CrashPoints};
use weir_core::prelude::*;
use weir_sql::{col, count, count_distinct, session_window, sum, StreamSqlExt};

use crate::aggregate::{event_schema, events, ten_minutes, Event};

/// (user, session start ms) -> (session end ms, sum, count, distinct amounts).
type Sessions = BTreeMap<(i64, i64), (i64, i64, i64, i64)>;

const GAP_MS: i64 = 3_000;

/// Ten minutes of clicks of five users (the events' first column), out of
/// order by up to 20 seconds, in chunks of 60: a user's events are about
/// five seconds apart, so with a three-second gap sessions both end and
/// reach across chunks, and out-of-order events join sessions apart before.
fn clicks() -> Vec<Vec<Event>> {
    ten_minutes(11, 4)
}

/// The sessions of `events` computed at once: a user's events sorted by
/// time, a session going on while the next event is at most the gap after
/// the last.
fn golden(events: &[Event]) -> Sessions {
    let mut by_user: BTreeMap<i64, Vec<(i64, i64)>> = BTreeMap::new();
    for e in events {
        by_user.entry(e.0).or_default().push((e.2, e.1));
    }
    let mut out = Sessions::new();
    for (user, mut times) in by_user {
        times.sort();
        let mut current: Option<(i64, i64, Vec<i64>)> = None;
        let mut close = |s: (i64, i64, Vec<i64>)| {
            let mut distinct = s.2.clone();
            distinct.sort();
            distinct.dedup();
            out.insert(
                (user, s.0),
                (s.1, s.2.iter().sum(), s.2.len() as i64, distinct.len() as i64),
            );
        };
        for (t, amount) in times {
            current = match current.take() {
                Some(mut s) if t <= s.1 => {
                    s.1 = s.1.max(t + GAP_MS);
                    s.2.push(amount);
                    Some(s)
                }
                Some(s) => {
                    close(s);
                    Some((t, t + GAP_MS, vec![amount]))
                }
                None => Some((t, t + GAP_MS, vec![amount])),
            };
        }
        close(current.expect("a user has an event"));
    }
    out
}

/// The sessions in output rows (session_start, session_end, merchant_id,
/// sum_amount, count, count_distinct_amount), each at most once.
fn sessions(batches: &[RecordBatch]) -> Sessions {
    let mut out = Sessions::new();
    for b in batches {
        let names: Vec<&str> = b.schema_ref().fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            names,
            [
                "session_start",
                "session_end",
                "merchant_id",
                "sum_amount",
                "count",
                "count_distinct_amount"
            ]
        );
        let ms = |c: usize| b.column(c).as_primitive::<TimestampMillisecondType>().clone();
        let int = |c: usize| b.column(c).as_primitive::<Int64Type>().clone();
        let (starts, ends, users, sums, counts, distinct) = (ms(0), ms(1), int(2), int(3), int(4), int(5));
        for r in 0..b.num_rows() {
            let old = out.insert(
                (users.value(r), starts.value(r)),
                (ends.value(r), sums.value(r), counts.value(r), distinct.value(r)),
            );
            assert!(
                old.is_none(),
                "session {:?} emitted twice",
                (users.value(r), starts.value(r))
            );
        }
    }
    out
}

fn user_sessions(input: &MemoryStream, chk: &std::path::Path, mode: OutputMode) -> StreamWriter {
    read_stream(input.clone())
        .with_watermark("ts", Duration::from_secs(30))
        .group_by([
            session_window("ts", Duration::from_millis(GAP_MS as u64)),
            col("merchant_id"),
        ])
        .agg([sum("amount"), count(), count_distinct("amount")])
        .write_stream()
        .query_name("user-sessions")
        .checkpoint_location(chk)
        .output_mode(mode)
        .trigger(Trigger::available_now())
}

#[tokio::test]
async fn append_emits_each_closed_session_once_with_its_totals_through_crashes() {
    let chunks = clicks();
    let all: Vec<Event> = chunks.iter().flatten().copied().collect();
    let expected = golden(&all);
    assert!(expected.len() > 50, "many sessions: {}", expected.len());
    for point in CrashPoint::ALL {
        let chk = tempfile::tempdir().unwrap();
        let table = MemorySink::new("t");
        let input = MemoryStream::new(event_schema());
        for (i, chunk) in chunks.iter().enumerate() {
            input.add_batch(events(chunk)).unwrap();
            let mut writer = user_sessions(&input, chk.path(), OutputMode::Append);
            if i == 4 {
                writer = writer.crash_points(CrashPoints::new().fail_at(point, None));
                let q = writer.start(table.clone()).await.unwrap();
                assert!(matches!(q.await_termination().await, Err(Error::InjectedCrash { .. })));
                continue;
            }
            let q = writer.start(table.clone()).await.unwrap();
            q.await_termination().await.unwrap();
            assert_eq!(q.recent_progress().iter().map(|p| p.late_rows).sum::<u64>(), 0);
        }
        // An event an hour later closes every session of the ten minutes.
        input.add_batch(events(&[(9, 1, 3_600_000)])).unwrap();
        let q = user_sessions(&input, chk.path(), OutputMode::Append)
            .start(table.clone())
            .await
            .unwrap();
        q.await_termination().await.unwrap();
        assert_eq!(sessions(&table.batches()), expected, "crash at {point}");
        let state = &q.last_progress().unwrap().state[0];
        assert_eq!(state.rows, 1, "only the open session is kept: {state:?}");
    }
}

#[tokio::test]
async fn complete_ends_with_the_sessions_of_all_the_input() {
    let chunks = clicks();
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let input = MemoryStream::new(event_schema());
    for chunk in &chunks {
        input.add_batch(events(chunk)).unwrap();
        let q = user_sessions(&input, chk.path(), OutputMode::Complete)
            .start(table.clone())
            .await
            .unwrap();
        q.await_termination().await.unwrap();
    }
    let all: Vec<Event> = chunks.iter().flatten().copied().collect();
    // Complete replaces the table's rows with every session each trigger.
    assert_eq!(sessions(&table.batches()), golden(&all));
}

/// An event between two sessions of a user, within the gap of both, makes
/// them one session: the two are never emitted, the merged one is.
#[tokio::test]
async fn an_event_between_two_sessions_merges_them() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let input = MemoryStream::new(event_schema());
    let run = || async {
        let q = user_sessions(&input, chk.path(), OutputMode::Append)
            .start(table.clone())
            .await
            .unwrap();
        q.await_termination().await.unwrap();
        q
    };
    // User 1: sessions [10 s, 13 s] and [15 s, 18 s]; user 2 one at 12 s.
    input
        .add_batch(events(&[(1, 1, 10_000), (1, 2, 15_000), (2, 5, 12_000)]))
        .unwrap();
    let q = run().await;
    assert_eq!(q.last_progress().unwrap().state[0].rows, 3);
    // 12.5 s is within the gap of both: one session [10 s, 18 s]. An event
    // exactly a gap after the last (18 s) still belongs to it.
    input.add_batch(events(&[(1, 4, 12_500), (1, 8, 18_000)])).unwrap();
    let q = run().await;
    assert_eq!(q.last_progress().unwrap().state[0].rows, 2);
    assert!(table.batches().iter().all(|b| b.num_rows() == 0));
    // 60 s moves the watermark to 30 s: both users' sessions close.
    input.add_batch(events(&[(3, 1, 60_000)])).unwrap();
    run().await;
    input.add_batch(events(&[(3, 1, 60_001)])).unwrap();
    run().await;
    assert_eq!(
        sessions(&table.batches()),
        Sessions::from([((1, 10_000), (21_000, 15, 4, 4)), ((2, 12_000), (15_000, 5, 1, 1))])
    );
}

/// Each refusal comes when the query starts, before the checkpoint is
/// written, and names the fix: Update mode (a session that merges into
/// another gets a new start, and its emitted row would stay), Append
/// without a watermark, a key named as a column sessions use.
#[tokio::test]
async fn each_refusal_names_the_fix_before_anything_is_written() {
    let sessions = || session_window("ts", Duration::from_secs(3));
    let reserved = Arc::new(Schema::new(vec![
        Field::new("__start", DataType::Int64, false),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), false),
    ]));
    let cases = [
        (
            read_stream(MemoryStream::new(event_schema())).with_watermark("ts", Duration::from_secs(30)),
            "merchant_id",
            OutputMode::Update,
            "Use Append",
        ),
        (
            read_stream(MemoryStream::new(event_schema())),
            "merchant_id",
            OutputMode::Append,
            "watermark",
        ),
        (
            read_stream(MemoryStream::new(reserved)).with_watermark("ts", Duration::ZERO),
            "__start",
            OutputMode::Append,
            "rename it",
        ),
    ];
    for (stream, key, mode, expected) in cases {
        let chk = tempfile::tempdir().unwrap();
        let err = stream
            .group_by([sessions(), col(key)])
            .agg([count()])
            .write_stream()
            .checkpoint_location(chk.path())
            .output_mode(mode)
            .start(MemorySink::new("t"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains(expected), "{mode}: {err}");
        assert!(!chk.path().join("metadata").exists(), "{mode}: {err}");
    }
}

/// Sessions keyed by a string column with nulls: each key's sessions apart,
/// a null key a key of its own.
#[tokio::test]
async fn string_and_null_keys_keep_their_sessions_apart() {
    let schema = Arc::new(Schema::new(vec![
        Field::new("page", DataType::Utf8, true),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), false),
    ]));
    let batch = |rows: &[(Option<&str>, i64)]| {
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(arrow_array::StringArray::from_iter(rows.iter().map(|r| r.0))),
                Arc::new(TimestampMillisecondArray::from_iter_values(rows.iter().map(|r| r.1))),
            ],
        )
        .unwrap()
    };
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let input = MemoryStream::new(schema.clone());
    // "a" and "ab" share a prefix; the null key and "" differ.
    input
        .add_batch(batch(&[
            (Some("a"), 1_000),
            (Some("ab"), 1_500),
            (None, 2_000),
            (Some(""), 2_500),
        ]))
        .unwrap();
    input
        .add_batch(batch(&[(Some("a"), 3_000), (None, 9_000), (Some("ab"), 20_000)]))
        .unwrap();
    input.add_batch(batch(&[(Some("z"), 100_000)])).unwrap();
    input.add_batch(batch(&[(Some("z"), 100_001)])).unwrap();
    let q = read_stream(input.clone())
        .with_watermark("ts", Duration::ZERO)
        .group_by([session_window("ts", Duration::from_millis(GAP_MS as u64)), col("page")])
        .agg([count()])
        .write_stream()
        .checkpoint_location(chk.path())
        .output_mode(OutputMode::Append)
        .trigger(Trigger::available_now())
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let mut got = Vec::new();
    for b in table.batches() {
        let starts = b.column(0).as_primitive::<TimestampMillisecondType>();
        let ends = b.column(1).as_primitive::<TimestampMillisecondType>();
        let pages = b.column(2).as_string::<i32>();
        let counts = b.column(3).as_primitive::<Int64Type>();
        for r in 0..b.num_rows() {
            let page = pages.is_valid(r).then(|| pages.value(r).to_string());
            got.push((page, starts.value(r), ends.value(r), counts.value(r)));
        }
    }
    got.sort();
    let s = |p: Option<&str>, start, end, n| (p.map(str::to_string), start, end, n);
    assert_eq!(
        got,
        vec![
            s(None, 2_000, 5_000, 1),
            s(None, 9_000, 12_000, 1),
            s(Some(""), 2_500, 5_500, 1),
            s(Some("a"), 1_000, 6_000, 2),
            s(Some("ab"), 1_500, 4_500, 1),
            s(Some("ab"), 20_000, 23_000, 1),
        ]
    );
}
