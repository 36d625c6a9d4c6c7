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
/// Conditional creates write a temporary file, sync it, and move it into
/// place with a rename that fails if the name exists (Linux's
/// `RENAME_NOREPLACE`; elsewhere, or on a file system without it, a hard
/// link and the temporary name's removal); replacements rename. The directory
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
        create_dirs_durably(&root).map_err(|source| Error::CheckpointIo {
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

    /// A new temporary file beside `target`, and its name. The directory is
    /// made only when it is missing (the usual case costs no `mkdir`).
    fn create_temp(target: &Path) -> io::Result<(PathBuf, File)> {
        let dir = target.parent().unwrap_or(Path::new("."));
        let name = target.file_name().and_then(|n| n.to_str()).unwrap_or("entry");
        let tmp = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4()));
        let file = match File::create(&tmp) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                create_dirs_durably(dir)?;
                File::create(&tmp)?
            }
            created => created?,
        };
        Ok((tmp, file))
    }

    /// Writes `bytes` to a synced temporary file beside `target`.
    fn write_temp(target: &Path, bytes: &[u8]) -> io::Result<PathBuf> {
        let (tmp, mut file) = Self::create_temp(target)?;
        let written = file.write_all(bytes).and_then(|()| file.sync_all());
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
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
        match move_if_absent(&tmp, target) {
            Ok(()) => {
                Self::sync_dir(target)?;
                Ok(PutOutcome::Created)
            }
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                match e.kind() {
                    io::ErrorKind::AlreadyExists => Ok(PutOutcome::AlreadyExists(fs::read(target)?.into())),
                    _ => Err(e),
                }
            }
        }
    }

    fn put_blocking(target: &Path, bytes: &[u8]) -> io::Result<()> {
        let tmp = Self::write_temp(target, bytes)?;
        Self::replace(&tmp, target)
    }

    fn put_written_blocking(target: &Path, contents: WriteContents) -> io::Result<()> {
        let (tmp, file) = Self::create_temp(target)?;
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
        let mut file = io::BufWriter::with_capacity(1 << 20, WrittenBack::new(file));
        contents(&mut file)?;
        file.into_inner()
            .map_err(io::IntoInnerError::into_error)?
            .file
            .sync_all()?;
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

/// How much of a file is written before its writeback is started.
const WRITEBACK_STEP: u64 = 8 << 20;

/// A file whose writeback starts every [`WRITEBACK_STEP`] bytes (on Linux,
/// `sync_file_range` without waiting), so a large file (a state snapshot
/// made beside the batches) never holds much unwritten data that a batch's
/// sync of a small file would wait behind. Its own sync at the end reports
/// any failure.
struct WrittenBack {
    file: fs::File,
    written: u64,
    started: u64,
}

impl WrittenBack {
    fn new(file: fs::File) -> Self {
        WrittenBack {
            file,
            written: 0,
            started: 0,
        }
    }
}

impl io::Write for WrittenBack {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.started >= WRITEBACK_STEP {
            #[cfg(target_os = "linux")]
            {
                use std::os::fd::AsRawFd;
                // SAFETY: the descriptor is open for the call; the range
                // was written. A failure here shows again at the sync.
                unsafe {
                    libc::sync_file_range(
                        self.file.as_raw_fd(),
                        self.started as libc::off64_t,
                        (self.written - self.started) as libc::off64_t,
                        libc::SYNC_FILE_RANGE_WRITE,
                    );
                }
            }
            self.started = self.written;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Moves `from` to `to` unless `to` exists (`AlreadyExists` then, and
/// `from` is left): one atomic rename where the system has it, else a hard
/// link and the removal of `from`.
fn move_if_absent(from: &Path, to: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other);
        let (src, dst) = (c(from)?, c(to)?);
        // The system call itself, not libc's wrapper: that needs glibc 2.28.
        // SAFETY: both are valid NUL-terminated paths that outlive the call.
        let done = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                src.as_ptr(),
                libc::AT_FDCWD,
                dst.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if done == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if !rename_unsupported(&e) {
            return Err(e);
        }
    }
    link_if_absent(from, to)
}

/// Whether a no-replace rename failed for want of support (an old kernel,
/// a file system without the flag, a sandbox that refuses the call): the
/// link then does the same, and reports any real error itself.
#[cfg(target_os = "linux")]
fn rename_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::ENOSYS | libc::EPERM | libc::EOPNOTSUPP)
    )
}

/// Makes `dir` and its missing ancestors, each synced into its parent, so
/// a file synced into `dir` survives a power loss with its path (table
/// sinks use it for their local files too).
pub fn create_dirs_durably(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        missing.push(d);
        at = d.parent();
    }
    fs::create_dir_all(dir)?;
    for made in missing.iter().rev() {
        if let Some(parent) = made.parent().filter(|p| !p.as_os_str().is_empty()) {
            File::open(parent)?.sync_all()?;
        }
    }
    Ok(())
}

/// [`move_if_absent`] by a hard link (which fails if `to` exists) and the
/// removal of `from`.
fn link_if_absent(from: &Path, to: &Path) -> io::Result<()> {
    fs::hard_link(from, to)?;
    let _ = fs::remove_file(from);
    Ok(())
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
        let names: Vec<_> = fs::read_dir(dir.path().join("offsets"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["0"], "no temporary files left");
        store.put("offsets/0", Bytes::from("c")).await.unwrap();
        assert_eq!(store.get("offsets/0").await.unwrap(), Some(Bytes::from("c")));
        store.delete("offsets/0").await.unwrap();
        store.delete("offsets/0").await.unwrap();
        assert_eq!(store.get("offsets/0").await.unwrap(), None);
        assert!(store.list("missing").await.unwrap().is_empty());
    }

    /// Without an atomic no-replace rename, a link does the same: the first
    /// name wins and the loser's file stays where it was.
    #[test]
    fn a_link_moves_a_file_only_to_a_free_name() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, to) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("to"));
        fs::write(&a, "a").unwrap();
        fs::write(&b, "b").unwrap();
        link_if_absent(&a, &to).unwrap();
        assert!(!a.exists());
        let e = link_if_absent(&b, &to).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read_to_string(&to).unwrap(), "a");
        assert_eq!(fs::read_to_string(&b).unwrap(), "b");
        move_if_absent(&b, &to).unwrap_err();
        assert_eq!(fs::read_to_string(&to).unwrap(), "a");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn only_a_missing_rename_falls_back_to_the_link() {
        for code in [libc::EINVAL, libc::ENOSYS, libc::EPERM, libc::EOPNOTSUPP] {
            assert!(rename_unsupported(&io::Error::from_raw_os_error(code)), "{code}");
        }
        for code in [libc::EEXIST, libc::ENOENT, libc::EACCES, libc::ENOSPC] {
            assert!(!rename_unsupported(&io::Error::from_raw_os_error(code)), "{code}");
        }
    }

    #[test]
    fn missing_directories_are_made() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        create_dirs_durably(&deep).unwrap();
        assert!(deep.is_dir());
        create_dirs_durably(&deep).unwrap();
    }

    /// A written file (larger than a writeback step) replaces the old one
    /// whole; contents that fail leave the old file and no temporary one,
    /// with the failure's kind kept.
    #[tokio::test]
    async fn a_written_file_replaces_the_old_one_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::open(dir.path()).unwrap();
        store.put("state/0.delta", Bytes::from("old")).await.unwrap();
        // Over two writeback steps, in a pattern that does not repeat at
        // any step's length, so a step written out of place would show.
        let big: Vec<u8> = (0..(WRITEBACK_STEP * 5 / 2)).map(|i| (i % 251) as u8).collect();
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
