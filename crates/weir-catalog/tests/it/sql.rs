//! The SQL catalog: the embedded default (SQLite) and PostgreSQL, holding
//! Delta tables in `weir_tables` and Iceberg tables in `iceberg_tables`.

use weir_catalog::{CatalogConfig, CatalogError, Catalogs, Config, TableFormat, TableOptions};
use weir_test_support::assert_exactly_once;

use crate::{delta_ids, iceberg_ids, local, pyiceberg_tables, readers, service, stream_into};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_default_writes_delta_and_iceberg_tables_by_name() {
    if !readers() {
        return;
    }
    let lake = tempfile::tempdir().unwrap();
    let chk = tempfile::tempdir().unwrap();
    let catalogs = Catalogs::new(Config::embedded(lake.path()));
    let db = lake.path().join("catalog.db");
    let db = db.to_str().unwrap();

    // A new name in the default catalog: Delta, the catalog's default.
    let bronze = catalogs.sink("bronze.payments", &TableOptions::new()).await.unwrap();
    assert_eq!(bronze.table.format, TableFormat::Delta);
    assert!(!bronze.existed);
    assert!(
        bronze.table.location.ends_with("/warehouse/bronze/payments"),
        "{}",
        bronze.table.location
    );
    stream_into(&bronze, &chk.path().join("bronze"), 100, 2).await;
    assert_exactly_once(&delta_ids(&bronze.table.location), 0..300);

    // The same table by its full name; its format stays.
    let again = catalogs
        .sink("lake.bronze.payments", &TableOptions::new())
        .await
        .unwrap();
    assert!(again.existed);
    assert_eq!(again.table, bronze.table);
    let e = catalogs
        .sink("bronze.payments", &TableOptions::new().format(TableFormat::Iceberg))
        .await
        .unwrap_err();
    assert!(matches!(e, CatalogError::FormatMismatch { .. }), "{e}");
    assert!(e.to_string().contains("is stored as delta, not iceberg"), "{e}");

    // An Iceberg table in the same catalog, which pyiceberg lists and reads.
    let silver = catalogs
        .sink("silver.events", &TableOptions::new().format(TableFormat::Iceberg))
        .await
        .unwrap();
    assert_eq!(silver.table.format, TableFormat::Iceberg);
    stream_into(&silver, &chk.path().join("silver"), 50, 1).await;
    assert_exactly_once(&iceberg_ids(db, "silver.events"), 0..100);
    assert_eq!(pyiceberg_tables(db, "silver"), ["silver.events"]);
    let e = catalogs
        .sink("silver.events", &TableOptions::new().format(TableFormat::Delta))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("is stored as iceberg, not delta"), "{e}");

    // What each table holds and which queries write it.
    let d = catalogs.describe("bronze.payments").await.unwrap();
    assert!(d.exists);
    assert_eq!(
        (d.format, d.name.as_str()),
        (TableFormat::Delta, "lake.bronze.payments")
    );
    assert!(d.files >= 3 && d.bytes > 0, "{d:?}");
    assert_eq!(d.queries.len(), 1, "{d:?}");
    assert_eq!((d.queries[0].query_name.as_str(), d.queries[0].batch_id), ("bronze", 2));
    assert!(d.queries[0].query_id.is_some());
    let h = catalogs.history("bronze.payments", 10).await.unwrap();
    let batches: Vec<_> = h.iter().filter_map(|c| c.batch_id).collect();
    assert_eq!(batches, [2, 1, 0], "{h:?}");
    let d = catalogs.describe("silver.events").await.unwrap();
    assert_eq!(
        (d.format, d.rows, d.files > 0),
        (TableFormat::Iceberg, Some(100), true),
        "{d:?}"
    );
    assert_eq!((d.queries[0].query_name.as_str(), d.queries[0].batch_id), ("silver", 1));
    let h = catalogs.history("silver.events", 10).await.unwrap();
    assert_eq!(h.iter().map(|s| s.batch_id).collect::<Vec<_>>(), [Some(1), Some(0)]);
    assert_eq!(h[0].version, d.version);

    // Listing: both, or one namespace.
    let all = catalogs.list(None, None).await.unwrap();
    let shown: Vec<_> = all.iter().map(|t| (t.name.to_string(), t.format)).collect();
    assert_eq!(
        shown,
        [
            ("lake.bronze.payments".to_string(), TableFormat::Delta),
            ("lake.silver.events".to_string(), TableFormat::Iceberg)
        ]
    );
    assert_eq!(catalogs.list(Some("lake"), Some("silver")).await.unwrap().len(), 1);

    // Dropping keeps the files unless purged.
    assert!(catalogs.drop_table("bronze.payments", false).await.unwrap());
    assert!(catalogs.find("bronze.payments").await.unwrap().is_none());
    let log = std::path::Path::new(local(&bronze.table.location)).join("_delta_log");
    assert!(log.is_dir(), "a drop without purge keeps the files");
    assert!(!catalogs.drop_table("bronze.payments", false).await.unwrap());
    // The name can be taken again: the table at the same place is found.
    let back = catalogs.sink("bronze.payments", &TableOptions::new()).await.unwrap();
    assert_eq!(back.table.location, bronze.table.location);
    assert!(catalogs.drop_table("bronze.payments", true).await.unwrap());
    assert!(!log.exists(), "purge deletes the table's files");

    let silver_dir = std::path::PathBuf::from(local(&silver.table.location));
    assert!(silver_dir.join("metadata").is_dir());
    assert!(catalogs.drop_table("silver.events", true).await.unwrap());
    assert!(!silver_dir.exists());
    assert!(pyiceberg_tables(db, "silver").is_empty());
    assert!(catalogs.list(None, None).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_catalog_holds_both_formats() {
    let Some(url) = service("WEIR_TEST_POSTGRES_URL") else {
        return;
    };
    if !readers() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A catalog name of this test's own: its rows are apart from others'.
    let name = format!("pg_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let warehouse = dir.path().join("warehouse");
    let config = Config::empty().with_catalog(
        &name,
        CatalogConfig::sql(&url, warehouse.to_str().unwrap()).with_format(TableFormat::Iceberg),
    );
    let catalogs = Catalogs::new(config);

    let events = catalogs.sink("raw.events", &TableOptions::new()).await.unwrap();
    assert_eq!(
        events.table.format,
        TableFormat::Iceberg,
        "the catalog's default format"
    );
    stream_into(&events, &dir.path().join("c1"), 40, 1).await;
    assert_exactly_once(&iceberg_ids(&format!("{url}#{name}"), "raw.events"), 0..80);

    let full = format!("{name}.raw.audit");
    let audit = catalogs
        .sink(&full, &TableOptions::new().format(TableFormat::Delta))
        .await
        .unwrap();
    stream_into(&audit, &dir.path().join("c2"), 30, 1).await;
    assert_exactly_once(&delta_ids(&audit.table.location), 0..60);

    let listed: Vec<_> = catalogs
        .list(None, Some("raw"))
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.name.table, t.format))
        .collect();
    assert_eq!(
        listed,
        [
            ("audit".to_string(), TableFormat::Delta),
            ("events".to_string(), TableFormat::Iceberg)
        ]
    );
    assert!(catalogs.drop_table("raw.events", true).await.unwrap());
    assert!(catalogs.drop_table(&full, true).await.unwrap());
    assert!(catalogs.list(None, None).await.unwrap().is_empty());
}

#[tokio::test]
async fn bad_names_and_missing_catalogs_are_clear_errors_and_touch_nothing() {
    let lake = tempfile::tempdir().unwrap();
    let catalogs = Catalogs::new(Config::embedded(lake.path()));
    for (name, says) in [
        ("payments", "needs a namespace"),
        ("bronze.pay'ments", "only ASCII letters"),
        ("bronze.pay;DROP TABLE weir_tables", "only ASCII letters"),
        ("../../etc.passwd", "empty"),
        ("lakee.bronze.payments", "no catalog named \"lakee\""),
    ] {
        let e = catalogs.sink(name, &TableOptions::new()).await.unwrap_err().to_string();
        assert!(e.contains(says), "{name}: {e}");
    }
    // Nothing was opened, so nothing was created.
    assert!(std::fs::read_dir(lake.path()).unwrap().next().is_none());
    let e = catalogs.list(Some("nope"), None).await.unwrap_err().to_string();
    assert!(e.contains("no catalog named \"nope\" (configured: lake)"), "{e}");
    assert!(catalogs
        .table("bronze.none")
        .await
        .unwrap_err()
        .to_string()
        .contains("does not exist"));
}

#[tokio::test]
async fn names_are_never_nested_nor_taken_by_both_formats() {
    let lake = tempfile::tempdir().unwrap();
    let catalogs = Catalogs::new(Config::embedded(lake.path()));
    let options = TableOptions::new();

    // a.b.c's folder is a/b/c: a.b (folder a/b) would hold it.
    catalogs.sink("lake.a.b.c", &options).await.unwrap();
    let e = catalogs.sink("a.b", &options).await.unwrap_err();
    assert!(matches!(e, CatalogError::Nested { relation: "hold", .. }), "{e}");
    assert!(e.to_string().contains("lake.a.b.c"), "{e}");
    let e = catalogs.sink("lake.a.b.c.d", &options).await.unwrap_err();
    assert!(
        matches!(
            e,
            CatalogError::Nested {
                relation: "sit inside",
                ..
            }
        ),
        "{e}"
    );
    let e = catalogs.sink("lake.a.b.c._delta_log", &options).await.unwrap_err();
    assert!(e.to_string().contains("starts with \"_\""), "{e}");

    // An Iceberg name is reserved before its first query creates the table.
    let iceberg = TableOptions::new().format(TableFormat::Iceberg);
    let reserved = catalogs.sink("silver.events", &iceberg).await.unwrap();
    assert!(!reserved.existed);
    assert_eq!(
        catalogs.table("silver.events").await.unwrap().format,
        TableFormat::Iceberg
    );
    let e = catalogs
        .sink("silver.events", &TableOptions::new().format(TableFormat::Delta))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("is stored as iceberg, not delta"), "{e}");
    // Asked for no format, the name keeps its own.
    assert_eq!(
        catalogs.sink("silver.events", &options).await.unwrap().table.format,
        TableFormat::Iceberg
    );
    let d = catalogs.describe("silver.events").await.unwrap();
    assert!(!d.exists);
    let listed: Vec<_> = catalogs.list(None, Some("silver")).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(catalogs.drop_table("silver.events", false).await.unwrap());
    assert!(catalogs.find("silver.events").await.unwrap().is_none());
    // Free again, for either format.
    assert_eq!(
        catalogs.sink("silver.events", &options).await.unwrap().table.format,
        TableFormat::Delta
    );
}

#[tokio::test]
async fn open_catalogs_show_no_secrets() {
    let lake = tempfile::tempdir().unwrap();
    let config = Config::empty().with_catalog(
        "lake",
        CatalogConfig::sql(
            format!("sqlite://{}", lake.path().join("c.db").display()),
            lake.path().join("w").to_str().unwrap(),
        )
        .with_storage("s3.secret-access-key", "hunter2-secret")
        .with_credential("id:hunter3-secret"),
    );
    let catalogs = Catalogs::new(config);
    assert!(catalogs.find("bronze.payments").await.unwrap().is_none()); // opens it
    let shown = format!("{catalogs:?}");
    assert!(!shown.contains("hunter2") && !shown.contains("hunter3"), "{shown}");
    assert!(shown.contains("s3.secret-access-key"), "{shown}");
}

#[tokio::test]
async fn a_catalog_built_in_code_is_checked_when_opened() {
    let config = Config::empty().with_catalog("lake", CatalogConfig::path(""));
    let e = Catalogs::new(config).find("a.b").await.unwrap_err().to_string();
    assert!(e.contains("needs `warehouse`"), "{e}");
}

#[tokio::test]
async fn a_delta_table_refused_for_its_options_is_not_registered() {
    let lake = tempfile::tempdir().unwrap();
    let catalogs = Catalogs::new(Config::embedded(lake.path()));
    let options = TableOptions::new().snapshot_expiry(weir_iceberg::ExpiryPolicy::STREAMING);
    let e = catalogs.sink("bronze.expiring", &options).await.unwrap_err();
    assert!(matches!(e, CatalogError::Unsupported { .. }), "{e}");
    assert!(
        e.to_string().contains("snapshot expiry policy is for Iceberg tables"),
        "{e}"
    );
    // Nothing was written: the name is free, in either format.
    assert_eq!(catalogs.find("bronze.expiring").await.unwrap(), None);
    assert!(catalogs.list(None, None).await.unwrap().is_empty());
    let iceberg = TableOptions::new()
        .format(TableFormat::Iceberg)
        .snapshot_expiry(weir_iceberg::ExpiryPolicy::STREAMING);
    let target = catalogs.sink("bronze.expiring", &iceberg).await.unwrap();
    assert_eq!(target.table.format, TableFormat::Iceberg);
}
