//! iceberg's `FileIO` for weir's tables: local warehouses through
//! [`LocalStorage`] (files synced before a commit lists them), S3 (any
//! endpoint that speaks it) and local paths alike through `object_store`
//! ([`ObjectStorage`]), so tables can live in object storage.
//!
//! Settings use pyiceberg's names: `s3.endpoint`, `s3.access-key-id`,
//! `s3.secret-access-key`, `s3.region`; what is not given comes from the
//! usual `AWS_*` variables. Secrets are neither printed nor serialised.
//!
//! [`store_file_io`] puts every file in one store the caller gives (an
//! instrumented, wrapped or custom `object_store` store): a local path or
//! `file://` URL is found there by its absolute path without the leading
//! `/`, `s3://bucket/key` by its key. That store is not serialised with
//! the storage: a deserialised copy has none, and fails every call saying
//! so rather than opening the locations' own stores.
//!
//! A failed call's error says whether trying again may help (iceberg's
//! `retryable`): a timeout, a reset connection or a server error may pass;
//! a missing object, a refused credential or a full local disk does not.

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
use weir_core::store_error_may_pass as transient;

mod local;

pub use local::{local_file_io, LocalStorage, LocalStorageFactory};
use weir_core::sync::Recover;

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

/// A `FileIO` whose every file is in `store`, a store of the caller's own
/// (instrumented, wrapped, or of a kind weir does not build). Locations
/// are found in it by their path:
///
/// - a local path or `file://` URL by its absolute path without the
///   leading `/` (`file:///w/t/a.avro` is `w/t/a.avro`), so
///   `LocalFileSystem::new()`, rooted at `/`, finds a local warehouse's
///   files where they are;
/// - `s3://bucket/key` (or `s3a://`) by `key`: the store is the bucket,
///   and the bucket's name is not looked at;
/// - any other scheme is refused.
///
/// The store lives in this process only: the `FileIO`'s storage is
/// serialisable, as iceberg asks, but without the store, and a
/// deserialised copy fails every call, saying the store was not carried
/// over.
pub fn store_file_io(store: Arc<dyn ObjectStore>) -> FileIO {
    FileIOBuilder::new(Arc::new(GivenStoreFactory { store: Some(store) })).build()
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

/// Builds an [`ObjectStorage`] over one given store ([`store_file_io`]).
/// The store is not serialised: a deserialised factory builds nothing, and
/// says why.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct GivenStoreFactory {
    #[serde(skip)]
    store: Option<Arc<dyn ObjectStore>>,
}

#[typetag::serde]
impl StorageFactory for GivenStoreFactory {
    fn build(&self, _config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        let store = self.store.clone().ok_or_else(lost_store)?;
        Ok(Arc::new(ObjectStorage {
            stores: Stores::Given(store),
            ..ObjectStorage::default()
        }))
    }
}

/// The error of a storage whose given store was not carried over by
/// serialisation.
fn lost_store() -> Error {
    Error::new(
        ErrorKind::FeatureUnsupported,
        "this file IO was built over a given object store (store_file_io), which is not serialised; \
         a deserialised copy has no store: build the file IO again where it is used",
    )
}

/// Files in object stores: one store per bucket, built from the settings,
/// or one store given for every location ([`store_file_io`]).
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct ObjectStorage {
    settings: HashMap<String, String>,
    #[serde(skip)]
    secrets: HashMap<String, String>,
    #[serde(default)]
    stores: Stores,
}

/// Where an [`ObjectStorage`] finds a location's store. Only its kind is
/// serialised, so a deserialised copy of a storage over a given store is
/// [`Stores::Lost`] and fails, rather than opening the locations' own
/// stores behind its user's back.
#[derive(Clone, Serialize, Deserialize)]
#[serde(into = "StoresKind", from = "StoresKind")]
enum Stores {
    /// One store per bucket, built from the settings when first used (as
    /// many as the buckets the tables' locations name); local files through
    /// the local file system.
    PerBucket(Arc<Mutex<HashMap<String, Arc<dyn ObjectStore>>>>),
    /// The one store every location is in.
    Given(Arc<dyn ObjectStore>),
    /// A given store that serialisation did not carry over.
    Lost,
}

impl Default for Stores {
    fn default() -> Self {
        Stores::PerBucket(Arc::default())
    }
}

/// What of [`Stores`] is serialised.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum StoresKind {
    PerBucket,
    Given,
}

impl From<Stores> for StoresKind {
    fn from(stores: Stores) -> Self {
        match stores {
            Stores::PerBucket(_) => StoresKind::PerBucket,
            Stores::Given(_) | Stores::Lost => StoresKind::Given,
        }
    }
}

impl From<StoresKind> for Stores {
    fn from(kind: StoresKind) -> Self {
        match kind {
            StoresKind::PerBucket => Stores::default(),
            StoresKind::Given => Stores::Lost,
        }
    }
}

impl std::fmt::Debug for ObjectStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStorage")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// The error of a failed store call on `path`: retryable when the store's
/// failure may pass.
fn err(context: &str, path: &str) -> impl Fn(object_store::Error) -> Error {
    let message = format!("{context} {path}");
    move |e| {
        let retryable = transient(&e);
        Error::new(ErrorKind::Unexpected, message.clone())
            .with_retryable(retryable)
            .with_source(e)
    }
}

/// The same for the I/O error a buffered upload's close gives, which holds
/// the store's error.
fn transient_io(e: &std::io::Error) -> bool {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<object_store::Error>())
    {
        Some(store) => transient(store),
        None => weir_core::permanent_io_kind(e).is_none(),
    }
}

/// Where `location` is: its bucket (none for a local path or `file://`
/// URL) and its path there (a local file's absolute path without the
/// leading `/`, or the key after the bucket).
fn place(location: &str) -> iceberg::Result<(Option<&str>, Path)> {
    let Some((scheme, rest)) = location.split_once("://") else {
        return Ok((None, local_path(location)?));
    };
    match scheme {
        "file" => Ok((None, local_path(rest)?)),
        "s3" | "s3a" => {
            let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
            let key = Path::parse(key).map_err(|e| Error::new(ErrorKind::DataInvalid, format!("{location}: {e}")))?;
            Ok((Some(bucket), key))
        }
        other => Err(Error::new(
            ErrorKind::FeatureUnsupported,
            format!("{location}: weir's Iceberg file IO reads local paths and s3://, not {other}://"),
        )),
    }
}

fn local_path(path: &str) -> iceberg::Result<Path> {
    Path::from_absolute_path(path)
        .map_err(|e| Error::new(ErrorKind::DataInvalid, format!("{path} is not an absolute path")).with_source(e))
}

impl ObjectStorage {
    fn new(settings: HashMap<String, String>) -> Self {
        let (secrets, settings) = settings.into_iter().partition(|(k, _)| is_secret_setting(k));
        ObjectStorage {
            settings,
            secrets,
            stores: Stores::default(),
        }
    }

    /// The store holding `location`, and the object's path in it.
    fn resolve(&self, location: &str) -> iceberg::Result<(Arc<dyn ObjectStore>, Path)> {
        let buckets = match &self.stores {
            Stores::PerBucket(buckets) => buckets,
            Stores::Given(store) => return Ok((store.clone(), place(location)?.1)),
            Stores::Lost => return Err(lost_store().with_context("location", location)),
        };
        match place(location)? {
            (None, path) => Ok((Arc::new(LocalFileSystem::new()), path)),
            (Some(bucket), path) => Ok((self.bucket(buckets, bucket)?, path)),
        }
    }

    /// The store of `bucket`, built once.
    fn bucket(
        &self,
        buckets: &Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
        bucket: &str,
    ) -> iceberg::Result<Arc<dyn ObjectStore>> {
        let mut buckets = buckets.lock().recover();
        if let Some(store) = buckets.get(bucket) {
            return Ok(store.clone());
        }
        let store: Arc<dyn ObjectStore> = Arc::new(self.s3(bucket)?);
        buckets.insert(bucket.to_string(), store.clone());
        Ok(store)
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
        writer.shutdown().await.map_err(|e| {
            let retryable = transient_io(&e);
            Error::new(ErrorKind::Unexpected, format!("cannot finish {}", self.path))
                .with_retryable(retryable)
                .with_source(e)
        })
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

    /// Every location is found in the given store by its path, whatever
    /// its scheme; a scheme with no path there is refused.
    #[tokio::test]
    async fn a_given_store_holds_every_location_by_its_path() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let io = store_file_io(store.clone());
        for (location, key) in [
            ("/w/t/a.bin", "w/t/a.bin"),
            ("file:///w/t/b.bin", "w/t/b.bin"),
            ("s3://bucket/w/t/c.bin", "w/t/c.bin"),
            ("s3a://other/w/t/d.bin", "w/t/d.bin"),
        ] {
            io.new_output(location).unwrap().write(Bytes::from(key)).await.unwrap();
            let held = store.get(&Path::from(key)).await.unwrap().bytes().await.unwrap();
            assert_eq!(held, Bytes::from(key), "{location}");
            assert_eq!(io.new_input(location).unwrap().read().await.unwrap(), held);
        }
        let mut w = io.new_output("file:///w/t/e.bin").unwrap().writer().await.unwrap();
        w.write(Bytes::from_static(b"ab")).await.unwrap();
        w.write(Bytes::from_static(b"cd")).await.unwrap();
        w.close().await.unwrap();
        let held = store
            .get(&Path::from("w/t/e.bin"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(held, Bytes::from_static(b"abcd"));

        io.delete("s3://bucket/w/t/c.bin").await.unwrap();
        assert!(
            !io.exists("/w/t/c.bin").await.unwrap(),
            "one store, whatever the scheme"
        );
        assert!(io.exists("/w/t/a.bin").await.unwrap());
        let refused = io.exists("gs://bucket/w/t/a.bin").await.unwrap_err();
        assert_eq!(refused.kind(), ErrorKind::FeatureUnsupported, "{refused}");
    }

    /// The given store is not serialised: a deserialised factory builds
    /// nothing and a deserialised storage fails every call, saying why,
    /// rather than reading the location's own store (here a local file
    /// that is there).
    #[tokio::test]
    async fn a_deserialised_copy_over_a_given_store_fails_saying_why() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let factory: Box<dyn StorageFactory> = Box::new(GivenStoreFactory { store: Some(store) });
        let copy: Box<dyn StorageFactory> = serde_json::from_str(&serde_json::to_string(&factory).unwrap()).unwrap();
        let refused = copy.build(&StorageConfig::new()).unwrap_err();
        assert!(refused.message().contains("not serialised"), "{refused}");

        let dir = tempfile::tempdir().unwrap();
        let local = format!("file://{}/there.bin", dir.path().display());
        std::fs::write(dir.path().join("there.bin"), b"x").unwrap();
        let storage = factory.build(&StorageConfig::new()).unwrap();
        assert!(!storage.exists(&local).await.unwrap(), "the given store holds nothing");
        let copy: Box<dyn Storage> = serde_json::from_str(&serde_json::to_string(&*storage).unwrap()).unwrap();
        for failed in [
            copy.exists(&local).await.map(|_| ()),
            copy.read(&local).await.map(|_| ()),
            copy.write(&local, Bytes::from_static(b"y")).await,
            copy.delete(&local).await,
        ] {
            let e = failed.unwrap_err();
            assert!(e.message().contains("not serialised"), "{e}");
            assert!(!e.retryable(), "{e}");
        }
        assert_eq!(std::fs::read(dir.path().join("there.bin")).unwrap(), b"x");
    }

    /// A store's transient failure is retryable; a missing object or a
    /// full local disk is not.
    #[test]
    fn store_errors_say_whether_a_retry_can_help() {
        let reset = object_store::Error::Generic {
            store: "S3",
            source: "connection reset".into(),
        };
        assert!(err("cannot read", "s3://b/k")(reset).retryable());
        let missing = object_store::Error::NotFound {
            path: "k".into(),
            source: "no such key".into(),
        };
        assert!(!err("cannot read", "s3://b/k")(missing).retryable());
        let full = object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(std::io::Error::from(std::io::ErrorKind::StorageFull)),
        };
        assert!(!err("cannot write", "/w/k")(full).retryable());
        // A buffered upload's close wraps the store's error in an I/O error.
        let timed_out = std::io::Error::from(object_store::Error::Generic {
            store: "S3",
            source: "timed out".into(),
        });
        assert!(transient_io(&timed_out));
        let denied = std::io::Error::from(object_store::Error::PermissionDenied {
            path: "k".into(),
            source: "access denied".into(),
        });
        assert!(!transient_io(&denied));
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
