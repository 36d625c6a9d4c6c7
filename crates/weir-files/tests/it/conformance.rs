//! The sink conformance suite on the file sink, read back through the log.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use weir_core::sink::Sink;
use weir_files::{FileLog, FileSink};
use weir_test_support::{event_ids, SinkHarness};

pub(crate) struct FilesHarness {
    _dir: tempfile::TempDir,
    out: PathBuf,
    other: PathBuf,
}

pub(crate) async fn files_harness() -> FilesHarness {
    let dir = tempfile::tempdir().unwrap();
    FilesHarness {
        out: dir.path().join("out"),
        other: dir.path().join("other"),
        _dir: dir,
    }
}

/// The event ids a log-aware reader sees in `dir`.
pub(crate) async fn log_ids(dir: &std::path::Path) -> Vec<i64> {
    let log = FileLog::open(dir.to_str().unwrap(), &Default::default()).unwrap();
    event_ids(&log.read().await.unwrap())
}

#[async_trait]
impl SinkHarness for FilesHarness {
    async fn sink(&self) -> Arc<dyn Sink> {
        Arc::new(
            FileSink::try_new(self.out.to_str().unwrap())
                .unwrap()
                .with_log_compact_interval(3),
        )
    }

    async fn other_sink(&self) -> Arc<dyn Sink> {
        Arc::new(FileSink::try_new(self.other.to_str().unwrap()).unwrap())
    }

    async fn recreate_table(&self) {
        std::fs::remove_dir_all(&self.out).unwrap();
    }

    async fn read_event_ids(&self) -> Vec<i64> {
        log_ids(&self.out).await
    }
}

weir_test_support::sink_conformance_tests!(files_harness);
