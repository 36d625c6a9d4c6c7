//! Update mode into a Delta table: each group once with its latest value,
//! read back by Python deltalake and DuckDB, beside a compaction that runs
//! again and again, and on a table partitioned by the key.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Int64Array, RecordBatch};
use weir_core::prelude::*;
use weir_delta::{Compact, DeltaSink, DeltaSinkError};
use weir_test_support::operators::{counted_groups, expected_group_counts, query_error};
use weir_test_support::readers::{alter, python, read};

/// More groups than a batch of 50 rows changes: each batch replaces some
/// rows of earlier files and leaves others, so small files build up for
/// compaction.
const GROUPS: i64 = 97;

fn counted(rows_per_batch: u64) -> ReadStream {
    counted_groups(rows_per_batch, GROUPS)
}

fn expected_counts(rows: i64) -> Vec<Vec<i64>> {
    expected_group_counts(rows, GROUPS)
}

/// The table's [group, count] rows by `reader`.
fn counts_by(reader: &str, table: &Path) -> Vec<Vec<i64>> {
    let out = read(&["counts", reader, table.to_str().unwrap()]).expect("readers present");
    serde_json::from_value(out["counts"].clone()).expect("counts")
}

/// The table's [group, count] rows by both readers, which must agree.
fn counts_by_both_readers(table: &Path) -> Vec<Vec<i64>> {
    let (a, b) = (counts_by("deltalake", table), counts_by("duckdb", table));
    assert_eq!(a, b, "Python deltalake and DuckDB disagree");
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_mode_beside_compaction_keeps_each_group_once_with_its_latest_count() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let last = 80;
    let q = counted(50)
        .write_stream()
        .output_mode(OutputMode::Update)
        .checkpoint_location(dir.path().join("chk"))
        .trigger(Trigger::processing_time(Duration::from_millis(20)))
        .stop_after_batch(BatchId(last))
        .start(DeltaSink::try_new(table.to_str().unwrap()).unwrap())
        .await
        .unwrap();
    // Compactions that met the stream: committed, or dropped groups whose
    // files the stream rewrote first (which wins depends on timing).
    let (mut runs, mut met) = (0, 0);
    while q.is_active() || runs < 3 {
        if table.join("_delta_log").exists() {
            let r = Compact::new(table.to_str().unwrap())
                .unwrap()
                .await
                .expect("compaction beside an Update stream commits or finds nothing");
            met += r.commits.len() + r.groups_dropped;
            if runs % 10 == 5 {
                // Between compactions a reader sees each group at most once.
                let got = counts_by(if runs % 2 == 0 { "deltalake" } else { "duckdb" }, &table);
                let mut groups: Vec<i64> = got.iter().map(|r| r[0]).collect();
                groups.dedup();
                assert_eq!(groups.len(), got.len(), "a group twice: {got:?}");
            }
            runs += 1;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    q.await_termination().await.expect("the stream never fails");
    eprintln!("{met} of {runs} compactions beside the stream committed or dropped groups");
    assert!(met >= 1, "no compaction of {runs} met the stream");
    // With the stream stopped nothing races it: what the Update commits
    // left is compacted at once (a second run finds nothing), and every
    // group stays.
    let first = Compact::new(table.to_str().unwrap()).unwrap().await.unwrap();
    assert_eq!(first.groups_dropped, 0, "nothing raced it: {first:?}");
    let again = Compact::new(table.to_str().unwrap()).unwrap().await.unwrap();
    assert!(
        again.groups.is_empty() && again.commits.is_empty(),
        "left to compact: {again:?}"
    );
    assert_eq!(counts_by_both_readers(&table), expected_counts((last as i64 + 1) * 50));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_mode_on_a_table_partitioned_by_the_key_replaces_each_partitions_file() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    for (restart, last) in [(0, 2), (1, 9)] {
        let sink = DeltaSink::try_new(table.to_str().unwrap())
            .unwrap()
            .with_partition_by(["event_id"]);
        let q = counted(20)
            .write_stream()
            .output_mode(OutputMode::Update)
            .checkpoint_location(dir.path().join("chk"))
            .stop_after_batch(BatchId(last))
            .start(sink)
            .await
            .unwrap();
        q.await_termination().await.unwrap();
        let rows = (last as i64 + 1) * 20;
        assert_eq!(
            counts_by_both_readers(&table),
            expected_counts(rows),
            "after run {restart}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_mode_whose_key_is_dropped_is_refused_before_the_table_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let q = counted(10)
        // The count alone: the rows no longer say which group they are.
        .map_batches(|batch| Ok(batch.project(&[1])?))
        .write_stream()
        .output_mode(OutputMode::Update)
        .checkpoint_location(dir.path().join("chk"))
        .stop_after_batch(BatchId(1))
        .start(DeltaSink::try_new(table.to_str().unwrap()).unwrap())
        .await;
    let err = query_error(q).await;
    let refused = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<DeltaSinkError>());
    assert!(matches!(refused, Some(DeltaSinkError::NoUpdateKey { .. })), "{err:?}");
    assert!(!table.join("_delta_log").exists(), "no table was made");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_mode_whose_key_values_are_changed_after_the_aggregation_is_refused() {
    // Unpartitioned (the keys read back from the batch's files), and
    // partitioned by the key (counted by each partition's rows).
    for partitioned in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let table = dir.path().join("t");
        let mut sink = DeltaSink::try_new(table.to_str().unwrap()).unwrap();
        if partitioned {
            sink = sink.with_partition_by(["event_id"]);
        }
        let q = counted(10)
            // Every group's key becomes 0: ten rows for one group.
            .map_batches(|batch| {
                let mut columns = batch.columns().to_vec();
                columns[0] = Arc::new(Int64Array::from(vec![0; batch.num_rows()]));
                Ok(RecordBatch::try_new(batch.schema(), columns)?)
            })
            .write_stream()
            .output_mode(OutputMode::Update)
            .checkpoint_location(dir.path().join("chk"))
            .stop_after_batch(BatchId(1))
            .start(sink)
            .await
            .unwrap();
        let err = q.await_termination().await.expect_err("refused");
        let refused = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<DeltaSinkError>());
        assert!(
            matches!(
                refused,
                Some(DeltaSinkError::DuplicateGroup {
                    rows: 10,
                    groups: 1,
                    ..
                })
            ),
            "partitioned {partitioned}: {err:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_mode_into_an_append_only_table_is_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    // The table exists; another engine makes it append-only.
    let first = counted(10)
        .write_stream()
        .output_mode(OutputMode::Update)
        .checkpoint_location(dir.path().join("chk"))
        .stop_after_batch(BatchId(0))
        .start(DeltaSink::try_new(table.to_str().unwrap()).unwrap())
        .await
        .unwrap();
    first.await_termination().await.unwrap();
    let t = table.to_str().unwrap();
    if alter(&["set-property", t, "delta.appendOnly", "true"]).is_none() {
        return;
    }
    let before = std::fs::read_dir(table.join("_delta_log")).unwrap().count();
    let q = counted(10)
        .write_stream()
        .output_mode(OutputMode::Update)
        .checkpoint_location(dir.path().join("chk"))
        .stop_after_batch(BatchId(1))
        .start(DeltaSink::try_new(table.to_str().unwrap()).unwrap())
        .await;
    let err = query_error(q).await;
    let refused = std::error::Error::source(&err).and_then(|s| s.downcast_ref::<DeltaSinkError>());
    assert!(
        matches!(refused, Some(DeltaSinkError::Unsupported { feature, .. }) if feature.contains("appendOnly")),
        "{err:?}"
    );
    assert_eq!(std::fs::read_dir(table.join("_delta_log")).unwrap().count(), before);
}
