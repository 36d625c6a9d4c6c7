//! An in-memory stream for tests and examples.

use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use futures::StreamExt;
use serde_json::json;

use super::{integer_offset, BatchStream, Offset, ReadLimit, Source};
use crate::error::{Error, Result};
use crate::sync::Recover;

/// An append-only list of record batches; each added batch is one offset.
/// Clones share the same list, so a test can keep adding rows to a running
/// query, or restart a query on the same data.
#[derive(Debug, Clone)]
pub struct MemoryStream {
    name: String,
    schema: SchemaRef,
    batches: Arc<Mutex<Vec<RecordBatch>>>,
}

impl MemoryStream {
    /// An empty stream of `schema`.
    pub fn new(schema: SchemaRef) -> Self {
        MemoryStream {
            name: "memory".into(),
            schema,
            batches: Arc::default(),
        }
    }

    /// Appends a record batch; it must have the stream's schema.
    pub fn add_batch(&self, batch: RecordBatch) -> Result<()> {
        if batch.schema() != self.schema {
            return Err(Error::SchemaMismatch {
                context: "MemoryStream::add_batch".into(),
                expected: self.schema.to_string(),
                found: batch.schema().to_string(),
            });
        }
        self.lock().push(batch);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RecordBatch>> {
        self.batches.lock().recover()
    }
}

const KEY: &str = "batches";

#[async_trait]
impl Source for MemoryStream {
    fn name(&self) -> &str {
        &self.name
    }

    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    async fn latest_offset(&self, _start: Option<&Offset>, _limit: ReadLimit) -> Result<Option<Offset>> {
        let len = self.lock().len();
        Ok((len > 0).then(|| Offset(json!({ KEY: len }))))
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<BatchStream> {
        let from = integer_offset(&self.name, start, KEY)? as usize;
        let to = integer_offset(&self.name, Some(end), KEY)? as usize;
        let batches = self.lock();
        if to > batches.len() || from > to {
            return Err(Error::Source {
                retryable: false,
                source_name: self.name.clone(),
                source: format!("range ({from}, {to}] is not in the stream of {} batches", batches.len()).into(),
            });
        }
        let rows: Vec<Result<RecordBatch>> = batches[from..to].iter().cloned().map(Ok).collect();
        Ok(futures::stream::iter(rows).boxed())
    }
}
