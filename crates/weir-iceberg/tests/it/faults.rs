//! An Iceberg query whose catalog, table store and checkpoint store all
//! fail 5% of their calls at random: catalog loads and swaps fail, and half
//! of the failed swaps land first (a timeout after the catalog committed);
//! the table store's reads fail and its puts fail or land then fail (data
//! files, manifests, manifest lists, version hints), and its deletes fail
//! too; the checkpoint's puts fail likewise. Every stop is retryable and
//! says what failed, the next run resumes, and after a run without faults
//! the table holds every id once, read by pyiceberg and DuckDB. Manifests
//! merge every five commits, ahead of the commit path, so swaps that list
//! merged manifests fail too: every manifest a snapshot lists is still
//! there.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use iceberg::io::FileIO;
use iceberg::spec::TableMetadata;
use iceberg::{TableIdent, TableUpdate};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use weir_core::checkpoint::{CheckpointStore, LeaseTiming, ObjectStoreCheckpoint};
use weir_core::prelude::*;
use weir_iceberg::{Catalog, ExpiryPolicy, IcebergSink, IcebergSinkError, LoadedTable, Swap};
use weir_test_support::faults::{Chance, Fault, FaultyStore};
use weir_test_support::readers::iceberg;
use weir_test_support::{assert_exactly_once, SinkHarness};

use crate::compact::{ids, TABLE};
use crate::conformance::sqlite_harness;

/// A catalog whose loads and swaps fail at random, and whose file IO (the
/// sink's data files, manifests, manifest lists, version hints, merges and
/// deletes) is a store that fails at random; everything else goes to the
/// SQL catalog, which reads and writes the metadata files through its own.
#[derive(Debug)]
struct RandomFaults {
    inner: Arc<dyn Catalog>,
    file_io: FileIO,
    chance: Mutex<Option<Chance>>,
    injected: Mutex<u64>,
}

impl RandomFaults {
    fn draw(&self) -> Option<Fault> {
        let fault = self.chance.lock().unwrap().as_mut()?.draw();
        if fault.is_some() {
            *self.injected.lock().unwrap() += 1;
        }
        fault
    }
}

/// The error a fault reports: transient, as a reset connection is.
fn reset(operation: &str) -> IcebergSinkError {
    IcebergSinkError::Catalog {
        catalog: "faulty".into(),
        operation: operation.into(),
        source: Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "injected fault: connection reset",
        )),
        retryable: true,
    }
}

#[async_trait]
impl Catalog for RandomFaults {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn file_io(&self) -> &FileIO {
        &self.file_io
    }
    fn default_location(&self, ident: &TableIdent) -> String {
        self.inner.default_location(ident)
    }
    fn storage_settings(&self) -> std::collections::HashMap<String, String> {
        self.inner.storage_settings()
    }
    fn writes_metadata(&self) -> bool {
        self.inner.writes_metadata()
    }
    async fn load(&self, ident: &TableIdent) -> Result<Option<LoadedTable>, IcebergSinkError> {
        match self.draw() {
            Some(_) => Err(reset("load")),
            None => self.inner.load(ident).await,
        }
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
        match self.draw() {
            None | Some(Fault::Delay(_)) => self.inner.swap(ident, base, metadata, changes).await,
            Some(Fault::Fail) => Err(reset("swap")),
            Some(Fault::LandThenFail) => {
                self.inner.swap(ident, base, metadata, changes).await?;
                Err(reset("swap"))
            }
            Some(Fault::LandThenRetry) => {
                self.inner.swap(ident, base, metadata.clone(), changes).await?;
                self.inner.swap(ident, base, metadata, changes).await
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_table_and_checkpoint_faults_lose_and_repeat_nothing() {
    let h = sqlite_harness().await;
    if h.skip_reason().is_some() {
        return;
    }
    // The table's own files, where the catalog and the readers find them
    // (`file:///...` locations are absolute paths from `/`), behind faults.
    let table_store = FaultyStore::new(Arc::new(LocalFileSystem::new()));
    let catalog = Arc::new(RandomFaults {
        inner: h.catalog().await,
        file_io: weir_iceberg::store_file_io(table_store.clone()),
        chance: Mutex::new(None),
        injected: Mutex::new(0),
    });
    // Made by the catalog; table stores' errors name files under it.
    let warehouse = std::fs::canonicalize(&h.warehouse).unwrap();
    let warehouse = warehouse.to_str().unwrap();
    let checkpoint_store = FaultyStore::new(Arc::new(InMemory::new()));
    let checkpoint = || {
        let timing = LeaseTiming {
            ttl: Duration::from_millis(1_500),
            renew_every: Duration::from_millis(200),
            clock_skew: Duration::from_millis(300),
        };
        let store = ObjectStoreCheckpoint::new(checkpoint_store.clone(), "chk".into(), "memory://chk")
            .with_lease_timing(timing)
            .unwrap();
        Arc::new(store) as Arc<dyn CheckpointStore>
    };
    let run = || async {
        let sink = IcebergSink::try_new(catalog.clone(), TABLE)
            .map_err(|e| (e.to_string(), false))?
            .with_table_property("commit.manifest.min-count-to-merge", "5")
            // Expiries folded into commits whose swaps fail, land then
            // fail, or land twice. (Every five commits: with three stores
            // failing, a run commits a few batches before it stops.)
            .with_snapshot_expiry(ExpiryPolicy {
                every_commits: 5,
                retain_last: 5,
                older_than: None,
                table_properties_first: false,
            });
        let q = read_stream(RateSource::rows_per_batch(10))
            .write_stream()
            .query_name("faults")
            .checkpoint_store(checkpoint())
            .stop_after_batch(BatchId(499))
            .start(sink)
            .await
            .map_err(|e| (e.to_string(), e.retryable()))?;
        q.await_termination().await.map_err(|e| (e.to_string(), e.retryable()))
    };
    *catalog.chance.lock().unwrap() = Some(Chance::new(0.05, 31));
    checkpoint_store.random(0.05, 37);
    table_store.random(0.05, 41);
    // The deletes of dropped metadata files, of expired snapshots' files,
    // of merges no commit lists and of lost attempts' files.
    table_store.random_deletes(0.05, 43);
    let (mut stops, mut by_catalog, mut by_checkpoint, mut by_table) = (0, 0, 0, 0);
    while let Err((message, retryable)) = run().await {
        assert!(retryable, "a fault stopped the query for good: {message}");
        // Every delete is best effort: one that fails leaves an orphan
        // file, never a stopped query.
        assert!(
            !message.contains("cannot delete"),
            "a failed delete stopped the query: {message}"
        );
        if message.contains("memory://chk") {
            by_checkpoint += 1;
        } else if message.contains("catalog \"faulty\"") {
            by_catalog += 1;
        } else {
            assert!(
                message.contains(warehouse) && message.contains("injected fault"),
                "a stop names no store: {message}"
            );
            by_table += 1;
        }
        stops += 1;
        assert!(stops < 3_000, "no progress: {message}");
    }
    *catalog.chance.lock().unwrap() = None;
    checkpoint_store.random(0.0, 0);
    table_store.random(0.0, 0);
    table_store.random_deletes(0.0, 0);
    eprintln!(
        "{stops} stops ({by_catalog} by the catalog, {by_table} by the table store, {by_checkpoint} by the \
         checkpoint), {} catalog faults, {} table store faults ({} failed deletes), {} checkpoint faults",
        catalog.injected.lock().unwrap(),
        table_store.injected(),
        table_store.failed_deletes(),
        checkpoint_store.injected()
    );
    // A swap of unknown outcome does not stop the query: the commit loop
    // reads the table back and tries again. The faults were met, and
    // some of them (failed loads, failed writes of the batch's files)
    // stopped it.
    assert!(
        *catalog.injected.lock().unwrap() >= 10 && by_catalog >= 1 && by_checkpoint >= 10,
        "{stops} stops, {by_catalog} by the catalog, {by_checkpoint} by the checkpoint"
    );
    assert!(
        table_store.injected() >= 20 && by_table >= 5,
        "{} table store faults, {by_table} stops by them",
        table_store.injected()
    );
    // Hundreds of metadata files leave the log (it keeps 100) and are
    // deleted in the background: some of those deletes failed.
    assert!(
        table_store.failed_deletes() >= 5,
        "{} failed deletes",
        table_store.failed_deletes()
    );

    // Once more without faults: nothing left to do, and nothing repeated.
    run().await.unwrap();
    assert_exactly_once(&ids(&h), 0..5_000);
    let out = iceberg(&["manifests", &h.reader, TABLE]).expect("readers present");
    let mut merged = 0;
    for snapshot in out["snapshots"].as_array().unwrap() {
        for m in snapshot["manifests"].as_array().unwrap() {
            let path = m.as_str().unwrap().trim_start_matches("file://");
            assert!(
                std::path::Path::new(path).exists(),
                "a snapshot lists {path}, which is gone"
            );
            merged += usize::from(path.contains("-merged-"));
        }
    }
    // Expiry leaves a few snapshots: some of them list a merge.
    assert!(merged >= 1, "{merged} merged manifests listed");
    // Each run counts its own commits towards the next expiry, and runs
    // stop every few batches: some expire, some end before.
    let snapshots = out["snapshots"].as_array().unwrap().len();
    assert!(
        (5..250).contains(&snapshots),
        "{snapshots} snapshots of 500 commits left by expiries every 5 commits keeping 5"
    );
}
