//! Batches through restarts, replays, racing commits and crashes at every
//! point of the commit sequence.

use std::sync::Arc;

use weir_core::crash::{CrashPoint, CrashPoints};
use weir_core::protocol::SinkMarker;
use weir_core::sink::{CommitMessage, CommitOutcome, Sink};
use weir_core::source::{MemoryStream, RateSource};
use weir_core::{read_stream, BatchId, Error, QueryId, StreamWriter};

use super::*;
use crate::data::assert_exactly_once;

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
    let mut input = Growing::new();

    let mut batch = 0u64;
    for point in CrashPoint::ALL {
        // Twice per point: the second crash hits the batch right after a restart.
        for _ in 0..2 {
            input.add_chunk();
            let armed = input
                .query(&chk)
                .crash_points(CrashPoints::new().fail_at(point, Some(BatchId(batch))));
            match run_to(h, armed, batch).await {
                Err(Error::InjectedCrash { point: p, batch_id }) => assert_eq!((p, batch_id), (point, BatchId(batch))),
                other => panic!("expected a crash at {point} in batch {batch}, got {other:?}"),
            }
            let total = input.add_chunk();
            run_to(h, input.query(&chk), batch + 1)
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

/// An at-least-once sink (no marker) through a crash at each named point,
/// then a restart: every row at least once, and a row twice only where it
/// belongs to the batch in flight at the crash, which the restart replays
/// with its logged offsets.
pub async fn crash_at_every_point_then_restart_is_at_least_once(h: &dyn SinkHarness) {
    assert!(!h.sink().await.keeps_marker(), "the case of sinks without a marker");
    let chk = CaseCheckpoint::new(h);
    let mut input = Growing::new();

    // Ids that may stand twice: those of each batch a crash cut short.
    let mut replayed: Vec<std::ops::Range<i64>> = Vec::new();
    let mut batch = 0u64;
    for point in CrashPoint::ALL {
        for _ in 0..2 {
            // The crashed batch reads exactly the chunk added just before it.
            let crashed = input.add_chunk();
            replayed.push(((crashed - 1) * ROWS) as i64..(crashed * ROWS) as i64);
            let armed = input
                .query(&chk)
                .crash_points(CrashPoints::new().fail_at(point, Some(BatchId(batch))));
            match run_to(h, armed, batch).await {
                Err(Error::InjectedCrash { point: p, batch_id }) => assert_eq!((p, batch_id), (point, BatchId(batch))),
                other => panic!("expected a crash at {point} in batch {batch}, got {other:?}"),
            }
            let total = input.add_chunk();
            run_to(h, input.query(&chk), batch + 1)
                .await
                .unwrap_or_else(|e| panic!("restart after {point}: {e}"));
            batch += 2;
            assert_at_least_once(&h.read_event_ids().await, 0..(total * ROWS) as i64, &replayed);
        }
    }
    assert_eq!(batch, 20);
}

/// A stream that grows by a chunk of the rate source's rows at a time,
/// while the query on it is down.
struct Growing {
    input: MemoryStream,
    chunks: u64,
}

impl Growing {
    fn new() -> Self {
        Growing {
            input: MemoryStream::new(RateSource::output_schema()),
            chunks: 0,
        }
    }

    /// Adds the next chunk; how many there are now.
    fn add_chunk(&mut self) -> u64 {
        let (from, to) = (self.chunks * ROWS, (self.chunks + 1) * ROWS);
        self.input.add_batch(RateSource::generate(from, to)).expect("add rows");
        self.chunks += 1;
        self.chunks
    }

    /// The conformance query on the stream.
    fn query(&self, chk: &CaseCheckpoint) -> StreamWriter {
        chk.on(read_stream(self.input.clone()).write_stream())
            .query_name(NAME)
            .writer_parallelism(2)
    }
}
