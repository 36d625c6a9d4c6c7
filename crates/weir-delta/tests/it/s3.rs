//! The sink conformance suite on a Delta table in S3 (SeaweedFS, started by
//! scripts/test.sh), its checkpoints on S3 too, read back by Python
//! deltalake. Commits rely on S3's conditional put; no locking service, no
//! unsafe rename.

use std::sync::Arc;

use async_trait::async_trait;
use deltalake::DeltaTableBuilder;
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use weir_core::sink::Sink;
use weir_delta::DeltaSink;
use weir_test_support::SinkHarness;

/// The event ids of the table at `table` (an S3 URL), by Python deltalake.
fn deltalake_ids(table: &str) -> Vec<i64> {
    let json = crate::readers::read(&["ids", "deltalake", table]).expect("the readers are installed with S3");
    weir_test_support::readers::json_ids(&json)
}

struct S3Harness {
    endpoint: Option<String>,
    prefix: String,
}

async fn s3_harness() -> S3Harness {
    let endpoint = weir_test_support::service("WEIR_TEST_S3_ENDPOINT");
    let bucket = std::env::var("WEIR_TEST_S3_BUCKET").unwrap_or_else(|_| "weir".into());
    S3Harness {
        endpoint,
        prefix: format!("s3://{bucket}/delta-conformance/{}", uuid::Uuid::new_v4()),
    }
}

impl S3Harness {
    fn storage(&self) -> std::collections::HashMap<String, String> {
        [
            (
                "AWS_ENDPOINT_URL".to_string(),
                self.endpoint.clone().unwrap_or_default(),
            ),
            ("AWS_ALLOW_HTTP".to_string(), "true".to_string()),
        ]
        .into()
    }

    /// The store of the table `name`, rooted at the table.
    fn store(&self, name: &str) -> Arc<dyn deltalake::ObjectStore> {
        let url = url::Url::parse(&format!("{}/{name}/", self.prefix)).unwrap();
        DeltaTableBuilder::from_url(url)
            .unwrap()
            .with_storage_options(self.storage())
            .build_storage()
            .unwrap()
            .object_store(None)
    }

    /// The data files of the table `name` as its store lists them.
    async fn data_files(&self, name: &str) -> Vec<String> {
        let mut files: Vec<String> = self
            .store(name)
            .list(None)
            .map_ok(|m| m.location.to_string())
            .try_collect::<Vec<_>>()
            .await
            .unwrap()
            .into_iter()
            .filter(|f| f.ends_with(".parquet") && !f.starts_with("_delta_log"))
            .collect();
        files.sort();
        files
    }

    fn sink_at(&self, name: &str) -> DeltaSink {
        DeltaSink::try_new(&format!("{}/{name}", self.prefix))
            .unwrap()
            .with_storage_option("AWS_ENDPOINT_URL", self.endpoint.clone().unwrap_or_default())
            .with_storage_option("AWS_ALLOW_HTTP", "true")
    }
}

#[async_trait]
impl SinkHarness for S3Harness {
    async fn sink(&self) -> Arc<dyn Sink> {
        Arc::new(self.sink_at("table"))
    }

    async fn other_sink(&self) -> Arc<dyn Sink> {
        Arc::new(self.sink_at("other"))
    }

    async fn recreate_table(&self) {
        let store = self.store("table");
        let files: Vec<_> = store.list(None).map_ok(|m| m.location).try_collect().await.unwrap();
        for file in files {
            store.delete(&file).await.unwrap();
        }
    }

    fn replaces_groups(&self) -> bool {
        true
    }

    async fn read_event_ids(&self) -> Vec<i64> {
        deltalake_ids(&format!("{}/table", self.prefix))
    }

    fn checkpoints(&self) -> Option<weir_test_support::ObjectCheckpoints> {
        let prefix = self.prefix.rsplit('/').next().unwrap_or_default();
        weir_test_support::ObjectCheckpoints::test_s3(&format!("delta-conformance-checkpoints/{prefix}"))
    }

    fn skip_reason(&self) -> Option<String> {
        match (&self.endpoint, crate::readers::python()) {
            (None, _) => Some("no S3 endpoint (WEIR_TEST_S3_ENDPOINT); scripts/test.sh starts SeaweedFS".into()),
            (_, None) => Some("the independent readers are not installed; run scripts/test.sh".into()),
            _ => None,
        }
    }
}

weir_test_support::sink_conformance_tests!(s3_harness);

/// Runs `stream` into `sink` up to batch `last`, checkpointed at `chk`.
async fn run(stream: weir_core::prelude::ReadStream, chk: &std::path::Path, sink: DeltaSink, last: u64) {
    let q = stream
        .write_stream()
        .checkpoint_location(chk)
        .stop_after_batch(weir_core::BatchId(last))
        .start(sink)
        .await
        .unwrap();
    q.await_termination().await.unwrap();
}

/// Compaction of a table in S3: the output is larger than an upload part,
/// so the rewrite thread sends it in parts of a multipart upload, and the
/// table reads back with every row once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_in_s3_sends_a_large_file_in_parts_and_keeps_every_row() {
    let h = s3_harness().await;
    if let Some(reason) = h.skip_reason() {
        eprintln!("skipped: {reason}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    run(
        weir_test_support::with_payload(100_000),
        &dir.path().join("chk"),
        h.sink_at("compacted"),
        4,
    )
    .await;
    let table = format!("{}/compacted", h.prefix);
    let done = weir_delta::Compact::new(&table)
        .unwrap()
        .with_storage_options(h.storage())
        .await
        .unwrap();
    assert_eq!(
        (done.files_removed, done.files_added),
        (done.files_before, 1),
        "{done:?}"
    );
    assert!(done.bytes_added > 16 << 20, "the file is past two parts: {done:?}");
    let json = crate::readers::read(&["describe", &table]).expect("the readers are installed with S3");
    assert_eq!(json["files"].as_array().unwrap().len(), 1, "{json}");
    weir_test_support::assert_exactly_once(&deltalake_ids(&table), 0..500_000);
}

/// Vacuum in S3 of a table whose partition folders hold escapes and spaces:
/// exactly the compacted inputs and the stray object go, never a live file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vacuum_in_s3_matches_escaped_and_spaced_partition_folders() {
    use weir_core::prelude::*;
    let h = s3_harness().await;
    if let Some(reason) = h.skip_reason() {
        eprintln!("skipped: {reason}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let q = read_stream(weir_core::source::RateSource::rows_per_batch(10))
        .map_batches(crate::maintenance::with_zones)
        .write_stream()
        .checkpoint_location(dir.path().join("chk"))
        .stop_after_batch(BatchId(3))
        .start(h.sink_at("zoned").with_partition_by(["zone"]))
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let table = format!("{}/zoned", h.prefix);
    let written = h.data_files("zoned").await;
    assert_eq!(written.len(), 8, "{written:?}");
    let compacted = weir_delta::Compact::new(&table)
        .unwrap()
        .with_storage_options(h.storage())
        .await
        .unwrap();
    assert_eq!(compacted.files_added, 2, "{compacted:?}");
    let live: Vec<String> = h
        .data_files("zoned")
        .await
        .into_iter()
        .filter(|f| !written.contains(f))
        .collect();
    assert_eq!(live.len(), 2, "{live:?}");
    let stray = object_store::path::Path::parse("zone=10%3A00%20utc/part-stray.parquet").unwrap();
    h.store("zoned")
        .put(&stray, "not a committed file".into())
        .await
        .unwrap();
    let mut expected = written.clone();
    expected.push(stray.to_string());
    expected.sort();

    let vacuum = || {
        weir_delta::Vacuum::new(&table)
            .unwrap()
            .with_storage_options(h.storage())
            .with_retention(std::time::Duration::ZERO)
            .with_force(true)
    };
    let plan = vacuum().with_dry_run(true).await.unwrap();
    assert_eq!(plan.files, expected, "the compacted inputs and the stray, no live file");
    let done = vacuum().await.unwrap();
    assert_eq!(done.files, expected);
    assert_eq!(h.data_files("zoned").await, live);
    weir_test_support::assert_exactly_once(&deltalake_ids(&table), 0..40);
    // S3 deletes a missing object without complaint: what an earlier vacuum
    // deleted is looked up, and neither planned nor reported again.
    assert_eq!(vacuum().with_dry_run(true).await.unwrap().files, Vec::<String>::new());
    assert_eq!(vacuum().await.unwrap().files, Vec::<String>::new());
}

/// Log checkpoints of a table in S3: written at the table's interval by
/// weir's own checkpoint writer, read by Python deltalake, and holding the
/// query's marker, so a restart resumes exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_checkpoints_in_s3_are_read_back_and_keep_the_marker() {
    use weir_core::prelude::*;
    use weir_core::source::RateSource;
    let h = s3_harness().await;
    if let Some(reason) = h.skip_reason() {
        eprintln!("skipped: {reason}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for last in [11, 13] {
        let sink = h
            .sink_at("checkpointed")
            .with_table_property("delta.checkpointInterval", "5");
        run(
            read_stream(RateSource::rows_per_batch(7)),
            &dir.path().join("chk"),
            sink,
            last,
        )
        .await;
    }
    let log: Vec<String> = h
        .store("checkpointed")
        .list(Some(&"_delta_log".into()))
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap();
    let checkpoints = log.iter().filter(|f| f.ends_with(".checkpoint.parquet")).count();
    assert!(checkpoints >= 2, "{log:?}");
    assert!(log.iter().any(|f| f.ends_with("_last_checkpoint")), "{log:?}");
    let table = format!("{}/checkpointed", h.prefix);
    weir_test_support::assert_exactly_once(&deltalake_ids(&table), 0..98);
}
