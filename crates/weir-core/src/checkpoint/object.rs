//! A checkpoint on object storage.

use std::future::Future;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, WriteMultipart};

use super::lease::{Fence, LeaseObject, LeaseTiming};
use super::store::{CheckpointStore, Lease, LeaseOwner, PutOutcome, WriteContents};
use crate::error::{Error, Result};
use crate::sync::Recover;

/// Files at least this large are uploaded in parts of this size.
const PART_BYTES: usize = 16 << 20;

/// A checkpoint under a prefix of an [`ObjectStore`]: S3 and the stores that
/// speak its API, GCS, Azure Blob Storage, or any other implementation with
/// conditional puts.
///
/// - Log entries are created with a conditional put (`PutMode::Create`), so
///   of two writers of one batch exactly one defines it. A put whose outcome
///   is unknown (a timeout after the request went out) is settled by reading
///   the file back: holding our bytes, it is ours (so a writer whose bytes
///   equal the winner's is told `Created` too: the file holds what it
///   wrote). Taking the lease first checks that the store honours
///   conditional puts, and refuses a store that ignores them.
/// - Replacements are plain puts, which object stores make atomic; files
///   of [`PART_BYTES`] or more go up in parts and appear whole at the end.
/// - The lease (invariant I5) is the object `lease`, holding its owner, an
///   epoch and an expiry, taken and renewed with conditional puts on its
///   ETag and renewed in the background (see [`LeaseTiming`] for the
///   timing it assumes). Once a handle took the lease, every write through
///   it (and its clones) is refused from the moment the lease may have
///   passed to another run, and a write still under way then is cut off.
#[derive(Debug, Clone)]
pub struct ObjectStoreCheckpoint {
    store: Arc<dyn ObjectStore>,
    root: Path,
    location: String,
    timing: LeaseTiming,
    /// The fence of the lease last taken through this handle.
    fence: Arc<Mutex<Arc<Fence>>>,
}

impl ObjectStoreCheckpoint {
    /// The checkpoint under `root` in `store`, shown as `location`.
    pub fn new(store: Arc<dyn ObjectStore>, root: Path, location: impl Into<String>) -> Self {
        ObjectStoreCheckpoint {
            store,
            root,
            location: location.into(),
            timing: LeaseTiming::default(),
            fence: Arc::new(Mutex::new(Arc::new(Fence::default()))),
        }
    }

    /// Keeps the lease with `timing` instead of the default.
    pub fn with_lease_timing(mut self, timing: LeaseTiming) -> Result<Self> {
        if let Some(reason) = timing.problem() {
            return Err(Error::InvalidOption {
                option: "lease timing",
                reason,
            });
        }
        self.timing = timing;
        Ok(self)
    }

    fn path(&self, path: &str) -> Path {
        self.root.parts().chain(Path::from(path).parts()).collect()
    }

    fn err(&self, path: &str) -> impl FnOnce(object_store::Error) -> Error + '_ {
        let path = path.to_string();
        move |source| Error::CheckpointStore {
            location: self.location.clone(),
            path,
            source,
        }
    }

    /// Runs the write `put` of `path` if this handle may write, and cuts it
    /// off when its lease lapses meanwhile.
    async fn fenced<T>(&self, path: &str, put: impl Future<Output = Result<T>>) -> Result<T> {
        let lost = |(epoch, loss)| Error::LeaseLost {
            location: self.location.clone(),
            path: path.to_string(),
            epoch,
            loss,
        };
        let fence = self.fence.lock().recover().clone();
        let Some(mut deadline) = fence.check().map_err(lost)? else {
            return put.await;
        };
        tokio::pin!(put);
        loop {
            tokio::select! {
                done = &mut put => return done,
                () = tokio::time::sleep_until(deadline) => match fence.check().map_err(lost)? {
                    // Renewed meanwhile.
                    Some(later) => deadline = later,
                    None => return put.await,
                },
            }
        }
    }

    async fn put_if_absent_unfenced(&self, path: &str, bytes: Bytes) -> Result<PutOutcome> {
        let full = self.path(path);
        let put = self
            .store
            .put_opts(&full, bytes.clone().into(), PutOptions::from(PutMode::Create))
            .await;
        let unknown = match put {
            Ok(_) => return Ok(PutOutcome::Created),
            Err(object_store::Error::AlreadyExists { .. }) => None,
            Err(e) => Some(e),
        };
        // Settled by what the store holds now.
        match (self.get(path).await?, unknown) {
            (Some(now), _) if now == bytes => Ok(PutOutcome::Created),
            (Some(now), _) => Ok(PutOutcome::AlreadyExists(now)),
            (None, Some(e)) => Err(self.err(path)(e)),
            // A conflict between concurrent conditional creates, or a
            // delete in between: the caller tries again.
            (None, None) => Err(Error::CheckpointStore {
                location: self.location.clone(),
                path: path.to_string(),
                source: object_store::Error::Generic {
                    store: "checkpoint",
                    source: "the create conflicted, yet the file is not there".into(),
                },
            }),
        }
    }

    /// A put that fails is settled by reading back: holding our bytes, the
    /// file was written.
    async fn put_unfenced(&self, path: &str, bytes: Bytes) -> Result<()> {
        let full = self.path(path);
        let put = if bytes.len() < PART_BYTES {
            self.store.put(&full, bytes.clone().into()).await.map(|_| ())
        } else {
            match self.store.put_multipart(&full).await {
                Ok(upload) => {
                    let mut parts = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
                    parts.put(bytes.clone());
                    parts.finish().await.map(|_| ())
                }
                Err(e) => Err(e),
            }
        };
        match put {
            Ok(()) => Ok(()),
            Err(e) => match self.get(path).await {
                Ok(Some(now)) if now == bytes => Ok(()),
                _ => Err(self.err(path)(e)),
            },
        }
    }
}

#[async_trait]
impl CheckpointStore for ObjectStoreCheckpoint {
    fn location(&self) -> &str {
        &self.location
    }

    async fn get(&self, path: &str) -> Result<Option<Bytes>> {
        match self.store.get(&self.path(path)).await {
            Ok(got) => got.bytes().await.map(Some).map_err(self.err(path)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(path)(e)),
        }
    }

    async fn put_if_absent(&self, path: &str, bytes: Bytes) -> Result<PutOutcome> {
        self.fenced(path, self.put_if_absent_unfenced(path, bytes)).await
    }

    async fn put(&self, path: &str, bytes: Bytes) -> Result<()> {
        self.fenced(path, self.put_unfenced(path, bytes)).await
    }

    /// Made on a blocking thread and gathered there, then put (in parts
    /// when large).
    async fn put_written(&self, path: &str, contents: WriteContents) -> Result<()> {
        let made = tokio::task::spawn_blocking(move || {
            let mut bytes = Vec::new();
            contents(&mut bytes).map(|()| bytes)
        })
        .await
        .unwrap_or_else(|join| Err(std::io::Error::other(join)));
        let bytes = made.map_err(|source| Error::CheckpointIo {
            location: self.location.clone(),
            path: path.to_string(),
            source,
        })?;
        self.put(path, Bytes::from(bytes)).await
    }

    async fn list(&self, dir: &str) -> Result<Vec<String>> {
        let prefix = self.path(dir);
        let listed = self
            .store
            .list_with_delimiter(Some(&prefix))
            .await
            .map_err(self.err(dir))?;
        Ok(listed
            .objects
            .iter()
            // Not a directory marker (`offsets/`) some tools leave.
            .filter(|o| o.location != prefix)
            .filter_map(|o| o.location.filename())
            .filter(|name| !name.starts_with('.'))
            .map(str::to_string)
            .collect())
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let full = self.path(path);
        self.fenced(path, async {
            match self.store.delete(&full).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(self.err(path)(e)),
            }
        })
        .await
    }

    async fn acquire_lease(&self, owner: &LeaseOwner) -> Result<Box<dyn Lease>> {
        let object = LeaseObject {
            store: self.store.clone(),
            path: self.path(super::LEASE),
            location: self.location.clone(),
            timing: self.timing,
        };
        object.probe(&self.root).await?;
        let fence = Arc::new(Fence::default());
        let lease = object.acquire(owner, fence.clone()).await?;
        *self.fence.lock().recover() = fence;
        Ok(lease)
    }
}
