//! A Delta query whose checkpoint store fails 5% of its calls at random and
//! whose table store fails 5% of its puts (data files, log entries, log
//! checkpoints), half of the failed puts landing first (a timeout after the
//! request went out): a log entry whose put failed is looked for in the log
//! and the commit goes on; every stop is retryable and says which store
//! failed, the next run resumes, and after a run without faults the
//! table holds every id once, read by Python deltalake and DuckDB; the same
//! for a Complete-mode query, whose commits go through deltalake.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use deltalake::logstore::{
    default_logstore, logstore_factories, object_store_factories, LogStore, LogStoreFactory, ObjectStoreFactory,
    ObjectStoreRef, StorageConfig,
};
use deltalake::DeltaResult;
use futures::TryStreamExt;
use object_store::memory::InMemory;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt};
use url::Url;
use weir_core::checkpoint::{CheckpointStore, LeaseTiming, ObjectStoreCheckpoint};
use weir_core::prelude::*;
use weir_delta::DeltaSink;
use weir_test_support::assert_exactly_once;
use weir_test_support::faults::FaultyStore;
use weir_test_support::operators::CountByKey;
use weir_test_support::readers::{json_ids, python};

/// The stores behind `faulty-mem://NAME/`, by name.
static STORES: Mutex<BTreeMap<String, Arc<FaultyStore>>> = Mutex::new(BTreeMap::new());

/// Opens `faulty-mem://NAME/path` as `path` in the store registered for
/// `NAME`.
struct Factory;

impl ObjectStoreFactory for Factory {
    fn parse_url_opts(&self, url: &Url, _config: &StorageConfig) -> DeltaResult<(ObjectStoreRef, StorePath)> {
        let host = url.host_str().unwrap_or_default();
        let store = STORES.lock().unwrap().get(host).cloned().expect("a registered store");
        Ok((store as ObjectStoreRef, StorePath::from(url.path())))
    }
}

impl LogStoreFactory for Factory {
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

/// A table URL on a faulty in-memory store of its own.
fn faulty_table(name: &str) -> (String, Arc<FaultyStore>) {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        let scheme = Url::parse("faulty-mem://").unwrap();
        object_store_factories().insert(scheme.clone(), Arc::new(Factory));
        logstore_factories().insert(scheme, Arc::new(Factory));
    });
    let store = FaultyStore::new(Arc::new(InMemory::new()));
    STORES.lock().unwrap().insert(name.to_string(), store.clone());
    (format!("faulty-mem://{name}/table/"), store)
}

/// Copies every object of `store` under `prefix` into `dir`, for readers
/// of local files.
async fn copy_out(store: &dyn ObjectStore, prefix: &str, dir: &Path) {
    let prefix = StorePath::from(prefix);
    let listed: Vec<_> = store.list(Some(&prefix)).try_collect().await.unwrap();
    for meta in listed {
        let relative: Vec<_> = meta.location.prefix_match(&prefix).unwrap().collect();
        let file = relative.iter().fold(dir.to_path_buf(), |p, part| p.join(part.as_ref()));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        let bytes = store.get(&meta.location).await.unwrap().bytes().await.unwrap();
        std::fs::write(file, bytes).unwrap();
    }
}

/// A checkpoint on `store` with a short lease.
fn checkpoint_on(store: &Arc<FaultyStore>) -> Arc<dyn CheckpointStore> {
    let timing = LeaseTiming {
        ttl: Duration::from_millis(1_500),
        renew_every: Duration::from_millis(200),
        clock_skew: Duration::from_millis(300),
    };
    let checkpoint = ObjectStoreCheckpoint::new(store.clone(), "chk".into(), "memory://chk")
        .with_lease_timing(timing)
        .unwrap();
    Arc::new(checkpoint)
}

/// Runs `run` again after each stop until it finishes. Every stop must be
/// retryable and name the store that failed (the checkpoint's
/// `memory://chk` or the table's `faulty-mem://`). Returns the stops, and
/// those by the table.
async fn restart_until_done<F, R>(run: F) -> (u64, u64)
where
    F: Fn() -> R,
    R: std::future::Future<Output = Result<(), (String, bool)>>,
{
    let (mut stops, mut by_table) = (0, 0);
    while let Err((message, retryable)) = run().await {
        assert!(retryable, "a fault stopped the query for good: {message}");
        if !message.contains("memory://chk") {
            assert!(
                message.contains("faulty-mem://"),
                "a stop names neither store: {message}"
            );
            by_table += 1;
        }
        stops += 1;
        assert!(stops < 3_000, "no progress: {message}");
    }
    (stops, by_table)
}

/// The event ids of the table in `store`, read by `reader` from a local
/// copy.
async fn table_ids(store: &FaultyStore, reader: &str) -> Vec<i64> {
    let dir = tempfile::tempdir().unwrap();
    copy_out(store, "table", dir.path()).await;
    let table = dir.path().to_str().unwrap();
    json_ids(&crate::readers::read(&["ids", reader, table]).expect("readers present"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_and_checkpoint_faults_lose_and_repeat_nothing() {
    if python().is_none() {
        return;
    }
    let (url, table_store) = faulty_table("faults");
    let checkpoint_store = FaultyStore::new(Arc::new(InMemory::new()));
    let run = || async {
        let sink = DeltaSink::try_new(&url).map_err(|e| (e.to_string(), false))?;
        let q = read_stream(RateSource::rows_per_batch(10))
            .write_stream()
            .query_name("faults")
            .checkpoint_store(checkpoint_on(&checkpoint_store))
            .stop_after_batch(BatchId(499))
            .start(sink)
            .await
            .map_err(|e| (e.to_string(), e.retryable()))?;
        q.await_termination().await.map_err(|e| (e.to_string(), e.retryable()))
    };
    table_store.random_puts(0.05, 23);
    checkpoint_store.random(0.05, 29);
    let (stops, by_table) = restart_until_done(run).await;
    table_store.random(0.0, 0);
    checkpoint_store.random(0.0, 0);
    eprintln!(
        "{stops} stops ({by_table} by the table), {} table faults, {} checkpoint faults",
        table_store.injected(),
        checkpoint_store.injected()
    );
    assert!(
        by_table >= 10 && stops - by_table >= 10,
        "{stops} stops, {by_table} by the table"
    );
    // A log entry's put that failed may have landed: the commit loop reads
    // the log for it and goes on, so not every table fault stops the query.
    assert!(
        by_table + 10 <= table_store.injected(),
        "{by_table} stops by the table of {} table faults: failed log entries are not settled in the run",
        table_store.injected()
    );

    // Once more without faults: nothing left to do, and nothing repeated.
    run().await.unwrap();
    for reader in ["deltalake", "duckdb"] {
        assert_exactly_once(&table_ids(&table_store, reader).await, 0..5_000);
    }
}

/// Complete mode commits through deltalake (its removes need the whole
/// table), not by writing the log entry directly: a failed put there is
/// settled the same way, and a later try of the batch must not let
/// deltalake rebase it over what may be its own entry. Each batch's result
/// is every id so far, counted: the table holds each id once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_mode_under_table_faults_holds_each_id_once() {
    if python().is_none() {
        return;
    }
    let (url, table_store) = faulty_table("complete-faults");
    let checkpoint_store = FaultyStore::new(Arc::new(InMemory::new()));
    let run = || async {
        let sink = DeltaSink::try_new(&url).map_err(|e| (e.to_string(), false))?;
        let q = read_stream(RateSource::rows_per_batch(10))
            .with_operator(CountByKey::new("ids", "event_id"))
            .write_stream()
            .query_name("complete-faults")
            .output_mode(OutputMode::Complete)
            .checkpoint_store(checkpoint_on(&checkpoint_store))
            .stop_after_batch(BatchId(199))
            .start(sink)
            .await
            .map_err(|e| (e.to_string(), e.retryable()))?;
        q.await_termination().await.map_err(|e| (e.to_string(), e.retryable()))
    };
    table_store.random_puts(0.05, 31);
    let (stops, by_table) = restart_until_done(run).await;
    table_store.random(0.0, 0);
    eprintln!(
        "complete: {stops} stops ({by_table} by the table), {} table faults",
        table_store.injected()
    );
    assert!(
        table_store.injected() >= 10 && by_table < table_store.injected(),
        "{by_table} stops of {} table faults",
        table_store.injected()
    );
    run().await.unwrap();
    for reader in ["deltalake", "duckdb"] {
        assert_exactly_once(&table_ids(&table_store, reader).await, 0..2_000);
    }
}
