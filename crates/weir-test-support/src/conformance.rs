//! The sink conformance suite: what every sink must do for the engine's
//! guarantees to hold. Each case takes a harness on a fresh table, drives
//! real queries over the deterministic rate source (100 rows per batch,
//! event ids equal to offsets), and reads the table back through the
//! harness, checking every event id exactly once.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use weir_core::crash::{CrashPoint, CrashPoints};
use weir_core::protocol::{Refusal, SinkMarker};
use weir_core::sink::{BatchContext, CommitMessage, CommitOutcome, QueryInfo, Sink};
use weir_core::source::{MemoryStream, Offset, RateSource, Source};
use weir_core::{
    read_stream, BatchId, Error, OutputMode, QueryId, QueryName, ReadStream, RunId, StreamWriter, Trigger,
};

use crate::data::assert_exactly_once;
use crate::operators::CountByKey;

/// A sink under test, on one table.
#[async_trait]
pub trait SinkHarness: Send + Sync {
    /// A new handle on the table under test, as a restarted process would
    /// open it. The table may be created by the sink's `prepare`.
    async fn sink(&self) -> Arc<dyn Sink>;

    /// A handle on a different table: the same other table on every call.
    async fn other_sink(&self) -> Arc<dyn Sink>;

    /// Drops the table and makes a new empty one at the same place, as a
    /// restore or a re-creation would.
    async fn recreate_table(&self);

    /// The `event_id` of every row in the table, read back (by an
    /// independent reader where the sink is a table format).
    async fn read_event_ids(&self) -> Vec<i64>;

    /// Whether, in Update mode, a row replaces the sink's row of the same
    /// group (a table sink's upsert), rather than following it (a log of
    /// changes, as Kafka keeps).
    fn replaces_groups(&self) -> bool {
        false
    }

    /// Why the suite cannot run here (a service that is not running), if so.
    /// The cases then print the reason and do nothing; a harness must not
    /// give a reason in CI, where every service is started.
    fn skip_reason(&self) -> Option<String> {
        None
    }

    /// Where the cases keep their checkpoints: a new local directory for
    /// each unless the harness names object storage, where each case takes
    /// a fresh prefix under it.
    fn checkpoints(&self) -> Option<ObjectCheckpoints> {
        None
    }
}

/// Checkpoints on object storage: a URL prefix (`s3://bucket/prefix`), the
/// options a query opens it with, and the bucket's store, to copy and
/// inspect checkpoints behind the query's back.
#[derive(Clone)]
pub struct ObjectCheckpoints {
    /// The store of the URL's bucket (the URL's path is a path in it).
    pub store: Arc<dyn ObjectStore>,
    /// The prefix under which every case makes its checkpoints.
    pub url: String,
    /// The query's `checkpoint_options`.
    pub options: HashMap<String, String>,
}

#[cfg(feature = "s3")]
impl ObjectCheckpoints {
    /// Checkpoints under `prefix` in the test S3's bucket
    /// (`WEIR_TEST_S3_ENDPOINT`, `WEIR_TEST_S3_BUCKET`), with the
    /// credentials and region of the environment and a lease short enough
    /// for a case to see it pass on; `None` without the test S3.
    pub fn test_s3(prefix: &str) -> Option<Self> {
        let endpoint = crate::service("WEIR_TEST_S3_ENDPOINT")?;
        let bucket = std::env::var("WEIR_TEST_S3_BUCKET").unwrap_or_else(|_| "weir".into());
        let store = object_store::aws::AmazonS3Builder::from_env()
            .with_endpoint(&endpoint)
            .with_allow_http(true)
            .with_bucket_name(&bucket)
            .build()
            .expect("an S3 store");
        let options = [
            ("aws_endpoint", endpoint.as_str()),
            ("aws_allow_http", "true"),
            ("lease_ttl_ms", "6000"),
            ("lease_renew_ms", "500"),
            ("lease_clock_skew_ms", "1000"),
        ];
        Some(Self {
            store: Arc::new(store),
            url: format!("s3://{bucket}/{}", prefix.trim_matches('/')),
            options: options.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        })
    }
}

#[cfg(feature = "azure")]
impl ObjectCheckpoints {
    /// Checkpoints under `prefix` in the test Azurite's container
    /// (`WEIR_TEST_AZURE_ENDPOINT`, `WEIR_TEST_AZURE_CONTAINER`), opened
    /// with Azurite's published development account, as an `az://` URL;
    /// `None` without the test Azurite.
    pub fn test_azure(prefix: &str) -> Option<Self> {
        /// Azurite's well-known development account and key (not secrets).
        const ACCOUNT: &str = "devstoreaccount1";
        const KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
        let endpoint = crate::service("WEIR_TEST_AZURE_ENDPOINT")?;
        let container = std::env::var("WEIR_TEST_AZURE_CONTAINER").unwrap_or_else(|_| "weir".into());
        let options = [
            ("azure_storage_account_name", ACCOUNT),
            ("azure_storage_account_key", KEY),
            ("azure_storage_endpoint", endpoint.as_str()),
            ("azure_allow_http", "true"),
            ("lease_ttl_ms", "6000"),
            ("lease_renew_ms", "500"),
            ("lease_clock_skew_ms", "1000"),
        ];
        let mut builder = object_store::azure::MicrosoftAzureBuilder::new().with_container_name(&container);
        for (key, value) in &options[..4] {
            builder = builder.with_config(key.parse().expect("an Azure option"), *value);
        }
        Some(Self {
            store: Arc::new(builder.build().expect("an Azure store")),
            url: format!("az://{container}/{}", prefix.trim_matches('/')),
            options: options.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        })
    }
}

/// One case's checkpoint: a local directory or a fresh prefix on object
/// storage.
enum CaseCheckpoint {
    Dir(tempfile::TempDir),
    Object {
        objects: ObjectCheckpoints,
        url: String,
        /// The checkpoint's root in `objects.store`.
        root: ObjectPath,
    },
}

impl CaseCheckpoint {
    /// A new, empty checkpoint where the harness keeps them.
    fn new(h: &dyn SinkHarness) -> Self {
        let Some(objects) = h.checkpoints() else {
            return Self::Dir(tempfile::tempdir().expect("tempdir"));
        };
        let url = format!("{}/{}", objects.url.trim_end_matches('/'), uuid::Uuid::new_v4());
        let root = ObjectPath::from(
            url::Url::parse(&url)
                .expect("a checkpoint URL")
                .path()
                .trim_matches('/'),
        );
        Self::Object { objects, url, root }
    }

    /// The location a query is given.
    fn location(&self) -> String {
        match self {
            Self::Dir(dir) => dir.path().to_string_lossy().into_owned(),
            Self::Object { url, .. } => url.clone(),
        }
    }

    /// `writer` with this checkpoint as its location.
    fn on(&self, writer: StreamWriter) -> StreamWriter {
        let writer = writer.checkpoint_location(self.location());
        match self {
            Self::Dir(_) => writer,
            Self::Object { objects, .. } => writer.checkpoint_options(objects.options.clone()),
        }
    }

    /// Whether the checkpoint holds the file `relative` (as `commits/1`).
    async fn has(&self, relative: &str) -> bool {
        match self {
            Self::Dir(dir) => dir.path().join(relative).exists(),
            Self::Object { objects, root, .. } => {
                let path = relative.split('/').fold(root.clone(), |p, part| p.join(part));
                match objects.store.head(&path).await {
                    Ok(_) => true,
                    Err(object_store::Error::NotFound { .. }) => false,
                    Err(e) => panic!("head {path}: {e}"),
                }
            }
        }
    }

    /// Copies this checkpoint into `to` (an old copy of it), as a restore
    /// from a backup would.
    async fn copy_to(&self, to: &CaseCheckpoint) {
        match (self, to) {
            (Self::Dir(from), Self::Dir(into)) => copy_dir(from.path(), into.path()),
            (
                Self::Object {
                    objects, root: from, ..
                },
                Self::Object { root: into, .. },
            ) => {
                let files: Vec<_> = objects
                    .store
                    .list(Some(from))
                    .try_collect()
                    .await
                    .expect("list the checkpoint");
                for file in files {
                    let relative = file.location.prefix_match(from).expect("under the checkpoint");
                    let target = relative.fold(into.clone(), |p, part| p.join(part));
                    objects
                        .store
                        .copy(&file.location, &target)
                        .await
                        .expect("copy a checkpoint file");
                }
            }
            _ => unreachable!("both checkpoints are where the harness keeps them"),
        }
    }
}

const ROWS: u64 = 100;
const NAME: &str = "conformance";

fn query(checkpoint: &CaseCheckpoint) -> StreamWriter {
    query_of(read_stream(RateSource::rows_per_batch(ROWS)), checkpoint)
}

/// The conformance query's settings on `stream`.
fn query_of(stream: ReadStream, checkpoint: &CaseCheckpoint) -> StreamWriter {
    checkpoint
        .on(stream.write_stream())
        .query_name(NAME)
        .trigger(Trigger::processing_time(Duration::ZERO))
        .writer_parallelism(2)
}

/// The query with each id's count as its result: an aggregation, for the
/// modes that need one.
fn counted(checkpoint: &CaseCheckpoint) -> StreamWriter {
    let stream = read_stream(RateSource::rows_per_batch(ROWS)).with_operator(CountByKey::new("ids", "event_id"));
    query_of(stream, checkpoint)
}

/// Update mode hands the sink each batch's changed groups (here each id
/// once, as ids never repeat), or is refused.
pub async fn update_mode_is_honoured_or_refused(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    let supported = h.sink().await.check_output_mode(OutputMode::Update).is_ok();
    let result = run_to(h, counted(&chk).output_mode(OutputMode::Update), 2).await;
    if supported {
        result.expect("update mode");
        assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..3));
    } else {
        assert!(
            matches!(
                result,
                Err(Error::UnsupportedOutputMode {
                    mode: OutputMode::Update,
                    ..
                })
            ),
            "{result:?}"
        );
        // Refused before the sink was prepared or the checkpoint written.
        assert!(!chk.has("metadata").await);
    }
}

/// Update mode with groups that change in every batch (seven groups of the
/// ids modulo 7, counted): a sink that replaces groups holds each once with
/// its latest count, one that logs changes holds each batch's change; or
/// the mode is refused.
pub async fn update_mode_replaces_or_logs_changed_groups(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    let stream = crate::operators::counted_groups(ROWS, 7);
    let writer = query_of(stream, &chk).output_mode(OutputMode::Update);
    if h.sink().await.check_output_mode(OutputMode::Update).is_err() {
        let result = run_to(h, writer, 2).await;
        assert!(matches!(result, Err(Error::UnsupportedOutputMode { .. })), "{result:?}");
        return;
    }
    run_to(h, writer, 2).await.expect("update mode");
    let ids = h.read_event_ids().await;
    if h.replaces_groups() {
        assert_exactly_once(&ids, 0..7);
    } else {
        // Every batch of 100 ids changes all seven groups.
        let expected: Vec<i64> = (0..3).flat_map(|_| 0..7).collect();
        let mut got = ids.clone();
        got.sort_unstable();
        let mut expected = expected;
        expected.sort_unstable();
        assert_eq!(got, expected);
    }
}

/// Runs the query until batch `last` is committed.
async fn run_to(h: &dyn SinkHarness, writer: StreamWriter, last: u64) -> Result<(), Error> {
    let q = writer.stop_after_batch(BatchId(last)).start_arc(h.sink().await).await?;
    q.await_termination().await
}

/// The event ids of batches `range`.
fn ids_of_batches(range: std::ops::Range<u64>) -> std::ops::Range<i64> {
    (range.start * ROWS) as i64..(range.end * ROWS) as i64
}

fn refusal(result: Result<(), Error>) -> Refusal {
    match result {
        Err(Error::Refused(r)) => *r,
        other => panic!("expected a guard's refusal, got {other:?}"),
    }
}

/// Copies a directory tree (a checkpoint, to make an old copy of it).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy");
    for entry in std::fs::read_dir(from).expect("read the checkpoint") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy a file");
        }
    }
}

fn name() -> QueryName {
    QueryName::new(NAME).expect("valid name")
}

fn batch_ctx(query_id: QueryId, batch: u64) -> BatchContext {
    BatchContext {
        query_id,
        query_name: name(),
        run_id: RunId::new(),
        batch_id: BatchId(batch),
        attempt_id: uuid::Uuid::new_v4(),
        output_mode: OutputMode::Append,
        schema: RateSource::output_schema(),
        taken_over: None,
    }
}

async fn prepare(sink: &dyn Sink, query_id: QueryId) {
    sink.prepare(&QueryInfo {
        query_id,
        query_name: name(),
        output_mode: OutputMode::Append,
        schema: RateSource::output_schema(),
        key_columns: Vec::new(),
    })
    .await
    .expect("prepare the sink");
}

/// Writes the rate source's batch `batch` through one writer.
async fn write_batch(sink: &dyn Sink, ctx: &BatchContext) -> Vec<CommitMessage> {
    try_write_batch(sink, ctx).await.expect("write the batch")
}

/// [`write_batch`], with the writer's error.
async fn try_write_batch(sink: &dyn Sink, ctx: &BatchContext) -> Result<Vec<CommitMessage>, Error> {
    let source = RateSource::rows_per_batch(ROWS);
    let start = (ctx.batch_id.0 > 0).then(|| Offset(serde_json::json!({"next_event_id": ctx.batch_id.0 * ROWS})));
    let end = Offset(serde_json::json!({"next_event_id": (ctx.batch_id.0 + 1) * ROWS}));
    let rows: Vec<RecordBatch> = source
        .read(start.as_ref(), &end)
        .await
        .expect("read")
        .try_collect()
        .await
        .expect("rows");
    let mut writer = sink.create_writer(ctx, 0)?;
    for b in rows {
        writer.write(b).await?;
    }
    Ok(vec![writer.commit().await?])
}

/// Batches run, stop and restart: every row once.
pub async fn every_batch_once_across_restarts(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    run_to(h, query(&chk), 2).await.expect("first run");
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..3));
    run_to(h, query(&chk), 5).await.expect("second run");
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..6));
}

/// A second commit of a committed batch (a replay) commits nothing.
pub async fn commit_is_idempotent_per_batch(h: &dyn SinkHarness) {
    let sink = h.sink().await;
    let qid = QueryId::new();
    prepare(sink.as_ref(), qid).await;
    let first = batch_ctx(qid, 0);
    let messages = write_batch(sink.as_ref(), &first).await;
    assert!(matches!(
        sink.commit(&first, messages).await.expect("commit"),
        CommitOutcome::Committed { .. }
    ));

    let replay = batch_ctx(qid, 0);
    let sink = h.sink().await;
    prepare(sink.as_ref(), qid).await;
    let messages = write_batch(sink.as_ref(), &replay).await;
    let outcome = sink.commit(&replay, messages.clone()).await.expect("replayed commit");
    let expected = SinkMarker {
        query_id: qid,
        batch_id: BatchId(0),
    };
    assert_eq!(outcome, CommitOutcome::AlreadyCommitted(expected));
    sink.abort(&replay, messages).await.expect("abort the replay");
    assert_eq!(sink.marker(&name(), &[qid]).await.expect("marker"), Some(expected));
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..1));
}

/// Two runs committing the same batch at the same moment: one wins. The
/// other finds the batch committed, or, with a sink that fences the older
/// of two runs of a query (Kafka's transactional ids), is stopped as a
/// concurrent run before it commits.
pub async fn racing_commits_of_one_batch_commit_once(h: &dyn SinkHarness) {
    let qid = QueryId::new();
    let (a, b) = (h.sink().await, h.sink().await);
    prepare(a.as_ref(), qid).await;
    prepare(b.as_ref(), qid).await;
    let (ctx_a, ctx_b) = (batch_ctx(qid, 0), batch_ctx(qid, 0));
    let (msg_a, msg_b) = (
        try_write_batch(a.as_ref(), &ctx_a).await,
        try_write_batch(b.as_ref(), &ctx_b).await,
    );
    let commit = |sink: &Arc<dyn Sink>, ctx, messages: Result<Vec<CommitMessage>, Error>| {
        let sink = sink.clone();
        async move { sink.commit(ctx, messages?).await }
    };
    let (ra, rb) = tokio::join!(commit(&a, &ctx_a, msg_a), commit(&b, &ctx_b, msg_b));
    let committed = [ra, rb]
        .into_iter()
        .filter(|r| match r {
            Ok(CommitOutcome::Committed { .. }) => true,
            Ok(CommitOutcome::AlreadyCommitted(_)) | Err(Error::ConcurrentRun { .. }) => false,
            Err(e) => panic!("a racing commit commits, finds the batch, or is stopped as a concurrent run: {e}"),
        })
        .count();
    assert_eq!(committed, 1, "exactly one of two racing commits commits");
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..1));
}

/// A batch whose rows are all filtered out still moves the marker, so a
/// restart resumes after it.
pub async fn empty_batch_commits_the_marker(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    let drop_all = chk
        .on(read_stream(RateSource::rows_per_batch(ROWS))
            .map_batches(|b| Ok(b.slice(0, 0)))
            .write_stream())
        .query_name(NAME);
    run_to(h, drop_all, 1).await.expect("empty batches");
    let sink = h.sink().await;
    let marker = sink
        .marker(&name(), &[])
        .await
        .expect("marker")
        .expect("the empty batches set a marker");
    assert_eq!(marker.batch_id, BatchId(1));
    assert!(h.read_event_ids().await.is_empty());
    run_to(h, query(&chk), 2).await.expect("resume");
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(2..3));
}

/// A crash at each named point, then a restart: every row once. New rows
/// arrive while the query is down, so a restart that planned the crashed
/// batch again instead of replaying its logged offsets would lose or repeat
/// them.
pub async fn crash_at_every_point_then_restart_is_exactly_once(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    let input = MemoryStream::new(RateSource::output_schema());
    let mut chunks = 0u64;
    let mut add_chunk = || {
        input
            .add_batch(RateSource::generate(chunks * ROWS, (chunks + 1) * ROWS))
            .expect("add rows");
        chunks += 1;
        chunks
    };
    let growing = || {
        chk.on(read_stream(input.clone()).write_stream())
            .query_name(NAME)
            .writer_parallelism(2)
    };
    let mut batch = 0u64;
    for point in CrashPoint::ALL {
        // Twice per point: the second crash hits the batch right after a restart.
        for _ in 0..2 {
            add_chunk();
            let armed = growing().crash_points(CrashPoints::new().fail_at(point, Some(BatchId(batch))));
            match run_to(h, armed, batch).await {
                Err(Error::InjectedCrash { point: p, batch_id }) => assert_eq!((p, batch_id), (point, BatchId(batch))),
                other => panic!("expected a crash at {point} in batch {batch}, got {other:?}"),
            }
            let total = add_chunk();
            run_to(h, growing(), batch + 1)
                .await
                .unwrap_or_else(|e| panic!("restart after {point}: {e}"));
            batch += 2;
            assert_exactly_once(&h.read_event_ids().await, 0..(total * ROWS) as i64);
        }
    }
    assert_eq!(batch, 20);
}

/// The sink committed but `commits/N` was never written: the restart
/// records the batch from the sink's marker instead of running it again.
pub async fn sink_commit_without_commit_log_is_recorded_not_rerun(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    let armed = query(&chk).crash_points(CrashPoints::new().fail_at(CrashPoint::AfterSinkCommit, Some(BatchId(1))));
    assert!(matches!(run_to(h, armed, 3).await, Err(Error::InjectedCrash { .. })));
    let q = query(&chk)
        .stop_after_batch(BatchId(3))
        .start_arc(h.sink().await)
        .await
        .expect("restart");
    q.await_termination().await.expect("run");
    let batches: Vec<BatchId> = q.recent_progress().iter().map(|p| p.batch_id).collect();
    assert_eq!(
        batches,
        vec![BatchId(2), BatchId(3)],
        "batch 1 is recorded, not run again"
    );
    assert!(chk.has("commits/1").await);
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..4));
}

/// I5: a second query on a checkpoint in use is refused.
pub async fn second_query_on_a_checkpoint_is_refused(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    let slow = || query(&chk).trigger(Trigger::processing_time(Duration::from_secs(3600)));
    let first = slow().start_arc(h.sink().await).await.expect("first query");
    match slow().start_arc(h.sink().await).await {
        Err(Error::CheckpointInUse { location, owner }) => {
            assert!(location.contains(chk.location().trim_end_matches('/')), "{location}");
            assert!(owner.contains(&first.run_id().to_string()), "names the holder: {owner}");
        }
        other => panic!("expected CheckpointInUse, got {other:?}"),
    }
    wait_for_batch(&first).await;
    first.stop_and_wait().await.expect("stop");
    let second = slow().start_arc(h.sink().await).await.expect("free after stop");
    wait_for_batch(&second).await;
    second.stop_and_wait().await.expect("stop");
    let ids = h.read_event_ids().await;
    assert!(!ids.is_empty() && ids.len() % ROWS as usize == 0);
    assert_exactly_once(&ids, 0..ids.len() as i64);
}

/// Waits (up to a minute) until the query has committed a batch.
async fn wait_for_batch(q: &weir_core::StreamingQuery) {
    for _ in 0..6000 {
        if q.last_progress().is_some() {
            return;
        }
        assert!(q.is_active(), "the query stopped: {:?}", q.exception());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no batch committed in a minute");
}

/// I4b: a new checkpoint for a name with output under another query id is
/// refused; the explicit takeover continues after the old marker.
pub async fn deleted_checkpoint_is_refused_then_taken_over(h: &dyn SinkHarness) {
    let (old, new) = (CaseCheckpoint::new(h), CaseCheckpoint::new(h));
    run_to(h, query(&old), 1).await.expect("old checkpoint");
    let r = refusal(run_to(h, query(&new), 3).await);
    assert!(matches!(r, Refusal::OutputOfAnotherQuery { .. }), "{r}");
    assert!(r.to_string().contains("take_over_output"));
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..2));

    run_to(h, query(&new).take_over_output(true), 3)
        .await
        .expect("take over");
    let marker = h
        .sink()
        .await
        .marker(&name(), &[])
        .await
        .expect("marker")
        .expect("a marker");
    assert_eq!(marker.batch_id, BatchId(3), "batch ids continue after the old marker");
    // The new checkpoint read its source from the start, as documented: the
    // old rows and the new checkpoint's first two batches.
    let mut ids = h.read_event_ids().await;
    ids.sort_unstable();
    let expected: Vec<i64> = ids_of_batches(0..2).flat_map(|i| [i, i]).collect();
    assert_eq!(ids, expected);

    let r = refusal(run_to(h, query(&old), 5).await);
    assert!(
        matches!(r, Refusal::OutputOfAnotherQuery { .. }),
        "the old checkpoint is now refused: {r}"
    );
}

/// I4 (T > P): an old copy of the checkpoint is refused.
pub async fn old_checkpoint_copy_is_refused(h: &dyn SinkHarness) {
    let (chk, copy) = (CaseCheckpoint::new(h), CaseCheckpoint::new(h));
    run_to(h, query(&chk), 1).await.expect("run");
    chk.copy_to(&copy).await;
    run_to(h, query(&chk), 3).await.expect("run on");
    let r = refusal(run_to(h, query(&copy), 5).await);
    assert!(
        matches!(
            r,
            Refusal::SinkAhead {
                marker: BatchId(3),
                planned: Some(BatchId(1)),
                ..
            }
        ),
        "{r}"
    );
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..4));
}

/// I4 (T < C): a table that lost committed batches is refused. A sink whose
/// tables have ids sees a re-created table as another table (I6).
pub async fn lost_table_is_refused(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    run_to(h, query(&chk), 1).await.expect("run");
    h.recreate_table().await;
    let accepted = match refusal(run_to(h, query(&chk), 3).await) {
        Refusal::SinkBehind {
            committed: BatchId(1),
            marker: None,
            ..
        } => query(&chk).accept_lost_batches(true),
        Refusal::SinkChanged { .. } => query(&chk).allow_sink_change(true),
        other => panic!("expected SinkBehind or SinkChanged, got {other}"),
    };
    run_to(h, accepted, 3).await.expect("accepted");
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(2..4));
}

/// I6: a checkpoint started against another sink is refused; the explicit
/// change sends later batches there and is remembered.
pub async fn other_sink_is_refused(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    run_to(h, query(&chk), 0).await.expect("run");
    let on_other = |writer: StreamWriter, last: u64| async move {
        let q = writer
            .stop_after_batch(BatchId(last))
            .start_arc(h.other_sink().await)
            .await?;
        q.await_termination().await
    };
    assert!(matches!(
        refusal(on_other(query(&chk), 2).await),
        Refusal::SinkChanged { .. }
    ));
    on_other(query(&chk).allow_sink_change(true), 2)
        .await
        .expect("allowed change");
    on_other(query(&chk), 3)
        .await
        .expect("a restart on the new sink needs no option");
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..1));
}

/// Two copies of one checkpoint running at once: each batch lands once; the
/// loser stops with a clear error.
pub async fn concurrent_copies_of_a_query_write_each_batch_once(h: &dyn SinkHarness) {
    let (a, b) = (CaseCheckpoint::new(h), CaseCheckpoint::new(h));
    run_to(h, query(&a), 0).await.expect("first batch");
    a.copy_to(&b).await;
    let (ra, rb) = tokio::join!(run_to(h, query(&a), 5), run_to(h, query(&b), 5));
    let lost = |r: &Result<(), Error>| match r {
        Ok(()) => false,
        Err(Error::ConcurrentRun { .. }) => true,
        Err(Error::Refused(r)) if matches!(**r, Refusal::SinkAhead { .. }) => true,
        Err(e) => panic!("unexpected error: {e}"),
    };
    assert_eq!(
        lost(&ra) as u8 + lost(&rb) as u8,
        1,
        "exactly one copy stops: {ra:?} {rb:?}"
    );
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..6));
    // The losing copy is refused from then on, never recorded as committed.
    let loser = if lost(&ra) { &a } else { &b };
    let r = refusal(run_to(h, query(loser), 8).await);
    assert!(matches!(r, Refusal::SinkAhead { .. }), "{r}");
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..6));
}

/// Complete mode replaces the table's rows with the whole result each
/// batch, or is refused.
pub async fn output_modes_are_honoured_or_refused(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    let supported = h.sink().await.check_output_mode(OutputMode::Complete).is_ok();
    let result = run_to(h, counted(&chk).output_mode(OutputMode::Complete), 2).await;
    if supported {
        result.expect("complete mode");
        // Each id once: the last batch's whole result replaced the others.
        assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..3));
    } else {
        assert!(
            matches!(
                result,
                Err(Error::UnsupportedOutputMode {
                    mode: OutputMode::Complete,
                    ..
                })
            ),
            "{result:?}"
        );
        assert!(h.read_event_ids().await.is_empty());
    }
}

/// An at-least-once sink (no marker) through a crash at each named point,
/// then a restart: every row at least once, and a row twice only where it
/// belongs to the batch in flight at the crash, which the restart replays
/// with its logged offsets.
pub async fn crash_at_every_point_then_restart_is_at_least_once(h: &dyn SinkHarness) {
    assert!(!h.sink().await.keeps_marker(), "the case of sinks without a marker");
    let chk = CaseCheckpoint::new(h);
    let input = MemoryStream::new(RateSource::output_schema());
    let mut chunks = 0u64;
    let mut add_chunk = || {
        input
            .add_batch(RateSource::generate(chunks * ROWS, (chunks + 1) * ROWS))
            .expect("add rows");
        chunks += 1;
        chunks
    };
    let growing = || {
        chk.on(read_stream(input.clone()).write_stream())
            .query_name(NAME)
            .writer_parallelism(2)
    };
    // Ids that may stand twice: those of each batch a crash cut short.
    let mut replayed: Vec<std::ops::Range<i64>> = Vec::new();
    let mut batch = 0u64;
    for point in CrashPoint::ALL {
        for _ in 0..2 {
            // The crashed batch reads exactly the chunk added just before it.
            let crashed = add_chunk();
            replayed.push(((crashed - 1) * ROWS) as i64..(crashed * ROWS) as i64);
            let armed = growing().crash_points(CrashPoints::new().fail_at(point, Some(BatchId(batch))));
            match run_to(h, armed, batch).await {
                Err(Error::InjectedCrash { point: p, batch_id }) => assert_eq!((p, batch_id), (point, BatchId(batch))),
                other => panic!("expected a crash at {point} in batch {batch}, got {other:?}"),
            }
            let total = add_chunk();
            run_to(h, growing(), batch + 1)
                .await
                .unwrap_or_else(|e| panic!("restart after {point}: {e}"));
            batch += 2;
            assert_at_least_once(&h.read_event_ids().await, 0..(total * ROWS) as i64, &replayed);
        }
    }
    assert_eq!(batch, 20);
}

/// Every id of `expected` in `ids`, none other; twice at most, and twice
/// only within one of `may_repeat`.
fn assert_at_least_once(ids: &[i64], expected: std::ops::Range<i64>, may_repeat: &[std::ops::Range<i64>]) {
    let mut counts: HashMap<i64, usize> = HashMap::new();
    for id in ids {
        *counts.entry(*id).or_default() += 1;
    }
    for id in expected.clone() {
        let n = counts.remove(&id).unwrap_or(0);
        assert!(n >= 1, "id {id} is missing");
        let repeatable = may_repeat.iter().any(|r| r.contains(&id));
        assert!(
            n == 1 || (repeatable && n == 2),
            "id {id} stands {n} times; only ids of a batch cut short by a crash may stand twice"
        );
    }
    assert!(
        counts.is_empty(),
        "ids outside {expected:?}: {:?}",
        counts.keys().take(10).collect::<Vec<_>>()
    );
}
