//! Replayable sources.
//!
//! A source hands out offsets and reads the rows between two of them. The
//! driver records each batch's end offset in the checkpoint before the batch
//! runs, so a source must return the same rows for the same range however
//! often it is asked: that is what makes a replayed batch identical.

mod file;
mod memory;
mod rate;

use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use futures::stream::BoxStream;

pub use file::{FileFormat, FileSource};
pub use memory::MemoryStream;
pub use rate::RateSource;

pub use crate::ids::Offset;

use crate::checkpoint::CheckpointStore;
use crate::error::Result;

/// The rows of one batch, in Arrow record batches.
pub type BatchStream = BoxStream<'static, Result<RecordBatch>>;

/// How much a source may hand out in one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadLimit {
    /// The source's own per-batch limits (`max_files_per_trigger`, rows per
    /// batch).
    Default,
    /// Everything available now (`Trigger::once`).
    All,
}

/// What a source gets when its query starts.
#[derive(Debug, Clone)]
pub struct SourceContext {
    /// The query's checkpoint, where a source may keep a private log under
    /// [`SourceContext::dir`].
    pub store: Arc<dyn CheckpointStore>,
    /// The source's own directory in the checkpoint (`sources/<name>`).
    pub dir: String,
}

/// A replayable source of rows.
///
/// The driver calls [`Source::open`] once, then for each batch
/// [`Source::latest_offset`] to plan it (unless it is replaying a logged
/// batch), [`Source::read`] to run it, and [`Source::commit`] after the batch
/// is recorded as committed.
#[async_trait]
pub trait Source: Send + Sync + fmt::Debug {
    /// The source's name within its query: the key of its offset in
    /// `offsets/N`. It must not change between runs of a query.
    fn name(&self) -> &str;

    /// What the source reads, recorded in the checkpoint: a query restarted
    /// with a source whose description differs is refused, since the
    /// checkpoint's offsets mean nothing for it. Defaults to the name.
    fn description(&self) -> String {
        self.name().to_string()
    }

    /// The schema of every record batch the source returns.
    fn schema(&self) -> SchemaRef;

    /// Called once before anything else in a run of the query.
    async fn open(&self, _ctx: &SourceContext) -> Result<()> {
        Ok(())
    }

    /// The end offset of the next batch, starting after `start` (`None`: from
    /// the source's beginning). `None`, or `start` itself, means no new data.
    async fn latest_offset(&self, start: Option<&Offset>, limit: ReadLimit) -> Result<Option<Offset>>;

    /// For `Trigger::available_now`: fixes the end of the data available now,
    /// beyond which [`Source::latest_offset`] must not go in this run.
    async fn prepare_for_available_now(&self) -> Result<()> {
        Ok(())
    }

    /// The rows after `start` up to and including `end`. The same range must
    /// always give the same rows.
    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<BatchStream>;

    /// What the source measured while reading the batch ending at `end`
    /// (records, bytes, lag, rows skipped), for the batch's progress under
    /// `sources[].metrics`. Defaults to nothing.
    fn metrics(&self, _end: &Offset) -> Option<serde_json::Value> {
        None
    }

    /// Called after the batch ending at `end` is recorded as committed: the
    /// source may release what it no longer needs to replay.
    async fn commit(&self, _end: &Offset) -> Result<()> {
        Ok(())
    }
}

/// Reads an integer offset, as the memory and rate sources write them.
pub(crate) fn integer_offset(source: &str, offset: Option<&Offset>, key: &str) -> Result<u64> {
    let Some(offset) = offset else { return Ok(0) };
    offset
        .0
        .get(key)
        .and_then(|v| v.as_u64())
        .ok_or_else(|| crate::Error::Source {
            retryable: false,
            source_name: source.to_string(),
            source: format!("offset {offset} has no integer field {key:?}").into(),
        })
}
