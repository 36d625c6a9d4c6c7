//! The Delta sink: the [`Sink`] of weir-core on a Delta table.

use std::sync::{Arc, Once, RwLock};

use async_trait::async_trait;
use deltalake::kernel::transaction::{CommitBuilder, CommitConflictError, CommitProperties, TransactionError};
use deltalake::kernel::{Action, Add};
use deltalake::protocol::{DeltaOperation, OutputMode as DeltaOutputMode};
use deltalake::table::config::TablePropertiesExt;
use deltalake::{DeltaTable, DeltaTableError};
use serde_json::json;
use url::Url;
use weir_core::protocol::{decide_commit, CommitDecision, SinkIdentity, SinkMarker};
use weir_core::sink::{BatchContext, CommitMessage, CommitOutcome, DataWriter, OutputMode, QueryInfo, Sink};
use weir_core::{QueryId, QueryName};

use crate::error::DeltaSinkError;
use crate::marker;
use crate::options::{Compression, DeltaSinkOptions};
use crate::table::{self, Files, Layout};
use crate::writer::{delete_files, AddFile, DeltaWriter, WriterContext};

/// How often the sink re-reads the table and re-checks its marker after
/// losing a commit race before giving up (deltalake itself rebases past
/// writers that do not conflict).
const MAX_COMMIT_ATTEMPTS: usize = 100;

/// How many versions the sink's table is updated incrementally before it is
/// loaded afresh from the newest log checkpoint.
const RELOAD_EVERY: u64 = 100;

/// deltalake's own retries of a commit over non-conflicting winners.
const DELTA_RETRIES: usize = 15;

/// Writes a streaming query's batches into a Delta table, each batch exactly
/// once: its files and the query's `txn` marker in one Delta commit.
///
/// ```no_run
/// use weir_core::prelude::*;
/// use weir_delta::DeltaSink;
///
/// # async fn run() -> weir_core::Result<()> {
/// let sink = DeltaSink::try_new("lake/bronze/payments")?.with_partition_by(["account_id"]);
/// let query = read_stream(RateSource::rows_per_second(1000))
///     .write_stream()
///     .query_name("payments-bronze")
///     .checkpoint_location("chk/payments-bronze")
///     .start(sink)
///     .await?;
/// # query.stop_and_wait().await
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DeltaSink {
    url: Url,
    options: DeltaSinkOptions,
    state: Arc<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The loaded table, kept between commits so each reads only new log
    /// entries.
    table: tokio::sync::Mutex<Option<DeltaTable>>,
    /// The version at which `table` was last loaded afresh.
    loaded_at: std::sync::Mutex<u64>,
    /// Markers, kept current with the table (locked after `table`).
    txns: tokio::sync::Mutex<marker::TxnCache>,
    /// Fixed by `prepare`: how rows map to files, and where files go.
    prepared: RwLock<Option<Prepared>>,
}

#[derive(Debug, Clone)]
struct Prepared {
    layout: Arc<Layout>,
    store: Arc<dyn deltalake::ObjectStore>,
}

static REGISTER_STORES: Once = Once::new();

impl DeltaSink {
    /// A sink on the Delta table at `location`: a local directory or an
    /// object store URL (`s3://bucket/path`). The table is created from the
    /// stream's schema when the query starts, if there is none.
    pub fn try_new(location: &str) -> Result<Self, DeltaSinkError> {
        REGISTER_STORES.call_once(|| deltalake::aws::register_handlers(None));
        Ok(DeltaSink {
            url: table::table_url(location)?,
            options: DeltaSinkOptions::default(),
            state: Arc::default(),
        })
    }

    /// All options at once.
    pub fn with_options(mut self, options: DeltaSinkOptions) -> Self {
        self.options = options;
        self
    }

    /// Partition columns of a table the sink creates.
    pub fn with_partition_by<S: Into<String>>(mut self, columns: impl IntoIterator<Item = S>) -> Self {
        self.options.partition_by = columns.into_iter().map(Into::into).collect();
        self
    }

    /// A table property of a table the sink creates.
    pub fn with_table_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.table_properties.insert(key.into(), value.into());
        self
    }

    /// Add the stream's new nullable columns to the table.
    pub fn with_merge_schema(mut self, merge: bool) -> Self {
        self.options.merge_schema = merge;
        self
    }

    /// A storage option for the object store (endpoint, region, keys).
    pub fn with_storage_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.storage_options.insert(key.into(), value.into());
        self
    }

    /// The size at which data files are closed.
    pub fn with_target_file_size(mut self, bytes: u64) -> Self {
        self.options.target_file_size = Some(bytes);
        self
    }

    /// The Parquet compression of data files.
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.options.compression = compression;
        self
    }

    /// The table's URL.
    pub fn url(&self) -> &Url {
        &self.url
    }

    fn err(&self, source: DeltaTableError) -> DeltaSinkError {
        DeltaSinkError::Delta {
            table: self.url.to_string(),
            source,
        }
    }

    fn prepared(&self) -> Result<Prepared, DeltaSinkError> {
        self.state
            .prepared
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| DeltaSinkError::NotPrepared {
                table: self.url.to_string(),
            })
    }

    fn layout(&self) -> Result<Arc<Layout>, DeltaSinkError> {
        self.prepared().map(|p| p.layout)
    }

    /// The table brought up to its latest version.
    async fn latest<'a>(&self, slot: &'a mut Option<DeltaTable>) -> Result<&'a DeltaTable, DeltaSinkError> {
        // A table updated commit by commit carries every commit since it was
        // loaded; loaded afresh, it starts from the newest log checkpoint.
        if let Some(table) = slot.as_ref() {
            let version = table.version().unwrap_or(0);
            let mut loaded_at = self.state.loaded_at.lock().unwrap_or_else(|e| e.into_inner());
            if version >= *loaded_at + RELOAD_EVERY {
                *loaded_at = version;
                *slot = None;
            }
        }
        match slot {
            Some(table) => table.update_incremental(None).await.map_err(|e| self.err(e))?,
            None => {
                let table = table::load(&self.url, &self.options, Files::Untracked)
                    .await?
                    .ok_or_else(|| {
                        self.err(DeltaTableError::NotATable(format!(
                            "{} has no Delta table (was it deleted?)",
                            self.url
                        )))
                    })?;
                *slot = Some(table);
            }
        }
        Ok(slot.as_ref().expect("loaded above"))
    }

    fn actions(
        &self,
        table: &DeltaTable,
        ctx: &BatchContext,
        files: &[AddFile],
        layout: &Layout,
    ) -> Result<Vec<Action>, DeltaSinkError> {
        let mut actions = Vec::with_capacity(files.len() + 1);
        // Only a query that adds columns pays for comparing schemas.
        if !layout.added_columns.is_empty() {
            if let Some(metadata) = table::merged_metadata(table, &self.url, &layout.added_columns)? {
                actions.push(Action::Metadata(metadata));
            }
        }
        if ctx.output_mode == OutputMode::Complete {
            let snapshot = table.snapshot().map_err(|e| self.err(e))?;
            actions.extend(
                snapshot
                    .log_data()
                    .iter()
                    .map(|f| Action::Remove(f.remove_action(true))),
            );
        }
        actions.extend(files.iter().map(|f| {
            Action::Add(Add {
                path: f.path.clone(),
                partition_values: f.partition_values.clone().into_iter().collect(),
                size: f.size,
                modification_time: f.modification_time,
                data_change: true,
                stats: Some(f.stats.clone()),
                ..Default::default()
            })
        }));
        Ok(actions)
    }

    /// One commit attempt. Returns the version once the log entry landed;
    /// the post-commit work (log checkpoint, expired-log cleanup) runs after,
    /// and its failure is logged, never reported as a failed commit.
    async fn try_commit(
        &self,
        table: &DeltaTable,
        ctx: &BatchContext,
        actions: Vec<Action>,
    ) -> Result<i64, DeltaTableError> {
        let metadata = [
            ("weir.queryName".to_string(), json!(ctx.query_name.as_str())),
            ("weir.queryId".to_string(), json!(ctx.query_id.to_string())),
            ("weir.batchId".to_string(), json!(ctx.batch_id.0)),
            ("weir.runId".to_string(), json!(ctx.run_id.to_string())),
            ("weir.attemptId".to_string(), json!(ctx.attempt_id.to_string())),
        ];
        // Complete mode must not be rebased over another writer's adds: its
        // removes would miss them. Any winner sends it back to the loop,
        // which rebuilds the removes from the new snapshot.
        let retries = match ctx.output_mode {
            OutputMode::Append => DELTA_RETRIES,
            OutputMode::Complete => 0,
        };
        let properties = CommitProperties::default()
            .with_application_transactions(marker::transactions(&ctx.query_name, ctx.query_id, ctx.batch_id))
            .with_metadata(metadata)
            .with_max_retries(retries)
            // Expired-log cleanup lists the whole log; it runs only after a
            // log checkpoint instead (see `after_commit`).
            .with_cleanup_expired_logs(Some(false));
        let operation = DeltaOperation::StreamingUpdate {
            output_mode: match ctx.output_mode {
                OutputMode::Append => DeltaOutputMode::Append,
                OutputMode::Complete => DeltaOutputMode::Complete,
            },
            query_id: ctx.query_id.to_string(),
            epoch_id: ctx.batch_id.0 as i64,
        };
        // The commit has landed once the prepared commit resolves. Its
        // post-commit hook (which rebuilds a snapshot of every file) is not
        // run; `after_commit` writes log checkpoints instead.
        let landed = CommitBuilder::from(properties)
            .with_actions(actions)
            .build(Some(table.snapshot()?), table.log_store(), operation)
            .into_prepared_commit_future()
            .await?
            .await?;
        let version = landed.version;
        self.after_commit(table, version).await;
        Ok(version as i64)
    }

    /// Every `delta.checkpointInterval` commits (counted as deltalake does),
    /// writes a log checkpoint and removes log files past the table's
    /// retention. Failures are logged: the batch is committed, and the next
    /// due commit tries again.
    async fn after_commit(&self, table: &DeltaTable, version: u64) {
        let Ok(snapshot) = table.snapshot() else { return };
        let config = snapshot.table_config();
        if !(version + 1).is_multiple_of(config.checkpoint_interval().get()) {
            return;
        }
        let cleanup = config.enable_expired_log_cleanup();
        let retention = config.log_retention_duration();
        let full = match table::load(&self.url, &self.options, Files::Tracked).await {
            Ok(Some(full)) => full,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(version, error = %e, "could not load the table for a log checkpoint");
                return;
            }
        };
        if let Err(e) = deltalake::checkpoints::create_checkpoint(&full, None).await {
            tracing::warn!(version, error = %e, "the batch is committed; the log checkpoint after it failed and is retried at the next interval");
            return;
        }
        if cleanup {
            let cutoff = chrono::Utc::now().timestamp_millis() - retention.as_millis() as i64;
            let log_store = full.log_store();
            if let Err(e) =
                deltalake::checkpoints::cleanup_expired_logs_for(version, log_store.as_ref(), cutoff, None).await
            {
                tracing::warn!(version, error = %e, "expired-log cleanup failed; the next checkpoint retries it");
            }
        }
    }

    /// Whether a commit of this attempt landed (seen after a lost race that
    /// was really our own write retried inside the object store or
    /// deltalake): its commit info carries the attempt id.
    async fn attempt_landed(
        &self,
        table: &DeltaTable,
        ctx: &BatchContext,
        since_version: u64,
    ) -> Result<bool, DeltaTableError> {
        let latest = table.version().unwrap_or(0);
        let depth = (latest.saturating_sub(since_version) + 1) as usize;
        let attempt = ctx.attempt_id.to_string();
        Ok(table
            .history(Some(depth))
            .await?
            .any(|info| info.info.get("weir.attemptId").and_then(|v| v.as_str()) == Some(attempt.as_str())))
    }
}

/// Whether a failed commit lost a race that a re-read and a retry can win.
fn lost_race(e: &DeltaTableError) -> bool {
    match e {
        DeltaTableError::VersionAlreadyExists(_) => true,
        DeltaTableError::Transaction { source } => matches!(
            source,
            TransactionError::CommitConflict(
                CommitConflictError::ConcurrentTransaction
                    | CommitConflictError::ConcurrentAppend
                    | CommitConflictError::ConcurrentDeleteRead
                    | CommitConflictError::ConcurrentDeleteDelete
                    | CommitConflictError::MetadataChanged
            ) | TransactionError::VersionAlreadyExists(_)
                | TransactionError::MaxCommitAttempts(_)
        ),
        _ => false,
    }
}

#[async_trait]
impl Sink for DeltaSink {
    fn identity(&self) -> SinkIdentity {
        let mut identity = SinkIdentity::new("delta", self.url.as_str());
        identity.table_id = self.layout().ok().map(|l| l.table_id.clone());
        identity
    }

    fn check_output_mode(&self, _mode: OutputMode) -> Result<(), String> {
        Ok(())
    }

    async fn prepare(&self, query: &QueryInfo) -> weir_core::Result<()> {
        let mut slot = self.state.table.lock().await;
        let table = match table::load(&self.url, &self.options, Files::Untracked).await? {
            Some(table) => table,
            None => table::create(&self.url, &query.schema, &self.options).await?,
        };
        let layout = table::layout(&table, &self.url, &query.schema, query.output_mode, &self.options)?;
        tracing::info!(table = %self.url, partitions = ?layout.partition_columns, target_file_size = layout.target_file_size, "Delta sink ready");
        let prepared = Prepared {
            layout: Arc::new(layout),
            store: table.log_store().object_store(None),
        };
        *self.state.prepared.write().unwrap_or_else(|e| e.into_inner()) = Some(prepared);
        *slot = Some(table);
        Ok(())
    }

    async fn marker(&self, name: &QueryName, known_ids: &[QueryId]) -> weir_core::Result<Option<SinkMarker>> {
        let mut slot = self.state.table.lock().await;
        let table = self.latest(&mut slot).await?;
        let mut txns = self.state.txns.lock().await;
        Ok(marker::read(table, &mut txns, name, known_ids)
            .await
            .map_err(|e| self.err(e))?)
    }

    fn create_writer(&self, batch: &BatchContext, partition_id: usize) -> weir_core::Result<Box<dyn DataWriter>> {
        let Prepared { layout, store } = self.prepared()?;
        let ctx = WriterContext {
            table: self.url.to_string(),
            store,
            layout,
            compression: self.options.compression,
            file_prefix: format!(
                "part-{:05}-{}-{}-p{:03}",
                batch.batch_id.0, batch.query_id, batch.attempt_id, partition_id
            ),
            batch_id: batch.batch_id,
        };
        Ok(Box::new(DeltaWriter::new(ctx, partition_id)))
    }

    async fn commit(&self, ctx: &BatchContext, messages: Vec<CommitMessage>) -> weir_core::Result<CommitOutcome> {
        let core = |e: DeltaSinkError| e.into_core(Some(ctx.batch_id));
        let layout = self.layout()?;
        let mut files = Vec::new();
        for m in &messages {
            files.extend(m.decode::<Vec<AddFile>>()?);
        }
        let mut slot = self.state.table.lock().await;
        let mut txns = self.state.txns.lock().await;
        // The version before this batch's first try: a commit of this
        // attempt can only be after it.
        let mut first_try: Option<u64> = None;
        let mut full: Option<DeltaTable>;
        for attempt in 1..=MAX_COMMIT_ATTEMPTS {
            let table = match ctx.output_mode {
                OutputMode::Append => self.latest(&mut slot).await.map_err(core)?,
                // Complete mode removes every live file: it needs them all.
                OutputMode::Complete => {
                    full = table::load(&self.url, &self.options, Files::Tracked)
                        .await
                        .map_err(core)?;
                    full.as_ref()
                        .ok_or_else(|| core(self.err(DeltaTableError::NotATable(self.url.to_string()))))?
                }
            };
            let snapshot = table.snapshot().map_err(|e| core(self.err(e)))?;
            if snapshot.metadata().id() != layout.table_id {
                return Err(core(DeltaSinkError::TableReplaced {
                    table: self.url.to_string(),
                    expected: layout.table_id.clone(),
                    found: snapshot.metadata().id().to_string(),
                }));
            }
            // The marker is read on the snapshot the commit is built on; a
            // winner that moves it makes deltalake fail the commit with a
            // conflict, and the next attempt reads it again.
            let found = marker::read(table, &mut txns, &ctx.query_name, &ctx.known_ids())
                .await
                .map_err(|e| core(self.err(e)))?;
            if let CommitDecision::AlreadyCommitted(m) = decide_commit(found, ctx.commit_facts())? {
                if let Some(since) = first_try {
                    if self
                        .attempt_landed(table, ctx, since)
                        .await
                        .map_err(|e| core(self.err(e)))?
                    {
                        tracing::info!(attempt, "the lost race was this attempt's own commit");
                        return Ok(CommitOutcome::Committed { version: None });
                    }
                }
                return Ok(CommitOutcome::AlreadyCommitted(m));
            }
            first_try.get_or_insert(table.version().unwrap_or(0));
            let actions = self.actions(table, ctx, &files, &layout).map_err(core)?;
            match self.try_commit(table, ctx, actions).await {
                Ok(version) => {
                    tracing::debug!(version, attempt, files = files.len(), "committed to Delta");
                    return Ok(CommitOutcome::Committed { version: Some(version) });
                }
                Err(e) if lost_race(&e) => {
                    tracing::info!(attempt, error = %e, "lost a commit race; re-reading the table");
                    // A little jittered backoff so racing writers spread out.
                    let jitter = u64::from(ctx.attempt_id.as_u128() as u16 % 20);
                    tokio::time::sleep(std::time::Duration::from_millis((attempt as u64 * 5).min(200) + jitter)).await;
                }
                Err(e) => return Err(core(self.err(e))),
            }
        }
        Err(core(DeltaSinkError::TooManyConflicts {
            table: self.url.to_string(),
            batch_id: ctx.batch_id,
            attempts: MAX_COMMIT_ATTEMPTS,
        }))
    }

    async fn abort(&self, _batch: &BatchContext, messages: Vec<CommitMessage>) -> weir_core::Result<()> {
        let Ok(Prepared { store, .. }) = self.prepared() else {
            return Ok(());
        };
        for m in &messages {
            if let Ok(files) = m.decode::<Vec<AddFile>>() {
                delete_files(&store, &files).await;
            }
        }
        Ok(())
    }
}
