//! Maintenance jobs on tables by name: builders awaited, each format's
//! jobs refused on the other's tables, rows read back by other engines.

use std::time::Duration;

use weir_catalog::{CatalogError, Catalogs, Config, TableFormat, TableOptions};
use weir_test_support::assert_exactly_once;

use crate::{delta_ids, iceberg_ids, readers, stream_into};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_table_by_name_is_compacted_and_vacuumed() {
    if !readers() {
        return;
    }
    let lake = tempfile::tempdir().unwrap();
    let chk = tempfile::tempdir().unwrap();
    let catalogs = Catalogs::new(Config::embedded(lake.path()));
    let bronze = catalogs.sink("bronze.payments", &TableOptions::new()).await.unwrap();
    stream_into(&bronze, chk.path(), 100, 4).await;
    let files_before = catalogs.describe("bronze.payments").await.unwrap().files;
    assert!(files_before >= 5, "{files_before}");

    let table = catalogs.table("bronze.payments");
    let entry = table.clone().await.unwrap();
    assert_eq!(
        (entry.format, entry.name.to_string()),
        (TableFormat::Delta, "lake.bronze.payments".into())
    );

    let plan = table.compact().with_dry_run(true).await.unwrap();
    assert_eq!((plan.report.dry_run, plan.report.files_removed), (true, 0), "{plan:?}");
    assert_eq!(
        plan.report.groups.iter().map(|g| g.files.len() as u64).sum::<u64>(),
        files_before
    );

    let done = table.compact().with_target_file_size(64 << 20).await.unwrap();
    assert_eq!(
        (done.report.files_removed as u64, done.files_after),
        (files_before, 1),
        "{done:?}"
    );
    assert_eq!(catalogs.describe("bronze.payments").await.unwrap().files, 1);
    assert_exactly_once(&delta_ids(&entry.location), 0..500);

    // The compacted inputs are what a vacuum with no retention deletes.
    let vacuum = || table.vacuum().with_retention(Duration::ZERO).with_force(true);
    let listed = vacuum().with_dry_run(true).await.unwrap();
    assert_eq!(listed.files.len() as u64, files_before, "{listed:?}");
    let deleted = vacuum().await.unwrap();
    assert_eq!(deleted.files, listed.files);
    assert!(vacuum().await.unwrap().files.is_empty());
    assert_exactly_once(&delta_ids(&entry.location), 0..500);

    // A short retention is refused unless forced, with nothing deleted.
    let e = table.vacuum().with_retention(Duration::ZERO).await.unwrap_err();
    assert!(e.to_string().contains("deletedFileRetentionDuration"), "{e}");

    // The positional form of before is kept for a release.
    #[allow(deprecated)]
    let again = catalogs
        .vacuum("bronze.payments", Some(Duration::ZERO), true, true)
        .await
        .unwrap();
    assert!(again.files.is_empty(), "{again:?}");

    // Iceberg's jobs are refused on a Delta table, naming what does their work.
    let e = table.expire_snapshots().await.unwrap_err();
    assert!(e.to_string().contains("snapshot expiry is for Iceberg tables"), "{e}");
    let e = table.remove_orphan_files().await.unwrap_err();
    assert!(e.to_string().contains("orphan removal is for Iceberg tables"), "{e}");
    let e = table.rewrite_manifests().await.unwrap_err();
    assert!(e.to_string().contains("manifests are Iceberg's"), "{e}");

    // A missing table, awaited or compacted.
    let e = catalogs.table("bronze.none").await.unwrap_err();
    assert!(matches!(e, CatalogError::NoSuchTable { .. }), "{e}");
    let e = catalogs.table("bronze.none").compact().await.unwrap_err();
    assert!(matches!(e, CatalogError::NoSuchTable { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_iceberg_table_by_name_is_compacted_and_its_snapshots_expired() {
    if !readers() {
        return;
    }
    let lake = tempfile::tempdir().unwrap();
    let chk = tempfile::tempdir().unwrap();
    let catalogs = Catalogs::new(Config::embedded(lake.path()));
    let db = lake.path().join("catalog.db");
    let db = db.to_str().unwrap();
    let options = TableOptions::new().format(TableFormat::Iceberg);
    let silver = catalogs.sink("silver.events", &options).await.unwrap();
    stream_into(&silver, chk.path(), 50, 3).await;

    let table = catalogs.table("silver.events");
    let done = table.compact().await.unwrap();
    assert_eq!(done.format, TableFormat::Iceberg);
    assert!(done.report.files_removed >= 4 && done.files_after == 1, "{done:?}");
    assert_exactly_once(&iceberg_ids(db, "silver.events"), 0..200);

    let plan = table
        .expire_snapshots()
        .with_older_than(Duration::ZERO)
        .with_retain_last(1)
        .with_dry_run(true);
    let plan = plan.await.unwrap();
    assert!(plan.dry_run && plan.expired.len() >= 4, "{plan:?}");
    let expired = table
        .expire_snapshots()
        .with_older_than(Duration::ZERO)
        .with_retain_last(1)
        .await
        .unwrap();
    assert_eq!(expired.expired, plan.expired);
    assert_eq!(expired.retained, 1);
    assert_exactly_once(&iceberg_ids(db, "silver.events"), 0..200);

    let orphans = table.remove_orphan_files().with_dry_run(true).await.unwrap();
    assert!(orphans.dry_run && orphans.orphans.is_empty(), "{orphans:?}");
    let manifests = table.rewrite_manifests().with_dry_run(true).await.unwrap();
    assert!(manifests.dry_run && manifests.snapshot_id.is_none(), "{manifests:?}");

    let e = table.vacuum().await.unwrap_err();
    assert!(e.to_string().contains("vacuum is for Delta tables"), "{e}");
    assert_exactly_once(&iceberg_ids(db, "silver.events"), 0..200);
}
