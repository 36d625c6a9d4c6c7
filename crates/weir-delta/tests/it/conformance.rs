//! The sink conformance suite on the Delta sink, read back independently.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use weir_core::sink::Sink;
use weir_delta::DeltaSink;
use weir_test_support::SinkHarness;

struct DeltaHarness {
    _dir: tempfile::TempDir,
    table: PathBuf,
    other: PathBuf,
}

async fn delta_harness() -> DeltaHarness {
    let dir = tempfile::tempdir().unwrap();
    DeltaHarness {
        table: dir.path().join("table"),
        other: dir.path().join("other"),
        _dir: dir,
    }
}

#[async_trait]
impl SinkHarness for DeltaHarness {
    async fn sink(&self) -> Arc<dyn Sink> {
        Arc::new(DeltaSink::try_new(self.table.to_str().unwrap()).unwrap())
    }

    async fn other_sink(&self) -> Arc<dyn Sink> {
        Arc::new(DeltaSink::try_new(self.other.to_str().unwrap()).unwrap())
    }

    async fn recreate_table(&self) {
        std::fs::remove_dir_all(&self.table).unwrap();
    }

    fn replaces_groups(&self) -> bool {
        true
    }

    async fn read_event_ids(&self) -> Vec<i64> {
        crate::readers::event_ids(&self.table).await
    }
}

weir_test_support::sink_conformance_tests!(delta_harness);
