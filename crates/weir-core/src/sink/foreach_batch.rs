//! Hands each batch's rows to an application function.

use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use futures::future::BoxFuture;

use super::staging::Staging;
use super::{BatchContext, CommitMessage, CommitOutcome, DataWriter, OutputMode, Sink};
use crate::error::{BoxError, Error, Result};
use crate::ids::BatchId;
use crate::protocol::SinkIdentity;

type BatchFn = dyn Fn(Vec<RecordBatch>, BatchId) -> BoxFuture<'static, std::result::Result<(), BoxError>> + Send + Sync;

/// Calls a function with all rows of each batch and the batch id, once the
/// batch's rows are written. The guarantee is what the function makes it: a
/// replayed batch calls it again with the same batch id and the same rows,
/// so a function that writes idempotently by batch id (an upsert keyed by
/// batch id or event id) is exactly-once.
#[derive(Clone)]
pub struct ForeachBatchSink {
    name: String,
    f: Arc<BatchFn>,
    staging: Staging,
}

impl fmt::Debug for ForeachBatchSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForeachBatchSink")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ForeachBatchSink {
    /// A sink that calls `f`; `name` is its identity in the checkpoint.
    pub fn new<F, Fut>(name: impl Into<String>, f: F) -> Self
    where
        F: Fn(Vec<RecordBatch>, BatchId) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = std::result::Result<(), BoxError>> + Send + 'static,
    {
        ForeachBatchSink {
            name: name.into(),
            f: Arc::new(move |rows, batch| Box::pin(f(rows, batch))),
            staging: Staging::default(),
        }
    }
}

#[async_trait]
impl Sink for ForeachBatchSink {
    fn identity(&self) -> SinkIdentity {
        SinkIdentity::new("foreach_batch", &self.name)
    }

    fn check_output_mode(&self, _mode: OutputMode) -> std::result::Result<(), super::ModeRefusal> {
        Ok(())
    }

    fn keeps_marker(&self) -> bool {
        false
    }

    fn create_writer(&self, _batch: &BatchContext, partition_id: usize) -> Result<Box<dyn DataWriter>> {
        Ok(self.staging.writer(partition_id))
    }

    async fn commit(&self, batch: &BatchContext, messages: Vec<CommitMessage>) -> Result<CommitOutcome> {
        let rows = self.staging.take(&self.name, &messages)?;
        (self.f)(rows, batch.batch_id)
            .await
            .map_err(|e| Error::sink(format!("foreach_batch {}", self.name), Some(batch.batch_id), false, e))?;
        Ok(CommitOutcome::Committed { version: None })
    }

    async fn abort(&self, _batch: &BatchContext, messages: Vec<CommitMessage>) -> Result<()> {
        self.staging.discard(&messages);
        Ok(())
    }
}
