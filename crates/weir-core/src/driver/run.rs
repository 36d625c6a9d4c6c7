//! The driver: the commit sequence of every batch.
//!
//! ```text
//!  plan ──► offsets/N ──► read ─► transform ─► writers ──► sink.commit ──► commits/N ──► source.commit
//!  (latest   (write-ahead:  (rows stream into one writer     (one atomic     (recorded   (cleanup)
//!   offset)   N is fixed)    per partition; files invisible)  commit + marker) only after)
//! ```
//!
//! [`super::start`] decides where a run begins (which logged batch to
//! replay, which to record without running, where new batches start) and
//! hands this loop the [`StartPlan`]; [`super::progress`] builds each
//! batch's progress record.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use chrono::Utc;
use futures::StreamExt;
use tokio::sync::watch;
use tracing::Instrument;
use uuid::Uuid;

use super::batch::{write_batch, WriteFailure, Written};
use super::handle::QueryShared;
use super::options::ProgressListener;
use super::progress::{BatchClock, BatchDone, RanIn};
use super::stateful::Stateful;
use super::stream::{check_schema, ReadStream};
use super::trigger::Trigger;
use super::trim::LogTrim;
use crate::checkpoint::{Checkpoint, CommitEntry, Lease, OffsetEntry, SourceOffset, FORMAT_VERSION};
use crate::crash::{CrashPoint, CrashPoints};
use crate::error::{Error, Result};
use crate::ids::{BatchId, QueryId, QueryName, RunId};
use crate::protocol::{SinkMarker, StartPlan};
use crate::sink::{BatchContext, CommitOutcome, OutputMode, Sink};
use crate::source::{Offset, ReadLimit};

/// How often (in batches) old state files are swept.
const STATE_PURGE_EVERY: u64 = 10;

/// How long an idle query with a zero interval waits before asking again.
const IDLE_POLL: Duration = Duration::from_millis(100);

/// A batch whose offsets are logged: its entry, where its source starts,
/// and what planning it took (zero for a batch an earlier run planned).
struct Planned {
    entry: OffsetEntry,
    start: Option<Offset>,
    plan_time: Duration,
}

pub(crate) struct Driver {
    pub(super) checkpoint: Checkpoint,
    pub(super) stream: ReadStream,
    pub(super) schema: SchemaRef,
    /// The schema after the stateless stages before the first operator.
    pub(super) prefix_schema: SchemaRef,
    /// The operators and their state, for a stateful query.
    pub(super) stateful: Option<Stateful>,
    /// The watermark recorded in the newest planned batch.
    pub(super) last_watermark: i64,
    pub(super) sink: Arc<dyn Sink>,
    /// The sink's identity as progress shows it, fixed at start.
    pub(super) sink_description: String,
    pub(super) query_id: QueryId,
    pub(super) query_name: QueryName,
    pub(super) run_id: RunId,
    pub(super) trigger: Trigger,
    /// The query's output mode, as the operators see it.
    pub(super) output_mode: OutputMode,
    /// The mode the sink gets (Append for Update without an aggregation).
    pub(super) sink_mode: OutputMode,
    pub(super) parallelism: usize,
    pub(super) retain: u64,
    /// Deletes the log entries of batches before the retained ones.
    pub(super) trim: LogTrim,
    pub(super) crash: CrashPoints,
    pub(super) listeners: Vec<Arc<ProgressListener>>,
    pub(super) taken_over: Option<SinkMarker>,
    pub(super) stop_after: Option<BatchId>,
    /// The next batch id to plan.
    pub(super) next_batch: BatchId,
    /// The end offset of the last planned batch: where the next one starts.
    pub(super) last_end: Option<Offset>,
    pub(super) last_batch_started: Option<Instant>,
    pub(super) shared: Arc<QueryShared>,
    /// Taken before anything is written; released when the query ends.
    pub(super) lease: Option<Box<dyn Lease>>,
}

impl Driver {
    pub(super) async fn run(&mut self, plan: StartPlan, mut stop: watch::Receiver<bool>) -> Result<()> {
        if let Some(batch) = plan.replay {
            self.replay(batch).await?;
        }
        if self.trigger == Trigger::AvailableNow {
            self.stream.source.prepare_for_available_now().await?;
        }
        let limit = if self.trigger == Trigger::Once {
            ReadLimit::All
        } else {
            ReadLimit::Default
        };
        loop {
            if *stop.borrow() || self.reached_stop_batch() {
                return Ok(());
            }
            let tick = Instant::now();
            let planned = self.plan(limit).await?;
            let had_data = planned.is_some();
            if let Some(batch) = planned {
                self.run_batch(batch, false).await?;
            }
            let wait = match self.trigger {
                Trigger::Once => return Ok(()),
                Trigger::AvailableNow if !had_data => return Ok(()),
                Trigger::AvailableNow => continue,
                Trigger::ProcessingTime(interval) if interval.is_zero() => {
                    if had_data {
                        continue;
                    }
                    IDLE_POLL
                }
                Trigger::ProcessingTime(interval) => interval.saturating_sub(tick.elapsed()),
            };
            let stop_asked = async {
                if stop.changed().await.is_err() {
                    // The query's handle is gone: nobody can stop it, and
                    // the loop must still wait out its interval.
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                () = stop_asked => {}
            }
        }
    }

    fn reached_stop_batch(&self) -> bool {
        self.stop_after.is_some_and(|last| self.next_batch > last)
    }

    /// Runs a batch planned by an earlier run, with its logged offsets.
    async fn replay(&mut self, batch: BatchId) -> Result<()> {
        let entry = self
            .checkpoint
            .offsets()
            .get(batch)
            .await?
            .ok_or_else(|| Error::CorruptCheckpoint {
                location: self.checkpoint.location().to_string(),
                path: format!("offsets/{batch}"),
                reason: "the batch to replay has no offsets".into(),
            })?;
        let start = match self.checkpoint.offsets().latest_before(batch).await? {
            Some((_, prev)) => prev.offset_of(self.stream.source.name()).cloned(),
            None => None,
        };
        tracing::info!(batch_id = %batch, "replaying a batch planned by an earlier run");
        self.last_watermark = entry.watermark_ms;
        let batch = Planned {
            entry,
            start,
            plan_time: Duration::ZERO,
        };
        self.run_batch(batch, true).await
    }

    /// Plans the next batch and writes `offsets/N`; `None` if no new data.
    async fn plan(&mut self, limit: ReadLimit) -> Result<Option<Planned>> {
        let started = Instant::now();
        let source = self.stream.source.clone();
        let start = self.last_end.clone();
        let watermark_ms = self
            .stateful
            .as_ref()
            .map_or(0, |s| s.next_watermark(self.last_watermark));
        let latest = source.latest_offset(start.as_ref(), limit).await?;
        let Some(end) = crate::watermark::next_end(start.as_ref(), latest, watermark_ms, self.last_watermark) else {
            return Ok(None);
        };
        let batch_id = self.next_batch;
        let entry = OffsetEntry {
            version: FORMAT_VERSION,
            batch_id,
            timestamp_ms: Utc::now().timestamp_millis(),
            watermark_ms,
            sources: vec![SourceOffset {
                source: source.name().to_string(),
                offset: end,
            }],
        };
        if !self.checkpoint.offsets().add(batch_id, &entry).await? {
            return Err(Error::ConcurrentRun {
                query_id: self.query_id,
                batch_id,
                detail: format!("another run wrote offsets/{batch_id} of this checkpoint at the same time with other offsets; this run stopped before reading anything"),
            });
        }
        self.last_watermark = watermark_ms;
        self.crash.hit(CrashPoint::AfterOffsetsWritten, batch_id)?;
        Ok(Some(Planned {
            entry,
            start,
            plan_time: started.elapsed(),
        }))
    }

    /// Read, write, commit and record one batch.
    async fn run_batch(&mut self, batch: Planned, replayed: bool) -> Result<()> {
        let span =
            tracing::info_span!("batch", batch_id = %batch.entry.batch_id, replayed, attempt = tracing::field::Empty);
        self.run_batch_inner(batch, replayed).instrument(span).await
    }

    async fn run_batch_inner(&mut self, batch: Planned, replayed: bool) -> Result<()> {
        let Planned {
            entry,
            start,
            plan_time,
        } = batch;
        let mut clock = BatchClock::start(plan_time, &mut self.last_batch_started);
        let batch_id = entry.batch_id;
        let end = self.end_of(&entry)?;
        let ctx = self.context(batch_id);
        tracing::Span::current().record("attempt", tracing::field::display(ctx.attempt_id));

        let written = self.write(&ctx, start.as_ref(), &end, entry.watermark_ms).await?;
        clock.wrote(written.read_time);
        self.crash.hit(CrashPoint::AfterDataWritten, batch_id)?;

        if let Some(stateful) = &mut self.stateful {
            stateful.persist(batch_id).await?;
        }
        clock.state_written();
        self.crash.hit(CrashPoint::AfterStateWritten, batch_id)?;

        // No abort after a failed commit: the error may hide a commit that
        // landed (a timeout after the swap), and deleting its files would lose
        // rows. Files of a commit that did not land are orphans for vacuum.
        // A run whose lease lapsed (a paused process) leaves the batch to
        // the run that holds it now.
        if let Some(lease) = &self.lease {
            lease.check()?;
        }
        let version = match self.sink.commit(&ctx, written.messages.clone()).await? {
            CommitOutcome::Committed { version } => version,
            CommitOutcome::AlreadyCommitted(marker) => {
                return Err(self.lost_race(&ctx, written.messages, marker).await);
            }
        };
        clock.committed();
        self.crash.hit(CrashPoint::AfterSinkCommit, batch_id)?;

        self.record(batch_id, version, Some(&end)).await?;
        clock.recorded();
        self.last_end = Some(end.clone());
        self.next_batch = self.next_batch.max(batch_id.next());

        self.report(BatchDone {
            entry: &entry,
            start,
            end,
            replayed,
            written: &written,
            version,
            clock,
        });
        Ok(())
    }

    /// Hands the batch's progress record to the log, the listeners and the
    /// query's handle.
    fn report(&self, done: BatchDone<'_>) {
        let progress = done.progress(RanIn {
            query_id: self.query_id,
            query_name: &self.query_name,
            run_id: self.run_id,
            source: self.stream.source.as_ref(),
            sink: &self.sink_description,
            state: self.stateful.as_ref().map(|s| s.progress()).unwrap_or_default(),
        });
        progress.emit();
        for listener in &self.listeners {
            listener(&progress);
        }
        self.shared.push_progress(progress);
    }

    /// The end offset of the batch's source in its log entry.
    fn end_of(&self, entry: &OffsetEntry) -> Result<Offset> {
        let source = self.stream.source.name();
        entry
            .offset_of(source)
            .cloned()
            .ok_or_else(|| Error::CorruptCheckpoint {
                location: self.checkpoint.location().to_string(),
                path: format!("offsets/{}", entry.batch_id),
                reason: format!("no offset for source {source:?}"),
            })
    }

    /// What the sink's writers and commit know of a batch's attempt.
    fn context(&self, batch_id: BatchId) -> BatchContext {
        BatchContext {
            query_id: self.query_id,
            query_name: self.query_name.clone(),
            run_id: self.run_id,
            batch_id,
            attempt_id: Uuid::new_v4(),
            output_mode: self.sink_mode,
            schema: self.schema.clone(),
            taken_over: self.taken_over,
        }
    }

    /// Reads the batch's rows from `start` to `end`, runs them through the
    /// query (and its operators, over their state) and into the sink's
    /// writers. The files of a failed write are aborted.
    async fn write(
        &mut self,
        ctx: &BatchContext,
        start: Option<&Offset>,
        end: &Offset,
        watermark_ms: i64,
    ) -> Result<Written> {
        let batch_id = ctx.batch_id;
        let rows = if start == Some(end) {
            // A batch without data, run because the watermark moved.
            futures::stream::empty().boxed()
        } else {
            self.stream.source.read(start, end).await?
        };
        let written = match &mut self.stateful {
            None => {
                let (stream, schema) = (&self.stream, &self.prefix_schema);
                let transform = |b| stream.transform(b, batch_id, schema);
                write_batch(rows, &transform, &self.sink, ctx, self.parallelism).await
            }
            Some(stateful) => {
                let (input, input_rows, read_time) =
                    read_whole(&self.stream, &self.prefix_schema, stateful, rows, batch_id).await?;
                let processed = stateful
                    .process(&self.stream, batch_id, watermark_ms, self.output_mode, input)
                    .await?;
                let output = futures::stream::iter(processed.output.into_iter().map(Ok)).boxed();
                let schema = &self.schema;
                let check = |b: RecordBatch| check_schema(&b, batch_id, schema).map(|()| b);
                write_batch(output, &check, &self.sink, ctx, self.parallelism)
                    .await
                    .map(|w| Written {
                        input_rows,
                        read_time,
                        late_rows: processed.late_rows,
                        ..w
                    })
            }
        };
        match written {
            Ok(w) => Ok(w),
            Err(WriteFailure { error, messages }) => {
                if let Err(e) = self.sink.abort(ctx, messages).await {
                    tracing::warn!(error = %e, "abort after a failed write also failed");
                }
                Err(error)
            }
        }
    }

    /// The sink already holds a batch this run was about to commit: another
    /// run of the same query id (a copy of the checkpoint) committed it, maybe
    /// with other offsets. This run discards its files and takes `offsets/N`
    /// out of its log, so that the sink's marker is ahead of this checkpoint
    /// and every later start of this copy is refused (I4) instead of
    /// recording a batch whose rows it never wrote.
    async fn lost_race(
        &self,
        ctx: &BatchContext,
        messages: Vec<crate::sink::CommitMessage>,
        marker: SinkMarker,
    ) -> Error {
        if let Err(e) = self.sink.abort(ctx, messages).await {
            tracing::warn!(error = %e, "could not remove the files of a batch another run committed; they are orphans");
        }
        let withdrawn = self.checkpoint.offsets().remove(ctx.batch_id).await;
        if let Err(e) = &withdrawn {
            tracing::warn!(error = %e, "could not take the batch out of the offset log");
        }
        tracing::error!(%marker, "another run of the same query committed this batch");
        Error::ConcurrentRun {
            query_id: self.query_id,
            batch_id: ctx.batch_id,
            detail: format!(
                "the sink already holds {marker}, committed by another run of the same query id (a copy of this checkpoint). This run committed nothing of it{}",
                if withdrawn.is_ok() { " and took the batch out of its offset log, so this copy of the checkpoint is refused from now on; keep the checkpoint of the run that went on" } else { "" }
            ),
        }
    }

    /// Writes `commits/N`, runs the source's commit hook, and trims the logs.
    pub(super) async fn record(
        &mut self,
        batch_id: BatchId,
        sink_version: Option<i64>,
        end: Option<&Offset>,
    ) -> Result<()> {
        let entry = CommitEntry {
            version: FORMAT_VERSION,
            batch_id,
            committed_at_ms: Utc::now().timestamp_millis(),
            sink_version,
        };
        // An existing entry means another run recorded the same commit.
        self.checkpoint.commits().add(batch_id, &entry).await?;
        self.crash.hit(CrashPoint::AfterCommitLog, batch_id)?;
        if let Some(end) = end {
            self.stream.source.commit(end).await?;
        }
        self.trim.recorded(batch_id)?;
        // State files outlive a batch's log entries by a few batches: they
        // are swept together, every few batches.
        if batch_id.0.is_multiple_of(STATE_PURGE_EVERY) {
            if let Some(stateful) = &self.stateful {
                stateful
                    .purge_before(BatchId((batch_id.0 + 1).saturating_sub(self.retain)))
                    .await?;
            }
        }
        Ok(())
    }

    /// Ends the work left beside the batches (the logs' trims, a state
    /// snapshot) when the run ended well.
    pub(super) async fn finish(&mut self) -> Result<()> {
        self.trim.finish().await?;
        if let Some(stateful) = &mut self.stateful {
            stateful.finish().await?;
        }
        Ok(())
    }

    /// Stops the work left beside the batches when the run failed: no task
    /// outlives it, nor so its lease.
    pub(super) fn abort(&mut self) {
        self.trim.abort();
        if let Some(stateful) = &mut self.stateful {
            stateful.abort();
        }
    }

    /// Trims the logs and the state to the retained batches.
    pub(super) async fn purge(&mut self) -> Result<()> {
        let kept_from = self.trim.purge().await?;
        if let (Some(stateful), Some(kept_from)) = (&self.stateful, kept_from) {
            stateful.purge_before(kept_from).await?;
        }
        Ok(())
    }
}

/// Reads a whole batch through the per-record-batch stages before the
/// first whole-batch stage (noting event times where the watermark is set);
/// returns its record batches, the rows read, and the time spent waiting on
/// the source.
async fn read_whole(
    stream: &ReadStream,
    schema: &SchemaRef,
    stateful: &mut Stateful,
    mut rows: crate::source::BatchStream,
    batch_id: BatchId,
) -> Result<(Vec<RecordBatch>, u64, Duration)> {
    let mut batches = Vec::new();
    let mut read_time = Duration::ZERO;
    let mut input_rows = 0u64;
    loop {
        let waited = Instant::now();
        let next = rows.next().await;
        read_time += waited.elapsed();
        let Some(batch) = next else { break };
        let batch = batch?;
        input_rows += batch.num_rows() as u64;
        let observe = &mut |b: &RecordBatch| stateful.observe(b);
        batches.push(stream.transform_observed(batch, batch_id, schema, observe)?);
    }
    Ok((batches, input_rows, read_time))
}
