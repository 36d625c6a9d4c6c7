//! What a streaming query is started with: the stream, its checkpoint,
//! trigger, output mode and guards, as the builder
//! ([`StreamWriter`]'s setters in `writer.rs`) gathered them and the batch
//! loop (`run.rs`) reads them.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use super::stream::ReadStream;
use super::trigger::Trigger;
use crate::checkpoint::CheckpointStore;
use crate::crash::CrashPoints;
use crate::ids::BatchId;
use crate::progress::QueryProgress;
use crate::protocol::Overrides;
use crate::sink::OutputMode;

pub(crate) type ProgressListener = dyn Fn(&QueryProgress) + Send + Sync;

/// Where a checkpoint lives.
#[derive(Debug, Clone)]
pub(crate) enum CheckpointLocation {
    /// A local path or an object store URL, with the store's options.
    Location(PathBuf, HashMap<String, String>),
    Store(Arc<dyn CheckpointStore>),
}

/// Describes a streaming query and starts it: `stream.write_stream()
/// .checkpoint_location(..).trigger(..).start(sink)`.
#[derive(Clone)]
pub struct StreamWriter {
    pub(crate) stream: ReadStream,
    pub(crate) query_name: Option<String>,
    pub(crate) checkpoint: Option<CheckpointLocation>,
    pub(crate) trigger: Trigger,
    pub(crate) output_mode: OutputMode,
    pub(crate) parallelism: usize,
    pub(crate) retain_batches: u64,
    pub(crate) overrides: Overrides,
    pub(crate) crash_points: CrashPoints,
    pub(crate) listeners: Vec<Arc<ProgressListener>>,
    pub(crate) stop_after: Option<BatchId>,
}

impl fmt::Debug for StreamWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamWriter")
            .field("query_name", &self.query_name)
            .field("checkpoint", &self.checkpoint)
            .field("trigger", &self.trigger)
            .field("output_mode", &self.output_mode)
            .field("parallelism", &self.parallelism)
            .finish_non_exhaustive()
    }
}

impl StreamWriter {
    pub(crate) fn new(stream: ReadStream) -> Self {
        StreamWriter {
            stream,
            query_name: None,
            checkpoint: None,
            trigger: Trigger::default(),
            output_mode: OutputMode::Append,
            parallelism: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            retain_batches: 100,
            overrides: Overrides::default(),
            crash_points: CrashPoints::new(),
            listeners: Vec::new(),
            stop_after: None,
        }
    }
}
