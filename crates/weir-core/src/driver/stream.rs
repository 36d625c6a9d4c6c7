//! A source with its transformations: stateless ones applied to each record
//! batch, and stateful operators that see the whole micro-batch.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::error::{BoxError, Error, Result};
use crate::ids::BatchId;
use crate::operator::{BatchTransform, OperatorFacts, OperatorKind, QueryShape, StatefulOperator};
use crate::source::Source;
use crate::state::valid_operator_name;
use crate::watermark::Watermark;

pub(crate) type TransformFn = dyn Fn(RecordBatch) -> std::result::Result<RecordBatch, BoxError> + Send + Sync;

/// One step rows go through.
#[derive(Clone)]
pub(crate) enum Stage {
    /// A stateless function of each record batch.
    Map(Arc<TransformFn>),
    /// A stateless transformation of the whole micro-batch.
    Batch(Arc<dyn BatchTransform>),
    /// A stateful operator over the whole micro-batch.
    Operator(Arc<dyn StatefulOperator>),
}

/// A stream of rows: a replayable source, the stateless transformations
/// (project, filter, derive columns) applied to each of its record batches,
/// and the stateful operators (deduplication, aggregation) that see each
/// micro-batch whole.
///
/// ```
/// use weir_core::prelude::*;
///
/// let events = read_stream(RateSource::rows_per_batch(1000))
///     .map_batches(|batch| Ok(batch.project(&[0, 2])?));
/// assert_eq!(events.schema().unwrap().fields().len(), 2);
/// ```
#[derive(Clone)]
pub struct ReadStream {
    pub(crate) source: Arc<dyn Source>,
    pub(crate) stages: Vec<Stage>,
    /// The watermark, and how many stages come before it.
    pub(crate) watermark: Option<(Watermark, usize)>,
}

impl fmt::Debug for ReadStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadStream")
            .field("source", &self.source)
            .field("stages", &self.stages.len())
            .field("watermark", &self.watermark)
            .finish()
    }
}

/// A stream reading `source`.
pub fn read_stream(source: impl Source + 'static) -> ReadStream {
    ReadStream::new(Arc::new(source))
}

/// The schemas of a stream: after the stateless stages before the first
/// operator, and at the end.
#[derive(Debug, Clone)]
pub(crate) struct Schemas {
    pub prefix: SchemaRef,
    pub output: SchemaRef,
    /// The last keyed operator's key columns, if all of them reach the
    /// output under their names (see [`StatefulOperator::key_columns`]).
    pub key_columns: Vec<String>,
}

impl ReadStream {
    /// A stream reading `source`.
    pub fn new(source: Arc<dyn Source>) -> Self {
        ReadStream {
            source,
            stages: Vec::new(),
            watermark: None,
        }
    }

    /// Applies `f` to every record batch. `f` must be a pure function of its
    /// input (a replayed batch must give the same rows) and must return the
    /// same schema for every input; weir learns that schema by calling `f` on
    /// an empty batch when the query starts.
    pub fn map_batches<F>(mut self, f: F) -> Self
    where
        F: Fn(RecordBatch) -> std::result::Result<RecordBatch, BoxError> + Send + Sync + 'static,
    {
        self.stages.push(Stage::Map(Arc::new(f)));
        self
    }

    /// Declares `column` (a timestamp) the stream's event time, and rows
    /// more than `delay` behind the latest event time seen late, as Spark's
    /// `withWatermark` does: the stateful operators after it drop late rows
    /// (counted in the progress as `late_rows`), close the windows the
    /// watermark passed, and forget state behind it. One watermark per
    /// query; a later call replaces an earlier one.
    pub fn with_watermark(mut self, column: impl Into<String>, delay: Duration) -> Self {
        let at = self.stages.len();
        self.watermark = Some((
            Watermark {
                column: column.into(),
                delay,
            },
            at,
        ));
        self
    }

    /// Adds a stateful operator, which sees each micro-batch whole and
    /// keeps its state in the checkpoint. Operators come from other crates
    /// (weir's `drop_duplicates` and aggregations) or from the application.
    pub fn with_operator(mut self, operator: impl StatefulOperator + 'static) -> Self {
        self.stages.push(Stage::Operator(Arc::new(operator)));
        self
    }

    /// Adds a transformation of the whole micro-batch (weir's SQL over
    /// each batch, or the application's own).
    pub fn with_batch_transform(mut self, transform: impl BatchTransform + 'static) -> Self {
        self.stages.push(Stage::Batch(Arc::new(transform)));
        self
    }

    /// The schema of the rows after the transformations.
    pub fn schema(&self) -> Result<SchemaRef> {
        Ok(self.schemas()?.output)
    }

    /// The stateful operators, in order.
    pub(crate) fn operators(&self) -> impl Iterator<Item = &Arc<dyn StatefulOperator>> {
        self.stages.iter().filter_map(|s| match s {
            Stage::Operator(op) => Some(op),
            _ => None,
        })
    }

    /// Whether the stream has a stateful operator.
    pub(crate) fn is_stateful(&self) -> bool {
        self.operators().next().is_some()
    }

    /// Whether a stage sees the whole micro-batch, so the batch is read
    /// whole before it.
    pub(crate) fn reads_whole_batches(&self) -> bool {
        self.prefix_len() < self.stages.len()
    }

    /// The number of stages before the first that sees the whole batch.
    pub(crate) fn prefix_len(&self) -> usize {
        self.stages
            .iter()
            .position(|s| !matches!(s, Stage::Map(_)))
            .unwrap_or(self.stages.len())
    }

    /// What the output-mode rules need to know.
    pub(crate) fn shape(&self) -> QueryShape {
        let operators: Vec<OperatorFacts> = self
            .operators()
            .map(|op| OperatorFacts {
                name: op.name().to_string(),
                kind: op.kind(),
            })
            .collect();
        let watermark = self.watermark.as_ref().map(|(w, at)| {
            let before = self.stages[..*at]
                .iter()
                .filter(|s| matches!(s, Stage::Operator(_)))
                .count();
            (w.column.clone(), before)
        });
        QueryShape { operators, watermark }
    }

    /// The schemas after the per-record-batch prefix and at the end; checks the
    /// watermark's column and the operators' names on the way.
    pub(crate) fn schemas(&self) -> Result<Schemas> {
        let learn = |source: BoxError| Error::Transform {
            batch_id: BatchId(0),
            source: format!("on an empty batch, to learn the output schema: {source}").into(),
        };
        let mut batch = RecordBatch::new_empty(self.source.schema());
        let prefix_len = self.prefix_len();
        let mut prefix = None;
        let mut names = Vec::new();
        let mut key_columns: Vec<String> = Vec::new();
        for (i, stage) in self.stages.iter().enumerate() {
            if i == prefix_len {
                prefix = Some(batch.schema());
            }
            if let Some((w, at)) = &self.watermark {
                if *at == i {
                    w.check(&batch.schema())?;
                }
            }
            batch = match stage {
                Stage::Map(f) => f(batch).map_err(learn)?,
                Stage::Batch(t) => RecordBatch::new_empty(t.output_schema(&batch.schema()).map_err(learn)?),
                Stage::Operator(op) => {
                    let needs_watermark =
                        names.is_empty() || matches!(op.kind(), OperatorKind::Deduplication { within_watermark: true });
                    if let (Some((w, _)), true) = (&self.watermark, needs_watermark) {
                        // Late rows are dropped before the first operator,
                        // and a deduplication within the watermark reads
                        // the event time of its rows.
                        w.check(&batch.schema())?;
                    }
                    let name = op.name().to_string();
                    if !valid_operator_name(&name) || names.contains(&name) {
                        return Err(Error::InvalidOption {
                            option: "operator name",
                            reason: format!("{name:?} must be unique in the query and made of letters, digits, '-', '_' and '.', not starting with '_' or '.'"),
                        });
                    }
                    names.push(name);
                    if let Some(key) = op.key_columns(&batch.schema()) {
                        key_columns = key;
                    }
                    let schema = op.output_schema(&batch.schema()).map_err(learn)?;
                    RecordBatch::new_empty(schema)
                }
            };
        }
        if let Some((w, at)) = &self.watermark {
            if *at == self.stages.len() {
                w.check(&batch.schema())?;
            }
        }
        // A later stage that drops or renames a key column leaves the rows
        // without a key.
        if key_columns.iter().any(|c| batch.schema().field_with_name(c).is_err()) {
            key_columns.clear();
        }
        Ok(Schemas {
            prefix: prefix.unwrap_or_else(|| batch.schema()),
            output: batch.schema(),
            key_columns,
        })
    }

    /// Runs the per-record-batch stages before the first whole-batch stage
    /// on one record batch of batch `batch_id`; `schema` is what they must
    /// give.
    pub(crate) fn transform(&self, batch: RecordBatch, batch_id: BatchId, schema: &SchemaRef) -> Result<RecordBatch> {
        self.transform_observed(batch, batch_id, schema, &mut |_| Ok(()))
    }

    /// [`ReadStream::transform`], calling `observe` with the rows where the
    /// watermark is set, if that is among these stages.
    pub(crate) fn transform_observed(
        &self,
        mut batch: RecordBatch,
        batch_id: BatchId,
        schema: &SchemaRef,
        observe: &mut dyn FnMut(&RecordBatch) -> Result<()>,
    ) -> Result<RecordBatch> {
        let watermark_at = self.watermark.as_ref().map(|(_, at)| *at);
        for (i, stage) in self.stages[..self.prefix_len()].iter().enumerate() {
            if watermark_at == Some(i) {
                observe(&batch)?;
            }
            if let Stage::Map(f) = stage {
                batch = f(batch).map_err(|source| Error::Transform { batch_id, source })?;
            }
        }
        check_schema(&batch, batch_id, schema)?;
        Ok(batch)
    }
}

pub(crate) fn check_schema(batch: &RecordBatch, batch_id: BatchId, schema: &SchemaRef) -> Result<()> {
    if batch.schema().fields() != schema.fields() {
        return Err(Error::SchemaMismatch {
            context: format!("the output of the transformation in batch {batch_id}"),
            expected: schema.to_string(),
            found: batch.schema().to_string(),
        });
    }
    Ok(())
}
