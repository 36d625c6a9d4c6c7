//! The Iceberg sink: the [`Sink`] of weir-core on an Iceberg table.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use iceberg::spec::{ManifestFile, TableMetadata};
use iceberg::writer::file_writer::location_generator::DefaultLocationGenerator;
use iceberg::TableIdent;
use weir_core::protocol::{SinkIdentity, SinkMarker};
use weir_core::sink::{
    commit_batch, Background, BatchContext, Close, CommitMessage, CommitOutcome, CompactionPolicy, DataWriter,
    OutputMode, Periodic, QueryInfo, Sink,
};
use weir_core::{QueryId, QueryName};

use crate::catalog::{parse_ident, Catalog, LoadedTable};
use crate::commit::{Change, Producer};
use crate::error::IcebergSinkError;
use crate::expire::Chosen;
use crate::marker;
use crate::merge_ahead::Ahead;
use crate::table::{self, Layout};
use crate::writer::{self, IcebergWriter, WriterContext};
use weir_core::sync::Recover;

mod swap;

use swap::SwapCommit;

/// How often the sink reloads the table and re-checks its marker after
/// losing a swap before giving up.
const MAX_COMMIT_ATTEMPTS: usize = 100;

/// Writes a streaming query's batches into an Iceberg table, each batch
/// exactly once: its snapshot and the query's marker in one metadata swap.
///
/// ```no_run
/// use std::sync::Arc;
/// use weir_core::prelude::*;
/// use weir_catalog::SqlCatalog;
/// use weir_iceberg::IcebergSink;
///
/// # async fn run() -> weir_core::Result<()> {
/// let lake = SqlCatalog::connect("lake", "sqlite://weir-lake/catalog.db", "weir-lake/warehouse").await?;
/// let sink = IcebergSink::try_new(Arc::new(lake), "bronze.payments")?.with_partition_by(["day(ts)"]);
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
pub struct IcebergSink {
    catalog: Arc<dyn Catalog>,
    ident: TableIdent,
    partition_by: Vec<String>,
    table_properties: HashMap<String, String>,
    target_file_size: Option<u64>,
    merge_schema: bool,
    expiry: Option<ExpiryPolicy>,
    compaction: Option<CompactionPolicy>,
    state: Arc<State>,
}

/// Snapshot expiry a sink runs by itself: once the query has made
/// `every_commits` commits since the last expiry, its next commit also
/// removes the snapshots older than `older_than` beyond the newest
/// `retain_last` (chosen as [`crate::ExpireSnapshots`] chooses, on that
/// commit's own base), and the files only they reached are deleted in the
/// background once that commit has landed. Keeps a streaming table's
/// metadata, and so its commit time, bounded, without a swap of its own
/// that the query's next commit would lose and retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpiryPolicy {
    /// Commits from one expiry's start to the next (at least 1).
    pub every_commits: u64,
    /// Snapshots kept whatever their age (at least 1).
    pub retain_last: usize,
    /// Only snapshots older than this expire (`None`: any age).
    pub older_than: Option<Duration>,
    /// Whether the table's own `history.expire.min-snapshots-to-keep` and
    /// `history.expire.max-snapshot-age-ms`, where it sets them, keep more
    /// than `retain_last` and `older_than` (each the larger of the two);
    /// otherwise the policy's values stand alone.
    pub table_properties_first: bool,
}

impl ExpiryPolicy {
    /// The expiry `to_table` and `weir stream` give an Iceberg table unless
    /// told otherwise: every 100 commits, the snapshots beyond the newest
    /// 100 expire, whatever their age, unless the table's
    /// `history.expire.*` properties keep more. Refs' heads and each
    /// branch's own retention always stay, and the exactly-once markers
    /// live in the table's properties, which expiry leaves alone.
    ///
    /// Without expiry every metadata file lists every snapshot the table
    /// ever had, so each commit reads and writes more: 4.8 ms a commit at
    /// first, 43 ms after 8,000. Time travel and incremental readers (a
    /// downstream stream) reach back 100 commits: at one commit a minute,
    /// 100 minutes. Set the table's properties to keep more.
    pub const STREAMING: ExpiryPolicy = ExpiryPolicy {
        every_commits: 100,
        retain_last: 100,
        older_than: None,
        table_properties_first: true,
    };
}

#[derive(Debug, Default)]
struct State {
    /// The table as last loaded or committed by this sink.
    table: tokio::sync::Mutex<Option<LoadedTable>>,
    /// The manifests of the snapshot this sink committed last.
    manifests: std::sync::Mutex<Option<(i64, Vec<ManifestFile>)>>,
    /// Fixed by `prepare`.
    prepared: RwLock<Option<Prepared>>,
    /// Commits since the last expiry, for the expiry policy.
    expiring: AtomicU64,
    /// The same for the compaction policy.
    compacting: Periodic,
    /// The running background jobs, ended with the query.
    background: Background,
    /// Manifests merged ahead of the commit path.
    ahead: Arc<Ahead>,
}

#[derive(Debug, Clone)]
struct Prepared {
    layout: Arc<Layout>,
    locations: DefaultLocationGenerator,
    /// Update mode: the columns naming a row's group.
    key: Vec<String>,
}

impl IcebergSink {
    /// A sink on the table `name` (`namespace.table`) of `catalog`. The
    /// table is created from the stream's schema when the query starts, if
    /// there is none (and its namespace with it).
    pub fn try_new(catalog: Arc<dyn Catalog>, name: &str) -> Result<Self, IcebergSinkError> {
        Ok(IcebergSink {
            catalog,
            ident: parse_ident(name)?,
            partition_by: Vec::new(),
            table_properties: HashMap::new(),
            target_file_size: None,
            merge_schema: false,
            expiry: None,
            compaction: None,
            state: Arc::default(),
        })
    }

    /// The partition fields of a table the sink creates: `col`,
    /// `bucket(N, col)`, `truncate(W, col)`, `year(col)`, `month(col)`,
    /// `day(col)` or `hour(col)`.
    pub fn with_partition_by<S: Into<String>>(mut self, fields: impl IntoIterator<Item = S>) -> Self {
        self.partition_by = fields.into_iter().map(Into::into).collect();
        self
    }

    /// A table property of a table the sink creates.
    pub fn with_table_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.table_properties.insert(key.into(), value.into());
        self
    }

    /// The size at which data files are closed (else the table's
    /// `write.target-file-size-bytes`, else 128 MiB).
    pub fn with_target_file_size(mut self, bytes: u64) -> Self {
        self.target_file_size = Some(bytes);
        self
    }

    /// Expires old snapshots as the query commits (see [`ExpiryPolicy`]):
    /// in the query's own commits, with their files deleted in the
    /// background. The query's end waits for the deletes or ends them
    /// ([`Sink::close`]); clones of this sink share them, so give each
    /// query a sink of its own.
    pub fn with_snapshot_expiry(mut self, policy: ExpiryPolicy) -> Self {
        self.expiry = Some(policy);
        self
    }

    /// Compacts small files in the background as the query commits (see
    /// [`crate::Compact`]): one rewrite at a time, with the sink's target
    /// size; never two compactions at once from this sink. The query's end
    /// ends them ([`Sink::close`]); clones of this sink share them, so give
    /// each query a sink of its own.
    pub fn with_compaction(mut self, policy: CompactionPolicy) -> Self {
        self.compaction = Some(policy);
        self
    }

    /// After a commit that added `files` data files: when the policy says
    /// so, a compaction in the background, one at a time (one due while it
    /// runs follows it); its failure is logged, never the batch's.
    fn maybe_compact(&self, files: usize) {
        let Some(policy) = self.compaction else { return };
        let (catalog, name) = (self.catalog.clone(), crate::catalog::shown(&self.ident));
        let (state, target) = (&self.state, self.target_file_size);
        policy.compact_when_due(
            &state.compacting,
            &state.background,
            files,
            name.clone(),
            target,
            move |options| {
                let (catalog, name) = (catalog.clone(), name.clone());
                async move { crate::Compact::new(catalog, &name)?.with_options(options).await }
            },
        );
    }

    /// The expiry policy's job on this sink's table.
    fn expiry_job(&self, policy: ExpiryPolicy) -> Result<crate::ExpireSnapshots, IcebergSinkError> {
        let job = crate::ExpireSnapshots::new(self.catalog.clone(), &crate::catalog::shown(&self.ident))?;
        let age = policy.older_than.unwrap_or(Duration::ZERO);
        Ok(match policy.table_properties_first {
            true => job.with_keeping_at_least(policy.retain_last, age),
            false => job.with_retain_last(policy.retain_last).with_older_than(age),
        })
    }

    /// The snapshots a commit on `base` removes: none until the policy's
    /// `every_commits` commits were made since the last expiry. A table
    /// the policy refuses (`gc.enabled=false`, format version 1) or whose
    /// retention cannot be read is logged and left as it is until the next
    /// expiry falls due.
    fn expiry_due(&self, base: &LoadedTable) -> Option<(crate::ExpireSnapshots, Chosen)> {
        let policy = self.expiry?;
        if self.state.expiring.load(Ordering::Relaxed) < policy.every_commits.max(1) {
            return None;
        }
        match self.expiry_job(policy).and_then(|job| Ok((job.choose(base)?, job))) {
            Ok((chosen, job)) => Some((job, chosen)),
            Err(e) => {
                tracing::warn!(table = %self.shown(), error = %e, "snapshot expiry skipped; the next one retries");
                self.state.expiring.store(0, Ordering::Relaxed);
                None
            }
        }
    }

    /// After a commit on `base` that landed as `landed` and removed the
    /// snapshots of `expiry`: the next expiry counts from here, and the
    /// files only those snapshots reached are deleted in the background.
    fn expiry_landed(
        &self,
        expiry: Option<(crate::ExpireSnapshots, Chosen)>,
        base: &TableMetadata,
        landed: &TableMetadata,
    ) {
        let Some((job, chosen)) = expiry else { return };
        self.state.expiring.store(0, Ordering::Relaxed);
        if chosen.expired.is_empty() {
            return;
        }
        let table = self.shown();
        tracing::info!(table, expired = chosen.expired.len(), "expired snapshots");
        let (base, landed) = (base.clone(), landed.clone());
        self.state.background.spawn(async move {
            let report = job.delete_chosen(&base, &chosen, &landed).await;
            tracing::debug!(
                table,
                deleted = report.deleted_files(),
                "deleted the files of expired snapshots"
            );
        });
    }

    /// Deletes the metadata files a commit dropped from `table`'s log (when
    /// the table asks for it) in the background, off the batch's path: a
    /// file left by a query that stops first is an orphan, as after a
    /// crash.
    fn delete_logs_later(&self, table: &LoadedTable, expired: Vec<String>) {
        if expired.is_empty() || !crate::catalog::deletes_dropped_logs(self.catalog.as_ref(), table) {
            return;
        }
        let catalog = self.catalog.clone();
        self.state
            .background
            .spawn(async move { crate::catalog::delete_logs(catalog.file_io(), expired).await });
    }

    /// Add the stream's new nullable columns to the table (as optional
    /// columns with new field ids), in the swap of the first batch.
    pub fn with_merge_schema(mut self, merge: bool) -> Self {
        self.merge_schema = merge;
        self
    }

    fn shown(&self) -> String {
        format!(
            "{}.{}.{}",
            self.catalog.name(),
            self.ident.namespace.join("."),
            self.ident.name
        )
    }

    fn prepared(&self) -> Result<Prepared, IcebergSinkError> {
        self.state
            .prepared
            .read()
            .recover()
            .clone()
            .ok_or_else(|| IcebergSinkError::NotPrepared { table: self.shown() })
    }

    async fn load(&self) -> Result<LoadedTable, IcebergSinkError> {
        self.catalog
            .load(&self.ident)
            .await?
            .ok_or_else(|| IcebergSinkError::NoSuchTable {
                catalog: self.catalog.name().to_string(),
                table: self.shown(),
            })
    }

    /// Checks that `base` is still the table the query started on, with the
    /// partitioning its files were written for.
    fn check_table(&self, base: &LoadedTable, layout: &Layout) -> Result<(), IcebergSinkError> {
        let uuid = base.metadata.uuid().to_string();
        if uuid != layout.table_uuid {
            return Err(IcebergSinkError::TableReplaced {
                table: self.shown(),
                expected: layout.table_uuid.clone(),
                found: uuid,
            });
        }
        let spec = base.metadata.default_partition_spec();
        if spec.spec_id() != layout.spec.spec_id() {
            return Err(IcebergSinkError::TableChanged {
                table: self.shown(),
                change: format!(
                    "the partition spec went from {} to {}",
                    layout.spec.spec_id(),
                    spec.spec_id()
                ),
            });
        }
        let schema = base.metadata.current_schema();
        let added: &[iceberg::spec::NestedFieldRef] = layout.evolution.as_ref().map_or(&[], |e| &e.fields);
        if let Some(evolution) = &layout.evolution {
            let present = added.iter().filter(|f| schema.field_by_id(f.id).is_some()).count();
            let ours = added.iter().all(|f| {
                schema
                    .field_by_id(f.id)
                    .is_none_or(|now| now.name == f.name && now.field_type == f.field_type)
            });
            let ids_free = base.metadata.last_column_id() == evolution.base_last_column_id;
            if !ours || (present < added.len() && (present > 0 || !ids_free)) {
                return Err(IcebergSinkError::TableChanged {
                    table: self.shown(),
                    change: "another writer changed the columns while this query was adding its new ones".into(),
                });
            }
        }
        if schema.schema_id() != layout.schema.schema_id() {
            // The written files carry field ids; they must still mean the
            // same columns.
            for field in layout.schema.as_struct().fields() {
                if added.iter().any(|f| f.id == field.id) {
                    continue;
                }
                match schema.field_by_id(field.id) {
                    Some(now) if now.field_type == field.field_type => {}
                    _ => {
                        return Err(IcebergSinkError::TableChanged {
                            table: self.shown(),
                            change: format!("column {:?} (field id {}) was dropped or changed", field.name, field.id),
                        })
                    }
                }
            }
        }
        Ok(())
    }

    /// Removes files of attempts that did not land.
    async fn delete(&self, files: Vec<String>) {
        for file in files {
            if let Err(e) = self.catalog.file_io().delete(&file).await {
                tracing::debug!(file, error = %e, "could not delete a file of a lost swap");
            }
        }
    }
}

#[async_trait]
impl Sink for IcebergSink {
    fn identity(&self) -> SinkIdentity {
        let mut identity = SinkIdentity::new("iceberg", self.shown());
        identity.table_id = self.prepared().ok().map(|p| p.layout.table_uuid.clone());
        identity
    }

    fn check_output_mode(&self, mode: OutputMode) -> Result<(), weir_core::sink::ModeRefusal> {
        match mode {
            OutputMode::Append | OutputMode::Complete | OutputMode::Update => Ok(()),
        }
    }

    async fn prepare(&self, query: &QueryInfo) -> weir_core::Result<()> {
        if query.output_mode == OutputMode::Update && query.key_columns.is_empty() {
            return Err(IcebergSinkError::NoUpdateKey { table: self.shown() }.into());
        }
        let mut slot = self.state.table.lock().await;
        let table = match self.catalog.load(&self.ident).await? {
            Some(table) => table,
            None => {
                let mut properties = self.table_properties.clone();
                // A streaming table makes a metadata version a batch: keep
                // the last 100, not every one.
                for (key, value) in [
                    ("write.format.default", "parquet"),
                    ("write.metadata.delete-after-commit.enabled", "true"),
                    ("write.metadata.previous-versions-max", "100"),
                ] {
                    properties.entry(key.into()).or_insert_with(|| value.into());
                }
                let metadata = table::new_metadata(
                    &self.shown(),
                    &self.catalog.default_location(&self.ident),
                    &query.schema,
                    &self.partition_by,
                    &properties,
                )?;
                self.catalog.create(&self.ident, metadata).await?
            }
        };
        let mut layout = table::layout(&self.shown(), &table.metadata, &query.schema, self.merge_schema)?;
        if let Some(size) = self.target_file_size {
            layout.target_file_size = size;
        }
        let locations = DefaultLocationGenerator::new(&table.metadata).map_err(|source| IcebergSinkError::Iceberg {
            table: self.shown(),
            context: "derive the data location".into(),
            source: Box::new(source),
        })?;
        tracing::info!(table = %self.shown(), spec = ?layout.spec.fields(), target_file_size = layout.target_file_size, "Iceberg sink ready");
        *self.state.prepared.write().recover() = Some(Prepared {
            layout: Arc::new(layout),
            locations,
            key: query.key_columns.clone(),
        });
        *self.state.manifests.lock().recover() = None;
        *slot = Some(table);
        Ok(())
    }

    async fn marker(&self, name: &QueryName, _known_ids: &[QueryId]) -> weir_core::Result<Option<SinkMarker>> {
        let table = self.load().await?;
        let found = marker::read(&table.metadata, name);
        *self.state.table.lock().await = Some(table);
        Ok(found)
    }

    fn create_writer(&self, batch: &BatchContext, partition_id: usize) -> weir_core::Result<Box<dyn DataWriter>> {
        let prepared = self.prepared()?;
        let ctx = WriterContext {
            table: self.shown(),
            file_io: self.catalog.file_io().clone(),
            layout: prepared.layout,
            locations: prepared.locations,
            file_prefix: format!(
                "part-{:05}-{}-{}-p{:03}",
                batch.batch_id.0, batch.query_id, batch.attempt_id, partition_id
            ),
        };
        Ok(Box::new(IcebergWriter::new(ctx, partition_id)))
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
        let core = |e: IcebergSinkError| e.into_core(Some(ctx.batch_id));
        let prepared = self.prepared()?;
        let layout = prepared.layout.clone();
        let partition_type = layout
            .spec
            .partition_type(&layout.schema)
            .map_err(|source| IcebergSinkError::Iceberg {
                table: self.shown(),
                context: "derive the partition type".into(),
                source: Box::new(source),
            })
            .map_err(core)?;
        let files = writer::decode(&messages, &layout.spec, &partition_type, &layout.schema)?;
        let change = match ctx.output_mode {
            OutputMode::Append => Change::Append,
            OutputMode::Complete => Change::Overwrite,
            OutputMode::Update => Change::Upsert,
        };
        let batch_files = match change {
            Change::Upsert => files.clone(),
            _ => Vec::new(),
        };
        let mut commit = SwapCommit {
            sink: self,
            ctx,
            slot: self.state.table.lock().await,
            summary: marker::summary(ctx),
            producer: Producer::new(self.catalog.file_io().clone(), self.shown(), files),
            layout,
            change,
            lost: Vec::new(),
            unknown_base: None,
            key: prepared.key.clone(),
            batch_files,
            keys: None,
            tries: 0,
        };
        commit_batch(&mut commit, ctx, MAX_COMMIT_ATTEMPTS).await
    }

    async fn abort(&self, _batch: &BatchContext, messages: Vec<CommitMessage>) -> weir_core::Result<()> {
        let Ok(prepared) = self.prepared() else {
            return Ok(());
        };
        let layout = prepared.layout;
        let Ok(partition_type) = layout.spec.partition_type(&layout.schema) else {
            return Ok(());
        };
        if let Ok(files) = writer::decode(&messages, &layout.spec, &partition_type, &layout.schema) {
            writer::delete_files(self.catalog.file_io(), &files).await;
        }
        Ok(())
    }

    async fn close(&self, how: Close) -> weir_core::Result<()> {
        self.state.background.close(how).await;
        self.delete(self.state.ahead.unused()).await;
        Ok(())
    }
}
