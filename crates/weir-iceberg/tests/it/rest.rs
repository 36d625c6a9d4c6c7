//! The sink conformance suite on the Iceberg sink with the REST catalog of
//! the test SeaweedFS (started by `scripts/test.sh`), data and checkpoints
//! on its S3, read back by pyiceberg through the same REST catalog.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use weir_catalog::RestCatalog;
use weir_core::sink::Sink;
use weir_iceberg::IcebergSink;
use weir_test_support::readers::{iceberg, json_ids, python};
use weir_test_support::SinkHarness;

struct RestHarness {
    uri: String,
    warehouse: String,
    /// A namespace of this test's own.
    namespace: String,
    skip: Option<String>,
}

async fn rest_harness() -> RestHarness {
    let uri = weir_test_support::service("WEIR_TEST_ICEBERG_REST_URI");
    let skip = match (&uri, python()) {
        (None, _) => Some("the REST catalog (SeaweedFS) is not running; scripts/test.sh starts it".into()),
        (_, None) => Some("pyiceberg is not installed; scripts/test.sh installs it".into()),
        _ => None,
    };
    RestHarness {
        uri: uri.unwrap_or_default(),
        warehouse: std::env::var("WEIR_TEST_ICEBERG_REST_WAREHOUSE").unwrap_or_else(|_| "s3://weirtables/".into()),
        namespace: format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
        skip,
    }
}

impl RestHarness {
    async fn catalog(&self) -> RestCatalog {
        let env = |k: &str| std::env::var(k).unwrap_or_default();
        let storage = HashMap::from([
            ("s3.endpoint".to_string(), env("WEIR_TEST_S3_ENDPOINT")),
            ("s3.access-key-id".to_string(), env("AWS_ACCESS_KEY_ID")),
            ("s3.secret-access-key".to_string(), env("AWS_SECRET_ACCESS_KEY")),
            ("s3.region".to_string(), "us-east-1".to_string()),
        ]);
        let credential = Some((env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")));
        RestCatalog::connect("rest", &self.uri, &self.warehouse, credential, storage)
            .await
            .unwrap()
    }

    async fn sink_on(&self, table: &str) -> IcebergSink {
        let catalog = self.catalog().await;
        IcebergSink::try_new(Arc::new(catalog), &format!("{}.{table}", self.namespace)).unwrap()
    }

    fn reader(&self) -> String {
        format!("rest+{}#{}", self.uri, self.warehouse)
    }
}

#[async_trait]
impl SinkHarness for RestHarness {
    async fn sink(&self) -> Arc<dyn Sink> {
        Arc::new(self.sink_on("payments").await)
    }

    async fn other_sink(&self) -> Arc<dyn Sink> {
        Arc::new(self.sink_on("other").await)
    }

    async fn recreate_table(&self) {
        iceberg(&["drop", &self.reader(), &format!("{}.payments", self.namespace)]).expect("readers present");
    }

    fn replaces_groups(&self) -> bool {
        true
    }

    async fn read_event_ids(&self) -> Vec<i64> {
        let name = format!("{}.payments", self.namespace);
        let Some(out) = iceberg(&["ids-or-none", "pyiceberg", &self.reader(), &name]) else {
            return Vec::new();
        };
        json_ids(&out)
    }

    fn checkpoints(&self) -> Option<weir_test_support::ObjectCheckpoints> {
        weir_test_support::ObjectCheckpoints::test_s3(&format!("iceberg-conformance-checkpoints/{}", self.namespace))
    }

    fn skip_reason(&self) -> Option<String> {
        self.skip.clone()
    }
}

weir_test_support::sink_conformance_tests!(rest_harness);

/// Compaction of a table in the REST catalog with its data on S3: the
/// rewrites read and write S3 from the job's own threads, one `replace`
/// snapshot swaps them in, and pyiceberg reads every row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_through_the_rest_catalog_on_s3_keeps_every_row() {
    use weir_core::prelude::*;
    let h = rest_harness().await;
    if let Some(reason) = h.skip_reason() {
        eprintln!("skipped: {reason}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    read_stream(weir_core::source::RateSource::rows_per_batch(50))
        .write_stream()
        .checkpoint_location(dir.path().join("chk"))
        .stop_after_batch(BatchId(5))
        .start(h.sink_on("compacted").await)
        .await
        .unwrap()
        .await_termination()
        .await
        .unwrap();
    let name = format!("{}.compacted", h.namespace);
    let catalog: Arc<dyn weir_iceberg::Catalog> = Arc::new(h.catalog().await);
    let done = weir_iceberg::Compact::new(catalog, &name).unwrap().await.unwrap();
    assert_eq!(
        (done.files_removed, done.files_added, done.commits.len()),
        (done.files_before, 1, 1),
        "{done:?}"
    );
    let described = iceberg(&["describe", &h.reader(), &name]).expect("readers present");
    assert_eq!(described["files"], 1, "{described}");
    let ids = json_ids(&iceberg(&["ids", "pyiceberg", &h.reader(), &name]).expect("readers present"));
    weir_test_support::assert_exactly_once(&ids, 0..300);
}
