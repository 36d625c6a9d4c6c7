//! An Iceberg REST catalog by name (the SeaweedFS one the test script
//! starts), its tables on S3.

use weir_catalog::{CatalogConfig, CatalogError, Catalogs, Config, TableFormat, TableOptions};
use weir_test_support::assert_exactly_once;

use crate::{iceberg_ids, pyiceberg_tables, readers, service, stream_into};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rest_catalog_holds_iceberg_tables_by_name() {
    let (Some(uri), Some(warehouse), Some(endpoint)) = (
        service("WEIR_TEST_ICEBERG_REST_URI"),
        service("WEIR_TEST_ICEBERG_REST_WAREHOUSE"),
        service("WEIR_TEST_S3_ENDPOINT"),
    ) else {
        return;
    };
    if !readers() {
        return;
    }
    let key = std::env::var("AWS_ACCESS_KEY_ID").unwrap();
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap();
    let config = Config::empty().with_catalog(
        "tables",
        CatalogConfig::rest(&uri, &warehouse)
            .with_credential(format!("{key}:{secret}"))
            .with_storage("s3.endpoint", endpoint)
            .with_storage("s3.access-key-id", key)
            .with_storage("s3.secret-access-key", secret),
    );
    let catalogs = Catalogs::new(config);
    // A namespace of this test's own.
    let ns = format!("ns_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let name = format!("tables.{ns}.events");
    let chk = tempfile::tempdir().unwrap();

    let events = catalogs.sink(&name, &TableOptions::new()).await.unwrap();
    assert_eq!(events.table.format, TableFormat::Iceberg);
    stream_into(&events, chk.path(), 25, 2).await;
    let reader = format!("rest+{uri}#{warehouse}");
    assert_exactly_once(&iceberg_ids(&reader, &format!("{ns}.events")), 0..75);
    assert_eq!(pyiceberg_tables(&reader, &ns), [format!("{ns}.events")]);

    let found = catalogs.table(&name).await.unwrap();
    assert_eq!(found.format, TableFormat::Iceberg);
    assert!(found.location.starts_with("s3://"), "{}", found.location);
    let listed = catalogs.list(Some("tables"), Some(&ns)).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name.to_string(), name);

    let e = catalogs
        .sink(
            &format!("tables.{ns}.audit"),
            &TableOptions::new().format(TableFormat::Delta),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, CatalogError::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("Iceberg tables only"), "{e}");

    assert!(catalogs.drop_table(&name, true).await.unwrap());
    assert!(catalogs.find(&name).await.unwrap().is_none());
    assert!(pyiceberg_tables(&reader, &ns).is_empty());
}
