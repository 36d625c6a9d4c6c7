//! The part of a batch that sees it whole: the watermark, late rows, the
//! whole-batch transformations, the operators and their state in the
//! checkpoint.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use super::stream::{ReadStream, Stage};
use crate::checkpoint::Checkpoint;
use crate::error::{BoxError, Error, Result, Transient};
use crate::ids::BatchId;
use crate::operator::{OperatorContext, StateContext, StatefulOperator};
use crate::progress::StateProgress;
use crate::sink::OutputMode;
use crate::state::{KeyedState, Snapshots, StateManifest, StateStore, DEFAULT_SNAPSHOT_EVERY};
use crate::watermark::{next_watermark, Watermark};

/// The stages of a query from the first that sees whole batches on, with
/// the operators' state as of the last batch run (or restored).
pub(crate) struct Stateful {
    store: StateStore,
    /// Snapshots of the state made beside the batches.
    snapshots: Snapshots,
    watermark: Option<Watermark>,
    /// Each operator, its input's schema and its state.
    operators: Vec<(Arc<dyn StatefulOperator>, SchemaRef, KeyedState)>,
    /// The manifest of the state the operators hold.
    manifest: Option<StateManifest>,
    /// The latest event time seen up to the state's batch.
    max_event_ms: Option<i64>,
    /// The watermark of the state's batch (0 for none): rows reaching an
    /// operator after the first are late when at or before it.
    previous_watermark_ms: i64,
}

/// What the stateful part made of a batch's rows.
pub(crate) struct Processed {
    pub output: Vec<RecordBatch>,
    pub late_rows: u64,
}

impl Stateful {
    /// The operators with the state after the newest batch before `first`
    /// (the first batch this run executes). `previous` is the newest batch
    /// in the offset log before `first`, with its watermark.
    pub(crate) async fn restore(
        checkpoint: &Checkpoint,
        stream: &ReadStream,
        first: BatchId,
        previous: Option<(BatchId, i64)>,
        output_mode: OutputMode,
    ) -> Result<Self> {
        let (previous, previous_watermark_ms) = match previous {
            Some((id, watermark)) => (Some(id), watermark),
            None => (None, 0),
        };
        let state_ctx = StateContext::new(output_mode, stream.watermark.as_ref().map(|(w, _)| w.column.clone()));
        let store = StateStore::new(checkpoint.store().clone(), DEFAULT_SNAPSHOT_EVERY);
        let mut input = stream.schemas()?.prefix;
        let mut operators = Vec::new();
        for stage in &stream.stages[stream.prefix_len()..] {
            match stage {
                Stage::Map(f) => {
                    input = f(RecordBatch::new_empty(input))
                        .map_err(|source| Error::Transform {
                            batch_id: first,
                            source,
                        })?
                        .schema();
                }
                Stage::Batch(t) => {
                    input = t.output_schema(&input).map_err(|source| Error::Transform {
                        batch_id: first,
                        source,
                    })?;
                }
                Stage::Operator(op) => {
                    let schema = op.state_schema(&input, &state_ctx).map_err(|source| Error::Transform {
                        batch_id: first,
                        source: format!("the state schema of operator {:?}: {source}", op.name()).into(),
                    })?;
                    let state = KeyedState::new(schema)
                        .map_err(|e| Error::arrow(format!("the state of operator {:?}", op.name()), e))?;
                    let output = op.output_schema(&input).map_err(|source| Error::Transform {
                        batch_id: first,
                        source,
                    })?;
                    operators.push((op.clone(), input, state));
                    input = output;
                }
            }
        }
        let manifest = match previous {
            // Without operators there is no state (and no watermark).
            _ if operators.is_empty() => None,
            None => None,
            Some(prev) => Some(store.manifest(prev).await?.ok_or_else(|| Error::CorruptCheckpoint {
                location: checkpoint.location().to_string(),
                path: format!("state/_manifest/{prev}"),
                reason: format!(
                    "batch {prev} was planned but its operator state is missing: the state was deleted, or the checkpoint was made by a query without these stateful operators. Restore the state, or start the query on a new checkpoint"
                ),
            })?),
        };
        if let Some(m) = &manifest {
            let current: Vec<&str> = operators.iter().map(|(op, _, _)| op.name()).collect();
            check_names(checkpoint, m, &current)?;
            for (op, _, state) in &mut operators {
                let files = m.operator(op.name()).expect("names compared above");
                store.restore(files, state).await?;
            }
        }
        Ok(Stateful {
            snapshots: Snapshots::new(store.clone()),
            store,
            watermark: stream
                .watermark
                .as_ref()
                .filter(|_| !operators.is_empty())
                .map(|(w, _)| w.clone()),
            max_event_ms: manifest.as_ref().and_then(|m| m.max_event_time_ms),
            manifest,
            operators,
            previous_watermark_ms,
        })
    }

    /// Refuses a checkpoint whose last committed batch has no state for
    /// these operators (before the query changes anything).
    pub(crate) async fn check_recorded(checkpoint: &Checkpoint, stream: &ReadStream) -> Result<()> {
        let Some(committed) = checkpoint.commits().latest().await? else {
            return Ok(());
        };
        let store = StateStore::new(checkpoint.store().clone(), DEFAULT_SNAPSHOT_EVERY);
        let current: Vec<&str> = stream.operators().map(|op| op.name()).collect();
        match store.manifest(committed).await? {
            Some(m) => check_names(checkpoint, &m, &current),
            None => Err(Error::StateChanged {
                location: checkpoint.location().to_string(),
                reason: format!(
                    "batch {committed} was committed without the state of the operators {current:?}: the checkpoint was made by a query without them, or its state was deleted"
                ),
            }),
        }
    }

    /// The watermark of the batch after one whose watermark was `current`.
    pub(crate) fn next_watermark(&self, current: i64) -> i64 {
        match &self.watermark {
            Some(w) => next_watermark(current, self.max_event_ms, w.delay),
            None => 0,
        }
    }

    /// Runs every stage from the first operator on, each operator's late
    /// input rows dropped.
    pub(crate) async fn process(
        &mut self,
        stream: &ReadStream,
        batch_id: BatchId,
        watermark_ms: i64,
        mode: OutputMode,
        mut rows: Vec<RecordBatch>,
    ) -> Result<Processed> {
        let mut late_rows = 0;
        let mut ctx = OperatorContext {
            batch_id,
            input_schema: Arc::new(arrow_schema::Schema::empty()),
            output_mode: mode,
            event_time_column: self.watermark.as_ref().map(|w| w.column.clone()),
            watermark_ms: (self.watermark.is_some() && watermark_ms != 0).then_some(watermark_ms),
            watermark_delay: self.watermark.as_ref().map(|w| w.delay),
        };
        let mut next = 0;
        let watermark_at = stream.watermark.as_ref().map(|(_, at)| *at);
        for (i, stage) in stream.stages.iter().enumerate().skip(stream.prefix_len()) {
            if watermark_at == Some(i) {
                for batch in &rows {
                    self.observe(batch)?;
                }
            }
            rows = match stage {
                Stage::Map(f) => rows
                    .into_iter()
                    .map(|b| f(b).map_err(|source| Error::Transform { batch_id, source }))
                    .collect::<Result<_>>()?,
                Stage::Batch(t) => t
                    .transform(rows, batch_id)
                    .await
                    .map_err(|source| Error::Transform { batch_id, source })?,
                Stage::Operator(_) => {
                    // Every operator whose input has the event-time column
                    // drops late rows, as Spark's stateful operators do: the
                    // first those at or before the batch's watermark, the
                    // others those at or before the previous batch's, so a
                    // stage before them cannot put rows into windows emitted
                    // already, while the windows an earlier aggregation
                    // closed in this batch pass. Complete mode takes late
                    // rows too, as Spark does: its groups are emitted whole
                    // every batch, never final.
                    if mode != OutputMode::Complete && self.has_event_time(&self.operators[next].1) {
                        let late_at = if next == 0 {
                            watermark_ms
                        } else {
                            self.previous_watermark_ms
                        };
                        let (kept, late) = self.drop_late(rows, late_at)?;
                        rows = kept;
                        late_rows += late;
                    }
                    let (op, input, state) = &mut self.operators[next];
                    next += 1;
                    ctx.input_schema = input.clone();
                    op.process(state, rows, &ctx).await.map_err(|source| Error::Transform {
                        batch_id,
                        source: OperatorFailed::wrap(op.name(), source),
                    })?
                }
            };
        }
        rows.retain(|b| b.num_rows() > 0);
        self.previous_watermark_ms = watermark_ms;
        Ok(Processed {
            output: rows,
            late_rows,
        })
    }

    /// Notes the latest event time of rows where the watermark is set.
    pub(crate) fn observe(&mut self, rows: &RecordBatch) -> Result<()> {
        if let Some(w) = &self.watermark {
            if let Some(max) = w.max_event_time(std::slice::from_ref(rows))? {
                self.max_event_ms = Some(self.max_event_ms.map_or(max, |m| m.max(max)));
            }
        }
        Ok(())
    }

    /// Whether rows of `schema` have the watermark's event-time column, as a
    /// timestamp.
    fn has_event_time(&self, schema: &arrow_schema::Schema) -> bool {
        self.watermark.as_ref().is_some_and(|w| {
            schema
                .field_with_name(&w.column)
                .is_ok_and(|f| matches!(f.data_type(), arrow_schema::DataType::Timestamp(..)))
        })
    }

    /// Drops the rows at or before `watermark_ms`; returns the rest and how
    /// many were late.
    fn drop_late(&self, rows: Vec<RecordBatch>, watermark_ms: i64) -> Result<(Vec<RecordBatch>, u64)> {
        let Some(w) = &self.watermark else {
            return Ok((rows, 0));
        };
        let mut late_rows = 0;
        let mut kept = Vec::with_capacity(rows.len());
        for batch in rows {
            let (batch, late) = w.drop_late(batch, watermark_ms)?;
            late_rows += late;
            if batch.num_rows() > 0 {
                kept.push(batch);
            }
        }
        Ok((kept, late_rows))
    }

    /// Writes the state after `batch_id` to the checkpoint.
    pub(crate) async fn persist(&mut self, batch_id: BatchId) -> Result<()> {
        if self.operators.is_empty() {
            return Ok(());
        }
        let mut states: Vec<(&str, &mut KeyedState)> =
            self.operators.iter_mut().map(|(op, _, s)| (op.name(), s)).collect();
        let snapshots = self.snapshots.ready(self.manifest.as_ref()).await?;
        let manifest = self
            .store
            .write(
                batch_id,
                self.manifest.as_ref(),
                &mut states,
                self.max_event_ms,
                snapshots,
            )
            .await?;
        let operators = &self.operators;
        self.snapshots.written(&manifest, |name| {
            operators
                .iter()
                .find(|(op, _, _)| op.name() == name)
                .map(|(_, _, s)| s.schema().clone())
        });
        self.manifest = Some(manifest);
        Ok(())
    }

    /// Waits for the snapshot being made (at the query's end, when it
    /// ended well).
    pub(crate) async fn finish(&mut self) -> Result<()> {
        self.snapshots.finish().await
    }

    /// Stops the snapshot being made (a query that failed).
    pub(crate) fn abort(&mut self) {
        self.snapshots.abort();
    }

    /// The size of each operator's state.
    pub(crate) fn progress(&self) -> Vec<StateProgress> {
        self.operators
            .iter()
            .map(|(op, _, s)| StateProgress {
                operator: op.name().to_string(),
                rows: s.len() as u64,
                bytes: s.bytes() as u64,
            })
            .collect()
    }

    /// Deletes state older than `keep_from`.
    pub(crate) async fn purge_before(&self, keep_from: BatchId) -> Result<()> {
        self.store.purge_before(keep_from).await
    }
}

/// Refuses a manifest of other operators than the query's.
fn check_names(checkpoint: &Checkpoint, manifest: &StateManifest, current: &[&str]) -> Result<()> {
    let recorded: Vec<&str> = manifest.operators.iter().map(|o| o.name.as_str()).collect();
    if recorded != current {
        return Err(Error::StateChanged {
            location: checkpoint.location().to_string(),
            reason: format!(
                "batch {} holds the state of the operators {recorded:?}, the query has {current:?}; a query's stateful operators cannot change under one checkpoint",
                manifest.batch_id
            ),
        });
    }
    Ok(())
}

/// A stateful operator's error, naming the operator.
#[derive(Debug, thiserror::Error)]
#[error("operator {operator:?}: {source}")]
pub(crate) struct OperatorFailed {
    operator: String,
    #[source]
    source: BoxError,
}

impl OperatorFailed {
    /// `source` as the error of `operator`, still [`Transient`] if it was,
    /// so the query's error is retryable exactly when the operator's is.
    fn wrap(operator: &str, source: BoxError) -> BoxError {
        let transient = source.downcast_ref::<Transient>().is_some();
        let failed = OperatorFailed {
            operator: operator.to_string(),
            source,
        };
        if transient {
            crate::transient(failed)
        } else {
            Box::new(failed)
        }
    }
}
