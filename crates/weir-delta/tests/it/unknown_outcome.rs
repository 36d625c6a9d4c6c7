//! Compaction commits whose outcome is unknown: the store answers the put
//! of the log entry with an error, whether or not the entry landed. The job
//! finds its own entry by its attempt id, never deletes a file a landed
//! entry adds, and both readers see every row once.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex, Once};

use async_trait::async_trait;
use deltalake::logstore::{
    default_logstore, logstore_factories, object_store_factories, LogStore, LogStoreFactory, ObjectStoreFactory,
    ObjectStoreRef, StorageConfig,
};
use deltalake::DeltaResult;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path as StorePath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};
use url::Url;
use weir_delta::Compact;
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::python;

use crate::compact::{ids_by_both_readers, optimizes, stream};

/// What the store does with the next put of a log entry.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Writes the entry, then answers with an error.
    LandThenFail,
    /// Answers with an error without writing.
    FailUnlanded,
}

/// The faults left, by table directory.
static FAULTS: Mutex<BTreeMap<String, VecDeque<Fault>>> = Mutex::new(BTreeMap::new());

fn next_fault(table: &str) -> Option<Fault> {
    FAULTS.lock().unwrap().get_mut(table)?.pop_front()
}

fn faults_left(table: &Path) -> usize {
    let faults = FAULTS.lock().unwrap();
    faults.get(table.to_str().unwrap()).map_or(0, VecDeque::len)
}

/// A local file system whose log entry puts fail as [`FAULTS`] says for
/// its table.
#[derive(Debug)]
struct Faulty {
    inner: Arc<dyn ObjectStore>,
    table: String,
}

impl fmt::Display for Faulty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Faulty({})", self.inner)
    }
}

fn injected() -> object_store::Error {
    object_store::Error::Generic {
        store: "faulty",
        source: "connection reset while putting the log entry".into(),
    }
}

fn is_log_entry(location: &StorePath) -> bool {
    let name = location.filename().unwrap_or_default();
    location.as_ref().contains("_delta_log/")
        && name.len() == 25
        && name.ends_with(".json")
        && name[..20].bytes().all(|b| b.is_ascii_digit())
}

#[async_trait]
impl ObjectStore for Faulty {
    async fn put_opts(
        &self,
        location: &StorePath,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let fault = if is_log_entry(location) {
            next_fault(&self.table)
        } else {
            None
        };
        match fault {
            None => self.inner.put_opts(location, payload, opts).await,
            Some(Fault::FailUnlanded) => Err(injected()),
            Some(Fault::LandThenFail) => {
                self.inner.put_opts(location, payload, opts).await?;
                Err(injected())
            }
        }
    }
    async fn put_multipart_opts(
        &self,
        location: &StorePath,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(&self, location: &StorePath, options: GetOptions) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<StorePath>>,
    ) -> BoxStream<'static, object_store::Result<StorePath>> {
        self.inner.delete_stream(locations)
    }
    /// Sorted, as object stores list (a local file system lists in no
    /// order, and the Delta log's reader expects the order).
    fn list(&self, prefix: Option<&StorePath>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let (store, prefix) = (self.inner.clone(), prefix.cloned());
        let listed = async move {
            let mut all: Vec<object_store::Result<ObjectMeta>> = store.list(prefix.as_ref()).collect().await;
            all.sort_by(|a, b| match (a, b) {
                (Ok(a), Ok(b)) => a.location.cmp(&b.location),
                _ => std::cmp::Ordering::Equal,
            });
            futures::stream::iter(all)
        };
        futures::stream::once(listed).flatten().boxed()
    }
    async fn list_with_delimiter(&self, prefix: Option<&StorePath>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, from: &StorePath, to: &StorePath, options: CopyOptions) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// Opens `faulty:///dir/` as the local `file:///dir/`, through [`Faulty`].
struct FaultyFactory;

impl ObjectStoreFactory for FaultyFactory {
    fn parse_url_opts(&self, url: &Url, _config: &StorageConfig) -> DeltaResult<(ObjectStoreRef, StorePath)> {
        let local = Url::parse(&format!("file://{}", url.path())).unwrap();
        let (store, path) = object_store::parse_url(&local)?;
        let faulty = Faulty {
            inner: Arc::from(store),
            table: url.path().trim_end_matches('/').to_string(),
        };
        Ok((Arc::new(faulty), path))
    }
}

impl LogStoreFactory for FaultyFactory {
    fn with_options(
        &self,
        prefixed_store: ObjectStoreRef,
        root_store: ObjectStoreRef,
        location: &Url,
        options: &StorageConfig,
    ) -> DeltaResult<Arc<dyn LogStore>> {
        Ok(default_logstore(prefixed_store, root_store, location, options))
    }
}

fn faulty_url(table: &Path, faults: &[Fault]) -> String {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        let scheme = Url::parse("faulty://").unwrap();
        object_store_factories().insert(scheme.clone(), Arc::new(FaultyFactory));
        logstore_factories().insert(scheme, Arc::new(FaultyFactory));
    });
    let key = table.to_str().unwrap().to_string();
    FAULTS.lock().unwrap().insert(key, faults.iter().copied().collect());
    format!("faulty://{}/", table.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_landed_but_answered_an_error_is_found_and_kept() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    stream(&table, &dir.path().join("chk"), 7).await;
    let url = faulty_url(&table, &[Fault::LandThenFail]);
    let done = Compact::new(&url).unwrap().await.unwrap();
    assert_eq!(faults_left(&table), 0, "the fault was met");
    assert_eq!(done.commits, vec![9], "{done:?}");
    assert_eq!((done.files_removed, done.files_added), (8, 1));
    assert_eq!(optimizes(&table), 1, "one entry landed, and only one");
    assert_exactly_once(&ids_by_both_readers(&table), 0..800);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_failed_unlanded_is_tried_again_and_lands_once() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    stream(&table, &dir.path().join("chk"), 7).await;
    let url = faulty_url(&table, &[Fault::FailUnlanded, Fault::FailUnlanded]);
    let done = Compact::new(&url).unwrap().await.unwrap();
    assert_eq!(faults_left(&table), 0, "both faults were met");
    assert_eq!(done.commits, vec![9], "{done:?}");
    assert_eq!(optimizes(&table), 1);
    assert_exactly_once(&ids_by_both_readers(&table), 0..800);
    // The stream goes on over the compacted table, exactly once.
    stream(&table, &dir.path().join("chk"), 9).await;
    assert_exactly_once(&ids_by_both_readers(&table), 0..1000);
}
