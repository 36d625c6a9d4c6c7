//! A source with its per-batch transformations.

use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::error::{BoxError, Error, Result};
use crate::ids::BatchId;
use crate::source::Source;

pub(crate) type TransformFn = dyn Fn(RecordBatch) -> std::result::Result<RecordBatch, BoxError> + Send + Sync;

/// A stream of rows: a replayable source and the stateless transformations
/// (project, filter, derive columns) applied to each of its record batches.
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
    pub(crate) transforms: Vec<Arc<TransformFn>>,
}

impl fmt::Debug for ReadStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadStream")
            .field("source", &self.source)
            .field("transforms", &self.transforms.len())
            .finish()
    }
}

/// A stream reading `source`.
pub fn read_stream(source: impl Source + 'static) -> ReadStream {
    ReadStream::new(Arc::new(source))
}

impl ReadStream {
    /// A stream reading `source`.
    pub fn new(source: Arc<dyn Source>) -> Self {
        ReadStream {
            source,
            transforms: Vec::new(),
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
        self.transforms.push(Arc::new(f));
        self
    }

    /// The schema of the rows after the transformations.
    pub fn schema(&self) -> Result<SchemaRef> {
        let mut batch = RecordBatch::new_empty(self.source.schema());
        for f in &self.transforms {
            batch = f(batch).map_err(|source| Error::Transform {
                batch_id: BatchId(0),
                source: format!("on an empty batch, to learn the output schema: {source}").into(),
            })?;
        }
        Ok(batch.schema())
    }

    /// Runs the transformations on one record batch of batch `batch_id`.
    pub(crate) fn transform(
        &self,
        mut batch: RecordBatch,
        batch_id: BatchId,
        schema: &SchemaRef,
    ) -> Result<RecordBatch> {
        for f in &self.transforms {
            batch = f(batch).map_err(|source| Error::Transform { batch_id, source })?;
        }
        if batch.schema().fields() != schema.fields() {
            return Err(Error::SchemaMismatch {
                context: format!("the output of the transformation in batch {batch_id}"),
                expected: schema.to_string(),
                found: batch.schema().to_string(),
            });
        }
        Ok(batch)
    }
}
