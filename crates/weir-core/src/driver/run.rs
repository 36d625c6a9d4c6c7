//! The driver: the commit sequence of every batch.
//!
//! ```text
//!  plan ──► offsets/N ──► read ─► transform ─► writers ──► sink.commit ──► commits/N ──► source.commit
//!  (latest   (write-ahead:  (rows stream into one writer     (one atomic     (recorded   (cleanup)
//!   offset)   N is fixed)    per partition; files invisible)  commit + marker) only after)
//! ```
//!
//! On start, [`crate::protocol::decide_start`] compares the checkpoint with
//! the sink's marker and says which logged batch to replay, which to record
//! without running, and where new batches start.

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
use super::handle::{QueryShared, StreamingQuery};
use super::options::{ProgressListener, StreamWriter};
use super::stateful::Stateful;
use super::stream::{check_schema, ReadStream};
use super::trigger::Trigger;
use super::trim::LogTrim;
use crate::checkpoint::{
    Checkpoint, CheckpointMetadata, CommitEntry, Lease, LeaseOwner, OffsetEntry, SourceOffset, FORMAT_VERSION,
};
use crate::crash::{CrashPoint, CrashPoints};
use crate::error::{Error, Result};
use crate::ids::{BatchId, QueryId, QueryName, RunId};
use crate::operator::{check_query_mode, has_aggregation};
use crate::progress::{PhaseDurations, QueryProgress, SinkProgress, SourceProgress};
use crate::protocol::{decide_start, Refusal, SinkIdentity, SinkMarker, StartFacts, StartPlan};
use crate::sink::{BatchContext, Close, CommitOutcome, OutputMode, QueryInfo, Sink};
use crate::source::{Offset, ReadLimit, SourceContext};

/// How often (in batches) old state files are swept.
const STATE_PURGE_EVERY: u64 = 10;

/// How long an idle query with a zero interval waits before asking again.
const IDLE_POLL: Duration = Duration::from_millis(100);

pub(crate) struct Driver {
    checkpoint: Checkpoint,
    stream: ReadStream,
    schema: SchemaRef,
    /// The schema after the stateless stages before the first operator.
    prefix_schema: SchemaRef,
    /// The operators and their state, for a stateful query.
    stateful: Option<Stateful>,
    /// The watermark recorded in the newest planned batch.
    last_watermark: i64,
    sink: Arc<dyn Sink>,
    /// The sink's identity as progress shows it, fixed at start.
    sink_description: String,
    query_id: QueryId,
    query_name: QueryName,
    run_id: RunId,
    trigger: Trigger,
    /// The query's output mode, as the operators see it.
    output_mode: OutputMode,
    /// The mode the sink gets (Append for Update without an aggregation).
    sink_mode: OutputMode,
    parallelism: usize,
    retain: u64,
    /// Deletes the log entries of batches before the retained ones.
    trim: LogTrim,
    crash: CrashPoints,
    listeners: Vec<Arc<ProgressListener>>,
    taken_over: Option<SinkMarker>,
    stop_after: Option<BatchId>,
    /// The next batch id to plan.
    next_batch: BatchId,
    /// The end offset of the last planned batch: where the next one starts.
    last_end: Option<Offset>,
    last_batch_started: Option<Instant>,
    shared: Arc<QueryShared>,
    /// Taken before anything is written; released when the query ends.
    lease: Option<Box<dyn Lease>>,
}

/// Runs the start-up sequence and spawns the batch loop.
pub(crate) async fn start(options: StreamWriter, sink: Arc<dyn Sink>) -> Result<StreamingQuery> {
    let shape = options.stream.shape();
    if let Err(rule) = check_query_mode(&shape, options.output_mode) {
        return Err(Error::UnsupportedQuery {
            mode: options.output_mode,
            rule,
        });
    }
    if options.output_mode == OutputMode::Complete {
        tracing::warn!(
            "Complete mode writes the whole result every batch: each batch costs as much as the result is large, and the result grows with every new group. Prefer Append with a watermark, or Update, for results that keep growing"
        );
    }
    // Without an aggregation, Update hands the sink new rows only: the
    // sink appends them, as in Append mode.
    let sink_mode = match options.output_mode {
        OutputMode::Update if !has_aggregation(&shape) => OutputMode::Append,
        mode => mode,
    };
    let schemas = options.stream.schemas()?;
    let schema = schemas.output.clone();
    if let Some((w, _)) = &options.stream.watermark {
        if !options.stream.is_stateful() {
            tracing::warn!(column = %w.column, "the query has a watermark but no stateful operator: no row is dropped as late and nothing waits for it");
        }
    }
    if let Err(reason) = sink.check_output_mode(sink_mode) {
        return Err(Error::UnsupportedOutputMode {
            mode: sink_mode,
            sink: sink.identity().to_string(),
            reason,
        });
    }
    let checkpoint = options.open_checkpoint()?;
    let run_id = RunId::new();
    let lease = checkpoint.store().acquire_lease(&lease_owner(run_id)).await?;

    let metadata = checkpoint.metadata().await?;
    let requested = options.resolved_name()?;
    let (query_id, query_name) = match &metadata {
        Some(m) if options.query_name.is_some() && m.query_name != requested => {
            return Err(Error::QueryNameChanged {
                location: checkpoint.location().to_string(),
                recorded: m.query_name.clone(),
                requested,
            })
        }
        Some(m) => (m.query_id, m.query_name.clone()),
        None => (QueryId::new(), requested),
    };
    let span = tracing::info_span!("query", query = %query_name, query_id = %query_id, run_id = %run_id);

    // I6 before `prepare`, so that a refused start cannot create or alter a
    // table at the wrong place. Table ids are compared after `prepare`.
    if let Some(m) = &metadata {
        let current = sink.identity();
        let moved = m.sink.format != current.format || m.sink.location != current.location;
        if moved && !options.overrides.allow_sink_change {
            return Err(Refusal::SinkChanged {
                checkpoint: checkpoint.location().to_string(),
                recorded: m.sink.clone(),
                current,
            }
            .into());
        }
    }
    let source = options.stream.source.clone();
    // The checkpoint's state must fit the operators before the sink is
    // prepared (which may create a table).
    if options.stream.is_stateful() {
        Stateful::check_recorded(&checkpoint, &options.stream).await?;
    }

    sink.prepare(&QueryInfo {
        query_id,
        query_name: query_name.clone(),
        output_mode: sink_mode,
        schema: schema.clone(),
        key_columns: schemas.key_columns.clone(),
    })
    .await?;
    let last_planned = checkpoint.offsets().latest().await?;
    let last_committed = checkpoint.commits().latest().await?;
    let recorded_takeover = metadata.as_ref().and_then(|m| m.taken_over);
    let known_ids: Vec<QueryId> = std::iter::once(query_id)
        .chain(recorded_takeover.map(|m| m.query_id))
        .collect();
    let marker = if sink.keeps_marker() {
        sink.marker(&query_name, &known_ids).await?
    } else {
        // Without a durable marker, the checkpoint is all there is: replay
        // the batch in flight (at least once).
        last_committed.map(|batch_id| SinkMarker { query_id, batch_id })
    };
    let facts = StartFacts {
        query_id,
        query_name: query_name.clone(),
        checkpoint: checkpoint.location().to_string(),
        last_planned,
        last_committed,
        recorded_sink: metadata.as_ref().map(|m| m.sink.clone()),
        current_sink: sink.identity(),
        taken_over: recorded_takeover,
        sink_since: metadata.as_ref().and_then(|m| m.sink_since),
        marker,
        recorded_sources: metadata.as_ref().map(|m| m.sources.clone()).unwrap_or_default(),
        current_sources: vec![source.description()],
    };
    let plan = decide_start(&facts, &options.overrides)?;
    tracing::info!(parent: &span, ?plan, ?last_planned, ?last_committed, ?marker, "starting query");
    let taken_over = record_metadata(&checkpoint, metadata, &facts, &plan).await?;

    source
        .open(&SourceContext {
            store: checkpoint.store().clone(),
            dir: format!("sources/{}", source.name()),
        })
        .await?;
    let last_end = match last_planned {
        Some(p) => offset_of(&checkpoint, p, source.name()).await?,
        None => None,
    };
    // The first batch this run executes, and the state it starts from: the
    // state after the newest batch planned before it.
    let first = match (plan.replay, plan.record_only) {
        (Some(b), _) => b,
        (None, Some(b)) => b.next(),
        (None, None) => plan.next_batch,
    };
    let previous = checkpoint.offsets().latest_before(first).await?;
    let last_watermark = previous.as_ref().map_or(0, |(_, e)| e.watermark_ms);
    let stateful = if options.stream.reads_whole_batches() {
        Some(
            Stateful::restore(
                &checkpoint,
                &options.stream,
                first,
                previous.map(|(id, entry)| (id, entry.watermark_ms)),
                options.output_mode,
            )
            .await?,
        )
    } else {
        None
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let shared = Arc::new(QueryShared::default());
    let task_shared = shared.clone();
    let mut driver = Driver {
        trim: LogTrim::new(checkpoint.clone(), options.retain_batches),
        checkpoint,
        stream: options.stream.clone(),
        schema,
        prefix_schema: schemas.prefix,
        stateful,
        last_watermark,
        sink_description: facts.current_sink.to_string(),
        sink,
        query_id,
        query_name: query_name.clone(),
        run_id,
        trigger: options.trigger,
        output_mode: options.output_mode,
        sink_mode,
        parallelism: options.parallelism,
        retain: options.retain_batches,
        crash: options.crash_points.clone().with_env()?,
        listeners: options.listeners.clone(),
        taken_over,
        stop_after: options.stop_after,
        next_batch: plan.next_batch,
        last_end,
        last_batch_started: None,
        shared: shared.clone(),
        lease: Some(lease),
    };
    if let Some(batch) = plan.record_only {
        // The sink holds the batch in flight: record it without running it.
        let end = offset_of(&driver.checkpoint, batch, source.name()).await?;
        driver.record(batch, None, end.as_ref()).await?;
    }
    driver.purge().await?;
    let stopping = stop_rx.clone();
    let task = tokio::spawn(
        async move {
            let result = match driver.run(plan, stop_rx).await {
                Ok(()) => driver.finish().await,
                Err(e) => {
                    driver.abort();
                    Err(e)
                }
            };
            let result = close_sink(driver.sink.as_ref(), result, stopping).await;
            if let Some(lease) = driver.lease.take() {
                if let Err(e) = lease.release().await {
                    tracing::warn!(error = %e, "could not release the checkpoint's lease; it lapses instead");
                }
            }
            if let Err(e) = &result {
                tracing::error!(error = %e, "query stopped with an error");
                task_shared.set_error(e);
            }
            result
        }
        .instrument(span),
    );
    Ok(StreamingQuery::new(query_id, query_name, run_id, stop_tx, shared, task))
}

/// Closes the sink of a query that ended with `result`: its background work
/// finishes when the query ran to its end, and is cancelled when it was
/// stopped or failed, or is stopped while the work finishes. A close error
/// is the query's only when the query ended well.
async fn close_sink(sink: &dyn Sink, result: Result<()>, mut stop: watch::Receiver<bool>) -> Result<()> {
    let stopped = *stop.borrow();
    let closed = if result.is_ok() && !stopped {
        let stop_asked = async move {
            if stop.wait_for(|s| *s).await.is_err() {
                // The query's handle is gone: nobody can stop it.
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            closed = sink.close(Close::Finish) => closed,
            () = stop_asked => sink.close(Close::Cancel).await,
        }
    } else {
        sink.close(Close::Cancel).await
    };
    result.and(closed)
}

/// Writes or updates the checkpoint's metadata after a start decision.
async fn record_metadata(
    checkpoint: &Checkpoint,
    existing: Option<CheckpointMetadata>,
    facts: &StartFacts,
    plan: &StartPlan,
) -> Result<Option<SinkMarker>> {
    let taken_over = plan.take_over.or(facts.taken_over);
    match existing {
        None => {
            let created = checkpoint
                .create_metadata(&CheckpointMetadata {
                    version: FORMAT_VERSION,
                    query_id: facts.query_id,
                    query_name: facts.query_name.clone(),
                    created_at: Utc::now(),
                    sink: facts.current_sink.clone(),
                    taken_over,
                    sink_since: plan.sink_since,
                    sources: facts.current_sources.clone(),
                })
                .await?;
            if created.query_id != facts.query_id {
                return Err(Error::ConcurrentRun {
                    query_id: created.query_id,
                    batch_id: plan.next_batch,
                    detail: "another run created this checkpoint at the same moment with another query id; this run wrote nothing".into(),
                });
            }
        }
        Some(old) => {
            let mut m = old.clone();
            let same_place =
                m.sink.format == facts.current_sink.format && m.sink.location == facts.current_sink.location;
            // A table id is filled in, never cleared: losing it would weaken I6.
            let table_id = match (&facts.current_sink.table_id, same_place) {
                (None, true) => m.sink.table_id.clone(),
                (id, _) => id.clone(),
            };
            m.sink = SinkIdentity {
                table_id,
                ..facts.current_sink.clone()
            };
            m.taken_over = taken_over;
            m.sink_since = plan.sink_since.or(m.sink_since);
            if m.sources.is_empty() {
                m.sources = facts.current_sources.clone();
            }
            if m != old {
                checkpoint.replace_metadata(&m).await?;
            }
        }
    }
    Ok(taken_over)
}

async fn offset_of(checkpoint: &Checkpoint, batch: BatchId, source: &str) -> Result<Option<Offset>> {
    let entry = checkpoint
        .offsets()
        .get(batch)
        .await?
        .ok_or_else(|| Error::CorruptCheckpoint {
            location: checkpoint.location().to_string(),
            path: format!("offsets/{batch}"),
            reason: "the entry vanished while the query was starting".into(),
        })?;
    entry
        .offset_of(source)
        .cloned()
        .map(Some)
        .ok_or_else(|| Error::CorruptCheckpoint {
            location: checkpoint.location().to_string(),
            path: format!("offsets/{batch}"),
            reason: format!("no offset for source {source:?}; the query's sources changed"),
        })
}

fn lease_owner(run_id: RunId) -> LeaseOwner {
    LeaseOwner::this_process(run_id.to_string())
}

impl Driver {
    async fn run(&mut self, plan: StartPlan, mut stop: watch::Receiver<bool>) -> Result<()> {
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
            if let Some((entry, start, plan_time)) = planned {
                self.run_batch(entry, start, plan_time, false).await?;
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
        self.run_batch(entry, start, Duration::ZERO, true).await
    }

    /// Plans the next batch and writes `offsets/N`; `None` if no new data.
    async fn plan(&mut self, limit: ReadLimit) -> Result<Option<(OffsetEntry, Option<Offset>, Duration)>> {
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
        Ok(Some((entry, start, started.elapsed())))
    }

    /// Read, write, commit and record one batch.
    async fn run_batch(
        &mut self,
        entry: OffsetEntry,
        start: Option<Offset>,
        plan_time: Duration,
        replayed: bool,
    ) -> Result<()> {
        let batch_id = entry.batch_id;
        let span = tracing::info_span!("batch", batch_id = %batch_id, replayed, attempt = tracing::field::Empty);
        self.run_batch_inner(entry, start, plan_time, replayed)
            .instrument(span)
            .await
    }

    async fn run_batch_inner(
        &mut self,
        entry: OffsetEntry,
        start: Option<Offset>,
        plan_time: Duration,
        replayed: bool,
    ) -> Result<()> {
        let started = Instant::now();
        let since_previous = self.last_batch_started.replace(started).map(|t| t.elapsed());
        let batch_id = entry.batch_id;
        let source = self.stream.source.clone();
        let end = entry
            .offset_of(source.name())
            .cloned()
            .ok_or_else(|| Error::CorruptCheckpoint {
                location: self.checkpoint.location().to_string(),
                path: format!("offsets/{batch_id}"),
                reason: format!("no offset for source {:?}", source.name()),
            })?;
        let ctx = BatchContext {
            query_id: self.query_id,
            query_name: self.query_name.clone(),
            run_id: self.run_id,
            batch_id,
            attempt_id: Uuid::new_v4(),
            output_mode: self.sink_mode,
            schema: self.schema.clone(),
            taken_over: self.taken_over,
        };
        tracing::Span::current().record("attempt", tracing::field::display(ctx.attempt_id));

        let write_started = Instant::now();
        let rows = if start.as_ref() == Some(&end) {
            // A batch without data, run because the watermark moved.
            futures::stream::empty().boxed()
        } else {
            source.read(start.as_ref(), &end).await?
        };
        let mut late_rows = 0;
        let written = match &mut self.stateful {
            None => {
                let (stream, schema) = (&self.stream, &self.prefix_schema);
                let transform = |b| stream.transform(b, batch_id, schema);
                write_batch(rows, &transform, &self.sink, &ctx, self.parallelism).await
            }
            Some(stateful) => {
                let (input, input_rows, read_time) =
                    read_whole(&self.stream, &self.prefix_schema, stateful, rows, batch_id).await?;
                let processed = stateful
                    .process(&self.stream, batch_id, entry.watermark_ms, self.output_mode, input)
                    .await?;
                late_rows = processed.late_rows;
                let output = futures::stream::iter(processed.output.into_iter().map(Ok)).boxed();
                let schema = &self.schema;
                let check = |b: RecordBatch| check_schema(&b, batch_id, schema).map(|()| b);
                write_batch(output, &check, &self.sink, &ctx, self.parallelism)
                    .await
                    .map(|w| Written {
                        input_rows,
                        read_time,
                        ..w
                    })
            }
        };
        let written = match written {
            Ok(w) => w,
            Err(WriteFailure { error, messages }) => {
                if let Err(e) = self.sink.abort(&ctx, messages).await {
                    tracing::warn!(error = %e, "abort after a failed write also failed");
                }
                return Err(error);
            }
        };
        let write_time = write_started.elapsed();
        self.crash.hit(CrashPoint::AfterDataWritten, batch_id)?;

        let state_started = Instant::now();
        if let Some(stateful) = &mut self.stateful {
            stateful.persist(batch_id).await?;
        }
        let state_time = state_started.elapsed();
        self.crash.hit(CrashPoint::AfterStateWritten, batch_id)?;

        let commit_started = Instant::now();
        let Written {
            messages,
            input_rows,
            output_rows,
            partitions,
            read_time,
        } = written;
        // No abort after a failed commit: the error may hide a commit that
        // landed (a timeout after the swap), and deleting its files would lose
        // rows. Files of a commit that did not land are orphans for vacuum.
        // A run whose lease lapsed (a paused process) leaves the batch to
        // the run that holds it now.
        if let Some(lease) = &self.lease {
            lease.check()?;
        }
        let outcome = self.sink.commit(&ctx, messages.clone()).await?;
        let commit_time = commit_started.elapsed();
        let version = match outcome {
            CommitOutcome::Committed { version } => version,
            CommitOutcome::AlreadyCommitted(marker) => return Err(self.lost_race(&ctx, messages, marker).await),
        };
        self.crash.hit(CrashPoint::AfterSinkCommit, batch_id)?;

        let record_started = Instant::now();
        self.record(batch_id, version, Some(&end)).await?;
        let record_time = record_started.elapsed();
        self.last_end = Some(end.clone());
        self.next_batch = self.next_batch.max(batch_id.next());

        let total = plan_time + started.elapsed();
        let per_sec = |d: Duration| {
            if d.is_zero() {
                0.0
            } else {
                input_rows as f64 / d.as_secs_f64()
            }
        };
        let progress = QueryProgress {
            query_id: self.query_id,
            query_name: self.query_name.clone(),
            run_id: self.run_id,
            batch_id,
            timestamp: chrono::DateTime::from_timestamp_millis(entry.timestamp_ms).unwrap_or_else(Utc::now),
            replayed,
            input_rows,
            output_rows,
            input_rows_per_second: since_previous.map(per_sec).unwrap_or(0.0),
            processed_rows_per_second: per_sec(total),
            partitions,
            durations_ms: PhaseDurations {
                plan: ms(plan_time),
                read: ms(read_time),
                write: ms(write_time.saturating_sub(read_time)),
                state: ms(state_time),
                commit: ms(commit_time),
                record: ms(record_time),
                total: ms(total),
            },
            sources: vec![SourceProgress {
                source: source.name().to_string(),
                metrics: source.metrics(&end),
                start_offset: start,
                end_offset: end,
            }],
            sink: SinkProgress {
                description: self.sink_description.clone(),
                version,
            },
            watermark: (entry.watermark_ms != 0)
                .then(|| chrono::DateTime::from_timestamp_millis(entry.watermark_ms))
                .flatten(),
            late_rows,
            state: self.stateful.as_ref().map(|s| s.progress()).unwrap_or_default(),
        };
        progress.emit();
        for listener in &self.listeners {
            listener(&progress);
        }
        self.shared.push_progress(progress);
        Ok(())
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
    async fn record(&mut self, batch_id: BatchId, sink_version: Option<i64>, end: Option<&Offset>) -> Result<()> {
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
    async fn finish(&mut self) -> Result<()> {
        self.trim.finish().await?;
        if let Some(stateful) = &mut self.stateful {
            stateful.finish().await?;
        }
        Ok(())
    }

    /// Stops the work left beside the batches when the run failed: no task
    /// outlives it, nor so its lease.
    fn abort(&mut self) {
        self.trim.abort();
        if let Some(stateful) = &mut self.stateful {
            stateful.abort();
        }
    }

    /// Trims the logs and the state to the retained batches.
    async fn purge(&mut self) -> Result<()> {
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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
