//! The offset and commit logs: one file per batch, named by its batch id.

use std::marker::PhantomData;
use std::sync::Arc;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::format::decode;
use super::store::{CheckpointStore, PutOutcome};
use crate::error::{Error, Result};
use crate::ids::BatchId;

/// A log of one entry per batch in a directory of the checkpoint. Entries are
/// created with a conditional create, so an entry, once written, is never
/// changed: a second writer of the same batch learns that it lost.
#[derive(Debug, Clone)]
pub struct BatchLog<T> {
    store: Arc<dyn CheckpointStore>,
    dir: &'static str,
    _entry: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> BatchLog<T> {
    pub(crate) fn new(store: Arc<dyn CheckpointStore>, dir: &'static str) -> Self {
        BatchLog {
            store,
            dir,
            _entry: PhantomData,
        }
    }

    fn path(&self, batch: BatchId) -> String {
        format!("{}/{}", self.dir, batch.0)
    }

    /// Writes the entry of `batch`. Returns `false` (and writes nothing) if
    /// the batch already has an entry with different content.
    pub async fn add(&self, batch: BatchId, entry: &T) -> Result<bool> {
        let bytes = Bytes::from(serde_json::to_vec(entry).expect("log entries serialise"));
        match self.store.put_if_absent(&self.path(batch), bytes.clone()).await? {
            PutOutcome::Created => Ok(true),
            PutOutcome::AlreadyExists(existing) => Ok(existing == bytes),
        }
    }

    /// The entry of `batch`, if written.
    pub async fn get(&self, batch: BatchId) -> Result<Option<T>> {
        let path = self.path(batch);
        match self.store.get(&path).await? {
            Some(bytes) => decode(self.store.location(), &path, &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// The ids of all entries, ascending.
    pub async fn batch_ids(&self) -> Result<Vec<BatchId>> {
        let mut ids = Vec::new();
        for name in self.store.list(self.dir).await? {
            let id = name.parse::<u64>().map_err(|_| Error::CorruptCheckpoint {
                location: self.store.location().to_string(),
                path: format!("{}/{name}", self.dir),
                reason: "a log file whose name is not a batch id".into(),
            })?;
            ids.push(BatchId(id));
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// The id of the newest entry.
    pub async fn latest(&self) -> Result<Option<BatchId>> {
        Ok(self.batch_ids().await?.last().copied())
    }

    /// The newest entry before `batch`, with its id.
    pub async fn latest_before(&self, batch: BatchId) -> Result<Option<(BatchId, T)>> {
        let ids = self.batch_ids().await?;
        match ids.into_iter().rev().find(|id| *id < batch) {
            Some(id) => Ok(self.get(id).await?.map(|e| (id, e))),
            None => Ok(None),
        }
    }

    /// Deletes the entry of `batch` if present.
    pub async fn remove(&self, batch: BatchId) -> Result<()> {
        self.store.delete(&self.path(batch)).await
    }

    /// Deletes every entry before `keep_from`.
    pub async fn purge_before(&self, keep_from: BatchId) -> Result<usize> {
        let mut purged = 0;
        for id in self.batch_ids().await? {
            if id >= keep_from {
                break;
            }
            self.remove(id).await?;
            purged += 1;
        }
        Ok(purged)
    }
}
