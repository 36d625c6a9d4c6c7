//! `weir::Result` takes every crate's error with `?` (the engine's, a
//! catalog's, a maintenance job's) and keeps its retryable judgement.

use std::path::Path;

use weir::prelude::*;
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::{json_ids, python, read};

/// Four batches into a Delta table by name, then a compaction of it, with
/// `?` on each step's own error type.
async fn stream_then_compact(lake: &Path, chk: &Path) -> Result<(usize, usize)> {
    let catalogs = Catalogs::new(weir::catalog::Config::embedded(lake));
    let query = read_stream(RateSource::rows_per_batch(50))
        .write_stream()
        .checkpoint_location(chk)
        .stop_after_batch(BatchId(3))
        .to_table_in(&catalogs, "lake.bronze.payments", TableOptions::new())
        .await?;
    query.await_termination().await?;
    let table = catalogs.describe("lake.bronze.payments").await?;
    let done = weir::delta::Compact::new(&table.location)?.await?;
    Ok((done.files_removed, done.files_added))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn question_marks_compose_across_the_crates() {
    if python().is_none() {
        return;
    }
    let lake = tempfile::tempdir().unwrap();
    let chk = tempfile::tempdir().unwrap();
    let (removed, added) = stream_then_compact(lake.path(), chk.path()).await.unwrap();
    assert_eq!((removed, added), (4, 1));
    let table = lake.path().join("warehouse/bronze/payments");
    let ids = json_ids(&read(&["ids", "deltalake", table.to_str().unwrap()]).expect("readers present"));
    assert_exactly_once(&ids, 0..200);
}

async fn compact(location: &str) -> Result<()> {
    weir::delta::Compact::new(location)?.await?;
    Ok(())
}

#[tokio::test]
async fn a_missing_table_is_named_and_not_retryable() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-table");
    let err = compact(missing.to_str().unwrap()).await.unwrap_err();
    assert!(err.to_string().contains("no-such-table"), "{err}");
    assert!(
        !err.retryable(),
        "a table that is not there does not appear by retrying: {err}"
    );
}
