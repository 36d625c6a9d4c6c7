//! Hands each row to an application writer, partition by partition.

use std::fmt;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, ArrayRef, RecordBatch};
use async_trait::async_trait;

use super::{BatchContext, CommitMessage, CommitOutcome, DataWriter, OutputMode, Sink};
use crate::error::{BoxError, Error, Result};
use crate::ids::BatchId;
use crate::protocol::SinkIdentity;

/// An application's per-partition row writer, as in Spark's `foreach`.
///
/// For each partition of each batch a new writer is made; weir calls `open`
/// once, then `process` for each row if `open` returned `true`, then `close`
/// with the error that stopped it, if any. At least once: a replayed batch
/// opens the same partitions with the same batch id again, which `open` can
/// use to skip work already done.
pub trait ForeachWriter: Send + 'static {
    /// Starts a partition; return `false` to skip its rows.
    fn open(&mut self, partition_id: usize, batch_id: BatchId) -> std::result::Result<bool, BoxError>;
    /// Handles one row.
    fn process(&mut self, row: Row<'_>) -> std::result::Result<(), BoxError>;
    /// Ends the partition, with the error that stopped it if any.
    fn close(&mut self, error: Option<&BoxError>);
}

/// One row of a record batch.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    batch: &'a RecordBatch,
    index: usize,
}

impl<'a> Row<'a> {
    /// The row's batch and its index in it.
    pub fn new(batch: &'a RecordBatch, index: usize) -> Self {
        Row { batch, index }
    }

    /// The record batch holding the row.
    pub fn batch(&self) -> &'a RecordBatch {
        self.batch
    }

    /// The row's index in [`Row::batch`].
    pub fn index(&self) -> usize {
        self.index
    }

    /// The column named `name`.
    pub fn column(&self, name: &str) -> Option<&'a ArrayRef> {
        self.batch.column_by_name(name)
    }

    /// The value of an int64 column, `None` if null, missing or not int64.
    pub fn get_i64(&self, name: &str) -> Option<i64> {
        let col = self.column(name)?.as_primitive_opt::<Int64Type>()?;
        col.is_valid(self.index).then(|| col.value(self.index))
    }

    /// The value of a string column, `None` if null, missing or not utf8.
    pub fn get_str(&self, name: &str) -> Option<&'a str> {
        let col = self.column(name)?.as_string_opt::<i32>()?;
        col.is_valid(self.index).then(|| col.value(self.index))
    }

    /// The row as a JSON object.
    pub fn to_json(&self) -> Result<serde_json::Value> {
        let mut writer = arrow_json::ArrayWriter::new(Vec::new());
        writer
            .write(&self.batch.slice(self.index, 1))
            .and_then(|_| writer.finish())
            .map_err(|e| Error::arrow("row to JSON", e))?;
        let rows: Vec<serde_json::Value> =
            serde_json::from_slice(&writer.into_inner()).map_err(|e| Error::sink("foreach", None, false, e))?;
        Ok(rows.into_iter().next().unwrap_or_default())
    }
}

type Factory = dyn Fn() -> Box<dyn ForeachWriter> + Send + Sync;

/// Runs a [`ForeachWriter`] over every row. Not durable on its own.
#[derive(Clone)]
pub struct ForeachSink {
    name: String,
    factory: Arc<Factory>,
}

impl fmt::Debug for ForeachSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForeachSink")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ForeachSink {
    /// A sink that makes a writer per partition with `factory`; `name` is its
    /// identity in the checkpoint.
    pub fn new<W: ForeachWriter>(name: impl Into<String>, factory: impl Fn() -> W + Send + Sync + 'static) -> Self {
        ForeachSink {
            name: name.into(),
            factory: Arc::new(move || Box::new(factory())),
        }
    }
}

struct ForeachPartition {
    writer: Box<dyn ForeachWriter>,
    partition_id: usize,
    batch_id: BatchId,
    open: Option<bool>,
    rows: u64,
    closed: bool,
}

impl ForeachPartition {
    fn close(&mut self, error: Option<&BoxError>) {
        if !std::mem::replace(&mut self.closed, true) {
            self.writer.close(error);
        }
    }

    fn fail(&mut self, e: BoxError) -> Error {
        self.close(Some(&e));
        Error::sink("foreach", Some(self.batch_id), false, e)
    }
}

#[async_trait]
impl DataWriter for ForeachPartition {
    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        let open = match self.open {
            Some(open) => open,
            None => {
                let open = self
                    .writer
                    .open(self.partition_id, self.batch_id)
                    .map_err(|e| self.fail(e))?;
                self.open = Some(open);
                open
            }
        };
        if !open {
            return Ok(());
        }
        for index in 0..batch.num_rows() {
            if let Err(e) = self.writer.process(Row::new(&batch, index)) {
                return Err(self.fail(e));
            }
            self.rows += 1;
        }
        Ok(())
    }

    async fn commit(mut self: Box<Self>) -> Result<CommitMessage> {
        self.close(None);
        CommitMessage::new(self.partition_id, &self.rows)
    }

    async fn abort(mut self: Box<Self>) -> Result<()> {
        self.close(Some(&"the batch was aborted".into()));
        Ok(())
    }
}

#[async_trait]
impl Sink for ForeachSink {
    fn identity(&self) -> SinkIdentity {
        SinkIdentity::new("foreach", &self.name)
    }

    fn check_output_mode(&self, _mode: OutputMode) -> std::result::Result<(), super::ModeRefusal> {
        Ok(())
    }

    fn keeps_marker(&self) -> bool {
        false
    }

    fn create_writer(&self, batch: &BatchContext, partition_id: usize) -> Result<Box<dyn DataWriter>> {
        Ok(Box::new(ForeachPartition {
            writer: (self.factory)(),
            partition_id,
            batch_id: batch.batch_id,
            open: None,
            rows: 0,
            closed: false,
        }))
    }

    async fn commit(&self, _batch: &BatchContext, _messages: Vec<CommitMessage>) -> Result<CommitOutcome> {
        Ok(CommitOutcome::Committed { version: None })
    }
}
