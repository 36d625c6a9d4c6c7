//! The builder that starts a streaming query.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::handle::StreamingQuery;
use super::options::{CheckpointLocation, StreamWriter};
use super::stream::ReadStream;
use super::trigger::Trigger;
use crate::checkpoint::{Checkpoint, CheckpointStore, LocalStore};
use crate::crash::CrashPoints;
use crate::error::{BoxError, Error, Result};
use crate::ids::{BatchId, QueryName};
use crate::progress::QueryProgress;
use crate::sink::{ForeachBatchSink, OutputMode, Sink};

impl StreamWriter {
    /// The query's stable name (default: the checkpoint directory's name).
    /// Sinks record it with their marker; keep it when the checkpoint is
    /// replaced, so the sink recognises the query.
    pub fn query_name(mut self, name: impl Into<String>) -> Self {
        self.query_name = Some(name.into());
        self
    }

    /// The query's name unless [`StreamWriter::query_name`] set one (a
    /// sink's or table's name, chosen by whatever starts the query).
    pub fn default_query_name(mut self, name: impl Into<String>) -> Self {
        if self.query_name.is_none() {
            self.query_name = Some(name.into());
        }
        self
    }

    /// The checkpoint's location (required): a local directory, or a URL
    /// of object storage such as `s3://chk/payments-bronze/` (also `gs://`,
    /// `az://`, `abfss://`), configured from the environment and
    /// [`StreamWriter::checkpoint_options`].
    pub fn checkpoint_location(mut self, location: impl Into<PathBuf>) -> Self {
        let options = match self.checkpoint.take() {
            Some(CheckpointLocation::Location(_, options)) => options,
            _ => HashMap::new(),
        };
        self.checkpoint = Some(CheckpointLocation::Location(location.into(), options));
        self
    }

    /// Options of the object store that holds the checkpoint, named as
    /// `object_store` names them (`aws_endpoint`, `aws_allow_http`,
    /// `google_service_account`, `azure_storage_account_name`, ...), and the
    /// lease's `lease_ttl_ms`, `lease_renew_ms` and `lease_clock_skew_ms`
    /// (see [`crate::checkpoint::LeaseTiming`]). They override the
    /// environment's; an option the store does not know is refused at start.
    pub fn checkpoint_options<K: Into<String>, V: Into<String>>(
        mut self,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        let (location, mut all) = match self.checkpoint.take() {
            Some(CheckpointLocation::Location(location, all)) => (location, all),
            _ => (PathBuf::new(), HashMap::new()),
        };
        all.extend(options.into_iter().map(|(k, v)| (k.into(), v.into())));
        self.checkpoint = Some(CheckpointLocation::Location(location, all));
        self
    }

    /// A checkpoint on another store (required, unless a location is set).
    pub fn checkpoint_store(mut self, store: Arc<dyn CheckpointStore>) -> Self {
        self.checkpoint = Some(CheckpointLocation::Store(store));
        self
    }

    /// When batches run (default: back to back).
    pub fn trigger(mut self, trigger: Trigger) -> Self {
        self.trigger = trigger;
        self
    }

    /// Append (default) or Complete.
    pub fn output_mode(mut self, mode: OutputMode) -> Self {
        self.output_mode = mode;
        self
    }

    /// How many writers a batch's rows are spread over (default: the number
    /// of cores).
    pub fn writer_parallelism(mut self, n: usize) -> Self {
        self.parallelism = n.max(1);
        self
    }

    /// How many batches the checkpoint's logs keep (default 100, at least 2).
    pub fn retain_batches(mut self, n: u64) -> Self {
        self.retain_batches = n.max(2);
        self
    }

    /// Stops the query once batch `batch` is committed (counting earlier
    /// runs), so a killed and restarted run ends at the same batch.
    pub fn stop_after_batch(mut self, batch: BatchId) -> Self {
        self.stop_after = Some(batch);
        self
    }

    /// Takes over the output of the query name written under another query
    /// id (its old checkpoint was lost): batch ids continue after its marker.
    pub fn take_over_output(mut self, yes: bool) -> Self {
        self.overrides.take_over_output = yes;
        self
    }

    /// Accepts a sink other than the one the checkpoint was created for.
    pub fn allow_sink_change(mut self, yes: bool) -> Self {
        self.overrides.allow_sink_change = yes;
        self
    }

    /// Goes on when the sink lost batches the checkpoint recorded.
    pub fn accept_lost_batches(mut self, yes: bool) -> Self {
        self.overrides.accept_lost_batches = yes;
        self
    }

    /// Goes on after the sink's marker when the checkpoint is behind it.
    pub fn resume_after_sink_marker(mut self, yes: bool) -> Self {
        self.overrides.resume_after_sink_marker = yes;
        self
    }

    /// Crash points armed by a test.
    pub fn crash_points(mut self, points: CrashPoints) -> Self {
        self.crash_points = points;
        self
    }

    /// Calls `f` with the progress of every committed batch.
    pub fn on_progress(mut self, f: impl Fn(&QueryProgress) + Send + Sync + 'static) -> Self {
        self.listeners.push(Arc::new(f));
        self
    }

    /// Starts the query writing into `sink`. Returns once the checkpoint's
    /// lease is held and every start-up guard passed; batches run on a task
    /// of the current Tokio runtime.
    pub async fn start(self, sink: impl Sink + 'static) -> Result<StreamingQuery> {
        self.start_arc(Arc::new(sink)).await
    }

    /// [`StreamWriter::start`] with a shared sink.
    pub async fn start_arc(self, sink: Arc<dyn Sink>) -> Result<StreamingQuery> {
        super::start::start(self, sink).await
    }

    /// Starts the query with a function called on each batch's rows.
    pub async fn foreach_batch<F, Fut>(self, f: F) -> Result<StreamingQuery>
    where
        F: Fn(Vec<arrow_array::RecordBatch>, BatchId) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = std::result::Result<(), BoxError>> + Send + 'static,
    {
        let name = self.resolved_name()?.to_string();
        self.start(ForeachBatchSink::new(name, f)).await
    }

    pub(crate) fn open_checkpoint(&self) -> Result<Checkpoint> {
        match &self.checkpoint {
            Some(CheckpointLocation::Location(path, _)) if path.as_os_str().is_empty() => Err(Error::InvalidOption {
                option: "checkpoint_location",
                reason: "checkpoint options were given without a checkpoint location; set checkpoint_location".into(),
            }),
            Some(CheckpointLocation::Location(path, options)) => match path.to_str() {
                Some(location) => Checkpoint::open(location, options),
                None => Ok(Checkpoint::new(Arc::new(LocalStore::open(path)?))),
            },
            Some(CheckpointLocation::Store(store)) => Ok(Checkpoint::new(store.clone())),
            None => Err(Error::InvalidOption {
                option: "checkpoint_location",
                reason: "a streaming query needs a checkpoint directory to be exactly-once; set checkpoint_location"
                    .into(),
            }),
        }
    }

    /// The explicit name, or one made from the checkpoint directory's name.
    pub(crate) fn resolved_name(&self) -> Result<QueryName> {
        if let Some(name) = &self.query_name {
            return Ok(QueryName::new(name.clone())?);
        }
        let base = match &self.checkpoint {
            Some(CheckpointLocation::Location(path, _)) => path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string(),
            Some(CheckpointLocation::Store(store)) => store
                .location()
                .rsplit('/')
                .find(|s| !s.is_empty())
                .unwrap_or_default()
                .to_string(),
            None => String::new(),
        };
        let cleaned: String = base
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '-'
                }
            })
            .take(200)
            .collect();
        Ok(QueryName::new(if cleaned.is_empty() {
            "query".to_string()
        } else {
            cleaned
        })?)
    }
}

impl ReadStream {
    /// Starts describing where the stream goes.
    pub fn write_stream(self) -> StreamWriter {
        StreamWriter::new(self)
    }
}
