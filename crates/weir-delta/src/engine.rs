//! The Delta kernel engine weir's tables read their log with: the kernel's
//! default engine, opening a bounded number of commit files at once.
//!
//! The default engine opens up to 1,000 commit files at once and gives each
//! a JSON decoder of about 1 MiB up front (room for 1,000 rows of the log's
//! 70-odd columns), whatever the file's size. Replaying the hundred commits
//! since a log checkpoint, as each reload and each log checkpoint does,
//! then takes over 100 MiB for a moment. A streaming process does that
//! every checkpoint interval, and with glibc's per-thread arenas each such
//! peak left memory behind: a `weir stream` process grew by about 27 KB a
//! commit, without end. [`COMMIT_FILES_AT_ONCE`] and [`JSON_ROWS_PER_BATCH`]
//! bring the replay's decoders to under 4 MiB.
//!
//! It also lists a local log again when the listing skipped a commit (see
//! [`ContiguousListing`]).

use std::sync::Arc;

use async_trait::async_trait;
use buoyant_kernel::engine::default::executor::tokio::TokioMultiThreadExecutor;
use buoyant_kernel::engine::default::json::DefaultJsonHandler;
use buoyant_kernel::{
    AsAny, DeltaResult as KernelResult, Engine, EvaluationHandler, FileMeta, FileSlice, JsonHandler, ParquetHandler,
    StorageHandler, Version,
};
use bytes::Bytes;
use deltalake::kernel::transaction::TransactionError;
use deltalake::logstore::{CommitOrBytes, LogStore, LogStoreConfig, LogStoreRef};
use deltalake::{DeltaResult, DeltaTable, ObjectStore, Path};
use url::Url;
use uuid::Uuid;

/// Commit files a log replay reads at once: sixteen keep a local replay as
/// fast as a thousand, and an object store's requests still overlap.
const COMMIT_FILES_AT_ONCE: usize = 16;

/// Rows a JSON decoder makes room for up front, 32 bytes for each of the
/// log's columns per row: 128 rows are about 220 KiB a decoder, against
/// 1.7 MiB for the default 1,000. A streaming commit is a handful of rows;
/// a large one (a compaction's) is read in more, smaller batches.
const JSON_ROWS_PER_BATCH: usize = 128;

/// `table` with its log store wrapped in [`BoundedLogStore`] (once), its
/// loaded state kept.
pub(crate) fn bounded(table: DeltaTable) -> DeltaTable {
    if table.log_store().any_ref().is::<BoundedLogStore>() {
        return table;
    }
    let inner = table.log_store();
    let mut wrapped = DeltaTable::new(Arc::new(BoundedLogStore { inner }), table.config.clone());
    wrapped.state = table.state;
    wrapped
}

/// A log store that is `inner` in every way but the engine it gives the
/// kernel: the default engine, reading [`COMMIT_FILES_AT_ONCE`] commit
/// files at once. `name` stays the inner store's, which the sink's choice
/// of commit path reads.
#[derive(Debug)]
struct BoundedLogStore {
    inner: LogStoreRef,
}

/// Times a local log is listed again while its listing shows a gap.
const RELISTS: usize = 5;

/// The default engine with a JSON handler that reads fewer files at once,
/// and a storage handler that lists a local log again if it saw a gap.
struct BoundedEngine {
    inner: Arc<dyn Engine>,
    json: Arc<dyn JsonHandler>,
    storage: Arc<dyn StorageHandler>,
}

impl Engine for BoundedEngine {
    fn evaluation_handler(&self) -> Arc<dyn EvaluationHandler> {
        self.inner.evaluation_handler()
    }

    fn storage_handler(&self) -> Arc<dyn StorageHandler> {
        self.storage.clone()
    }

    fn json_handler(&self) -> Arc<dyn JsonHandler> {
        self.json.clone()
    }

    fn parquet_handler(&self) -> Arc<dyn ParquetHandler> {
        self.inner.parquet_handler()
    }
}

#[async_trait]
impl LogStore for BoundedLogStore {
    fn name(&self) -> String {
        self.inner.name()
    }

    async fn refresh(&self) -> DeltaResult<()> {
        self.inner.refresh().await
    }

    async fn read_commit_entry(&self, version: Version) -> DeltaResult<Option<Bytes>> {
        self.inner.read_commit_entry(version).await
    }

    async fn write_commit_entry(
        &self,
        version: Version,
        commit_or_bytes: CommitOrBytes,
        operation_id: Uuid,
    ) -> Result<(), TransactionError> {
        self.inner
            .write_commit_entry(version, commit_or_bytes, operation_id)
            .await
    }

    async fn abort_commit_entry(
        &self,
        version: Version,
        commit_or_bytes: CommitOrBytes,
        operation_id: Uuid,
    ) -> Result<(), TransactionError> {
        self.inner
            .abort_commit_entry(version, commit_or_bytes, operation_id)
            .await
    }

    async fn get_latest_version(&self, start_version: Version) -> DeltaResult<Version> {
        self.inner.get_latest_version(start_version).await
    }

    fn object_store(&self, operation_id: Option<Uuid>) -> Arc<dyn ObjectStore> {
        self.inner.object_store(operation_id)
    }

    fn root_object_store(&self, operation_id: Option<Uuid>) -> Arc<dyn ObjectStore> {
        self.inner.root_object_store(operation_id)
    }

    /// On a current-thread runtime the default engine runs its reads on a
    /// thread of its own, which a second JSON handler would duplicate: the
    /// inner engine's JSON handler is kept there, and only the listing is
    /// wrapped.
    fn engine(&self, operation_id: Option<Uuid>) -> Arc<dyn Engine> {
        let inner = self.inner.engine(operation_id);
        let storage = Arc::new(ContiguousListing {
            inner: inner.storage_handler(),
        });
        let multi_thread = tokio::runtime::Handle::try_current()
            .ok()
            .filter(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        let json: Arc<dyn JsonHandler> = match multi_thread {
            Some(handle) => {
                let store = self.inner.root_object_store(operation_id);
                let executor = Arc::new(TokioMultiThreadExecutor::new(handle));
                Arc::new(
                    DefaultJsonHandler::new(store, executor)
                        .with_buffer_size(COMMIT_FILES_AT_ONCE)
                        .with_batch_size(JSON_ROWS_PER_BATCH),
                )
            }
            None => inner.json_handler(),
        };
        Arc::new(BoundedEngine { inner, json, storage })
    }

    fn to_uri(&self, location: &Path) -> String {
        self.inner.to_uri(location)
    }

    fn root_url(&self) -> &Url {
        self.inner.root_url()
    }

    fn log_path(&self) -> &Path {
        self.inner.log_path()
    }

    fn transaction_url(&self, operation_id: Option<Uuid>) -> DeltaResult<Url> {
        self.inner.transaction_url(operation_id)
    }

    async fn is_delta_table_location(&self) -> DeltaResult<bool> {
        self.inner.is_delta_table_location().await
    }

    fn config(&self) -> &LogStoreConfig {
        self.inner.config()
    }
}

/// A storage handler that lists a local log directory again when the
/// listing skipped a commit: it holds commit N+1 but not N, or it was asked
/// for the commits from N and its first is past N. A local directory is
/// read in the order of its names' hashes, so a listing taken while another
/// writer (a background compaction, a second query) commits can see the
/// newer of two commits made during it and miss the older; the kernel then
/// refuses the log as broken. Versions are only ever added above the
/// newest, so the listing taken again holds N. Listings of other schemes
/// pass through untouched (object stores list in name order; of those the
/// kernel supports, S3 Express does not, and is not yet covered here).
struct ContiguousListing {
    inner: Arc<dyn StorageHandler>,
}

impl StorageHandler for ContiguousListing {
    fn list_from(&self, path: &Url) -> KernelResult<Box<dyn Iterator<Item = KernelResult<FileMeta>>>> {
        if path.scheme() != "file" {
            return self.inner.list_from(path);
        }
        let list = || self.inner.list_from(path)?.collect::<KernelResult<Vec<FileMeta>>>();
        let from = listed_from(path);
        let mut listed = list()?;
        for _ in 0..RELISTS {
            if !has_gap(from, &listed) {
                break;
            }
            tracing::debug!(%path, "the log's listing missed a commit written meanwhile; listing it again");
            listed = list()?;
        }
        Ok(Box::new(listed.into_iter().map(Ok)))
    }

    fn read_files(&self, files: Vec<FileSlice>) -> KernelResult<Box<dyn Iterator<Item = KernelResult<Bytes>>>> {
        self.inner.read_files(files)
    }

    fn copy_atomic(&self, src: &Url, dest: &Url) -> KernelResult<()> {
        self.inner.copy_atomic(src, dest)
    }

    fn put(&self, path: &Url, data: Bytes, overwrite: bool) -> KernelResult<()> {
        self.inner.put(path, data, overwrite)
    }

    fn head(&self, path: &Url) -> KernelResult<FileMeta> {
        self.inner.head(path)
    }
}

/// Whether a sorted listing's commit files (`<20 digits>.json`) skip a
/// version, counting from `from` (the version the listing starts at, if it
/// was asked for the commits from one).
fn has_gap(from: Option<u64>, listed: &[FileMeta]) -> bool {
    let versions: Vec<u64> = listed.iter().filter_map(|f| commit_version(&f.location)).collect();
    // Commits before a checkpoint may be gone (cleaned up): the first one
    // after `from` is missing only if no checkpoint just before it is there.
    let skipped_first = match (from, versions.first()) {
        (Some(from), Some(&first)) if first > from => !listed
            .iter()
            .any(|f| checkpoint_version(&f.location) == Some(first - 1)),
        _ => false,
    };
    skipped_first || versions.windows(2).any(|pair| pair[1] != pair[0] + 1)
}

/// The version of a checkpoint file's URL (`<20 digits>.checkpoint...`).
fn checkpoint_version(url: &Url) -> Option<u64> {
    let name = url.path_segments()?.next_back()?;
    let (digits, rest) = name.split_at_checked(20)?;
    if !rest.starts_with(".checkpoint.") || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The version a listing from `path` starts at, when `path` names one
/// (`_delta_log/<20 digits>`, as the kernel lists the commits from it).
fn listed_from(path: &Url) -> Option<u64> {
    let name = path.path_segments()?.next_back()?;
    (name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit()))
        .then(|| name.parse().ok())
        .flatten()
}

/// The version of a commit file's URL, if it is one.
fn commit_version(url: &Url) -> Option<u64> {
    let name = url.path_segments()?.next_back()?;
    let digits = name.strip_suffix(".json")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(name: &str) -> FileMeta {
        FileMeta {
            location: Url::parse(&format!("file:///t/_delta_log/{name}")).unwrap(),
            last_modified: 0,
            size: 1,
        }
    }

    fn v(n: u64) -> String {
        format!("{n:020}.json")
    }

    #[test]
    fn a_listing_that_skips_a_commit_has_a_gap() {
        let listed = |names: &[&str]| names.iter().map(|n| meta(n)).collect::<Vec<_>>();
        let checkpoint = format!("{:020}.checkpoint.parquet", 9);
        assert!(!has_gap(None, &listed(&[&checkpoint, &v(10), &v(11), &v(12)])));
        assert!(has_gap(None, &listed(&[&checkpoint, &v(10), &v(12)])));
        // Asked for the commits from 10, the first seen is 11.
        assert!(has_gap(Some(10), &listed(&[&v(11), &v(12)])));
        assert!(!has_gap(Some(10), &listed(&[&v(10), &v(11)])));
        assert!(!has_gap(Some(10), &listed(&[])));
        // Commits 10 and 11 cleaned up behind checkpoint 11.
        let eleven = format!("{:020}.checkpoint.parquet", 11);
        assert!(!has_gap(Some(10), &listed(&[&eleven, &v(12)])));
        // Not commits: checkpoints, the hint, staged commits, CRC files.
        let staged = format!("_staged_commits/{:020}.3f2a.json", 11);
        let crc = format!("{:020}.crc", 11);
        assert!(!has_gap(
            None,
            &listed(&[&v(10), &staged, &crc, "_last_checkpoint", &v(11)])
        ));
        let from = Url::parse(&format!("file:///t/_delta_log/{:020}", 10)).unwrap();
        assert_eq!(listed_from(&from), Some(10));
        assert_eq!(listed_from(&Url::parse("file:///t/_delta_log/").unwrap()), None);
    }

    /// A storage handler whose first listing misses commit 11.
    struct Racing {
        listings: std::sync::atomic::AtomicUsize,
    }

    impl StorageHandler for Racing {
        fn list_from(&self, _: &Url) -> KernelResult<Box<dyn Iterator<Item = KernelResult<FileMeta>>>> {
            let first = self.listings.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
            let names: Vec<String> = match first {
                true => vec![v(10), v(12)],
                false => vec![v(10), v(11), v(12), v(13)],
            };
            Ok(Box::new(names.into_iter().map(|n| Ok(meta(&n)))))
        }

        fn read_files(&self, _: Vec<FileSlice>) -> KernelResult<Box<dyn Iterator<Item = KernelResult<Bytes>>>> {
            unreachable!()
        }

        fn copy_atomic(&self, _: &Url, _: &Url) -> KernelResult<()> {
            unreachable!()
        }

        fn put(&self, _: &Url, _: Bytes, _: bool) -> KernelResult<()> {
            unreachable!()
        }

        fn head(&self, _: &Url) -> KernelResult<FileMeta> {
            unreachable!()
        }
    }

    #[test]
    fn a_local_listing_that_missed_a_commit_is_taken_again() {
        let racing = Arc::new(Racing {
            listings: Default::default(),
        });
        let listing = ContiguousListing { inner: racing.clone() };
        let from = Url::parse(&format!("file:///t/_delta_log/{:020}", 10)).unwrap();
        let names: Vec<String> = listing
            .list_from(&from)
            .unwrap()
            .map(|f| {
                f.unwrap()
                    .location
                    .path_segments()
                    .unwrap()
                    .next_back()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert_eq!(names, [v(10), v(11), v(12), v(13)]);
        assert_eq!(racing.listings.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
