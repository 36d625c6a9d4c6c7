//! Another engine changing the table: while a query runs, between runs.
//! Each change happens inside a batch's transformation, so it lands between
//! the batch's file writes and its commit, with no timing involved.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use weir_core::prelude::*;
use weir_core::source::RateSource;
use weir_delta::DeltaSink;
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::alter;

use crate::readers;

/// The rate source, 100 rows a batch; while batch `at` is read, `change`
/// runs once.
fn changing_at(at: u64, change: impl Fn() + Send + Sync + 'static) -> ReadStream {
    let done = AtomicBool::new(false);
    read_stream(RateSource::rows_per_batch(100)).map_batches(move |b| {
        let ids = b.column(0).as_primitive::<Int64Type>();
        if ids.iter().next().flatten() == Some((at * 100) as i64) && !done.swap(true, Ordering::SeqCst) {
            change();
        }
        Ok(b)
    })
}

async fn run(stream: ReadStream, chk: &Path, table: &Path, last: u64) -> Result<StreamingQuery> {
    let q = stream
        .write_stream()
        .query_name("payments")
        .checkpoint_location(chk)
        .stop_after_batch(BatchId(last))
        .start(DeltaSink::try_new(table.to_str().unwrap()).unwrap())
        .await?;
    q.await_termination().await?;
    Ok(q)
}

fn columns(table: &Path) -> Vec<String> {
    let describe = readers::read(&["describe", table.to_str().unwrap()]).expect("readers present");
    describe["schema"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f[0].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_another_engine_adds_mid_run_is_taken_in_stride() {
    if readers::python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let path = table.to_str().unwrap().to_string();
    let stream = changing_at(2, move || {
        alter(&["add-column", &path, "note"]).expect("readers present");
    });
    run(stream, &dir.path().join("chk"), &table, 5).await.unwrap();

    assert!(columns(&table).contains(&"note".to_string()));
    let ids = readers::event_ids(&table).await;
    assert_exactly_once(&ids, 0..600);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioning_changed_mid_run_fails_the_batch_and_a_restart_follows_it() {
    if readers::python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let chk = dir.path().join("chk");
    let path = table.to_str().unwrap().to_string();
    let stream = changing_at(2, move || {
        alter(&["repartition", &path, "account_id"]).expect("readers present");
    });
    let msg = run(stream, &chk, &table, 5).await.unwrap_err().to_string();
    assert!(
        msg.contains(r#"the partition columns went from [] to ["account_id"]"#),
        "{msg}"
    );
    // The rewrite kept batches 0 and 1; nothing of batch 2 landed.
    assert_exactly_once(&readers::event_ids(&table).await, 0..200);

    // A restart writes batch 2 on, into the new partitions.
    run(read_stream(RateSource::rows_per_batch(100)), &chk, &table, 5)
        .await
        .unwrap();
    assert_exactly_once(&readers::event_ids(&table).await, 0..600);
    let describe = readers::read(&["describe", &table.to_string_lossy()]).unwrap();
    assert_eq!(describe["partition_columns"], serde_json::json!(["account_id"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_with_a_check_constraint_is_refused_at_start() {
    if readers::python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let chk = dir.path().join("chk");
    let rate = || read_stream(RateSource::rows_per_batch(100));
    run(rate(), &chk, &table, 0).await.unwrap();
    alter(&["add-constraint", table.to_str().unwrap(), "not_negative", "amount >= 0"]).unwrap();

    let msg = run(rate(), &chk, &table, 2).await.unwrap_err().to_string();
    assert!(
        msg.contains("CHECK constraint (delta.constraints.not_negative)"),
        "{msg}"
    );
    assert!(msg.contains("nothing was written"), "{msg}");
    assert_exactly_once(&readers::event_ids(&table).await, 0..100);
}

/// Rows another engine appends between two batches of the query stay, and
/// the query's own rows land once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_of_another_engine_mid_batch_are_kept() {
    if readers::python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let path = table.to_str().unwrap().to_string();
    let stream = changing_at(2, move || {
        alter(&["append-copy", &path]).expect("readers present");
    });
    run(stream, &dir.path().join("chk"), &table, 5).await.unwrap();
    // The copy re-appended batches 0 and 1 under ids offset by 1,000,000.
    let ids = readers::event_ids(&table).await;
    let (ours, copies): (Vec<i64>, Vec<i64>) = ids.into_iter().partition(|id| *id < 1_000_000);
    assert_exactly_once(&ours, 0..600);
    assert_exactly_once(&copies, 1_000_000..1_000_200);
}

/// A table deleted and created again under a running query is a different
/// table: the query stops at the next commit and writes nothing into the
/// new table's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_recreated_mid_run_stops_the_query() {
    if readers::python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let path = table.to_str().unwrap().to_string();
    let stream = changing_at(3, move || {
        alter(&["recreate", &path]).expect("readers present");
    });
    let msg = run(stream, &dir.path().join("chk"), &table, 5)
        .await
        .unwrap_err()
        .to_string();
    assert!(msg.contains("was replaced while the query ran"), "{msg}");
    let log: Vec<String> = std::fs::read_dir(table.join("_delta_log"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    assert_eq!(log, vec!["00000000000000000000.json".to_string()]);
    assert_exactly_once(&readers::event_ids(&table).await, 0..300);
}
