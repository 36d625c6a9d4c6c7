//! A query's start: the checks that refuse a start before anything is
//! written, the lease, the start decision over the checkpoint and the
//! sink's marker ([`decide_start`]), the state restore, and the batch loop's
//! task.
//!
//! The decisions are pure functions over what was read (the mode rules,
//! the query's identity, I6, [`decide_start`], [`StartPlan::first_batch`]);
//! [`start`] reads the facts, asks them in order, and acts on the answers.

use std::sync::Arc;

use chrono::Utc;
use tokio::sync::watch;
use tracing::Instrument;

use super::handle::{QueryShared, StreamingQuery};
use super::options::StreamWriter;
use super::run::Driver;
use super::stateful::Stateful;
use super::trim::LogTrim;
use crate::checkpoint::{Checkpoint, CheckpointMetadata, LeaseOwner, FORMAT_VERSION};
use crate::error::{Error, Result};
use crate::ids::{BatchId, QueryId, QueryName, RunId};
use crate::operator::{check_query_mode, has_aggregation};
use crate::protocol::{decide_start, Refusal, SinkIdentity, SinkMarker, StartFacts, StartPlan};
use crate::sink::{Close, OutputMode, QueryInfo, Sink};
use crate::source::{Offset, SourceContext};

/// Runs the start-up sequence and spawns the batch loop.
pub(crate) async fn start(options: StreamWriter, sink: Arc<dyn Sink>) -> Result<StreamingQuery> {
    let sink_mode = check_modes(&options, sink.as_ref())?;
    let schemas = options.stream.schemas()?;
    let checkpoint = options.open_checkpoint()?;
    let run_id = RunId::new();
    let lease = checkpoint
        .store()
        .acquire_lease(&LeaseOwner::this_process(run_id.to_string()))
        .await?;

    let metadata = checkpoint.metadata().await?;
    let (query_id, query_name) = identify(&options, &checkpoint, metadata.as_ref())?;
    let span = tracing::info_span!("query", query = %query_name, query_id = %query_id, run_id = %run_id);
    // I6 before `prepare`, so that a refused start cannot create or alter a
    // table at the wrong place. Table ids are compared after `prepare`.
    check_same_sink(&options, &checkpoint, metadata.as_ref(), sink.as_ref())?;
    // The checkpoint's state must fit the operators before the sink is
    // prepared (which may create a table).
    if options.stream.is_stateful() {
        Stateful::check_recorded(&checkpoint, &options.stream).await?;
    }
    sink.prepare(&QueryInfo {
        query_id,
        query_name: query_name.clone(),
        output_mode: sink_mode,
        schema: schemas.output.clone(),
        key_columns: schemas.key_columns.clone(),
    })
    .await?;

    let source = options.stream.source.clone();
    let facts = start_facts(
        &checkpoint,
        metadata.as_ref(),
        sink.as_ref(),
        query_id,
        &query_name,
        source.description(),
    )
    .await?;
    let plan = decide_start(&facts, &options.overrides)?;
    tracing::info!(parent: &span, ?plan, last_planned = ?facts.last_planned, last_committed = ?facts.last_committed, marker = ?facts.marker, "starting query");
    let taken_over = record_metadata(&checkpoint, metadata, &facts, &plan).await?;

    source
        .open(&SourceContext {
            store: checkpoint.store().clone(),
            dir: format!("sources/{}", source.name()),
        })
        .await?;
    let last_end = match facts.last_planned {
        Some(p) => offset_of(&checkpoint, p, source.name()).await?,
        None => None,
    };
    // The operators start from the state after the newest batch planned
    // before the first one this run executes.
    let previous = checkpoint.offsets().latest_before(plan.first_batch()).await?;
    let last_watermark = previous.as_ref().map_or(0, |(_, e)| e.watermark_ms);
    let stateful = match options.stream.reads_whole_batches() {
        true => Some(
            Stateful::restore(
                &checkpoint,
                &options.stream,
                plan.first_batch(),
                previous.map(|(id, entry)| (id, entry.watermark_ms)),
                options.output_mode,
            )
            .await?,
        ),
        false => None,
    };
    let shared = Arc::new(QueryShared::default());
    let mut driver = Driver {
        trim: LogTrim::new(checkpoint.clone(), options.retain_batches),
        checkpoint,
        stream: options.stream.clone(),
        schema: schemas.output,
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

    let (stop_tx, stop_rx) = watch::channel(false);
    let task = tokio::spawn(run_to_end(driver, plan, stop_rx, shared.clone()).instrument(span));
    Ok(StreamingQuery::new(query_id, query_name, run_id, stop_tx, shared, task))
}

/// The output modes' rules, checked before anything is read or written:
/// the query's operators against its mode (Spark's rules), and the sink
/// against the mode it gets. Returns the sink's mode: without an
/// aggregation, Update hands the sink new rows only, which it appends.
fn check_modes(options: &StreamWriter, sink: &dyn Sink) -> Result<OutputMode> {
    let shape = options.stream.shape();
    check_query_mode(&shape, options.output_mode).map_err(|rule| Error::UnsupportedQuery {
        mode: options.output_mode,
        rule,
    })?;
    if options.output_mode == OutputMode::Complete {
        tracing::warn!(
            "Complete mode writes the whole result every batch: each batch costs as much as the result is large, and the result grows with every new group. Prefer Append with a watermark, or Update, for results that keep growing"
        );
    }
    if let Some((w, _)) = &options.stream.watermark {
        if !options.stream.is_stateful() {
            tracing::warn!(column = %w.column, "the query has a watermark but no stateful operator: no row is dropped as late and nothing waits for it");
        }
    }
    let sink_mode = match options.output_mode {
        OutputMode::Update if !has_aggregation(&shape) => OutputMode::Append,
        mode => mode,
    };
    sink.check_output_mode(sink_mode)
        .map_err(|reason| Error::UnsupportedOutputMode {
            mode: sink_mode,
            sink: sink.identity().to_string(),
            reason,
        })?;
    Ok(sink_mode)
}

/// The query's id and name: the checkpoint's, or new ones for a new
/// checkpoint. A name asked for that differs from the recorded one is
/// refused.
fn identify(
    options: &StreamWriter,
    checkpoint: &Checkpoint,
    metadata: Option<&CheckpointMetadata>,
) -> Result<(QueryId, QueryName)> {
    let requested = options.resolved_name()?;
    match metadata {
        Some(m) if options.query_name.is_some() && m.query_name != requested => Err(Error::QueryNameChanged {
            location: checkpoint.location().to_string(),
            recorded: m.query_name.clone(),
            requested,
        }),
        Some(m) => Ok((m.query_id, m.query_name.clone())),
        None => Ok((QueryId::new(), requested)),
    }
}

/// I6: the checkpoint's recorded sink is the one given (format and
/// location), unless the user accepts the change.
fn check_same_sink(
    options: &StreamWriter,
    checkpoint: &Checkpoint,
    metadata: Option<&CheckpointMetadata>,
    sink: &dyn Sink,
) -> Result<()> {
    let Some(m) = metadata else { return Ok(()) };
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
    Ok(())
}

/// Reads what [`decide_start`] decides on: the checkpoint's last planned
/// and committed batches and the sink's marker for the query's ids.
async fn start_facts(
    checkpoint: &Checkpoint,
    metadata: Option<&CheckpointMetadata>,
    sink: &dyn Sink,
    query_id: QueryId,
    query_name: &QueryName,
    source: String,
) -> Result<StartFacts> {
    let last_planned = checkpoint.offsets().latest().await?;
    let last_committed = checkpoint.commits().latest().await?;
    let recorded_takeover = metadata.and_then(|m| m.taken_over);
    let known_ids: Vec<QueryId> = std::iter::once(query_id)
        .chain(recorded_takeover.map(|m| m.query_id))
        .collect();
    let marker = if sink.keeps_marker() {
        sink.marker(query_name, &known_ids).await?
    } else {
        // Without a durable marker, the checkpoint is all there is: replay
        // the batch in flight (at least once).
        last_committed.map(|batch_id| SinkMarker { query_id, batch_id })
    };
    Ok(StartFacts {
        query_id,
        query_name: query_name.clone(),
        checkpoint: checkpoint.location().to_string(),
        last_planned,
        last_committed,
        recorded_sink: metadata.map(|m| m.sink.clone()),
        current_sink: sink.identity(),
        taken_over: recorded_takeover,
        sink_since: metadata.and_then(|m| m.sink_since),
        marker,
        recorded_sources: metadata.map(|m| m.sources.clone()).unwrap_or_default(),
        current_sources: vec![source],
    })
}

/// The batch loop's task: runs the batches, ends or aborts the work beside
/// them, closes the sink and releases the lease.
async fn run_to_end(
    mut driver: Driver,
    plan: StartPlan,
    stop: watch::Receiver<bool>,
    shared: Arc<QueryShared>,
) -> Result<()> {
    let result = match driver.run(plan, stop.clone()).await {
        Ok(()) => driver.finish().await,
        Err(e) => {
            driver.abort();
            Err(e)
        }
    };
    let result = close_sink(driver.sink.as_ref(), result, stop).await;
    if let Some(lease) = driver.lease.take() {
        if let Err(e) = lease.release().await {
            tracing::warn!(error = %e, "could not release the checkpoint's lease; it lapses instead");
        }
    }
    if let Err(e) = &result {
        tracing::error!(error = %e, "query stopped with an error");
        shared.set_error(e);
    }
    result
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

/// The end offset of `source` in `offsets/{batch}`.
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
