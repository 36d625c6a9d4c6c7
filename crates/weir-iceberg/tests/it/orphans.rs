//! Orphan removal: old files no snapshot or metadata references go; young
//! ones (a commit may be in flight) and referenced ones stay.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use weir_core::prelude::*;
use weir_core::source::RateSource;
use weir_iceberg::{Catalog, RemoveOrphanFiles};
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::python;

use crate::conformance::{event_ids, sqlite_harness};

const TABLE: &str = "bronze.payments";
const TWO_DAYS: Duration = Duration::from_secs(2 * 86_400);

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

fn age(path: &Path, by: Duration) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - by).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_unreferenced_files_go_and_nothing_else() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    let q = read_stream(RateSource::rows_per_batch(100))
        .write_stream()
        .checkpoint_location(chk.path())
        .stop_after_batch(BatchId(2))
        .start(h.sink_on(TABLE).await)
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let catalog: Arc<dyn Catalog> = h.catalog().await;
    let table = h.warehouse.join("bronze/payments");

    // Every file of the table is old; two old strays and a young one join.
    for file in files_under(&table) {
        age(&file, TWO_DAYS);
    }
    let old_data = table.join("data/stray-old.parquet");
    let old_meta = table.join("metadata/99999-stray.metadata.json");
    let young = table.join("data/in-flight.parquet");
    for stray in [&old_data, &old_meta, &young] {
        std::fs::write(stray, b"not referenced").unwrap();
    }
    age(&old_data, TWO_DAYS);
    age(&old_meta, TWO_DAYS);

    let e = RemoveOrphanFiles::new(catalog.clone(), TABLE)
        .unwrap()
        .with_older_than(Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("commit in flight"), "{e}");

    let hour = Duration::from_secs(3600);
    let plan = RemoveOrphanFiles::new(catalog.clone(), TABLE)
        .unwrap()
        .with_older_than(hour)
        .with_dry_run(true)
        .await
        .unwrap();
    let mut expected: Vec<String> = [&old_data, &old_meta]
        .iter()
        .map(|p| format!("file://{}", p.canonicalize().unwrap().display()))
        .collect();
    expected.sort();
    assert_eq!(plan.orphans, expected);
    assert!(old_data.exists() && old_meta.exists());

    let done = RemoveOrphanFiles::new(catalog, TABLE)
        .unwrap()
        .with_older_than(hour)
        .await
        .unwrap();
    assert_eq!(done.orphans, plan.orphans);
    assert!(done.failed.is_empty());
    assert!(!old_data.exists() && !old_meta.exists());
    assert!(young.exists(), "a young file may be a commit in flight");
    assert_eq!(done.listed, files_under(&table).len() + 2);
    assert_exactly_once(&event_ids(&h, TABLE), 0..300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_that_may_share_files_is_never_cleaned() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    let sink = h.sink_on(TABLE).await.with_table_property("gc.enabled", "false");
    let q = read_stream(RateSource::rows_per_batch(10))
        .write_stream()
        .checkpoint_location(chk.path())
        .stop_after_batch(BatchId(1))
        .start(sink)
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let catalog: Arc<dyn Catalog> = h.catalog().await;
    let e = RemoveOrphanFiles::new(catalog.clone(), TABLE)
        .unwrap()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("gc.enabled=false"), "{e}");
    let e = weir_iceberg::ExpireSnapshots::new(catalog, TABLE)
        .unwrap()
        .with_older_than(Duration::ZERO)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("gc.enabled=false"), "{e}");
    assert_exactly_once(&event_ids(&h, TABLE), 0..20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_holding_another_table_is_never_cleaned() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    let q = read_stream(RateSource::rows_per_batch(10))
        .write_stream()
        .checkpoint_location(chk.path())
        .stop_after_batch(BatchId(0))
        .start(h.sink_on(TABLE).await)
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    // Another table's metadata inside this table's folder.
    let nested = h.warehouse.join("bronze/payments/data/inner/metadata");
    std::fs::create_dir_all(&nested).unwrap();
    std::fs::write(nested.join("00000-x.metadata.json"), b"{}").unwrap();
    let catalog: Arc<dyn Catalog> = h.catalog().await;
    let e = RemoveOrphanFiles::new(catalog, TABLE)
        .unwrap()
        .with_older_than(Duration::ZERO)
        .with_allow_recent(true)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("holds another table"), "{e}");
    assert!(nested.join("00000-x.metadata.json").exists());
}
