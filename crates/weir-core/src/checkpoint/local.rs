//! A checkpoint in a local directory.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;

use super::store::{CheckpointStore, Lease, LeaseOwner, PutOutcome, WriteContents};
use crate::error::{Error, Result};

/// A checkpoint in a directory of the local file system.
///
/// Conditional creates write a temporary file, sync it, and hard-link it into
/// place (which fails if the name exists); replacements rename. The directory
/// is synced after each change, so a file that was reported written survives
/// a power loss. The lease is an advisory `flock` on the `lease` file, which
/// the operating system releases when the holder dies; it needs a local file
/// system (not NFS).
#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
    location: String,
}

impl LocalStore {
    /// Opens (creating it if missing) the checkpoint directory `root`.
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let location = root.display().to_string();
        fs::create_dir_all(&root).map_err(|source| Error::CheckpointIo {
            location: location.clone(),
            path: String::new(),
            source,
        })?;
        Ok(LocalStore { root, location })
    }

    fn io_err(&self, path: &str) -> impl FnOnce(io::Error) -> Error + '_ {
        let path = path.to_string();
        move |source| Error::CheckpointIo {
            location: self.location.clone(),
            path,
            source,
        }
    }

    fn full(&self, path: &str) -> PathBuf {
        self.root.join(path)
    }

    /// A new temporary name beside `target` (its directory created).
    fn temp_beside(target: &Path) -> io::Result<PathBuf> {
        let dir = target.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir)?;
        let name = target.file_name().and_then(|n| n.to_str()).unwrap_or("entry");
        Ok(dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4())))
    }

    /// Writes `bytes` to a synced temporary file beside `target`.
    fn write_temp(target: &Path, bytes: &[u8]) -> io::Result<PathBuf> {
        let tmp = Self::temp_beside(target)?;
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        Ok(tmp)
    }

    fn sync_dir(path: &Path) -> io::Result<()> {
        match path.parent() {
            Some(dir) => File::open(dir)?.sync_all(),
            None => Ok(()),
        }
    }

    fn put_if_absent_blocking(target: &Path, bytes: &[u8]) -> io::Result<PutOutcome> {
        let tmp = Self::write_temp(target, bytes)?;
        let linked = fs::hard_link(&tmp, target);
        // The temporary name is removed whatever happened; the link (if any)
        // keeps the data.
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                Self::sync_dir(target)?;
                Ok(PutOutcome::Created)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Ok(PutOutcome::AlreadyExists(fs::read(target)?.into()))
            }
            Err(e) => Err(e),
        }
    }

    fn put_blocking(target: &Path, bytes: &[u8]) -> io::Result<()> {
        let tmp = Self::write_temp(target, bytes)?;
        Self::replace(&tmp, target)
    }

    fn put_written_blocking(target: &Path, contents: WriteContents) -> io::Result<()> {
        let tmp = Self::temp_beside(target)?;
        // Removed unless it was moved into place, also when `contents`
        // fails or panics.
        struct Unfinished<'a>(&'a Path, bool);
        impl Drop for Unfinished<'_> {
            fn drop(&mut self) {
                if !self.1 {
                    let _ = fs::remove_file(self.0);
                }
            }
        }
        let mut guard = Unfinished(&tmp, false);
        // Written through a small buffer: a large file is never gathered.
        let mut file = io::BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        contents(&mut file)?;
        file.into_inner().map_err(io::IntoInnerError::into_error)?.sync_all()?;
        guard.1 = true;
        Self::replace(&tmp, target)
    }

    /// Moves the written temporary file `tmp` to `target`, durably.
    fn replace(tmp: &Path, target: &Path) -> io::Result<()> {
        if let Err(e) = fs::rename(tmp, target) {
            let _ = fs::remove_file(tmp);
            return Err(e);
        }
        Self::sync_dir(target)
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> io::Result<T> + Send + 'static) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|join| Err(io::Error::other(join)))
}

#[async_trait]
impl CheckpointStore for LocalStore {
    fn location(&self) -> &str {
        &self.location
    }

    async fn get(&self, path: &str) -> Result<Option<Bytes>> {
        let full = self.full(path);
        blocking(move || match fs::read(&full) {
            Ok(b) => Ok(Some(Bytes::from(b))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        })
        .await
        .map_err(self.io_err(path))
    }

    async fn put_if_absent(&self, path: &str, bytes: Bytes) -> Result<PutOutcome> {
        let full = self.full(path);
        blocking(move || Self::put_if_absent_blocking(&full, &bytes))
            .await
            .map_err(self.io_err(path))
    }

    async fn put(&self, path: &str, bytes: Bytes) -> Result<()> {
        let full = self.full(path);
        blocking(move || Self::put_blocking(&full, &bytes))
            .await
            .map_err(self.io_err(path))
    }

    async fn put_written(&self, path: &str, contents: WriteContents) -> Result<()> {
        let full = self.full(path);
        blocking(move || Self::put_written_blocking(&full, contents))
            .await
            .map_err(self.io_err(path))
    }

    async fn list(&self, dir: &str) -> Result<Vec<String>> {
        let full = self.full(dir);
        blocking(move || {
            let entries = match fs::read_dir(&full) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(e),
            };
            let mut names = Vec::new();
            for entry in entries {
                let entry = entry?;
                if !entry.file_type()?.is_file() {
                    continue;
                }
                if let Some(name) = entry.file_name().to_str() {
                    if !name.starts_with('.') {
                        names.push(name.to_string());
                    }
                }
            }
            Ok(names)
        })
        .await
        .map_err(self.io_err(dir))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let full = self.full(path);
        blocking(move || match fs::remove_file(&full) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
        .await
        .map_err(self.io_err(path))
    }

    async fn acquire_lease(&self, owner: &LeaseOwner) -> Result<Box<dyn Lease>> {
        let full = self.full(super::LEASE);
        let owner_json = serde_json::to_vec(owner).expect("a lease owner serialises");
        let held = blocking(move || {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&full)?;
            match file.try_lock() {
                Ok(()) => {
                    file.set_len(0)?;
                    file.write_all(&owner_json)?;
                    file.sync_all()?;
                    Ok(Ok(LocalLease { _file: file }))
                }
                Err(fs::TryLockError::WouldBlock) => {
                    let mut holder = String::new();
                    file.read_to_string(&mut holder)?;
                    Ok(Err(holder))
                }
                Err(fs::TryLockError::Error(e)) => Err(e),
            }
        })
        .await
        .map_err(self.io_err(super::LEASE))?;
        match held {
            Ok(lease) => Ok(Box::new(lease)),
            Err(holder) => {
                let owner = serde_json::from_str::<LeaseOwner>(&holder)
                    .map(|o| o.to_string())
                    .unwrap_or_else(|_| "an unknown holder".to_string());
                Err(Error::CheckpointInUse {
                    location: self.location.clone(),
                    owner,
                })
            }
        }
    }
}

/// A held `flock` on the lease file; closing the file releases it.
#[derive(Debug)]
struct LocalLease {
    _file: File,
}

impl Lease for LocalLease {}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(run: &str) -> LeaseOwner {
        LeaseOwner {
            run_id: run.into(),
            pid: 1,
            host: "h".into(),
            since: "now".into(),
            process: None,
        }
    }

    #[tokio::test]
    async fn conditional_create_keeps_the_first_writer() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        assert_eq!(
            store.put_if_absent("offsets/0", Bytes::from("a")).await.unwrap(),
            PutOutcome::Created
        );
        assert_eq!(
            store.put_if_absent("offsets/0", Bytes::from("b")).await.unwrap(),
            PutOutcome::AlreadyExists(Bytes::from("a"))
        );
        assert_eq!(store.get("offsets/0").await.unwrap(), Some(Bytes::from("a")));
        assert_eq!(
            store.list("offsets").await.unwrap(),
            vec!["0".to_string()],
            "no temporary files left"
        );
        store.put("offsets/0", Bytes::from("c")).await.unwrap();
        assert_eq!(store.get("offsets/0").await.unwrap(), Some(Bytes::from("c")));
        store.delete("offsets/0").await.unwrap();
        store.delete("offsets/0").await.unwrap();
        assert_eq!(store.get("offsets/0").await.unwrap(), None);
        assert!(store.list("missing").await.unwrap().is_empty());
    }

    /// A written file replaces the old one whole; contents that fail leave
    /// the old file and no temporary one, with the failure's kind kept.
    #[tokio::test]
    async fn a_written_file_replaces_the_old_one_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        store.put("state/0.delta", Bytes::from("old")).await.unwrap();
        let big = vec![7u8; 3 << 20];
        let expected = big.clone();
        store
            .put_written("state/0.delta", Box::new(move |out| out.write_all(&big)))
            .await
            .unwrap();
        assert_eq!(store.get("state/0.delta").await.unwrap().unwrap(), expected);
        let err = store
            .put_written(
                "state/0.delta",
                Box::new(|out| {
                    out.write_all(b"half")?;
                    Err(io::Error::new(io::ErrorKind::InvalidData, "bad rows"))
                }),
            )
            .await
            .unwrap_err();
        assert!(!err.retryable(), "{err}");
        assert_eq!(store.get("state/0.delta").await.unwrap().unwrap(), expected);
        assert_eq!(store.list("state").await.unwrap(), vec!["0.delta".to_string()]);
    }

    #[tokio::test]
    async fn lease_is_exclusive_until_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        let lease = store.acquire_lease(&owner("first")).await.unwrap();
        let err = store.acquire_lease(&owner("second")).await.unwrap_err();
        assert!(
            matches!(&err, Error::CheckpointInUse { owner, .. } if owner.contains("run first")),
            "{err}"
        );
        drop(lease);
        store.acquire_lease(&owner("second")).await.unwrap();
    }
}
