//! iceberg's `FileIO` for weir's tables: local warehouses through
//! [`LocalStorage`] (files synced before a commit lists them), S3 (any
//! endpoint that speaks it) and local paths alike through `object_store`
//! ([`ObjectStorage`]), so tables can live in object storage.
//!
//! Settings use pyiceberg's names: `s3.endpoint`, `s3.access-key-id`,
//! `s3.secret-access-key`, `s3.region`; what is not given comes from the
//! usual `AWS_*` variables. Secrets are neither printed nor serialised.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use iceberg::io::{
    FileIO, FileIOBuilder, FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage, StorageConfig,
    StorageFactory,
};
use iceberg::{Error, ErrorKind};
use object_store::aws::AmazonS3Builder;
use object_store::buffered::BufWriter;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

mod local;

pub use local::{local_file_io, LocalStorage, LocalStorageFactory};

/// Whether a storage or catalog setting holds a secret (its value is never
/// printed, logged or serialised).
pub fn is_secret_setting(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["secret", "token", "password", "key", "credential"]
        .iter()
        .any(|w| name.contains(w))
}

/// A `FileIO` for `location` (a warehouse or table location) with
/// `settings`: the local file system for paths and `file://` URLs
/// ([`LocalStorage`]), `object_store` for `s3://` (and `s3a://`).
pub fn file_io(location: &str, settings: HashMap<String, String>) -> FileIO {
    if location.contains("://") && !location.starts_with("file://") {
        object_file_io(settings)
    } else {
        local_file_io()
    }
}

/// The object store holding `location` (an absolute local path, `file://`
/// or `s3://`) with `settings` (as [`file_io`] takes them), and the
/// location's path in it.
pub fn object_store_at(
    location: &str,
    settings: HashMap<String, String>,
) -> iceberg::Result<(Arc<dyn ObjectStore>, Path)> {
    ObjectStorage::new(settings).resolve(location)
}

/// A `FileIO` on `object_store` whatever the location: local paths and
/// `s3://`, and a clear error for anything else.
pub fn object_file_io(settings: HashMap<String, String>) -> FileIO {
    FileIOBuilder::new(Arc::new(ObjectStoreFactory))
        .with_props(settings)
        .build()
}

/// Builds [`ObjectStorage`] from a `FileIO`'s settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ObjectStoreFactory;

#[typetag::serde]
impl StorageFactory for ObjectStoreFactory {
    fn build(&self, config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        Ok(Arc::new(ObjectStorage::new(config.props().clone())))
    }
}

/// Files in object stores, one store per bucket.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct ObjectStorage {
    settings: HashMap<String, String>,
    #[serde(skip)]
    secrets: HashMap<String, String>,
    #[serde(skip)]
    stores: Arc<Mutex<HashMap<String, Arc<dyn ObjectStore>>>>,
}

impl std::fmt::Debug for ObjectStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStorage")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

fn err(context: &str, path: &str) -> impl Fn(object_store::Error) -> Error {
    let message = format!("{context} {path}");
    move |e| Error::new(ErrorKind::Unexpected, message.clone()).with_source(e)
}

impl ObjectStorage {
    fn new(settings: HashMap<String, String>) -> Self {
        let (secrets, settings) = settings.into_iter().partition(|(k, _)| is_secret_setting(k));
        ObjectStorage {
            settings,
            secrets,
            stores: Arc::default(),
        }
    }

    /// The store holding `location`, and the object's path in it.
    fn resolve(&self, location: &str) -> iceberg::Result<(Arc<dyn ObjectStore>, Path)> {
        let invalid = |reason: &str| Error::new(ErrorKind::DataInvalid, format!("{location}: {reason}"));
        let Some((scheme, rest)) = location.split_once("://") else {
            return self.local(location);
        };
        match scheme {
            "file" => self.local(rest),
            "s3" | "s3a" => {
                let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
                let path = Path::parse(key).map_err(|e| invalid(&e.to_string()))?;
                let mut stores = self.stores.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(store) = stores.get(bucket) {
                    return Ok((store.clone(), path));
                }
                let store: Arc<dyn ObjectStore> = Arc::new(self.s3(bucket)?);
                stores.insert(bucket.to_string(), store.clone());
                Ok((store, path))
            }
            other => Err(Error::new(
                ErrorKind::FeatureUnsupported,
                format!("{location}: weir's Iceberg file IO reads local paths and s3://, not {other}://"),
            )),
        }
    }

    fn local(&self, path: &str) -> iceberg::Result<(Arc<dyn ObjectStore>, Path)> {
        let path = Path::from_absolute_path(path).map_err(|e| {
            Error::new(ErrorKind::DataInvalid, format!("{path} is not an absolute path")).with_source(e)
        })?;
        Ok((Arc::new(LocalFileSystem::new()), path))
    }

    fn s3(&self, bucket: &str) -> iceberg::Result<object_store::aws::AmazonS3> {
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        let get = |k: &str| self.settings.get(k).or_else(|| self.secrets.get(k));
        if let Some(endpoint) = get("s3.endpoint") {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        if let Some(v) = get("s3.access-key-id") {
            builder = builder.with_access_key_id(v);
        }
        if let Some(v) = get("s3.secret-access-key") {
            builder = builder.with_secret_access_key(v);
        }
        if let Some(v) = get("s3.session-token") {
            builder = builder.with_token(v);
        }
        if let Some(v) = get("s3.region") {
            builder = builder.with_region(v);
        }
        builder
            .build()
            .map_err(|e| Error::new(ErrorKind::DataInvalid, format!("cannot open bucket {bucket}")).with_source(e))
    }
}

#[typetag::serde]
#[async_trait]
impl Storage for ObjectStorage {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        let (store, key) = self.resolve(path)?;
        match store.head(&key).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(err("cannot look up", path)(e)),
        }
    }

    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        let (store, key) = self.resolve(path)?;
        let meta = store.head(&key).await.map_err(err("cannot look up", path))?;
        Ok(FileMetadata { size: meta.size })
    }

    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        let (store, key) = self.resolve(path)?;
        let got = store.get(&key).await.map_err(err("cannot read", path))?;
        got.bytes().await.map_err(err("cannot read", path))
    }

    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        let (store, key) = self.resolve(path)?;
        Ok(Box::new(Reader {
            store,
            key,
            path: path.to_string(),
        }))
    }

    async fn write(&self, path: &str, bs: Bytes) -> iceberg::Result<()> {
        let (store, key) = self.resolve(path)?;
        store.put(&key, bs.into()).await.map_err(err("cannot write", path))?;
        Ok(())
    }

    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        let (store, key) = self.resolve(path)?;
        Ok(Box::new(Writer {
            inner: Some(BufWriter::new(store, key)),
            path: path.to_string(),
        }))
    }

    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        let (store, key) = self.resolve(path)?;
        match store.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(err("cannot delete", path)(e)),
        }
    }

    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        let (store, key) = self.resolve(path)?;
        if key.as_ref().is_empty() {
            return Err(Error::new(
                ErrorKind::DataInvalid,
                format!("{path}: refusing to delete everything in a bucket or file system"),
            ));
        }
        let listed: Vec<Path> = store
            .list(Some(&key))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(err("cannot list", path))?;
        for location in listed {
            match store.delete(&location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(err("cannot delete", location.as_ref())(e)),
            }
        }
        Ok(())
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
    store: Arc<dyn ObjectStore>,
    key: Path,
    path: String,
}

#[async_trait]
impl FileRead for Reader {
    async fn read(&self, range: Range<u64>) -> iceberg::Result<Bytes> {
        self.store
            .get_range(&self.key, range)
            .await
            .map_err(err("cannot read", &self.path))
    }
}

/// Writes through `object_store`'s buffered writer: one put for a small
/// file, a multipart upload for a large one; nothing is visible before
/// `close`. A writer dropped before `close` (a cancelled or failed write)
/// aborts its multipart upload, so no parts are left behind.
struct Writer {
    inner: Option<BufWriter>,
    path: String,
}

impl Drop for Writer {
    fn drop(&mut self) {
        let Some(mut writer) = self.inner.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let path = std::mem::take(&mut self.path);
        runtime.spawn(async move {
            if let Err(e) = writer.abort().await {
                tracing::debug!(path, error = %e, "could not abort an unfinished upload");
            }
        });
    }
}

#[async_trait]
impl FileWrite for Writer {
    async fn write(&mut self, bs: Bytes) -> iceberg::Result<()> {
        let writer = self
            .inner
            .as_mut()
            .ok_or_else(|| Error::new(ErrorKind::Unexpected, format!("{} is closed", self.path)))?;
        writer.put(bs).await.map_err(err("cannot write", &self.path))
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        let mut writer = self
            .inner
            .take()
            .ok_or_else(|| Error::new(ErrorKind::Unexpected, format!("{} is closed twice", self.path)))?;
        writer
            .shutdown()
            .await
            .map_err(|e| Error::new(ErrorKind::Unexpected, format!("cannot finish {}", self.path)).with_source(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_neither_printed_nor_serialised() {
        let storage = ObjectStorage::new(HashMap::from([
            ("s3.endpoint".to_string(), "http://127.0.0.1:9000".to_string()),
            ("s3.access-key-id".to_string(), "AKIDEXAMPLE".to_string()),
            ("s3.secret-access-key".to_string(), "wJalrXUtnFEMI".to_string()),
            ("s3.session-token".to_string(), "FwoGZXIvYXdz".to_string()),
        ]));
        let shown = format!("{storage:?} {}", serde_json::to_string(&storage).unwrap());
        assert!(shown.contains("127.0.0.1:9000"), "{shown}");
        for secret in ["AKIDEXAMPLE", "wJalrXUtnFEMI", "FwoGZXIvYXdz"] {
            assert!(!shown.contains(secret), "{shown}");
        }
    }

    #[tokio::test]
    async fn a_bucket_is_never_deleted_whole() {
        let storage = ObjectStorage::new(HashMap::new());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("keep"), b"x").unwrap();
        assert!(storage.delete_prefix("s3://bucket/").await.is_err());
        assert!(storage.delete_prefix("file:///").await.is_err());
        assert!(dir.path().join("keep").exists());
    }

    #[tokio::test]
    async fn local_files_round_trip() {
        let storage = ObjectStorage::new(HashMap::new());
        let dir = tempfile::tempdir().unwrap();
        let path = format!("file://{}/a/b.bin", dir.path().display());
        storage.write(&path, Bytes::from_static(b"hello")).await.unwrap();
        assert!(storage.exists(&path).await.unwrap());
        assert_eq!(storage.read(&path).await.unwrap(), Bytes::from_static(b"hello"));
        let mut w = storage
            .writer(&format!("{}/c.bin", dir.path().display()))
            .await
            .unwrap();
        w.write(Bytes::from_static(b"ab")).await.unwrap();
        w.write(Bytes::from_static(b"cd")).await.unwrap();
        w.close().await.unwrap();
        assert_eq!(std::fs::read(dir.path().join("c.bin")).unwrap(), b"abcd");
        storage
            .delete_prefix(&format!("file://{}/a", dir.path().display()))
            .await
            .unwrap();
        assert!(!storage.exists(&path).await.unwrap());
    }
}
