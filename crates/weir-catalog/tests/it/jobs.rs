//! Maintenance jobs on tables by name: builders awaited, each format's
//! jobs refused on the other's tables, rows read back by other engines.

use std::time::Duration;

use weir_catalog::{CatalogError, Catalogs, Config, TableFormat, TableOptions};
use weir_test_support::assert_exactly_once;

use crate::{delta_ids, iceberg_ids, local, readers, stream_into};

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

    // Each setter reaches the job: a plan with them leaves every file alone,
    // one without them rewrites them all in one group.
    let plan = table.compact().with_dry_run(true).await.unwrap();
    assert_eq!((plan.report.dry_run, plan.report.files_removed), (true, 0), "{plan:?}");
    assert_eq!(plan.report.groups.len(), 1, "{plan:?}");
    assert_eq!(plan.report.groups[0].files.len() as u64, files_before);
    let tiny = table
        .compact()
        .with_target_file_size(1)
        .with_dry_run(true)
        .await
        .unwrap();
    assert!(tiny.report.groups.is_empty(), "{tiny:?}");
    let few = table
        .compact()
        .with_min_input_files(files_before as usize + 1)
        .with_dry_run(true);
    assert!(few.await.unwrap().report.groups.is_empty());

    let done = table.compact().with_groups_per_commit(1).await.unwrap();
    assert_eq!(
        (
            done.report.files_removed as u64,
            done.files_after,
            done.report.commits.len()
        ),
        (files_before, 1, 1),
        "{done:?}"
    );
    assert_eq!(catalogs.describe("bronze.payments").await.unwrap().files, 1);
    assert_exactly_once(&delta_ids(&entry.location), 0..500);

    // A short retention is refused unless forced, and deletes nothing.
    let vacuum = || table.vacuum().with_retention(Duration::ZERO).with_force(true);
    let listed = vacuum().with_dry_run(true).await.unwrap();
    assert_eq!(listed.files.len() as u64, files_before, "{listed:?}");
    let e = table.vacuum().with_retention(Duration::ZERO).await.unwrap_err();
    assert!(e.to_string().contains("deletedFileRetentionDuration"), "{e}");
    assert_eq!(vacuum().with_dry_run(true).await.unwrap().files, listed.files);

    // The compacted inputs are what a forced vacuum with no retention
    // deletes; after it, nothing is left to plan or delete.
    let deleted = vacuum().await.unwrap();
    assert_eq!(deleted.files, listed.files);
    for file in &deleted.files {
        assert!(
            !std::path::Path::new(local(&entry.location)).join(file).exists(),
            "{file}"
        );
    }
    assert!(vacuum().with_dry_run(true).await.unwrap().files.is_empty());
    assert!(vacuum().await.unwrap().files.is_empty());
    assert_exactly_once(&delta_ids(&entry.location), 0..500);

    // The positional form of before is kept for a release.
    #[allow(deprecated)]
    let again = catalogs
        .vacuum("bronze.payments", Some(Duration::ZERO), true, true)
        .await
        .unwrap();
    assert!(again.files.is_empty(), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_iceberg_table_by_name_is_compacted_its_snapshots_expired_and_orphans_removed() {
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
    let files_before = catalogs.describe("silver.events").await.unwrap().files;
    assert!(files_before >= 4, "{files_before}");

    let table = catalogs.table("silver.events");
    let done = table.compact().await.unwrap();
    assert_eq!(done.format, TableFormat::Iceberg);
    assert_eq!(
        (done.report.files_removed as u64, done.files_after),
        (files_before, 1),
        "{done:?}"
    );
    assert_exactly_once(&iceberg_ids(db, "silver.events"), 0..200);

    // Expiry of every snapshot but the newest deletes the compacted inputs.
    let expire = || {
        table
            .expire_snapshots()
            .with_older_than(Duration::ZERO)
            .with_retain_last(1)
    };
    let plan = expire().with_dry_run(true).await.unwrap();
    assert!(plan.dry_run && plan.expired.len() >= 4, "{plan:?}");
    let expired = expire().await.unwrap();
    assert_eq!(expired.expired, plan.expired);
    assert_eq!(
        (expired.retained, expired.data_files.len() as u64),
        (1, files_before),
        "{expired:?}"
    );
    for file in &expired.data_files {
        assert!(!std::path::Path::new(local(file)).exists(), "{file}");
    }
    assert_exactly_once(&iceberg_ids(db, "silver.events"), 0..200);

    // A file nothing references is an orphan once old enough; a recent one
    // only with allow_recent.
    let entry = table.clone().await.unwrap();
    let stray = std::path::Path::new(local(&entry.location)).join("data/stray.parquet");
    std::fs::write(&stray, b"not referenced").unwrap();
    let orphans = || table.remove_orphan_files().with_older_than(Duration::ZERO);
    let e = orphans().with_dry_run(true).await.unwrap_err();
    assert!(e.to_string().contains("hour"), "{e}");
    let found = orphans().with_allow_recent(true).with_dry_run(true).await.unwrap();
    assert_eq!(found.orphans.len(), 1, "{found:?}");
    assert!(found.orphans[0].ends_with("data/stray.parquet"), "{found:?}");
    assert!(stray.exists(), "a dry run deletes nothing");
    let removed = orphans().with_allow_recent(true).await.unwrap();
    assert_eq!(removed.orphans, found.orphans);
    assert!(!stray.exists());

    let manifests = table.rewrite_manifests().with_dry_run(true).await.unwrap();
    assert!(manifests.dry_run && manifests.snapshot_id.is_none(), "{manifests:?}");
    assert_exactly_once(&iceberg_ids(db, "silver.events"), 0..200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_of_one_format_is_refused_on_the_others_table_and_a_missing_table_is_named() {
    let lake = tempfile::tempdir().unwrap();
    let chk = tempfile::tempdir().unwrap();
    let catalogs = Catalogs::new(Config::embedded(lake.path()));
    let bronze = catalogs.sink("bronze.payments", &TableOptions::new()).await.unwrap();
    stream_into(&bronze, &chk.path().join("bronze"), 10, 0).await;
    let options = TableOptions::new().format(TableFormat::Iceberg);
    let silver = catalogs.sink("silver.events", &options).await.unwrap();
    stream_into(&silver, &chk.path().join("silver"), 10, 0).await;
    let delta_files = catalogs.describe("bronze.payments").await.unwrap().files;
    let iceberg_version = catalogs.describe("silver.events").await.unwrap().version;

    let delta = catalogs.table("bronze.payments");
    let e = delta.expire_snapshots().await.unwrap_err();
    assert!(e.to_string().contains("snapshot expiry is for Iceberg tables"), "{e}");
    let e = delta.remove_orphan_files().await.unwrap_err();
    assert!(e.to_string().contains("orphan removal is for Iceberg tables"), "{e}");
    let e = delta.rewrite_manifests().await.unwrap_err();
    assert!(e.to_string().contains("manifests are Iceberg's"), "{e}");
    let e = catalogs.table("silver.events").vacuum().await.unwrap_err();
    assert!(e.to_string().contains("vacuum is for Delta tables"), "{e}");
    assert!(matches!(e, CatalogError::Unsupported { .. }), "{e}");

    // Nothing was touched.
    assert_eq!(catalogs.describe("bronze.payments").await.unwrap().files, delta_files);
    assert_eq!(
        catalogs.describe("silver.events").await.unwrap().version,
        iceberg_version
    );

    let e = catalogs.table("bronze.none").await.unwrap_err();
    assert!(matches!(e, CatalogError::NoSuchTable { .. }), "{e}");
    let e = catalogs.table("bronze.none").compact().await.unwrap_err();
    assert!(matches!(e, CatalogError::NoSuchTable { .. }), "{e}");
    let e = catalogs.table("bronze.none").vacuum().await.unwrap_err();
    assert!(matches!(e, CatalogError::NoSuchTable { .. }), "{e}");
}
