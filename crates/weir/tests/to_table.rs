//! `to_table`: a stream into a table by name, created when missing, read
//! back by other engines; with the checkpoint on S3 too, with faults in the
//! checkpoint's store, and with the network to the catalog and S3 cut,
//! stalled or down.

use weir::prelude::*;
use weir_test_support::proxy::{Mode, TcpProxy};
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

/// The ids in the table `lake.<namespace>.<table>` of `catalogs`, whose
/// SQL catalog is on PostgreSQL at `pg`, as the format's Python reader
/// reads them.
async fn python_ids(format: TableFormat, catalogs: &Catalogs, name: &str, pg: &str) -> Vec<i64> {
    match format {
        TableFormat::Delta => {
            let location = catalogs.find(name).await.unwrap().expect("the table").location;
            json_ids(&read(&["ids", "deltalake", &location]).expect("readers present"))
        }
        _ => {
            let table = name.strip_prefix("lake.").expect("a table of the catalog lake");
            json_ids(&iceberg(&["ids", "pyiceberg", pg, table]).expect("readers present"))
        }
    }
}

/// Runs `writer()` into `name` to its last batch, starting it again after
/// each stop, which must be retryable and pass `check` (given its message);
/// returns how many stops there were.
async fn until_done(
    writer: impl Fn() -> StreamWriter,
    catalogs: &Catalogs,
    name: &str,
    options: impl Fn() -> TableOptions,
    check: impl Fn(&str),
) -> usize {
    let mut stops = 0;
    loop {
        let ran = match writer().to_table_in(catalogs, name, options()).await {
            Ok(q) => q.await_termination().await.map_err(|e| (e.to_string(), e.retryable())),
            Err(e) => Err((e.to_string(), e.retryable())),
        };
        let Err((message, retryable)) = ran else { return stops };
        assert!(retryable, "a fault stopped the query for good: {message}");
        check(&message);
        stops += 1;
        assert!(stops < 2_000, "no progress: {message}");
    }
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
    let stops = until_done(
        || writer(499),
        &catalogs,
        "bronze.faults",
        options,
        |message| assert!(message.contains("memory://chk"), "{message}"),
    )
    .await;
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

/// The `HOST:PORT` of a service's `http://HOST:PORT` address.
fn socket(url: &str) -> std::net::SocketAddr {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("http://HOST:PORT")
}

/// `catalog` with its tables' files on the test S3 reached at `endpoint`,
/// with the environment's credentials.
fn on_s3(catalog: weir::catalog::CatalogConfig, endpoint: &str) -> weir::catalog::CatalogConfig {
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    catalog
        .with_storage("s3.endpoint", endpoint)
        .with_storage("s3.region", "us-east-1")
        .with_storage("s3.access-key-id", env("AWS_ACCESS_KEY_ID"))
        .with_storage("s3.secret-access-key", env("AWS_SECRET_ACCESS_KEY"))
}

/// The options of a checkpoint on the test S3 reached at `endpoint`, with a
/// lease that network trouble outlasts within a test: 3 s, renewed every
/// 300 ms.
fn checkpoint_options(endpoint: &str) -> [(String, String); 5] {
    [
        ("aws_endpoint", endpoint),
        ("aws_allow_http", "true"),
        ("lease_ttl_ms", "3000"),
        ("lease_renew_ms", "300"),
        ("lease_clock_skew_ms", "500"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
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

    let (Some(endpoint), Some(pg)) = (
        weir_test_support::service("WEIR_TEST_S3_ENDPOINT"),
        weir_test_support::service("WEIR_TEST_POSTGRES_URL"),
    ) else {
        return;
    };
    if python().is_none() {
        return;
    }
    let (pg_head, pg_tail) = pg.split_once('@').expect("postgres://USER@HOST:PORT/DB");
    let (pg_host, pg_db) = pg_tail.split_once('/').expect("a database");
    let pg_addr: SocketAddr = pg_host.parse().expect("host:port");
    let mut s3 = TcpProxy::start(socket(&endpoint)).await.unwrap();
    let mut postgres = TcpProxy::start(pg_addr).await.unwrap();
    let pg_via = format!("{pg_head}@{}/{pg_db}", postgres.addr());

    let bucket = std::env::var("WEIR_TEST_S3_BUCKET").unwrap_or_else(|_| "weir".into());
    let prefix = format!("s3://{bucket}/network/{}", uuid::Uuid::new_v4());
    let config = Config::empty().with_catalog(
        "lake",
        on_s3(CatalogConfig::sql(pg_via, format!("{prefix}/warehouse")), &s3.http()).with_format(format),
    );
    let catalogs = Catalogs::new(config);
    let ns = format!("net_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let name = format!("lake.{ns}.events");
    let options = checkpoint_options(&s3.http());
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
    let stops = until_done(writer, &catalogs, &name, TableOptions::new, |_| {}).await;
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
    let ids = python_ids(format, &catalogs, &name, &pg).await;
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

/// An Iceberg table in the REST catalog of the test SeaweedFS, with the
/// catalog's endpoint, the table's S3 and the checkpoint's S3 each reached
/// through a loopback proxy that cuts every open connection at random
/// moments, mid-request: a commit cut after the catalog took it is a swap
/// of unknown outcome, which the table as read next must settle. Each stop
/// is retryable, the next run resumes, and once the proxies calm down and
/// the run ends, the table holds every id once, read past the proxies by
/// pyiceberg through the same catalog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_cuts_lose_and_repeat_nothing_in_iceberg_rest() {
    use std::time::Duration;
    use weir::catalog::{CatalogConfig, Config};

    let (Some(endpoint), Some(uri)) = (
        weir_test_support::service("WEIR_TEST_S3_ENDPOINT"),
        weir_test_support::service("WEIR_TEST_ICEBERG_REST_URI"),
    ) else {
        return;
    };
    if python().is_none() {
        return;
    }
    let warehouse = std::env::var("WEIR_TEST_ICEBERG_REST_WAREHOUSE").unwrap_or_else(|_| "s3://weirtables/".into());
    let mut rest = TcpProxy::start(socket(&uri)).await.unwrap();
    // The table's files and the checkpoint have a proxy each, so each shows
    // that its requests went through one.
    let mut files = TcpProxy::start(socket(&endpoint)).await.unwrap();
    let mut checkpoints = TcpProxy::start(socket(&endpoint)).await.unwrap();
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    // The table's files are reached at the catalog's `s3.endpoint`: the
    // server's configuration could replace it (its overrides win), and
    // SeaweedFS's names its own S3 only in its answers to table loads,
    // which weir takes no storage settings from.
    let catalog = on_s3(CatalogConfig::rest(rest.http(), warehouse.as_str()), &files.http()).with_credential(format!(
        "{}:{}",
        env("AWS_ACCESS_KEY_ID"),
        env("AWS_SECRET_ACCESS_KEY")
    ));
    let catalogs = Catalogs::new(Config::empty().with_catalog("lake", catalog));
    let table = format!("net_{}.events", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let name = format!("lake.{table}");
    let bucket = std::env::var("WEIR_TEST_S3_BUCKET").unwrap_or_else(|_| "weir".into());
    let chk = format!("s3://{bucket}/network-rest/{}/chk/", uuid::Uuid::new_v4());
    let options = checkpoint_options(&checkpoints.http());
    let writer = || {
        read_stream(RateSource::rows_per_batch(10))
            .write_stream()
            .query_name("network")
            .checkpoint_location(&chk)
            .checkpoint_options(options.clone())
            .stop_after_batch(BatchId(99))
    };
    rest.cut_at_random(Duration::from_millis(800), 47);
    files.cut_at_random(Duration::from_millis(400), 53);
    checkpoints.cut_at_random(Duration::from_millis(400), 59);
    let stops = until_done(writer, &catalogs, &name, TableOptions::new, |_| {}).await;
    rest.calm();
    files.calm();
    checkpoints.calm();
    eprintln!(
        "REST: {stops} stops; connections cut open: {} of {} to the catalog, {} of {} to the table's S3, {} of {} to the checkpoint's",
        rest.severed(),
        rest.connections(),
        files.severed(),
        files.connections(),
        checkpoints.severed(),
        checkpoints.connections()
    );
    assert!(
        files.connections() > 0,
        "the table's files were not written through their proxy: the catalog's configuration replaced s3.endpoint"
    );
    assert!(
        rest.severed() >= 1 && files.severed() >= 3 && checkpoints.severed() >= 3,
        "too few connections cut to tell"
    );
    // Once more, calm: nothing left to do, and nothing repeated.
    run(writer(), &name, Some((&catalogs, TableOptions::new())))
        .await
        .unwrap();
    let reader = format!("rest+{uri}#{warehouse}");
    let ids = json_ids(&iceberg(&["ids", "pyiceberg", &reader, &table]).expect("readers present"));
    assert_exactly_once(&ids, 0..1_000);
}

/// How long S3 stays stalled or down in the outage tests: longer than the
/// checkpoint's lease (3 s) and than the few seconds the S3 clients' retries
/// of one request usually take, shorter than their 30 s request timeout, so
/// a stalled request is held, not timed out.
const OUTAGE: std::time::Duration = std::time::Duration::from_secs(8);

/// How a run ended: its error's message and whether a retry may help. A run
/// not ended two minutes on has hung: its S3 clients give up on a silent
/// server after 30 s.
async fn ended(query: &StreamingQuery) -> Result<(), (String, bool)> {
    tokio::time::timeout(std::time::Duration::from_secs(120), query.await_termination())
        .await
        .expect("the run hung: a request got no answer and no timeout ended it")
        .map_err(|e| (e.to_string(), e.retryable()))
}

/// A query whose table and checkpoint are on S3 behind one proxy (its
/// catalog, PostgreSQL, reached directly), with a 3 s lease: once a few
/// batches are in, S3 goes `mode` ([`Mode::Stall`]: every byte held in
/// both directions; [`Mode::Down`]: open connections cut, new ones closed
/// as they open) for longer than the lease, then passes again. The run
/// carries on, or stops with a retryable error that names the table or the
/// checkpoint; it never hangs. Restarts resume it to its last batch, one
/// more run finds nothing left to do, and the table holds every id once,
/// read past the proxy by the format's Python reader.
async fn s3_outage_loses_and_repeats_nothing(format: TableFormat, mode: Mode) {
    use std::time::Duration;
    use weir::catalog::{CatalogConfig, Config};

    let (Some(endpoint), Some(pg)) = (
        weir_test_support::service("WEIR_TEST_S3_ENDPOINT"),
        weir_test_support::service("WEIR_TEST_POSTGRES_URL"),
    ) else {
        return;
    };
    if python().is_none() {
        return;
    }
    let s3 = TcpProxy::start(socket(&endpoint)).await.unwrap();
    let bucket = std::env::var("WEIR_TEST_S3_BUCKET").unwrap_or_else(|_| "weir".into());
    // In the table's location and the checkpoint's, so an error naming
    // either names it.
    let run_path = format!("outage/{}", uuid::Uuid::new_v4());
    let prefix = format!("s3://{bucket}/{run_path}");
    let config = Config::empty().with_catalog(
        "lake",
        on_s3(
            CatalogConfig::sql(pg.as_str(), format!("{prefix}/warehouse")),
            &s3.http(),
        )
        .with_format(format),
    );
    let catalogs = Catalogs::new(config);
    let table = format!("outage_{}.events", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let name = format!("lake.{table}");
    let options = checkpoint_options(&s3.http());
    let last: u64 = 79;
    let writer = || {
        read_stream(RateSource::rows_per_batch(10))
            .write_stream()
            .query_name("outage")
            .checkpoint_location(format!("{prefix}/chk/"))
            .checkpoint_options(options.clone())
            .trigger(Trigger::processing_time(Duration::from_millis(100)))
            .stop_after_batch(BatchId(last))
    };
    let first = writer()
        .to_table_in(&catalogs, &name, TableOptions::new())
        .await
        .unwrap();
    while first.is_active() && first.last_progress().map_or(0, |p| p.batch_id.0) < 3 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        first.is_active(),
        "the first run ended before the outage: {:?}",
        first.exception()
    );
    s3.set(mode);
    tokio::time::sleep(OUTAGE).await;
    s3.set(Mode::Pass);
    let mut ran = ended(&first).await;
    let mut stops = 0;
    while let Err((message, retryable)) = &ran {
        assert!(*retryable, "S3 {mode:?} stopped the query for good: {message}");
        assert!(
            message.contains(&run_path) || message.contains(&table),
            "the error names neither the table nor the checkpoint: {message}"
        );
        stops += 1;
        assert!(stops < 100, "no progress: {message}");
        ran = match writer().to_table_in(&catalogs, &name, TableOptions::new()).await {
            Ok(q) => ended(&q).await,
            Err(e) => Err((e.to_string(), e.retryable())),
        };
    }
    eprintln!("{format:?}, S3 {mode:?} for {OUTAGE:?}: {stops} stops");
    // Once more: nothing left to do, and nothing repeated.
    run(writer(), &name, Some((&catalogs, TableOptions::new())))
        .await
        .unwrap();
    let ids = python_ids(format, &catalogs, &name, &pg).await;
    assert_exactly_once(&ids, 0..(last as i64 + 1) * 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_s3_loses_and_repeats_nothing_in_delta() {
    s3_outage_loses_and_repeats_nothing(TableFormat::Delta, Mode::Stall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_s3_loses_and_repeats_nothing_in_iceberg() {
    s3_outage_loses_and_repeats_nothing(TableFormat::Iceberg, Mode::Stall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_gone_down_loses_and_repeats_nothing_in_delta() {
    s3_outage_loses_and_repeats_nothing(TableFormat::Delta, Mode::Down).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_s3_gone_down_loses_and_repeats_nothing_in_iceberg() {
    s3_outage_loses_and_repeats_nothing(TableFormat::Iceberg, Mode::Down).await;
}
