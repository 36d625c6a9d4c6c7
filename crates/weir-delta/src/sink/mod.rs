//! The Delta sink: the [`Sink`] of weir-core on a Delta table.

use std::sync::{Arc, Once, RwLock};
use std::time::{Duration, Instant};

use arrow_schema::SchemaRef;
use async_trait::async_trait;
use deltalake::kernel::transaction::{CommitBuilder, CommitConflictError, CommitProperties, TransactionError};
use deltalake::kernel::Action;
use deltalake::logstore::CommitOrBytes;
use deltalake::table::config::TablePropertiesExt;
use deltalake::{DeltaTable, DeltaTableError};
use futures::FutureExt;
use url::Url;
use weir_core::protocol::{SinkIdentity, SinkMarker};
use weir_core::sink::{
    commit_batch, Background, BatchContext, Close, CommitMessage, CommitOutcome, CompactionPolicy, DataWriter,
    OutputMode, Periodic, QueryInfo, Sink, TableCommit, Tried,
};
use weir_core::{QueryId, QueryName};

use crate::entry;
use crate::error::DeltaSinkError;
use crate::marker;
use crate::open_file::AddFile;
use crate::options::{Compression, DeltaSinkOptions};
use crate::table::{self, Files, Layout};
use crate::writer::{delete_files, DeltaWriter, WriterContext};

/// How often the sink re-reads the table and re-checks its marker after
/// losing a commit race before giving up (deltalake itself rebases past
/// writers that do not conflict).
const MAX_COMMIT_ATTEMPTS: usize = 100;

/// How many versions the sink's table is updated incrementally before it is
/// loaded afresh from the newest log checkpoint.
const RELOAD_EVERY: u64 = 100;

/// deltalake's own retries of a commit over non-conflicting winners.
const DELTA_RETRIES: usize = 15;

/// How long a version seen as the log's latest stays the base of a commit
/// without listing the log again (at most half the table's log retention:
/// cleanup removes only entries older than that, so within it a missing
/// next entry proves the version is the latest).
const TRUST_LATEST_FOR: Duration = Duration::from_secs(15 * 60);

/// How many times in a row other writers may change the table's metadata
/// while the sink reloads it.
const MAX_RELOADS: usize = 10;

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
    compaction: Option<CompactionPolicy>,
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
    /// Commits and the running background compaction.
    compacting: Periodic,
    /// The background compaction and log checkpoints, ended with the query.
    background: Background,
    /// The log checkpoints, one at a time.
    checkpoints: checkpoints::Checkpoints,
}

#[derive(Debug, Clone)]
struct Prepared {
    layout: Arc<Layout>,
    store: Arc<dyn deltalake::ObjectStore>,
    /// The stream's schema and output mode, to fit the table again when
    /// another writer changes its metadata.
    schema: SchemaRef,
    mode: OutputMode,
    /// Update mode: the columns naming a row's group.
    key: Vec<String>,
}

static REGISTER_STORES: Once = Once::new();

mod checkpoints;
mod commit;
mod upsert;

use commit::DeltaCommit;
use weir_core::sync::Recover;

impl DeltaSink {
    /// A sink on the Delta table at `location`: a local directory or an
    /// object store URL (`s3://bucket/path`). The table is created from the
    /// stream's schema when the query starts, if there is none.
    pub fn try_new(location: &str) -> Result<Self, DeltaSinkError> {
        REGISTER_STORES.call_once(|| deltalake::aws::register_handlers(None));
        Ok(DeltaSink {
            url: table::table_url(location)?,
            options: DeltaSinkOptions::default(),
            compaction: None,
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

    /// Compacts small files in the background as the query commits (see
    /// [`crate::Compact`]): one rewrite at a time, with the sink's
    /// compression and target size, its commits rebased over the query's;
    /// never two compactions at once from this sink. The query's end ends
    /// them ([`Sink::close`]); clones of this sink share them, so give each
    /// query a sink of its own.
    pub fn with_compaction(mut self, policy: CompactionPolicy) -> Self {
        self.compaction = Some(policy);
        self
    }

    /// After a commit that added `files` data files: when the policy says
    /// so, a compaction in the background, one at a time (one due while it
    /// runs follows it); its failure is logged, never the batch's.
    fn maybe_compact(&self, files: usize) {
        let Some(policy) = self.compaction else { return };
        let (location, storage) = (self.url.to_string(), self.options.storage_options.clone());
        let compression = self.options.compression;
        let (state, target) = (&self.state, self.options.target_file_size);
        policy.compact_when_due(
            &state.compacting,
            &state.background,
            files,
            location.clone(),
            target,
            move |options| {
                let (location, storage) = (location.clone(), storage.clone());
                async move {
                    let job = crate::Compact::new(&location)?;
                    let job = job.with_storage_options(storage).with_options(options);
                    job.with_compression(compression).await
                }
            },
        );
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
            .recover()
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
            let mut loaded_at = self.state.loaded_at.lock().recover();
            if self.reload_due(*loaded_at, version) {
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
            // Each remove names its file exactly as the log's add did.
            let raw_paths = crate::data_file::raw_paths(self.url.as_str(), snapshot)?;
            actions.extend(snapshot.log_data().iter().map(|f| {
                let mut remove = f.remove_action(true);
                if let Some(raw) = raw_paths.get(&remove.path) {
                    remove.path = raw.clone();
                }
                Action::Remove(remove)
            }));
        }
        actions.extend(files.iter().map(|f| entry::add(f, true)));
        Ok(actions)
    }

    /// Whether a table loaded at version `loaded` and now at `latest` is
    /// loaded afresh: once a log checkpoint newer than `loaded` is written
    /// (by this sink, in the background) and [`RELOAD_EVERY`] versions have
    /// passed, or after twice that whatever the checkpoints.
    fn reload_due(&self, loaded: u64, latest: u64) -> bool {
        let gap = latest.saturating_sub(loaded);
        gap >= 2 * RELOAD_EVERY || (gap >= RELOAD_EVERY && self.state.checkpoints.written().is_some_and(|w| w > loaded))
    }

    /// One commit attempt. Returns the version once the log entry landed;
    /// the post-commit work (a log checkpoint in the background) starts
    /// after, and its failure is logged, never reported as a failed commit. Without
    /// `may_rebase`, a version taken first is a lost race for the loop to
    /// read, not one for deltalake to rebase over.
    async fn try_commit(
        &self,
        table: &DeltaTable,
        ctx: &BatchContext,
        actions: Vec<Action>,
        may_rebase: bool,
    ) -> Result<i64, DeltaTableError> {
        // Complete mode must not be rebased over another writer's adds: its
        // removes would miss them. Any winner sends it back to the loop,
        // which rebuilds the removes from the new snapshot.
        // Update mode likewise: a winner may have rewritten a file that
        // holds one of its groups.
        let retries = match ctx.output_mode {
            OutputMode::Append if may_rebase => DELTA_RETRIES,
            _ => 0,
        };
        let properties = CommitProperties::default()
            .with_application_transactions(marker::transactions(&ctx.query_name, ctx.query_id, ctx.batch_id))
            .with_metadata(entry::commit_metadata(ctx))
            .with_max_retries(retries)
            // Expired-log cleanup lists the whole log; it runs only after a
            // log checkpoint instead (see `after_commit`).
            .with_cleanup_expired_logs(Some(false));
        let operation = entry::streaming_update(ctx);
        let added = actions.iter().filter(|a| matches!(a, Action::Add(_))).count();
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
        self.after_commit(table, version, added);
        Ok(version as i64)
    }

    /// Every `delta.checkpointInterval` commits (counted as deltalake does),
    /// starts writing a log checkpoint and removing log files past the
    /// table's retention, in the background: the next batch never waits for
    /// it. Failures are logged: the batch is committed, and the next due
    /// checkpoint tries again.
    fn after_commit(&self, table: &DeltaTable, version: u64, files: usize) {
        if let Some(due) = table::DueCheckpoint::after(table, &self.url, version) {
            let version = due.version();
            self.state
                .checkpoints
                .start(&self.state.background, version, due.write().boxed());
        }
        self.maybe_compact(files);
    }

    /// Brings the marker cache to the log's latest version, reading only
    /// the entries after the one it knows. The table is loaded again (which
    /// lists the log) when the cache's knowledge is too old to trust or
    /// another writer changed the table's metadata or protocol; then the
    /// stream is fitted to the table again.
    async fn refresh(&self, slot: &mut Option<DeltaTable>, txns: &mut marker::TxnCache) -> Result<(), DeltaSinkError> {
        let mut changed = false;
        for _ in 0..MAX_RELOADS {
            let loaded = slot.as_ref().and_then(|t| Some((t.version()?, t.snapshot().ok()?)));
            let trust = loaded
                .as_ref()
                .map(|(_, s)| TRUST_LATEST_FOR.min(s.table_config().log_retention_duration() / 2))
                .unwrap_or_default();
            let trusted = txns.version().is_some() && txns.confirmed_within(trust);
            // A table left far behind the cache is loaded afresh from the
            // newest log checkpoint, so reloading it never replays much.
            let behind = match (&loaded, txns.version()) {
                (Some((t, _)), Some(c)) => self.reload_due(*t, c),
                _ => false,
            };
            if loaded.is_none() || !trusted || behind || changed {
                if behind {
                    *slot = None;
                }
                let listed = Instant::now();
                let table = self.latest(slot).await?;
                if !trusted {
                    txns.reset(table, listed);
                }
            }
            let table = slot.as_ref().expect("loaded above");
            let tail = txns
                .catch_up(table.log_store().as_ref())
                .await
                .map_err(|e| self.err(e))?;
            match tail {
                marker::Tail::Data => {
                    if txns.needs_refit() {
                        self.fit_again(table)?;
                        txns.refitted();
                    }
                    return Ok(());
                }
                marker::Tail::TableChanged => {
                    tracing::info!(table = %self.url, "another writer changed the table's metadata; reloading it");
                    changed = true;
                }
                marker::Tail::LogReplaced => {
                    tracing::warn!(table = %self.url, "the log entry the sink last read is gone or different; loading the table afresh");
                    *slot = None;
                    *txns = marker::TxnCache::default();
                }
            }
        }
        Err(DeltaSinkError::Unsettled {
            table: self.url.to_string(),
            reloads: MAX_RELOADS,
        })
    }

    /// Checks that the table, whose metadata another writer changed, is
    /// still the one the query started on and still takes the stream.
    fn fit_again(&self, table: &DeltaTable) -> Result<(), DeltaSinkError> {
        let Ok(prepared) = self.prepared() else {
            // Not started: `prepare` fits the stream when it is.
            return Ok(());
        };
        let snapshot = table.snapshot().map_err(|e| self.err(e))?;
        if snapshot.metadata().id() != prepared.layout.table_id {
            return Err(DeltaSinkError::TableReplaced {
                table: self.url.to_string(),
                expected: prepared.layout.table_id.clone(),
                found: snapshot.metadata().id().to_string(),
            });
        }
        let layout = table::layout(table, &self.url, &prepared.schema, prepared.mode, &self.options)?;
        if layout.partition_columns != prepared.layout.partition_columns {
            return Err(DeltaSinkError::TableChanged {
                table: self.url.to_string(),
                change: format!(
                    "the partition columns went from {:?} to {:?}",
                    prepared.layout.partition_columns, layout.partition_columns
                ),
            });
        }
        let mut slot = self.state.prepared.write().recover();
        if let Some(p) = slot.as_mut() {
            p.layout = Arc::new(layout);
        }
        Ok(())
    }

    /// Whether this batch can be committed by writing its log entry with a
    /// put-if-absent on the version after the cache's: an append that
    /// changes no metadata, on a log store that writes entries that way.
    fn direct(&self, table: &DeltaTable, ctx: &BatchContext, layout: &Layout) -> Result<bool, DeltaSinkError> {
        Ok(ctx.output_mode == OutputMode::Append
            && table.log_store().name() == "DefaultLogStore"
            && (layout.added_columns.is_empty()
                || table::merged_metadata(table, &self.url, &layout.added_columns)?.is_none()))
    }

    /// Writes the batch's log entry at `version`. `Ok(false)`: another
    /// writer took that version first.
    async fn write_entry(
        &self,
        table: &DeltaTable,
        txns: &mut marker::TxnCache,
        ctx: &BatchContext,
        files: &[AddFile],
        version: u64,
    ) -> Result<bool, DeltaSinkError> {
        let transactions = marker::transactions(&ctx.query_name, ctx.query_id, ctx.batch_id);
        let bytes = entry::append(ctx, &transactions, files, version - 1).map_err(|e| {
            self.err(DeltaTableError::Transaction {
                source: TransactionError::SerializeLogJson { json_err: e },
            })
        })?;
        let asked = Instant::now();
        let written = table
            .log_store()
            .write_commit_entry(version, CommitOrBytes::LogBytes(bytes.clone()), uuid::Uuid::new_v4())
            .await;
        match written {
            Ok(()) => {
                txns.committed(version, &bytes, &transactions, asked);
                Ok(true)
            }
            Err(TransactionError::VersionAlreadyExists(_)) => Ok(false),
            Err(source) => Err(self.err(DeltaTableError::Transaction { source })),
        }
    }
}

#[async_trait]
impl Sink for DeltaSink {
    fn identity(&self) -> SinkIdentity {
        let mut identity = SinkIdentity::new("delta", self.url.as_str());
        identity.table_id = self.layout().ok().map(|l| l.table_id.clone());
        identity
    }

    fn check_output_mode(&self, mode: OutputMode) -> Result<(), weir_core::sink::ModeRefusal> {
        match mode {
            OutputMode::Append | OutputMode::Complete | OutputMode::Update => Ok(()),
        }
    }

    async fn prepare(&self, query: &QueryInfo) -> weir_core::Result<()> {
        if query.output_mode == OutputMode::Update && query.key_columns.is_empty() {
            return Err(DeltaSinkError::NoUpdateKey {
                table: self.url.to_string(),
            }
            .into());
        }
        if query.output_mode == OutputMode::Update {
            // Before a new table is made with these partition columns.
            upsert::check_key(
                self.url.as_str(),
                &self.options.partition_by,
                &query.schema,
                &query.key_columns,
            )?;
        }
        let mut slot = self.state.table.lock().await;
        // A sink started again knows nothing of what happened meanwhile.
        *self.state.txns.lock().await = marker::TxnCache::default();
        let table = match table::load(&self.url, &self.options, Files::Untracked).await? {
            Some(table) => table,
            None => table::create(&self.url, &query.schema, &self.options).await?,
        };
        let layout = table::layout(&table, &self.url, &query.schema, query.output_mode, &self.options)?;
        if query.output_mode == OutputMode::Update {
            upsert::check_key(
                self.url.as_str(),
                &layout.partition_columns,
                &query.schema,
                &query.key_columns,
            )?;
        }
        tracing::info!(table = %self.url, partitions = ?layout.partition_columns, target_file_size = layout.target_file_size, "Delta sink ready");
        let prepared = Prepared {
            layout: Arc::new(layout),
            store: table.log_store().object_store(None),
            schema: query.schema.clone(),
            mode: query.output_mode,
            key: query.key_columns.clone(),
        };
        *self.state.prepared.write().recover() = Some(prepared);
        *slot = Some(table);
        Ok(())
    }

    async fn marker(&self, name: &QueryName, known_ids: &[QueryId]) -> weir_core::Result<Option<SinkMarker>> {
        let mut slot = self.state.table.lock().await;
        let mut txns = self.state.txns.lock().await;
        self.refresh(&mut slot, &mut txns).await?;
        let table = slot.as_ref().expect("refreshed");
        Ok(marker::read(table, &mut txns, name, known_ids)
            .await
            .map_err(|e| self.err(e))?)
    }

    fn create_writer(&self, batch: &BatchContext, partition_id: usize) -> weir_core::Result<Box<dyn DataWriter>> {
        let Prepared { layout, store, .. } = self.prepared()?;
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
        if let Err(reason) = self.check_output_mode(ctx.output_mode) {
            // The driver refused the mode at start; a caller of its own did not.
            return Err(weir_core::Error::UnsupportedOutputMode {
                mode: ctx.output_mode,
                sink: self.identity().to_string(),
                reason,
            });
        }
        let mut files = Vec::new();
        for m in &messages {
            files.extend(m.decode::<Vec<AddFile>>()?);
        }
        let mut commit = DeltaCommit {
            sink: self,
            ctx,
            slot: self.state.table.lock().await,
            txns: self.state.txns.lock().await,
            files,
            first_try: None,
            direct_tried: false,
            keys: None,
            tries: 0,
            lost: Vec::new(),
            uncertain: false,
        };
        commit_batch(&mut commit, ctx, MAX_COMMIT_ATTEMPTS).await
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

    async fn close(&self, how: Close) -> weir_core::Result<()> {
        self.state.background.close(how).await;
        Ok(())
    }
}
