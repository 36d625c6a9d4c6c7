//! The sink conformance suite on the Iceberg sink with the SQL catalog on
//! SQLite and on PostgreSQL, read back with pyiceberg through the same
//! catalog database.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use weir_catalog::SqlCatalog;
use weir_core::sink::Sink;
use weir_iceberg::IcebergSink;
use weir_test_support::readers::{iceberg, iceberg_ids, python};
use weir_test_support::SinkHarness;

/// A SQL catalog for one test: its own SQLite file, or its own catalog name
/// in the test PostgreSQL.
pub(crate) struct SqlHarness {
    _dir: tempfile::TempDir,
    uri: String,
    name: String,
    /// The catalog as `read_iceberg.py` takes it.
    pub reader: String,
    pub warehouse: PathBuf,
    /// An object-store warehouse (`s3://...`) instead, with its settings.
    s3: Option<(String, HashMap<String, String>)>,
    skip: Option<String>,
}

pub(crate) async fn sqlite_harness() -> SqlHarness {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("catalog.db");
    SqlHarness {
        uri: format!("sqlite://{}", db.display()),
        name: "lake".into(),
        reader: db.to_str().unwrap().to_string(),
        warehouse: dir.path().join("warehouse"),
        s3: None,
        skip: python()
            .is_none()
            .then(|| "pyiceberg is not installed; scripts/test.sh installs it".into()),
        _dir: dir,
    }
}

/// The SQLite catalog with its warehouse on the test S3 (SeaweedFS,
/// started by `scripts/test.sh`), under a prefix of this test's own.
pub(crate) async fn s3_harness() -> SqlHarness {
    let mut h = sqlite_harness().await;
    let endpoint = weir_test_support::service("WEIR_TEST_S3_ENDPOINT");
    let Some(endpoint) = endpoint else {
        h.skip = Some("S3 (SeaweedFS) is not running; scripts/test.sh starts it".into());
        return h;
    };
    let bucket = std::env::var("WEIR_TEST_S3_BUCKET").unwrap_or_else(|_| "weir".into());
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let settings = HashMap::from([
        ("s3.endpoint".to_string(), endpoint),
        ("s3.access-key-id".to_string(), env("AWS_ACCESS_KEY_ID")),
        ("s3.secret-access-key".to_string(), env("AWS_SECRET_ACCESS_KEY")),
        (
            "s3.region".to_string(),
            std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()),
        ),
    ]);
    let prefix = uuid::Uuid::new_v4().simple().to_string();
    h.s3 = Some((format!("s3://{bucket}/iceberg-{prefix}/warehouse"), settings));
    h
}

/// The test PostgreSQL (`WEIR_TEST_POSTGRES_URL`, started by
/// `scripts/test.sh`), with a catalog name of this test's own.
pub(crate) async fn postgres_harness() -> SqlHarness {
    let dir = tempfile::tempdir().unwrap();
    let url = weir_test_support::service("WEIR_TEST_POSTGRES_URL");
    let name = format!("lake_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let skip = match (&url, python()) {
        (None, _) => Some("PostgreSQL is not running (WEIR_TEST_POSTGRES_URL); scripts/test.sh starts it".into()),
        (_, None) => Some("pyiceberg is not installed; scripts/test.sh installs it".into()),
        _ => None,
    };
    let url = url.unwrap_or_default();
    SqlHarness {
        reader: format!("{url}#{name}"),
        uri: url,
        name,
        warehouse: dir.path().join("warehouse"),
        s3: None,
        skip,
        _dir: dir,
    }
}

impl SqlHarness {
    pub(crate) async fn catalog(&self) -> Arc<SqlCatalog> {
        let catalog = match &self.s3 {
            Some((warehouse, settings)) => {
                SqlCatalog::connect_with_storage(&self.name, &self.uri, warehouse, settings.clone()).await
            }
            None => SqlCatalog::connect(&self.name, &self.uri, self.warehouse.to_str().unwrap()).await,
        };
        Arc::new(catalog.unwrap())
    }

    pub(crate) async fn sink_on(&self, name: &str) -> IcebergSink {
        IcebergSink::try_new(self.catalog().await, name).unwrap()
    }
}

/// The event ids pyiceberg reads from table `name`.
pub(crate) fn event_ids(h: &SqlHarness, name: &str) -> Vec<i64> {
    iceberg_ids("pyiceberg", &h.reader, name).expect("readers present").0
}

#[async_trait]
impl SinkHarness for SqlHarness {
    async fn sink(&self) -> Arc<dyn Sink> {
        Arc::new(self.sink_on("bronze.payments").await)
    }

    async fn other_sink(&self) -> Arc<dyn Sink> {
        Arc::new(self.sink_on("bronze.other").await)
    }

    async fn recreate_table(&self) {
        iceberg(&["drop", &self.reader, "bronze.payments"]).expect("readers present");
    }

    fn replaces_groups(&self) -> bool {
        true
    }

    async fn read_event_ids(&self) -> Vec<i64> {
        let catalog = self.catalog().await;
        let ident = weir_iceberg::parse_ident("bronze.payments").unwrap();
        if weir_iceberg::Catalog::load(catalog.as_ref(), &ident)
            .await
            .unwrap()
            .is_none()
        {
            return Vec::new();
        }
        event_ids(self, "bronze.payments")
    }

    fn skip_reason(&self) -> Option<String> {
        self.skip.clone()
    }
}

mod sqlite {
    use super::sqlite_harness;
    weir_test_support::sink_conformance_tests!(sqlite_harness);
}

mod postgres {
    use super::postgres_harness;
    weir_test_support::sink_conformance_tests!(postgres_harness);
}

mod s3 {
    use super::s3_harness;
    weir_test_support::sink_conformance_tests!(s3_harness);
}
