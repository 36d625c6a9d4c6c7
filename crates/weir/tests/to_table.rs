//! `to_table`: a stream into a table by name, created when missing, read
//! back by other engines; with the checkpoint on S3 too, and with faults in
//! the checkpoint's store.

use weir::prelude::*;
use weir_test_support::readers::{iceberg, json_ids, python, read};
use weir_test_support::{assert_exactly_once, ObjectCheckpoints};

async fn run(writer: StreamWriter, name: &str, catalogs: Option<(&Catalogs, TableOptions)>) -> Result<(), weir::Error> {
    let q = match catalogs {
        Some((c, options)) => writer.to_table_in(c, name, options).await?,
        None => writer.to_table(name).await?,
    };
    q.await_termination().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn to_table_on_the_embedded_default_creates_a_delta_table_named_after_itself() {
    if python().is_none() {
        return;
    }
    let lake = tempfile::tempdir().unwrap();
    let chk = tempfile::tempdir().unwrap();
    std::env::remove_var("WEIR_CONFIG");
    std::env::set_var("WEIR_LAKE", lake.path());
    let stream = || read_stream(RateSource::rows_per_batch(100));

    let writer = stream()
        .write_stream()
        .checkpoint_location(chk.path().join("a"))
        .stop_after_batch(BatchId(2));
    run(writer, "lake.bronze.payments", None).await.unwrap();
    let table = lake.path().join("warehouse/bronze/payments");
    let ids = json_ids(&read(&["ids", "deltalake", table.to_str().unwrap()]).expect("readers present"));
    assert_exactly_once(&ids, 0..300);

    // The query took the table's name: a new checkpoint for the same table
    // is a lost checkpoint, refused, not a silent restart at batch 0.
    let writer = stream()
        .write_stream()
        .checkpoint_location(chk.path().join("b"))
        .stop_after_batch(BatchId(2));
    let e = run(writer, "bronze.payments", None).await.unwrap_err().to_string();
    assert!(e.contains("lake.bronze.payments") && e.contains("take"), "{e}");
    let ids = json_ids(&read(&["ids", "deltalake", table.to_str().unwrap()]).expect("readers present"));
    assert_exactly_once(&ids, 0..300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn to_table_in_takes_a_format_and_a_query_name() {
    if python().is_none() {
        return;
    }
    let lake = tempfile::tempdir().unwrap();
    let chk = tempfile::tempdir().unwrap();
    let catalogs = Catalogs::new(weir::catalog::Config::embedded(lake.path()));
    let options = TableOptions::new()
        .format(TableFormat::Iceberg)
        .partition_by(["bucket(4, account_id)"]);
    let writer = read_stream(RateSource::rows_per_batch(70))
        .write_stream()
        .query_name("events-to-silver")
        .checkpoint_location(chk.path())
        .stop_after_batch(BatchId(1));
    run(writer, "silver.events", Some((&catalogs, options))).await.unwrap();

    let db = lake.path().join("catalog.db");
    let db = db.to_str().unwrap();
    let ids = json_ids(&iceberg(&["ids", "pyiceberg", db, "silver.events"]).expect("readers present"));
    assert_exactly_once(&ids, 0..140);
    let d = iceberg(&["describe", db, "silver.events"]).expect("readers present");
    assert_eq!(d["properties"]["weir.query.events-to-silver.batch-id"], "1");
    assert_eq!(d["partition_spec"][0][1], "bucket[4]");
}

/// The checkpoint of a query on S3 (SeaweedFS, started by scripts/test.sh),
/// opened by its URL, with a short lease for the tests.
fn s3_checkpoint(name: &str) -> Option<ObjectCheckpoints> {
    ObjectCheckpoints::test_s3(&format!("checkpoints/{}/{name}", uuid::Uuid::new_v4()))
}

/// The store of the checkpoint `chk`, opened by its URL as a query opens it.
fn open(chk: &ObjectCheckpoints) -> std::sync::Arc<dyn weir::checkpoint::CheckpointStore> {
    weir::checkpoint::Checkpoint::open(&chk.url, &chk.options)
        .unwrap()
        .store()
        .clone()
}

/// The checkpoint of a query on Azure Blob Storage (Azurite, started by
/// scripts/test.sh), opened by its `az://` URL.
fn azure_checkpoint(name: &str) -> Option<ObjectCheckpoints> {
    ObjectCheckpoints::test_azure(&format!("checkpoints/{}/{name}", uuid::Uuid::new_v4()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_on_s3_passes_the_store_suite() {
    let Some(chk) = s3_checkpoint("suite") else { return };
    weir_test_support::checkpoint_store::check_store(&|| open(&chk)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_on_azure_passes_the_store_suite() {
    let Some(chk) = azure_checkpoint("suite") else { return };
    weir_test_support::checkpoint_store::check_store(&|| open(&chk)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_with_its_checkpoint_on_s3_lands_every_id_once() {
    if let Some(chk) = s3_checkpoint("payments") {
        checkpoint_on_object_storage(chk).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_with_its_checkpoint_on_azure_lands_every_id_once() {
    if let Some(chk) = azure_checkpoint("payments") {
        checkpoint_on_object_storage(chk).await;
    }
}

/// A query whose checkpoint is on object storage: a second run on the
/// checkpoint is refused while the first runs, a restart resumes where the
/// first stopped, and the table holds every id once.
async fn checkpoint_on_object_storage(chk: ObjectCheckpoints) {
    if python().is_none() {
        return;
    }
    let lake = tempfile::tempdir().unwrap();
    let catalogs = Catalogs::new(weir::catalog::Config::embedded(lake.path()));
    let writer = |stop: u64| {
        read_stream(RateSource::rows_per_batch(100))
            .write_stream()
            .checkpoint_location(&chk.url)
            .checkpoint_options(chk.options.clone())
            .stop_after_batch(BatchId(stop))
    };
    let first = writer(1_000)
        .trigger(Trigger::processing_time(std::time::Duration::from_millis(200)))
        .to_table_in(&catalogs, "bronze.payments", TableOptions::new())
        .await
        .unwrap();
    let refused = writer(1_000)
        .to_table_in(&catalogs, "bronze.payments", TableOptions::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("in use") && refused.contains("checkpoints/"),
        "{refused}"
    );
    first.stop_and_wait().await.unwrap();
    let checkpoint = weir::checkpoint::Checkpoint::new(open(&chk));
    let stopped = checkpoint
        .status()
        .await
        .unwrap()
        .last_committed
        .expect("the first run committed");

    let last = stopped.0 + 5;
    run(writer(last), "bronze.payments", Some((&catalogs, TableOptions::new())))
        .await
        .unwrap();
    let table = lake.path().join("warehouse/bronze/payments");
    let ids = json_ids(&read(&["ids", "deltalake", table.to_str().unwrap()]).expect("readers present"));
    assert_exactly_once(&ids, 0..(last as i64 + 1) * 100);
    assert_eq!(checkpoint.status().await.unwrap().last_committed, Some(BatchId(last)));
}

/// The checkpoint's store fails 5% of its calls (half of the failed puts
/// landing first): each run goes until a fault stops it with a retryable
/// error that names the checkpoint, the next run resumes, and once 500
/// batches are in, the table holds every id once.
async fn checkpoint_faults_lose_and_repeat_nothing(format: TableFormat) {
    use std::sync::Arc;
    use std::time::Duration;
    use weir::checkpoint::{LeaseTiming, ObjectStoreCheckpoint};
    use weir_test_support::faults::FaultyStore;

    let Some(reader) = python() else { return };
    let _ = reader;
    let lake = tempfile::tempdir().unwrap();
    let catalogs = Catalogs::new(weir::catalog::Config::embedded(lake.path()));
    let options = || TableOptions::new().format(format);
    let faulty = FaultyStore::new(Arc::new(object_store::memory::InMemory::new()));
    let checkpoint = || {
        let timing = LeaseTiming {
            ttl: Duration::from_millis(1_500),
            renew_every: Duration::from_millis(200),
            clock_skew: Duration::from_millis(300),
        };
        let store = ObjectStoreCheckpoint::new(faulty.clone(), "chk".into(), "memory://chk")
            .with_lease_timing(timing)
            .unwrap();
        Arc::new(store) as Arc<dyn weir::checkpoint::CheckpointStore>
    };
    let writer = |last: u64| {
        read_stream(RateSource::rows_per_batch(10))
            .write_stream()
            .query_name("faults")
            .checkpoint_store(checkpoint())
            .stop_after_batch(BatchId(last))
    };
    faulty.random(0.05, 17);
    let mut stops = 0;
    loop {
        let ran = match writer(499).to_table_in(&catalogs, "bronze.faults", options()).await {
            Ok(q) => q.await_termination().await.map_err(|e| (e.to_string(), e.retryable())),
            Err(e) => Err((e.to_string(), e.retryable())),
        };
        match ran {
            Ok(()) => break,
            Err((message, retryable)) => {
                assert!(retryable, "a fault stopped the query for good: {message}");
                assert!(message.contains("memory://chk"), "{message}");
                stops += 1;
                assert!(stops < 2_000, "no progress: {message}");
            }
        }
    }
    faulty.random(0.0, 0);
    eprintln!("{format:?}: {stops} stops, {} faults", faulty.injected());
    assert!(
        stops >= 10 && faulty.injected() >= 10,
        "{stops} stops, {} faults",
        faulty.injected()
    );
    // Once more without faults: nothing left to do, and nothing repeated.
    writer(499)
        .to_table_in(&catalogs, "bronze.faults", options())
        .await
        .unwrap()
        .await_termination()
        .await
        .unwrap();
    let ids = match format {
        TableFormat::Delta => {
            let table = lake.path().join("warehouse/bronze/faults");
            json_ids(&read(&["ids", "deltalake", table.to_str().unwrap()]).expect("readers present"))
        }
        _ => {
            let db = lake.path().join("catalog.db");
            json_ids(&iceberg(&["ids", "pyiceberg", db.to_str().unwrap(), "bronze.faults"]).expect("readers present"))
        }
    };
    assert_exactly_once(&ids, 0..5_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_faults_lose_and_repeat_nothing_in_delta() {
    checkpoint_faults_lose_and_repeat_nothing(TableFormat::Delta).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_faults_lose_and_repeat_nothing_in_iceberg() {
    checkpoint_faults_lose_and_repeat_nothing(TableFormat::Iceberg).await;
}

/// The table's catalog (PostgreSQL), its store and the checkpoint's (both
/// S3) reached through loopback proxies that cut every open connection at
/// random moments, mid-request: each stop is retryable, the next run
/// resumes, and once the proxies calm down and the run ends, the table
/// holds every id once, read past the proxies by the format's Python
/// reader.
async fn network_cuts_lose_and_repeat_nothing(format: TableFormat) {
    use std::net::SocketAddr;
    use std::time::Duration;
    use weir::catalog::{CatalogConfig, Config};
    use weir_test_support::proxy::TcpProxy;

    let (Some(endpoint), Some(pg)) = (
        weir_test_support::service("WEIR_TEST_S3_ENDPOINT"),
        weir_test_support::service("WEIR_TEST_POSTGRES_URL"),
    ) else {
        return;
    };
    if python().is_none() {
        return;
    }
    let s3_addr: SocketAddr = endpoint.trim_start_matches("http://").parse().expect("host:port");
    let (pg_head, pg_tail) = pg.split_once('@').expect("postgres://USER@HOST:PORT/DB");
    let (pg_host, pg_db) = pg_tail.split_once('/').expect("a database");
    let pg_addr: SocketAddr = pg_host.parse().expect("host:port");
    let mut s3 = TcpProxy::start(s3_addr).await.unwrap();
    let mut postgres = TcpProxy::start(pg_addr).await.unwrap();
    let pg_via = format!("{pg_head}@{}/{pg_db}", postgres.addr());

    let bucket = std::env::var("WEIR_TEST_S3_BUCKET").unwrap_or_else(|_| "weir".into());
    let prefix = format!("s3://{bucket}/network/{}", uuid::Uuid::new_v4());
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let config = Config::empty().with_catalog(
        "lake",
        CatalogConfig::sql(pg_via, format!("{prefix}/warehouse"))
            .with_format(format)
            .with_storage("s3.endpoint", s3.http())
            .with_storage("s3.region", "us-east-1")
            .with_storage("s3.access-key-id", env("AWS_ACCESS_KEY_ID"))
            .with_storage("s3.secret-access-key", env("AWS_SECRET_ACCESS_KEY")),
    );
    let catalogs = Catalogs::new(config);
    let ns = format!("net_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let name = format!("lake.{ns}.events");
    let options = [
        ("aws_endpoint".to_string(), s3.http()),
        ("aws_allow_http".to_string(), "true".to_string()),
        ("lease_ttl_ms".to_string(), "3000".to_string()),
        ("lease_renew_ms".to_string(), "300".to_string()),
        ("lease_clock_skew_ms".to_string(), "500".to_string()),
    ];
    let writer = || {
        read_stream(RateSource::rows_per_batch(10))
            .write_stream()
            .query_name("network")
            .checkpoint_location(format!("{prefix}/chk/"))
            .checkpoint_options(options.clone())
            .stop_after_batch(BatchId(199))
    };
    s3.cut_at_random(Duration::from_millis(400), 41);
    postgres.cut_at_random(Duration::from_millis(700), 43);
    let mut stops = 0;
    loop {
        let ran = match writer().to_table_in(&catalogs, &name, TableOptions::new()).await {
            Ok(q) => q.await_termination().await.map_err(|e| (e.to_string(), e.retryable())),
            Err(e) => Err((e.to_string(), e.retryable())),
        };
        match ran {
            Ok(()) => break,
            Err((message, retryable)) => {
                assert!(retryable, "a cut connection stopped the query for good: {message}");
                stops += 1;
                assert!(stops < 1_000, "no progress: {message}");
            }
        }
    }
    s3.calm();
    postgres.calm();
    eprintln!(
        "{format:?}: {stops} stops; {} S3 connections of {} cut open, {} PostgreSQL connections of {}",
        s3.severed(),
        s3.connections(),
        postgres.severed(),
        postgres.connections()
    );
    // The S3 client retries a request whose connection was cut, and the
    // PostgreSQL pool connects again: most cuts, often all, pass unseen.
    assert!(
        s3.severed() >= 10 && postgres.severed() >= 1,
        "too few connections cut to tell"
    );
    // Once more, calm: nothing left to do, and nothing repeated.
    run(writer(), &name, Some((&catalogs, TableOptions::new())))
        .await
        .unwrap();
    let ids = match format {
        TableFormat::Delta => {
            let location = catalogs.find(&name).await.unwrap().expect("the table").location;
            json_ids(&read(&["ids", "deltalake", &location]).expect("readers present"))
        }
        _ => json_ids(&iceberg(&["ids", "pyiceberg", &pg, &format!("{ns}.events")]).expect("readers present")),
    };
    assert_exactly_once(&ids, 0..2_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_cuts_lose_and_repeat_nothing_in_delta() {
    network_cuts_lose_and_repeat_nothing(TableFormat::Delta).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_cuts_lose_and_repeat_nothing_in_iceberg() {
    network_cuts_lose_and_repeat_nothing(TableFormat::Iceberg).await;
}
