//! The stateful part of a batch: the watermark, late rows, the operators
//! and their state in the checkpoint.

use std::sync::Arc;

use arrow_array::RecordBatch;

use super::stream::{ReadStream, Stage};
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::ids::BatchId;
use crate::operator::{OperatorContext, StatefulOperator};
use crate::progress::StateProgress;
use crate::sink::OutputMode;
use crate::state::{KeyedState, StateManifest, StateStore, DEFAULT_SNAPSHOT_EVERY};
use crate::watermark::{next_watermark, Watermark};

/// The operators of a stateful query with their state, as of the last batch
/// run (or restored).
pub(crate) struct Stateful {
    store: StateStore,
    watermark: Option<Watermark>,
    operators: Vec<(Arc<dyn StatefulOperator>, KeyedState)>,
    /// The manifest of the state the operators hold.
    manifest: Option<StateManifest>,
    /// The latest event time seen up to the state's batch.
    max_event_ms: Option<i64>,
}

/// What the stateful part made of a batch's rows.
pub(crate) struct Processed {
    pub output: Vec<RecordBatch>,
    pub late_rows: u64,
}

impl Stateful {
    /// The operators with the state after the newest batch before `first`
    /// (the first batch this run executes). `previous` is the newest batch
    /// in the offset log before `first`.
    pub(crate) async fn restore(
        checkpoint: &Checkpoint,
        stream: &ReadStream,
        first: BatchId,
        previous: Option<BatchId>,
    ) -> Result<Self> {
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
                Stage::Operator(op) => {
                    let schema = op.state_schema(&input).map_err(|source| Error::Transform {
                        batch_id: first,
                        source: format!("the state schema of operator {:?}: {source}", op.name()).into(),
                    })?;
                    let state = KeyedState::new(schema)
                        .map_err(|e| Error::arrow(format!("the state of operator {:?}", op.name()), e))?;
                    input = op.output_schema(&input).map_err(|source| Error::Transform {
                        batch_id: first,
                        source,
                    })?;
                    operators.push((op.clone(), state));
                }
            }
        }
        let manifest = match previous {
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
            let recorded: Vec<&str> = m.operators.iter().map(|o| o.name.as_str()).collect();
            let current: Vec<&str> = operators.iter().map(|(op, _)| op.name()).collect();
            if recorded != current {
                return Err(Error::CorruptCheckpoint {
                    location: checkpoint.location().to_string(),
                    path: format!("state/_manifest/{}", m.batch_id),
                    reason: format!(
                        "the checkpoint holds the state of the operators {recorded:?}, the query has {current:?}; a query's stateful operators cannot change under one checkpoint, start it on a new one"
                    ),
                });
            }
            for (op, state) in &mut operators {
                let files = m.operator(op.name()).expect("names compared above");
                store.restore(files, state).await?;
            }
        }
        Ok(Stateful {
            store,
            watermark: stream.watermark.as_ref().map(|(w, _)| w.clone()),
            max_event_ms: manifest.as_ref().and_then(|m| m.max_event_time_ms),
            manifest,
            operators,
        })
    }

    /// The watermark of the batch after one whose watermark was `current`.
    pub(crate) fn next_watermark(&self, current: i64) -> i64 {
        match &self.watermark {
            Some(w) => next_watermark(current, self.max_event_ms, w.delay),
            None => 0,
        }
    }

    /// Drops late rows, then runs every stage from the first operator on.
    pub(crate) fn process(
        &mut self,
        stream: &ReadStream,
        batch_id: BatchId,
        watermark_ms: i64,
        mode: OutputMode,
        mut rows: Vec<RecordBatch>,
    ) -> Result<Processed> {
        let mut late_rows = 0;
        if let Some(w) = &self.watermark {
            if let Some(max) = w.max_event_time(&rows)? {
                self.max_event_ms = Some(self.max_event_ms.map_or(max, |m| m.max(max)));
            }
            let mut kept = Vec::with_capacity(rows.len());
            for batch in rows {
                let (batch, late) = w.drop_late(batch, watermark_ms)?;
                late_rows += late;
                if batch.num_rows() > 0 {
                    kept.push(batch);
                }
            }
            rows = kept;
        }
        let ctx = OperatorContext {
            batch_id,
            output_mode: mode,
            event_time_column: self.watermark.as_ref().map(|w| w.column.clone()),
            watermark_ms: (self.watermark.is_some() && watermark_ms != 0).then_some(watermark_ms),
        };
        let mut next = 0;
        for stage in &stream.stages[stream.prefix_len()..] {
            rows = match stage {
                Stage::Map(f) => rows
                    .into_iter()
                    .map(|b| f(b).map_err(|source| Error::Transform { batch_id, source }))
                    .collect::<Result<_>>()?,
                Stage::Operator(_) => {
                    let (op, state) = &mut self.operators[next];
                    next += 1;
                    op.process(state, rows, &ctx).map_err(|source| Error::Transform {
                        batch_id,
                        source: format!("operator {:?}: {source}", op.name()).into(),
                    })?
                }
            };
        }
        rows.retain(|b| b.num_rows() > 0);
        Ok(Processed {
            output: rows,
            late_rows,
        })
    }

    /// Writes the state after `batch_id` to the checkpoint.
    pub(crate) async fn persist(&mut self, batch_id: BatchId) -> Result<()> {
        let mut states: Vec<(&str, &mut KeyedState)> =
            self.operators.iter_mut().map(|(op, s)| (op.name(), s)).collect();
        let manifest = self
            .store
            .write(batch_id, self.manifest.as_ref(), &mut states, self.max_event_ms)
            .await?;
        self.manifest = Some(manifest);
        Ok(())
    }

    /// The size of each operator's state.
    pub(crate) fn progress(&self) -> Vec<StateProgress> {
        self.operators
            .iter()
            .map(|(op, s)| StateProgress {
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
