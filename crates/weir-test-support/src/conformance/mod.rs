//! The sink conformance suite: what every sink must do for the engine's
//! guarantees to hold. Each case takes a harness on a fresh table, drives
//! real queries over the deterministic rate source (100 rows per batch,
//! event ids equal to offsets), and reads the table back through the
//! harness, checking every event id exactly once (at least once, for the
//! cases of sinks without a marker).
//!
//! The cases, by what they hold: `batches.rs` (restarts, replays, racing
//! commits, crashes at every point), `guards.rs` (the checkpoint's lease
//! and the start-up guards I4, I4b and I6), `modes.rs` (output modes);
//! `harness.rs` says what a sink under test gives them.

mod batches;
mod guards;
mod harness;
mod modes;

use std::collections::HashMap;
use std::time::Duration;

use arrow_array::RecordBatch;
use futures::TryStreamExt;
use weir_core::protocol::Refusal;
use weir_core::sink::{BatchContext, CommitMessage, QueryInfo, Sink};
use weir_core::source::{Offset, RateSource, Source};
use weir_core::{
    read_stream, BatchId, Error, OutputMode, QueryId, QueryName, ReadStream, RunId, StreamWriter, Trigger,
};

pub use batches::*;
pub use guards::*;
use harness::CaseCheckpoint;
pub use harness::{copy_dir, ObjectCheckpoints, SinkHarness};
pub use modes::*;

use crate::operators::CountByKey;

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
