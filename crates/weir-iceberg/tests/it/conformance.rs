//! The sink conformance suite on the Iceberg sink with the SQLite catalog,
//! read back with pyiceberg through the same catalog database.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use weir_core::sink::Sink;
use weir_iceberg::{IcebergSink, SqlCatalog};
use weir_test_support::readers::{iceberg, python};
use weir_test_support::SinkHarness;

pub(crate) struct SqliteHarness {
    _dir: tempfile::TempDir,
    pub db: PathBuf,
    pub warehouse: PathBuf,
}

pub(crate) async fn sqlite_harness() -> SqliteHarness {
    let dir = tempfile::tempdir().unwrap();
    SqliteHarness {
        db: dir.path().join("catalog.db"),
        warehouse: dir.path().join("warehouse"),
        _dir: dir,
    }
}

impl SqliteHarness {
    pub(crate) async fn catalog(&self) -> Arc<SqlCatalog> {
        let uri = format!("sqlite://{}", self.db.display());
        Arc::new(
            SqlCatalog::connect("lake", &uri, self.warehouse.to_str().unwrap())
                .await
                .unwrap(),
        )
    }

    pub(crate) async fn sink_on(&self, name: &str) -> IcebergSink {
        IcebergSink::try_new(self.catalog().await, name).unwrap()
    }
}

/// The event ids pyiceberg reads from `name` through the catalog `db`.
pub(crate) fn event_ids(db: &std::path::Path, name: &str) -> Vec<i64> {
    let out = iceberg(&["ids", "pyiceberg", db.to_str().unwrap(), name]).expect("readers present");
    out["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect()
}

#[async_trait]
impl SinkHarness for SqliteHarness {
    async fn sink(&self) -> Arc<dyn Sink> {
        Arc::new(self.sink_on("bronze.payments").await)
    }

    async fn other_sink(&self) -> Arc<dyn Sink> {
        Arc::new(self.sink_on("bronze.other").await)
    }

    async fn recreate_table(&self) {
        iceberg(&["drop", self.db.to_str().unwrap(), "bronze.payments"]).expect("readers present");
    }

    async fn read_event_ids(&self) -> Vec<i64> {
        let exists = self.catalog().await;
        let ident = weir_iceberg::parse_ident("bronze.payments").unwrap();
        if weir_iceberg::Catalog::load(exists.as_ref(), &ident)
            .await
            .unwrap()
            .is_none()
        {
            return Vec::new();
        }
        event_ids(&self.db, "bronze.payments")
    }

    fn skip_reason(&self) -> Option<String> {
        python()
            .is_none()
            .then(|| "pyiceberg is not installed; scripts/test.sh installs it".to_string())
    }
}

weir_test_support::sink_conformance_tests!(sqlite_harness);
