//! Manifests merged ahead of the commit path. Once a commit leaves as many
//! small manifests as the next commit would merge (Java's merge-append
//! rule, `commit.manifest.min-count-to-merge`), the sink merges them in the
//! background, and the first commit after that whose base still lists
//! every input lists the merged manifests instead: no batch waits for a
//! merge, and the table's manifests stay as few as with merging inline.
//!
//! The merged files are deleted only when no snapshot can list them: when
//! another writer rewrote an input first and no swap that listed them has
//! an unknown outcome.

use std::sync::{Arc, Mutex};

use iceberg::io::FileIO;
use iceberg::spec::{ManifestFile, TableMetadata};
use weir_core::sink::Background;

use crate::commit::{AheadUse, MergedAhead, Producer};
use weir_core::sync::Recover;

/// How long a merge may wait for a commit to list it. Orphan removal
/// deletes unlisted files an hour old at the soonest; a merge that waited
/// longer (no data came, or the query's commits merge nothing) is dropped
/// and made again when due.
const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(30 * 60);

/// The sink's merge ahead: none, one being written, or one ready.
#[derive(Debug, Default)]
pub(crate) struct Ahead(Mutex<Slot>);

#[derive(Debug, Default)]
enum Slot {
    #[default]
    Idle,
    Running,
    Ready {
        merged: Arc<MergedAhead>,
        /// A swap that listed it failed with an unknown outcome.
        uncertain: bool,
    },
}

impl Ahead {
    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.0.lock().recover()
    }

    /// The merge ready for the next commit, if one is, and the files of
    /// one that waited too long to be listed, to delete.
    pub(crate) fn ready(&self) -> (Option<Arc<MergedAhead>>, Vec<String>) {
        let mut slot = self.slot();
        match &*slot {
            Slot::Ready { merged, uncertain } if merged.made.elapsed() > MAX_WAIT => {
                let files = if *uncertain { Vec::new() } else { merged.paths() };
                *slot = Slot::Idle;
                (None, files)
            }
            Slot::Ready { merged, .. } => (Some(merged.clone()), Vec::new()),
            _ => (None, Vec::new()),
        }
    }

    /// After a commit attempt offered `offered`: `landed` says whether its
    /// swap landed (`None`: unknown). Returns the files to delete.
    pub(crate) fn settle(&self, offered: &Arc<MergedAhead>, used: AheadUse, landed: Option<bool>) -> Vec<String> {
        let mut slot = self.slot();
        let Slot::Ready { merged, uncertain } = &mut *slot else {
            return Vec::new();
        };
        if !Arc::ptr_eq(merged, offered) {
            return Vec::new();
        }
        match (used, landed) {
            (AheadUse::Listed, Some(true)) | (AheadUse::AlreadyListed, _) => {
                *slot = Slot::Idle;
                Vec::new()
            }
            (AheadUse::Listed, None) => {
                *uncertain = true;
                Vec::new()
            }
            (AheadUse::Stale, _) => {
                let files = if *uncertain { Vec::new() } else { merged.paths() };
                tracing::debug!(
                    kept = *uncertain,
                    "manifests merged ahead lost an input to another writer"
                );
                *slot = Slot::Idle;
                files
            }
            _ => Vec::new(),
        }
    }

    /// After a commit that left a snapshot listing `manifests`: starts a
    /// merge in the background when the next commit would merge, unless
    /// one is running or ready.
    pub(crate) fn start_if_due(
        self: &Arc<Self>,
        background: &Background,
        file_io: &FileIO,
        table: String,
        metadata: &TableMetadata,
        manifests: &[ManifestFile],
    ) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        if !crate::commit::merge_due(metadata, manifests) {
            return;
        }
        {
            let mut slot = self.slot();
            if !matches!(*slot, Slot::Idle) {
                return;
            }
            *slot = Slot::Running;
        }
        let (this, metadata, manifests) = (self.clone(), metadata.clone(), manifests.to_vec());
        let producer = Producer::new(file_io.clone(), table.clone(), Vec::new());
        let merge = async move {
            let started = std::time::Instant::now();
            let next = match producer.merge_ahead(&metadata, manifests).await {
                Ok(Some(merged)) => {
                    tracing::debug!(
                        table,
                        inputs = merged.inputs.len(),
                        ms = started.elapsed().as_millis() as u64,
                        "merged manifests ahead of the commit"
                    );
                    Slot::Ready {
                        merged: Arc::new(merged),
                        uncertain: false,
                    }
                }
                Ok(None) => Slot::Idle,
                Err(e) => {
                    tracing::warn!(table, error = %e, "merging manifests ahead failed; the next commit that falls due tries again");
                    Slot::Idle
                }
            };
            *this.slot() = next;
        };
        // Decoding and encoding manifests is CPU work: on a thread of its
        // own (of the background runtime's pool) it never holds up a worker.
        background.spawn(async move {
            let handle = tokio::runtime::Handle::current();
            if let Err(e) = handle.clone().spawn_blocking(move || handle.block_on(merge)).await {
                tracing::warn!(error = %e, "merging manifests ahead stopped");
            }
        });
    }

    /// At the query's end: the files of a merge no commit listed, unless a
    /// swap that listed it may have landed.
    pub(crate) fn unused(&self) -> Vec<String> {
        match std::mem::take(&mut *self.slot()) {
            Slot::Ready {
                merged,
                uncertain: false,
            } => merged.paths(),
            _ => Vec::new(),
        }
    }
}
