//! An in-memory table with an exactly-once marker, for tests and examples.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use async_trait::async_trait;

use super::staging::Staging;
use super::{BatchContext, CommitMessage, CommitOutcome, DataWriter, OutputMode, Sink};
use crate::error::Result;
use crate::ids::{BatchId, QueryId, QueryName};
use crate::protocol::{decide_commit, CommitDecision, SinkIdentity, SinkMarker};
use crate::sync::Recover;

/// A queryable in-memory table. Clones share the table, so a test can read
/// what a query wrote, and a restarted query finds its marker.
///
/// Writers stage rows under an id (like data files); the commit moves the
/// staged rows of every message into the table and sets the marker under one
/// lock, so readers see all rows of a batch or none. Staged rows of an
/// attempt that never committed stay staged, like orphan files.
///
/// Output modes, as Spark's memory sink: Complete replaces the rows, Append
/// and Update add them (in Update mode, each batch's changed groups follow
/// the earlier values of the same groups: the last row of a key is its
/// value).
#[derive(Debug, Clone)]
pub struct MemorySink {
    name: String,
    table: Arc<Mutex<MemoryTable>>,
    staging: Staging,
}

#[derive(Debug, Default)]
struct MemoryTable {
    rows: Vec<RecordBatch>,
    markers: HashMap<QueryName, SinkMarker>,
    version: i64,
    committed: Vec<BatchId>,
}

impl MemorySink {
    /// A new empty table; `name` is its identity.
    pub fn new(name: impl Into<String>) -> Self {
        MemorySink {
            name: name.into(),
            table: Arc::default(),
            staging: Staging::default(),
        }
    }

    /// Every committed row, in commit order.
    pub fn batches(&self) -> Vec<RecordBatch> {
        self.lock().rows.clone()
    }

    /// The number of committed rows.
    pub fn row_count(&self) -> usize {
        self.lock().rows.iter().map(RecordBatch::num_rows).sum()
    }

    /// The table version: the number of commits.
    pub fn version(&self) -> i64 {
        self.lock().version
    }

    /// The batch ids committed, in order (a batch appears once per commit).
    pub fn committed_batches(&self) -> Vec<BatchId> {
        self.lock().committed.clone()
    }

    /// The number of staged row sets no commit took (orphans).
    pub fn staged_count(&self) -> usize {
        self.staging.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryTable> {
        self.table.lock().recover()
    }
}

#[async_trait]
impl Sink for MemorySink {
    fn identity(&self) -> SinkIdentity {
        SinkIdentity::new("memory", &self.name)
    }

    fn check_output_mode(&self, _mode: OutputMode) -> std::result::Result<(), super::ModeRefusal> {
        Ok(())
    }

    async fn marker(&self, name: &QueryName, _known_ids: &[QueryId]) -> Result<Option<SinkMarker>> {
        Ok(self.lock().markers.get(name).copied())
    }

    fn create_writer(&self, _batch: &BatchContext, partition_id: usize) -> Result<Box<dyn DataWriter>> {
        Ok(self.staging.writer(partition_id))
    }

    async fn commit(&self, batch: &BatchContext, messages: Vec<CommitMessage>) -> Result<CommitOutcome> {
        let mut table = self.lock();
        let marker = table.markers.get(&batch.query_name).copied();
        if let CommitDecision::AlreadyCommitted(m) = decide_commit(marker, batch.commit_facts())? {
            return Ok(CommitOutcome::AlreadyCommitted(m));
        }
        let rows = self.staging.take(&format!("memory:{}", self.name), &messages)?;
        if batch.output_mode == OutputMode::Complete {
            table.rows.clear();
        }
        table.rows.extend(rows);
        table.markers.insert(
            batch.query_name.clone(),
            SinkMarker {
                query_id: batch.query_id,
                batch_id: batch.batch_id,
            },
        );
        table.version += 1;
        table.committed.push(batch.batch_id);
        Ok(CommitOutcome::Committed {
            version: Some(table.version),
        })
    }

    async fn abort(&self, _batch: &BatchContext, messages: Vec<CommitMessage>) -> Result<()> {
        self.staging.discard(&messages);
        Ok(())
    }
}
