//! Triggers: once, available now, processing time; stop.

use std::time::Duration;

use weir_core::prelude::*;
use weir_test_support::{assert_exactly_once, event_ids};

use crate::common::{rows, schema};

#[tokio::test]
async fn once_takes_everything_in_one_batch() {
    let chk = tempfile::tempdir().unwrap();
    let input = MemoryStream::new(schema());
    for i in 0..3 {
        input.add_batch(rows(i * 10..i * 10 + 10)).unwrap();
    }
    let table = MemorySink::new("t");
    let q = read_stream(input.clone())
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::once())
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    assert_eq!(table.committed_batches(), vec![BatchId(0)]);
    assert_exactly_once(&event_ids(&table.batches()), 0..30);

    // A second `once` with no new data plans nothing.
    let q = read_stream(input)
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::once())
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    assert_eq!(table.committed_batches(), vec![BatchId(0)]);
}

#[tokio::test]
async fn available_now_stops_at_what_was_there_at_start() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let source = RateSource::rows_per_batch(100).with_total_rows(450);
    let q = read_stream(source)
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::available_now())
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    assert_eq!(table.committed_batches().len(), 5, "450 rows at 100 per batch");
    assert_exactly_once(&event_ids(&table.batches()), 0..450);
}

#[tokio::test]
async fn processing_time_runs_batches_as_data_arrives_until_stopped() {
    let chk = tempfile::tempdir().unwrap();
    let input = MemoryStream::new(schema());
    let table = MemorySink::new("t");
    let q = read_stream(input.clone())
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::processing_time(Duration::from_millis(20)))
        .start(table.clone())
        .await
        .unwrap();
    for i in 0..3 {
        input.add_batch(rows(i * 5..i * 5 + 5)).unwrap();
        wait_for(|| table.row_count() == (i as usize + 1) * 5).await;
    }
    assert!(q.is_active());
    q.stop_and_wait().await.unwrap();
    assert!(!q.is_active());
    assert_exactly_once(&event_ids(&table.batches()), 0..15);
    let batches = q.recent_progress().len();
    assert!((1..=3).contains(&batches), "{batches} batches for three arrivals");
}

#[tokio::test]
async fn a_query_needs_a_checkpoint() {
    let err = read_stream(MemoryStream::new(schema()))
        .write_stream()
        .start(MemorySink::new("t"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidOption {
                option: "checkpoint_location",
                ..
            }
        ),
        "{err}"
    );
}

/// Polls `done` for up to 10 seconds.
pub async fn wait_for(done: impl Fn() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("condition not reached in 10 s");
}
