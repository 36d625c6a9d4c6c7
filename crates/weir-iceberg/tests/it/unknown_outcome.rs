//! Compaction swaps whose outcome is unknown: the catalog answers a swap
//! with an error, whether or not it landed. Nothing a landed swap refers
//! to is ever deleted, and the rows stay the same for pyiceberg and DuckDB.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use iceberg::io::FileIO;
use iceberg::spec::TableMetadata;
use iceberg::{TableIdent, TableUpdate};
use weir_catalog::SqlCatalog;
use weir_iceberg::{Catalog, Compact, CompactReport, IcebergSinkError, LoadedTable, Swap};
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::python;

use crate::compact::{describe, ids, outputs_on_disk, replaces, stream, TABLE};
use crate::conformance::{sqlite_harness, SqlHarness};

/// What the catalog does with the next compaction swap.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Swaps, then answers with an error.
    LandThenFail { retryable: bool },
    /// Answers with an error without swapping.
    FailUnlanded { retryable: bool },
}

/// A catalog that answers compaction swaps as its faults say, one fault a
/// swap, and passes everything else to the SQL catalog.
#[derive(Debug)]
struct Faulty {
    inner: Arc<dyn Catalog>,
    faults: Mutex<VecDeque<Fault>>,
}

fn failure(retryable: bool) -> IcebergSinkError {
    if retryable {
        IcebergSinkError::Catalog {
            catalog: "faulty".into(),
            operation: "swap".into(),
            source: Box::new(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "connection reset",
            )),
            retryable: true,
        }
    } else {
        IcebergSinkError::CommitRefused {
            catalog: "faulty".into(),
            table: TABLE.into(),
            reason: "the proxy answered 500".into(),
        }
    }
}

#[async_trait]
impl Catalog for Faulty {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn file_io(&self) -> &FileIO {
        self.inner.file_io()
    }
    fn default_location(&self, ident: &TableIdent) -> String {
        self.inner.default_location(ident)
    }
    async fn load(&self, ident: &TableIdent) -> Result<Option<LoadedTable>, IcebergSinkError> {
        self.inner.load(ident).await
    }
    async fn create(&self, ident: &TableIdent, metadata: TableMetadata) -> Result<LoadedTable, IcebergSinkError> {
        self.inner.create(ident, metadata).await
    }
    async fn list(&self, namespace: Option<&[String]>) -> Result<Vec<TableIdent>, IcebergSinkError> {
        self.inner.list(namespace).await
    }
    async fn drop_table(&self, ident: &TableIdent, purge: bool) -> Result<bool, IcebergSinkError> {
        self.inner.drop_table(ident, purge).await
    }
    async fn swap(
        &self,
        ident: &TableIdent,
        base: &LoadedTable,
        metadata: TableMetadata,
        changes: &[TableUpdate],
    ) -> Result<Swap, IcebergSinkError> {
        let compacts = metadata.current_snapshot().is_some_and(|s| {
            s.summary()
                .additional_properties
                .get("weir.operation")
                .map(String::as_str)
                == Some("compact")
        });
        let fault = if compacts {
            self.faults.lock().unwrap().pop_front()
        } else {
            None
        };
        match fault {
            None => self.inner.swap(ident, base, metadata, changes).await,
            Some(Fault::FailUnlanded { retryable }) => Err(failure(retryable)),
            Some(Fault::LandThenFail { retryable }) => {
                let swapped = self.inner.swap(ident, base, metadata, changes).await?;
                assert!(matches!(swapped, Swap::Swapped(_)), "the faulty swap was to land");
                Err(failure(retryable))
            }
        }
    }
}

/// A compaction through a faulty catalog, run; and how many faults it left.
async fn compact(catalog: Arc<SqlCatalog>, faults: &[Fault]) -> (Result<CompactReport, IcebergSinkError>, usize) {
    let faulty = Arc::new(Faulty {
        inner: catalog,
        faults: Mutex::new(faults.iter().copied().collect()),
    });
    let done = Compact::new(faulty.clone(), TABLE).unwrap().await;
    let left = faulty.faults.lock().unwrap().len();
    (done, left)
}

/// A table of 8 small files (480 rows), and its checkpoint.
async fn small_files() -> (SqlHarness, tempfile::TempDir) {
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    stream(&h, chk.path(), 7, None).await;
    (h, chk)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_that_landed_but_answered_an_error_is_found_and_kept() {
    if python().is_none() {
        return;
    }
    for retryable in [true, false] {
        let (h, _chk) = small_files().await;
        let (done, left) = compact(h.catalog().await, &[Fault::LandThenFail { retryable }]).await;
        let done = done.unwrap_or_else(|e| panic!("retryable {retryable}: {e}"));
        assert_eq!(left, 0, "the fault was met");
        assert_eq!(done.commits.len(), 1, "retryable {retryable}: {done:?}");
        assert_eq!((done.files_removed, done.files_added), (8, 1));
        assert_eq!(replaces(&h), 1, "one swap landed, and only one");
        assert_eq!(describe(&h)["files"], 1);
        assert_exactly_once(&ids(&h), 0..480);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swap_that_failed_unlanded_is_retried_or_stops_keeping_its_files() {
    if python().is_none() {
        return;
    }
    // A retryable error: the job reads the table, sees no swap of its own,
    // and swaps again.
    let (h, _chk) = small_files().await;
    let faults = [Fault::FailUnlanded { retryable: true }];
    let (done, left) = compact(h.catalog().await, &faults).await;
    let done = done.unwrap();
    assert_eq!(left, 0, "the fault was met");
    assert_eq!(done.commits.len(), 1, "{done:?}");
    assert_eq!(replaces(&h), 1);
    assert_eq!(describe(&h)["files"], 1);
    assert_exactly_once(&ids(&h), 0..480);

    // A refusal: the job stops, changing nothing, and keeps its output (a
    // late swap could still land); a rerun compacts.
    let (h, _chk) = small_files().await;
    let before = describe(&h)["metadata_location"].clone();
    let faults = [Fault::FailUnlanded { retryable: false }];
    let (done, left) = compact(h.catalog().await, &faults).await;
    let e = done.unwrap_err();
    assert_eq!(left, 0, "the fault was met");
    assert!(e.to_string().contains("its files are kept"), "{e}");
    assert_eq!(describe(&h)["metadata_location"], before, "nothing changed");
    assert_eq!(describe(&h)["files"], 8);
    assert_exactly_once(&ids(&h), 0..480);
    let kept = outputs_on_disk(&h);
    assert_eq!(kept, 1, "the output of the unknown swap is kept");
    let done = compact(h.catalog().await, &[]).await.0.unwrap();
    assert_eq!(done.commits.len(), 1);
    assert_eq!(describe(&h)["files"], 1);
    assert_exactly_once(&ids(&h), 0..480);
}
