//! The file sink: a batch's files first, then its log entry.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use arrow_schema::Schema;
use async_trait::async_trait;
use weir_core::partition;
use weir_core::protocol::{SinkIdentity, SinkMarker};
use weir_core::sink::{
    commit_batch, BatchContext, CommitMessage, CommitOutcome, DataWriter, QueryInfo, Sink, TableCommit, Tried,
};
use weir_core::{BatchId, QueryId, QueryName};

use crate::error::FileSinkError;
use crate::log::{EntryHeader, FileEntry, MetadataLog, Written};
use crate::store::Output;
use crate::writer::{delete_files, Coalesced, FileFormat, FileWriter, Layout, WriterContext};
use weir_core::sync::Recover;

/// How many times a commit re-reads the log after another writer took the
/// batch's entry first.
const MAX_COMMIT_ATTEMPTS: usize = 5;

/// Options of the file sink.
#[derive(Debug, Clone)]
pub struct FileSinkOptions {
    /// The format of the files.
    pub format: FileFormat,
    /// Partition columns: their values become `col=value/` directories.
    pub partition_by: Vec<String>,
    /// The size at which a file is closed and another begun.
    pub target_file_size: u64,
    /// Every this many batches, the batch's log entry lists every file so
    /// far (`N.compact`), and older entries go.
    pub log_compact_interval: u64,
    /// Files of batches committed longer ago than this leave the log at its
    /// next compaction: log-aware readers no longer see them (the files
    /// stay until removed as orphans). `None`: the log keeps every file.
    pub log_retention: Option<Duration>,
    /// Object storage options for `s3://` outputs.
    pub storage_options: HashMap<String, String>,
    /// Write each batch into at most this many files per partition (more
    /// only when a file passes the target size), whatever the query's
    /// writer parallelism: the writers share that many files.
    pub max_files_per_partition: Option<usize>,
}

impl Default for FileSinkOptions {
    fn default() -> Self {
        FileSinkOptions {
            format: FileFormat::Parquet,
            partition_by: Vec::new(),
            target_file_size: 128 << 20,
            log_compact_interval: 10,
            log_retention: None,
            storage_options: HashMap::new(),
            max_files_per_partition: None,
        }
    }
}

/// Writes a streaming query's batches as files into a directory, each batch
/// exactly once: its files first, then `_weir_metadata/N` listing them.
///
/// ```no_run
/// use weir_core::prelude::*;
/// use weir_files::FileSink;
///
/// # async fn run() -> weir_core::Result<()> {
/// let sink = FileSink::try_new("out/payments")?.with_partition_by(["account_id"]);
/// let query = read_stream(RateSource::rows_per_second(1000))
///     .write_stream()
///     .query_name("payments-files")
///     .checkpoint_location("chk/payments-files")
///     .start(sink)
///     .await?;
/// # query.stop_and_wait().await
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct FileSink {
    location: String,
    options: FileSinkOptions,
    output: Output,
    prepared: Arc<RwLock<Option<Arc<Layout>>>>,
    /// The shared writers of each coalesced batch attempt.
    coalesced: Arc<std::sync::Mutex<HashMap<uuid::Uuid, Arc<Coalesced>>>>,
}

impl FileSink {
    /// A sink into the directory `location` (a local path or `s3://`).
    pub fn try_new(location: &str) -> Result<Self, FileSinkError> {
        Self::with_options(location, FileSinkOptions::default())
    }

    /// A sink with every option at once.
    pub fn with_options(location: &str, options: FileSinkOptions) -> Result<Self, FileSinkError> {
        let output = Output::open(location, &options.storage_options, true)?;
        Ok(FileSink {
            location: location.to_string(),
            options,
            output,
            prepared: Arc::default(),
            coalesced: Arc::default(),
        })
    }

    /// Partition columns.
    pub fn with_partition_by<S: Into<String>>(mut self, columns: impl IntoIterator<Item = S>) -> Self {
        self.options.partition_by = columns.into_iter().map(Into::into).collect();
        self
    }

    /// The format of the files.
    pub fn with_format(mut self, format: FileFormat) -> Self {
        self.options.format = format;
        self
    }

    /// The size at which a file is closed.
    pub fn with_target_file_size(mut self, bytes: u64) -> Self {
        self.options.target_file_size = bytes.max(1);
        self
    }

    /// Batches between two compact log entries.
    pub fn with_log_compact_interval(mut self, batches: u64) -> Self {
        self.options.log_compact_interval = batches.max(1);
        self
    }

    /// At most `files` files per partition per batch (see
    /// [`FileSinkOptions::max_files_per_partition`]).
    pub fn with_max_files_per_partition(mut self, files: usize) -> Self {
        self.options.max_files_per_partition = Some(files.max(1));
        self
    }

    /// How long files stay in the log (see [`FileSinkOptions::log_retention`]).
    pub fn with_log_retention(mut self, retention: Duration) -> Self {
        self.options.log_retention = Some(retention);
        self
    }

    /// The sink's metadata log.
    pub fn log(&self) -> MetadataLog {
        MetadataLog::new(
            self.output.clone(),
            self.options.log_compact_interval,
            self.options.log_retention,
        )
    }

    fn layout(&self) -> Result<Arc<Layout>, FileSinkError> {
        self.prepared
            .read()
            .recover()
            .clone()
            .ok_or_else(|| FileSinkError::Unsupported {
                location: self.output.shown.clone(),
                reason: "the sink was used before prepare; start it through a streaming query".into(),
            })
    }

    /// The marker of `name` in the latest entry; an entry of another query
    /// name is an error (a log serves one query).
    async fn read_marker(&self, name: &QueryName) -> Result<Option<SinkMarker>, FileSinkError> {
        let Some(h) = self.log().latest_header().await? else {
            return Ok(None);
        };
        if h.query_name != name.as_str() {
            return Err(FileSinkError::OtherQuery {
                location: self.output.shown.clone(),
                owner: h.query_name,
                name: name.to_string(),
                batch_id: BatchId(h.batch_id),
            });
        }
        let query_id = uuid::Uuid::parse_str(&h.query_id)
            .map(QueryId)
            .map_err(|e| FileSinkError::BadEntry {
                location: self.output.shown.clone(),
                path: format!("{}/{}", crate::LOG_DIR, h.batch_id),
                reason: format!("query id {:?}: {e}", h.query_id),
            })?;
        Ok(Some(SinkMarker {
            query_id,
            batch_id: BatchId(h.batch_id),
        }))
    }
}

#[async_trait]
impl Sink for FileSink {
    fn identity(&self) -> SinkIdentity {
        SinkIdentity::new("files", &self.output.shown)
    }

    async fn prepare(&self, query: &QueryInfo) -> weir_core::Result<()> {
        let err = |reason: String| FileSinkError::Unsupported {
            location: self.output.shown.clone(),
            reason,
        };
        let schema = &query.schema;
        let mut partition_indices = Vec::new();
        for column in &self.options.partition_by {
            let i = schema
                .index_of(column)
                .map_err(|_| err(format!("partition column {column:?} is not in the stream")))?;
            let t = schema.field(i).data_type();
            if !partition::supported(t) {
                return Err(err(format!(
                    "partition column {column:?} is {t}; weir partitions by strings, integers, dates, booleans, timestamps (in microseconds) and decimals"
                ))
                .into());
            }
            partition_indices.push(i);
        }
        let file_columns: Vec<usize> = (0..schema.fields().len())
            .filter(|i| !partition_indices.contains(i))
            .collect();
        if file_columns.is_empty() {
            return Err(err("every column is a partition column, so the files would hold none".into()).into());
        }
        let mut file_schema = Schema::new(
            file_columns
                .iter()
                .map(|i| schema.field(*i).clone())
                .collect::<Vec<_>>(),
        );
        if self.options.format == FileFormat::JsonLines {
            file_schema = crate::writer::json_schema(&file_schema).map_err(err)?;
        }
        let file_schema = Arc::new(file_schema);
        // The log must be this query's (or empty).
        self.read_marker(&query.query_name).await?;
        *self.prepared.write().recover() = Some(Arc::new(Layout {
            format: self.options.format,
            partition_columns: self.options.partition_by.clone(),
            partition_indices,
            file_schema,
            file_columns,
            target_file_size: self.options.target_file_size,
        }));
        tracing::info!(output = %self.output.shown, location = %self.location, "file sink ready");
        Ok(())
    }

    async fn marker(&self, name: &QueryName, _known_ids: &[QueryId]) -> weir_core::Result<Option<SinkMarker>> {
        Ok(self.read_marker(name).await?)
    }

    fn create_writer(&self, batch: &BatchContext, partition_id: usize) -> weir_core::Result<Box<dyn DataWriter>> {
        let ctx = WriterContext {
            output: self.output.clone(),
            layout: self.layout()?,
            file_prefix: format!(
                "part-{:05}-{}-{}-p{partition_id:03}",
                batch.batch_id.0, batch.query_id, batch.attempt_id
            ),
            batch_id: batch.batch_id,
        };
        let Some(n) = self.options.max_files_per_partition else {
            return Ok(Box::new(FileWriter::new(ctx, partition_id)));
        };
        let mut coalesced = self.coalesced.lock().recover();
        // Attempts of other batches are done: the driver runs one at a time.
        coalesced.retain(|attempt, _| *attempt == batch.attempt_id);
        let ctx = WriterContext {
            file_prefix: format!("part-{:05}-{}-{}", batch.batch_id.0, batch.query_id, batch.attempt_id),
            ..ctx
        };
        let shared = coalesced
            .entry(batch.attempt_id)
            .or_insert_with(|| Arc::new(Coalesced::new(&ctx, n)));
        Ok(Box::new(shared.handle(partition_id)))
    }

    async fn commit(&self, ctx: &BatchContext, messages: Vec<CommitMessage>) -> weir_core::Result<CommitOutcome> {
        let mut files: Vec<FileEntry> = Vec::new();
        for m in &messages {
            files.extend(m.decode::<Vec<FileEntry>>()?);
        }
        let mut commit = LogCommit {
            sink: self,
            log: self.log(),
            ctx,
            files,
        };
        commit_batch(&mut commit, ctx, MAX_COMMIT_ATTEMPTS).await
    }

    async fn abort(&self, _batch: &BatchContext, messages: Vec<CommitMessage>) -> weir_core::Result<()> {
        for m in &messages {
            if let Ok(files) = m.decode::<Vec<FileEntry>>() {
                delete_files(&self.output, &files).await;
            }
        }
        Ok(())
    }
}

/// One batch's commit to the metadata log: its entry, named by the batch id,
/// put if absent. The log has no base to load: the entry's name is the
/// condition.
struct LogCommit<'a> {
    sink: &'a FileSink,
    log: MetadataLog,
    ctx: &'a BatchContext,
    files: Vec<FileEntry>,
}

impl LogCommit<'_> {
    fn core(&self, e: FileSinkError) -> weir_core::Error {
        e.into_core(Some(self.ctx.batch_id))
    }
}

#[async_trait]
impl TableCommit for LogCommit<'_> {
    type Base = ();

    async fn base(&mut self, _attempt: usize) -> weir_core::Result<()> {
        Ok(())
    }

    async fn marker(&mut self, _base: &()) -> weir_core::Result<Option<SinkMarker>> {
        let found = self.sink.read_marker(&self.ctx.query_name).await;
        found.map_err(|e| self.core(e))
    }

    async fn already(&mut self, _base: (), _tried: bool) -> weir_core::Result<Option<Option<i64>>> {
        // A write that reported an error may have been this attempt's.
        let latest = self.log.latest_header().await.map_err(|e| self.core(e))?;
        let attempt = self.ctx.attempt_id.to_string();
        Ok(latest
            .is_some_and(|h| h.attempt_id.as_deref() == Some(attempt.as_str()))
            .then_some(Some(self.ctx.batch_id.0 as i64)))
    }

    async fn try_commit(&mut self, _base: (), _attempt: usize) -> weir_core::Result<Tried> {
        let ctx = self.ctx;
        let header = EntryHeader {
            query_name: ctx.query_name.to_string(),
            query_id: ctx.query_id.to_string(),
            batch_id: ctx.batch_id.0,
            committed_at: chrono::Utc::now().timestamp_millis(),
            attempt_id: Some(ctx.attempt_id.to_string()),
            retained_from: None,
        };
        match self
            .log
            .commit(header, self.files.clone())
            .await
            .map_err(|e| self.core(e))?
        {
            Written::Written => {
                tracing::debug!(
                    batch = ctx.batch_id.0,
                    files = self.files.len(),
                    "committed to the file log"
                );
                Ok(Tried::Landed {
                    version: Some(ctx.batch_id.0 as i64),
                })
            }
            // Another run took the entry first: read it and decide again.
            Written::Exists => {
                tracing::info!(
                    batch = ctx.batch_id.0,
                    "the batch's log entry was written by another run"
                );
                Ok(Tried::Lost)
            }
        }
    }

    fn backs_off(&self, _attempt: usize) -> bool {
        false
    }

    fn too_many_conflicts(&self, _attempts: usize) -> weir_core::Error {
        self.core(FileSinkError::LogConflict {
            location: self.sink.output.shown.clone(),
            batch_id: self.ctx.batch_id,
        })
    }
}
