//! The checkpoint of a query: its metadata, the offset log (write-ahead),
//! the commit log, and an exclusive lease.
//!
//! Layout of a checkpoint directory:
//!
//! ```text
//! metadata        query id and name, creation time, sink identity
//! offsets/N       batch N's end offsets, written before batch N runs
//! commits/N       written after the sink committed batch N
//! sources/<s>/..  private logs of sources (the file source's file lists)
//! lease           the running query's exclusive lease
//! ```

mod format;
mod lease;
pub(crate) mod lease_loss;
mod local;
mod location;
mod log;
mod object;
mod store;

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;

pub(crate) use format::decode;
pub use format::{CheckpointMetadata, CommitEntry, OffsetEntry, SourceOffset, FORMAT_VERSION};
pub use lease::LeaseTiming;
pub use lease_loss::LeaseLoss;
pub use local::{create_dirs_durably, LocalStore};
pub use log::BatchLog;
pub use object::ObjectStoreCheckpoint;
pub use store::{CheckpointStore, Lease, LeaseOwner, ProcessIdentity, PutOutcome, WriteContents};

use crate::error::Result;
use crate::ids::BatchId;

const METADATA: &str = "metadata";
const LEASE: &str = "lease";

/// A query's checkpoint on some [`CheckpointStore`].
#[derive(Debug, Clone)]
pub struct Checkpoint {
    store: Arc<dyn CheckpointStore>,
    offsets: BatchLog<OffsetEntry>,
    commits: BatchLog<CommitEntry>,
}

/// A summary of a checkpoint, for inspection.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckpointStatus {
    /// Where the checkpoint is.
    pub location: String,
    /// Its metadata, if the query ever started.
    pub metadata: Option<CheckpointMetadata>,
    /// The last planned batch.
    pub last_planned: Option<BatchId>,
    /// The last batch recorded as committed.
    pub last_committed: Option<BatchId>,
    /// The offsets of the last planned batch.
    pub latest_offsets: Option<OffsetEntry>,
}

impl Checkpoint {
    /// A checkpoint on `store`.
    pub fn new(store: Arc<dyn CheckpointStore>) -> Self {
        Checkpoint {
            offsets: BatchLog::new(store.clone(), "offsets"),
            commits: BatchLog::new(store.clone(), "commits"),
            store,
        }
    }

    /// The checkpoint at `location`: a local directory (created if
    /// missing), or a URL of object storage (`s3://bucket/prefix`,
    /// `gs://`, `az://`, `abfss://`) whose store is configured from the
    /// environment and then `options` (named as `object_store` names them,
    /// such as `aws_endpoint`; plus the lease's `lease_ttl_ms`,
    /// `lease_renew_ms` and `lease_clock_skew_ms`).
    pub fn open(location: &str, options: &HashMap<String, String>) -> Result<Self> {
        Ok(Self::new(location::open(location, options)?))
    }

    /// A checkpoint in a local directory, created if missing.
    pub fn open_local(path: impl AsRef<std::path::Path>) -> Result<Self> {
        Ok(Self::new(Arc::new(LocalStore::open(path)?)))
    }

    /// Where the checkpoint is.
    pub fn location(&self) -> &str {
        self.store.location()
    }

    /// The storage under the checkpoint.
    pub fn store(&self) -> &Arc<dyn CheckpointStore> {
        &self.store
    }

    /// The offset log.
    pub fn offsets(&self) -> &BatchLog<OffsetEntry> {
        &self.offsets
    }

    /// The commit log.
    pub fn commits(&self) -> &BatchLog<CommitEntry> {
        &self.commits
    }

    /// The metadata, if the checkpoint was ever used.
    pub async fn metadata(&self) -> Result<Option<CheckpointMetadata>> {
        match self.store.get(METADATA).await? {
            Some(bytes) => format::decode(self.location(), METADATA, &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Writes the metadata of a new checkpoint. If another run created it
    /// meanwhile, returns what that run wrote.
    pub async fn create_metadata(&self, metadata: &CheckpointMetadata) -> Result<CheckpointMetadata> {
        match self.store.put_if_absent(METADATA, Self::encode(metadata)).await? {
            PutOutcome::Created => Ok(metadata.clone()),
            PutOutcome::AlreadyExists(bytes) => format::decode(self.location(), METADATA, &bytes),
        }
    }

    /// Replaces the metadata (after an explicit override changed it).
    pub async fn replace_metadata(&self, metadata: &CheckpointMetadata) -> Result<()> {
        self.store.put(METADATA, Self::encode(metadata)).await
    }

    fn encode(metadata: &CheckpointMetadata) -> Bytes {
        Bytes::from(serde_json::to_vec_pretty(metadata).expect("metadata serialises"))
    }

    /// A summary of the checkpoint.
    pub async fn status(&self) -> Result<CheckpointStatus> {
        let last_planned = self.offsets.latest().await?;
        let latest_offsets = match last_planned {
            Some(b) => self.offsets.get(b).await?,
            None => None,
        };
        Ok(CheckpointStatus {
            location: self.location().to_string(),
            metadata: self.metadata().await?,
            last_planned,
            last_committed: self.commits.latest().await?,
            latest_offsets,
        })
    }

    /// Keeps the newest `retain` entries of each log and deletes the rest;
    /// returns the first batch kept (`None`: nothing was committed).
    pub async fn purge(&self, retain: u64) -> Result<Option<BatchId>> {
        let Some(last) = self.commits.latest().await? else {
            return Ok(None);
        };
        let keep_from = BatchId((last.0 + 1).saturating_sub(retain));
        self.offsets.purge_before(keep_from).await?;
        self.commits.purge_before(keep_from).await?;
        Ok(Some(keep_from))
    }
}
