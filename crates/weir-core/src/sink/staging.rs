//! Rows staged in memory by writers until the driver-side commit takes them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use async_trait::async_trait;
use uuid::Uuid;

use super::{CommitMessage, DataWriter};
use crate::error::{Error, Result};
use crate::sync::Recover;

/// Staged row sets by id. A writer's commit message is the id of its set.
#[derive(Debug, Clone, Default)]
pub(crate) struct Staging {
    sets: Arc<Mutex<HashMap<Uuid, Vec<RecordBatch>>>>,
}

impl Staging {
    pub(crate) fn writer(&self, partition_id: usize) -> Box<dyn DataWriter> {
        Box::new(StagingWriter {
            staging: self.clone(),
            partition_id,
            rows: Vec::new(),
        })
    }

    /// Removes and returns the rows of the messages, in message order.
    pub(crate) fn take(&self, sink: &str, messages: &[CommitMessage]) -> Result<Vec<RecordBatch>> {
        let mut sets = self.lock();
        let mut rows = Vec::new();
        for m in messages {
            let id = m.decode::<Uuid>()?;
            let set = sets
                .remove(&id)
                .ok_or_else(|| Error::sink(sink, None, false, format!("staged rows {id} are gone")))?;
            rows.extend(set);
        }
        Ok(rows)
    }

    /// Drops the rows of the messages.
    pub(crate) fn discard(&self, messages: &[CommitMessage]) {
        let mut sets = self.lock();
        for id in messages.iter().filter_map(|m| m.decode::<Uuid>().ok()) {
            sets.remove(&id);
        }
    }

    /// How many sets are staged and not taken.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Vec<RecordBatch>>> {
        self.sets.lock().recover()
    }
}

struct StagingWriter {
    staging: Staging,
    partition_id: usize,
    rows: Vec<RecordBatch>,
}

#[async_trait]
impl DataWriter for StagingWriter {
    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        self.rows.push(batch);
        Ok(())
    }

    async fn commit(self: Box<Self>) -> Result<CommitMessage> {
        let id = Uuid::new_v4();
        self.staging.lock().insert(id, self.rows);
        CommitMessage::new(self.partition_id, &id)
    }

    async fn abort(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}
