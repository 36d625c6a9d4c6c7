//! iceberg's `FileIO` on the local file system, as weir writes tables
//! there: every file a writer closes is synced first (a commit never lists
//! a file a power loss could empty), and a directory is made only when a
//! file's parent is missing, not before every file.

use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use iceberg::io::{
    FileIO, FileIOBuilder, FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use iceberg::{Error, ErrorKind};
use serde::{Deserialize, Serialize};
use weir_core::sync::Recover;

/// A `FileIO` on the local file system ([`LocalStorage`]): absolute paths
/// and `file://` URLs.
pub fn local_file_io() -> FileIO {
    FileIOBuilder::new(Arc::new(LocalStorageFactory)).build()
}

/// Builds [`LocalStorage`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LocalStorageFactory;

#[typetag::serde]
impl StorageFactory for LocalStorageFactory {
    fn build(&self, _config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        Ok(Arc::new(LocalStorage))
    }
}

/// Files of the local file system. A writer's file is synced when it
/// closes; `write` (iceberg's whole-file write, which weir uses for
/// `version-hint.text` alone) replaces a file's bytes without a sync, as
/// iceberg's own local storage does.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LocalStorage;

fn io_err<'a>(context: &'static str, path: &'a Path) -> impl Fn(io::Error) -> Error + 'a {
    move |e| {
        let kind = match e.kind() {
            io::ErrorKind::NotFound | io::ErrorKind::InvalidInput => ErrorKind::DataInvalid,
            _ => ErrorKind::Unexpected,
        };
        Error::new(kind, format!("{context} {}", path.display())).with_source(e)
    }
}

/// The local path of `location`: an absolute path or a `file:` URL.
fn local_path(location: &str) -> PathBuf {
    match location
        .strip_prefix("file://")
        .or_else(|| location.strip_prefix("file:"))
    {
        Some(rest) if !rest.starts_with('/') => PathBuf::from(format!("/{rest}")),
        Some(rest) => PathBuf::from(rest),
        None => PathBuf::from(location),
    }
}

/// Creates (or truncates) `path` for writing, making its directory first
/// (durably) if it is missing.
fn create(path: &Path) -> io::Result<File> {
    match File::create(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent() {
                weir_core::checkpoint::create_dirs_durably(parent)?;
            }
            File::create(path)
        }
        created => created,
    }
}

/// Whether an error means the file is not there (also when a directory on
/// its path is a file).
fn absent(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory)
}

#[typetag::serde]
#[async_trait]
impl Storage for LocalStorage {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        let path = local_path(path);
        path.try_exists().map_err(io_err("cannot look up", &path))
    }

    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        let path = local_path(path);
        let meta = fs::metadata(&path).map_err(io_err("cannot look up", &path))?;
        Ok(FileMetadata { size: meta.len() })
    }

    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        let path = local_path(path);
        fs::read(&path).map(Bytes::from).map_err(io_err("cannot read", &path))
    }

    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        let path = local_path(path);
        let file = File::open(&path).map_err(io_err("cannot open", &path))?;
        Ok(Box::new(Reader {
            file: Mutex::new(file),
            path,
        }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> iceberg::Result<()> {
        let path = local_path(path);
        create(&path)
            .and_then(|mut file| file.write_all(&bs))
            .map_err(io_err("cannot write", &path))
    }

    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        let path = local_path(path);
        let file = create(&path).map_err(io_err("cannot create", &path))?;
        Ok(Box::new(Writer {
            file: Some(io::BufWriter::with_capacity(1 << 16, file)),
            path,
        }))
    }

    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        let path = local_path(path);
        match fs::remove_file(&path) {
            Err(e) if !absent(&e) => Err(io_err("cannot delete", &path)(e)),
            _ => Ok(()),
        }
    }

    /// Deletes the directory `path` and all in it (nothing if it is not a
    /// directory); refuses the root and paths with `..`.
    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        let path = local_path(path);
        let climbs = path.components().any(|c| c == std::path::Component::ParentDir);
        if path.parent().is_none() || climbs {
            return Err(Error::new(
                ErrorKind::DataInvalid,
                format!(
                    "{}: refusing to delete a whole file system or a path with ..",
                    path.display()
                ),
            ));
        }
        if !path.is_dir() {
            return Ok(());
        }
        match fs::remove_dir_all(&path) {
            Err(e) if !absent(&e) => Err(io_err("cannot delete", &path)(e)),
            _ => Ok(()),
        }
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> iceberg::Result<()> {
        while let Some(path) = paths.next().await {
            self.delete(&path).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> iceberg::Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> iceberg::Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

struct Reader {
    file: Mutex<File>,
    path: PathBuf,
}

#[async_trait]
impl FileRead for Reader {
    async fn read(&self, range: Range<u64>) -> iceberg::Result<Bytes> {
        let mut file = self.file.lock().recover();
        let mut buf = vec![0; (range.end - range.start) as usize];
        file.seek(SeekFrom::Start(range.start))
            .and_then(|_| file.read_exact(&mut buf))
            .map_err(io_err("cannot read", &self.path))?;
        Ok(buf.into())
    }
}

/// Writes through a buffer; `close` flushes and syncs the file.
struct Writer {
    file: Option<io::BufWriter<File>>,
    path: PathBuf,
}

fn closed(path: &Path) -> Error {
    Error::new(ErrorKind::Unexpected, format!("{} is closed", path.display()))
}

#[async_trait]
impl FileWrite for Writer {
    async fn write(&mut self, bs: Bytes) -> iceberg::Result<()> {
        let file = self.file.as_mut().ok_or_else(|| closed(&self.path))?;
        file.write_all(&bs).map_err(io_err("cannot write", &self.path))
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        let mut file = self.file.take().ok_or_else(|| closed(&self.path))?;
        file.flush().map_err(io_err("cannot write", &self.path))?;
        file.get_ref().sync_all().map_err(io_err("cannot sync", &self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_are_local_paths() {
        assert_eq!(local_path("/w/t/a.avro"), PathBuf::from("/w/t/a.avro"));
        assert_eq!(local_path("file:///w/t/a.avro"), PathBuf::from("/w/t/a.avro"));
        assert_eq!(local_path("file:/w/t/a.avro"), PathBuf::from("/w/t/a.avro"));
        // As iceberg reads it: a host is the first directory.
        assert_eq!(local_path("file://w/t/a.avro"), PathBuf::from("/w/t/a.avro"));
    }

    #[tokio::test]
    async fn files_round_trip_and_directories_are_made_when_missing() {
        let dir = tempfile::tempdir().unwrap();
        let io = local_file_io();
        let deep = format!("file://{}/a/b/c.bin", dir.path().display());
        let mut w = io.new_output(&deep).unwrap().writer().await.unwrap();
        w.write(Bytes::from_static(b"ab")).await.unwrap();
        w.write(Bytes::from(vec![b'c'; 100_000])).await.unwrap();
        w.close().await.unwrap();
        assert!(w.close().await.is_err(), "a second close is an error");
        let input = io.new_input(&deep).unwrap();
        assert_eq!(input.metadata().await.unwrap().size, 100_002);
        assert_eq!(&input.reader().await.unwrap().read(1..4).await.unwrap()[..], b"bcc");
        assert_eq!(input.read().await.unwrap().len(), 100_002);

        // A whole-file write replaces longer contents exactly.
        let hint = format!("{}/m/version-hint.text", dir.path().display());
        io.new_output(&hint)
            .unwrap()
            .write(Bytes::from("00010-long"))
            .await
            .unwrap();
        io.new_output(&hint).unwrap().write(Bytes::from("9")).await.unwrap();
        assert_eq!(fs::read_to_string(dir.path().join("m/version-hint.text")).unwrap(), "9");

        io.delete(&deep).await.unwrap();
        io.delete(&deep).await.unwrap();
        assert!(!io.exists(&deep).await.unwrap());
        io.delete(&format!("{}/version-hint.text/x", dir.path().join("m").display()))
            .await
            .unwrap();
        io.delete_prefix(&hint).await.unwrap();
        assert!(dir.path().join("m/version-hint.text").exists(), "a file is no prefix");
        io.delete_prefix(&format!("{}/a", dir.path().display())).await.unwrap();
        assert!(!dir.path().join("a").exists());
        io.delete_prefix(&format!("{}/a", dir.path().display())).await.unwrap();
        assert!(io.delete_prefix("/").await.is_err());
        assert!(io.delete_prefix(&format!("{}/..", dir.path().display())).await.is_err());
        assert!(dir.path().exists());
        assert!(io.new_input("/no/such/file").unwrap().read().await.is_err());
    }
}
