//! The sink conformance suite with the output and the checkpoints in S3
//! (SeaweedFS, started by scripts/test.sh): log entries rely on S3's
//! conditional put.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::TryStreamExt;
use object_store::{ObjectStore, ObjectStoreExt};
use weir_core::sink::Sink;
use weir_files::{FileLog, FileSink, FileSinkOptions};
use weir_test_support::{event_ids, SinkHarness};

pub(crate) struct S3Harness {
    endpoint: Option<String>,
    bucket: String,
    prefix: String,
}

pub(crate) async fn s3_harness() -> S3Harness {
    let endpoint = weir_test_support::service("WEIR_TEST_S3_ENDPOINT");
    S3Harness {
        endpoint,
        bucket: std::env::var("WEIR_TEST_S3_BUCKET").unwrap_or_else(|_| "weir".into()),
        prefix: format!("files-conformance/{}", uuid::Uuid::new_v4()),
    }
}

impl S3Harness {
    fn options(&self) -> HashMap<String, String> {
        [
            ("aws_endpoint".to_string(), self.endpoint.clone().unwrap_or_default()),
            ("aws_allow_http".to_string(), "true".to_string()),
        ]
        .into()
    }

    fn location(&self, name: &str) -> String {
        format!("s3://{}/{}/{name}", self.bucket, self.prefix)
    }

    fn sink_at(&self, name: &str) -> FileSink {
        let options = FileSinkOptions {
            storage_options: self.options(),
            log_compact_interval: 3,
            ..FileSinkOptions::default()
        };
        FileSink::with_options(&self.location(name), options).unwrap()
    }
}

#[async_trait]
impl SinkHarness for S3Harness {
    async fn sink(&self) -> Arc<dyn Sink> {
        Arc::new(self.sink_at("out"))
    }

    async fn other_sink(&self) -> Arc<dyn Sink> {
        Arc::new(self.sink_at("other"))
    }

    async fn recreate_table(&self) {
        let mut builder = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(&self.bucket);
        for (k, v) in self.options() {
            builder = builder.with_config(k.parse().unwrap(), v);
        }
        let store = builder.build().unwrap();
        let prefix = object_store::path::Path::from(format!("{}/out", self.prefix));
        let files: Vec<_> = store
            .list(Some(&prefix))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .unwrap();
        for file in files {
            store.delete(&file).await.unwrap();
        }
    }

    async fn read_event_ids(&self) -> Vec<i64> {
        let log = FileLog::open(&self.location("out"), &self.options()).unwrap();
        event_ids(&log.read().await.unwrap())
    }

    fn checkpoints(&self) -> Option<weir_test_support::ObjectCheckpoints> {
        weir_test_support::ObjectCheckpoints::test_s3(&format!("{}/checkpoints", self.prefix))
    }

    fn skip_reason(&self) -> Option<String> {
        self.endpoint
            .is_none()
            .then(|| "no S3 endpoint (WEIR_TEST_S3_ENDPOINT); scripts/test.sh starts SeaweedFS".into())
    }
}

weir_test_support::sink_conformance_tests!(s3_harness);
