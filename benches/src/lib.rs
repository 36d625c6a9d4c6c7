//! Shared pieces of weir's benchmarks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use weir_core::protocol::{decide_commit, CommitDecision, SinkIdentity, SinkMarker};
use weir_core::sink::{BatchContext, CommitMessage, CommitOutcome, DataWriter, Sink};
use weir_core::{QueryId, QueryName, Result};

/// A sink that counts rows and keeps its marker in memory: the engine's cost
/// without a table format's.
#[derive(Debug, Clone, Default)]
pub struct NoopSink {
    rows: Arc<AtomicU64>,
    marker: Arc<Mutex<Option<SinkMarker>>>,
}

impl NoopSink {
    /// Rows the sink was handed.
    pub fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }
}

struct CountingWriter {
    rows: Arc<AtomicU64>,
    partition_id: usize,
}

#[async_trait]
impl DataWriter for CountingWriter {
    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        self.rows.fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        Ok(())
    }
    async fn commit(self: Box<Self>) -> Result<CommitMessage> {
        CommitMessage::new(self.partition_id, &())
    }
    async fn abort(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

#[async_trait]
impl Sink for NoopSink {
    fn identity(&self) -> SinkIdentity {
        SinkIdentity::new("noop", "bench")
    }
    async fn marker(&self, _name: &QueryName, _known_ids: &[QueryId]) -> Result<Option<SinkMarker>> {
        Ok(*self.marker.lock().unwrap())
    }
    fn create_writer(&self, _batch: &BatchContext, partition_id: usize) -> Result<Box<dyn DataWriter>> {
        Ok(Box::new(CountingWriter {
            rows: self.rows.clone(),
            partition_id,
        }))
    }
    async fn commit(&self, batch: &BatchContext, _messages: Vec<CommitMessage>) -> Result<CommitOutcome> {
        let mut marker = self.marker.lock().unwrap();
        if let CommitDecision::AlreadyCommitted(m) = decide_commit(*marker, batch.commit_facts())? {
            return Ok(CommitOutcome::AlreadyCommitted(m));
        }
        *marker = Some(SinkMarker {
            query_id: batch.query_id,
            batch_id: batch.batch_id,
        });
        Ok(CommitOutcome::Committed { version: None })
    }
}

/// Milliseconds of a duration.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
