//! The sink conformance suite on the memory sink.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use weir_core::sink::{MemorySink, Sink};
use weir_test_support::{event_ids, SinkHarness};

struct MemoryHarness {
    table: Mutex<MemorySink>,
    other: MemorySink,
}

async fn memory_harness() -> MemoryHarness {
    MemoryHarness {
        table: Mutex::new(MemorySink::new("conformance-table")),
        other: MemorySink::new("another-table"),
    }
}

impl MemoryHarness {
    fn table(&self) -> MemorySink {
        self.table.lock().unwrap().clone()
    }
}

#[async_trait]
impl SinkHarness for MemoryHarness {
    async fn sink(&self) -> Arc<dyn Sink> {
        Arc::new(self.table())
    }

    async fn other_sink(&self) -> Arc<dyn Sink> {
        Arc::new(self.other.clone())
    }

    async fn recreate_table(&self) {
        *self.table.lock().unwrap() = MemorySink::new("conformance-table");
    }

    async fn read_event_ids(&self) -> Vec<i64> {
        event_ids(&self.table().batches())
    }
}

weir_test_support::sink_conformance_tests!(memory_harness);
