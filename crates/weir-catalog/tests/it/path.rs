//! A path catalog: a warehouse directory whose folders are the tables.

use weir_catalog::{CatalogConfig, Catalogs, Config, TableFormat, TableOptions};
use weir_test_support::assert_exactly_once;

use crate::{delta_ids, readers, stream_into};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_catalog_writes_delta_and_lists_both_formats() {
    if !readers() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("lake");
    // The SQL catalog writes its Iceberg tables into the same folders.
    let config = Config::empty()
        .with_catalog("files", CatalogConfig::path(root.to_str().unwrap()))
        .with_catalog(
            "sql",
            CatalogConfig::sql(
                format!("sqlite://{}", dir.path().join("catalog.db").display()),
                root.to_str().unwrap(),
            ),
        );
    let catalogs = Catalogs::new(config);

    let payments = catalogs
        .sink("files.bronze.payments", &TableOptions::new())
        .await
        .unwrap();
    assert_eq!(payments.table.format, TableFormat::Delta);
    stream_into(&payments, &dir.path().join("c1"), 60, 1).await;
    assert_exactly_once(&delta_ids(&payments.table.location), 0..120);

    let events = catalogs
        .sink("sql.silver.events", &TableOptions::new().format(TableFormat::Iceberg))
        .await
        .unwrap();
    stream_into(&events, &dir.path().join("c2"), 10, 0).await;

    let listed: Vec<_> = catalogs
        .list(Some("files"), None)
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.name.to_string(), t.format))
        .collect();
    assert_eq!(
        listed,
        [
            ("files.bronze.payments".to_string(), TableFormat::Delta),
            ("files.silver.events".to_string(), TableFormat::Iceberg)
        ]
    );
    // The folder's format is found; a path catalog does not write Iceberg.
    assert_eq!(
        catalogs.table("files.silver.events").await.unwrap().format,
        TableFormat::Iceberg
    );
    let e = catalogs
        .sink("files.silver.events", &TableOptions::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("sql or rest") && e.contains("Nothing was written"), "{e}");

    // A folder of other files is not taken for a table.
    std::fs::create_dir_all(root.join("bronze/notes")).unwrap();
    std::fs::write(root.join("bronze/notes/readme.txt"), "hello").unwrap();
    let e = catalogs
        .sink("files.bronze.notes", &TableOptions::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("neither a Delta table"), "{e}");

    // A path catalog's tables are their folders: dropping needs purge.
    let e = catalogs
        .drop_table("files.bronze.payments", false)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("purge"), "{e}");
    assert!(catalogs.drop_table("files.bronze.payments", true).await.unwrap());
    assert!(!root.join("bronze/payments").exists());
    assert!(root.join("bronze/notes/readme.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_catalog_on_s3_writes_lists_and_purges_delta_tables() {
    let (Some(endpoint), Some(bucket)) = (
        crate::service("WEIR_TEST_S3_ENDPOINT"),
        crate::service("WEIR_TEST_S3_BUCKET"),
    ) else {
        return;
    };
    if !readers() {
        return;
    }
    let env = |k: &str| std::env::var(k).unwrap();
    let prefix = uuid::Uuid::new_v4().simple().to_string();
    let warehouse = format!("s3://{bucket}/path-catalog-{prefix}/lake");
    let config = Config::empty().with_catalog(
        "files",
        CatalogConfig::path(&warehouse)
            .with_storage("s3.endpoint", endpoint)
            .with_storage("s3.access-key-id", env("AWS_ACCESS_KEY_ID"))
            .with_storage("s3.secret-access-key", env("AWS_SECRET_ACCESS_KEY"))
            .with_storage(
                "s3.region",
                std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()),
            ),
    );
    let catalogs = Catalogs::new(config);
    let chk = tempfile::tempdir().unwrap();

    let payments = catalogs
        .sink("files.bronze.payments", &TableOptions::new())
        .await
        .unwrap();
    assert_eq!(payments.table.location, format!("{warehouse}/bronze/payments"));
    stream_into(&payments, chk.path(), 30, 1).await;
    assert_exactly_once(&delta_ids(&payments.table.location), 0..60);

    let listed = catalogs.list(None, None).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].name.to_string().as_str(), listed[0].format),
        ("files.bronze.payments", TableFormat::Delta)
    );
    let d = catalogs.describe("files.bronze.payments").await.unwrap();
    assert_eq!((d.files, d.queries[0].batch_id), (2, 1));

    assert!(catalogs.drop_table("files.bronze.payments", true).await.unwrap());
    assert!(catalogs.find("files.bronze.payments").await.unwrap().is_none());
    assert!(catalogs.list(None, None).await.unwrap().is_empty());
}
