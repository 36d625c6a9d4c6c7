//! Opening or creating the table, and fitting the stream's schema to it.

use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use bytes::Bytes;
use deltalake::kernel::engine::arrow_conversion::{TryIntoArrow, TryIntoKernel};
use deltalake::kernel::transaction::TransactionError;
use deltalake::kernel::{Action, CommitInfo, Metadata, MetadataExt, StructField, StructType};
use deltalake::logstore::{CommitOrBytes, LogStoreRef};
use deltalake::operations::create::CreateBuilder;
use deltalake::table::config::TablePropertiesExt;
use deltalake::{DeltaTable, DeltaTableBuilder, DeltaTableError};
use url::Url;
use weir_core::OutputMode;

use crate::engine;
use crate::error::DeltaSinkError;
use crate::log_checkpoint;
use crate::options::DeltaSinkOptions;
use crate::protocol;
use weir_core::partition;

/// How the stream's rows map onto the table's data files, fixed when the
/// query starts.
#[derive(Debug)]
pub(crate) struct Layout {
    /// The table's metadata id.
    pub table_id: String,
    /// Partition columns, in table order.
    pub partition_columns: Vec<String>,
    /// Their indices in the stream's batches.
    pub partition_indices: Vec<usize>,
    /// The columns of a data file (the table's non-partition columns, in
    /// table order).
    pub file_schema: SchemaRef,
    /// For each file column, its index in the stream's batches, or `None`
    /// for a nullable table column the stream does not have (written null).
    pub file_sources: Vec<Option<usize>>,
    /// New nullable columns to add with the first commit (merge_schema).
    pub added_columns: Vec<StructField>,
    pub target_file_size: u64,
    pub num_indexed_cols: usize,
    /// `delta.dataSkippingStatsColumns`, which replaces the first-N rule.
    pub stats_columns: Option<Vec<String>>,
}

pub(crate) fn table_url(location: &str) -> Result<Url, DeltaSinkError> {
    let err = |reason: String| DeltaSinkError::Location {
        location: location.to_string(),
        reason,
    };
    if location.contains("://") {
        let mut url = Url::parse(location).map_err(|e| err(e.to_string()))?;
        if !url.path().ends_with('/') {
            url.set_path(&format!("{}/", url.path()));
        }
        return Ok(url);
    }
    std::fs::create_dir_all(location).map_err(|e| err(format!("cannot create the directory: {e}")))?;
    let absolute = std::fs::canonicalize(location).map_err(|e| err(e.to_string()))?;
    Url::from_directory_path(&absolute).map_err(|()| err("not an absolute path".into()))
}

fn delta_err(table: &Url) -> impl Fn(DeltaTableError) -> DeltaSinkError + '_ {
    move |source| DeltaSinkError::Delta {
        table: table.to_string(),
        source,
    }
}

/// The table at `location` (with object storage options), as the
/// maintenance and inspection functions open it: its URL, and the table
/// or `None` if there is none.
pub(crate) async fn load_at(
    location: &str,
    storage: &std::collections::HashMap<String, String>,
    files: Files,
) -> Result<(Url, Option<DeltaTable>), DeltaSinkError> {
    let url = table_url(location)?;
    let options = DeltaSinkOptions {
        storage_options: storage.clone(),
        ..DeltaSinkOptions::default()
    };
    let table = load(&url, &options, files).await?;
    Ok((url, table))
}

/// [`load_at`], where a missing table is an error.
pub(crate) async fn load_existing(
    location: &str,
    storage: &std::collections::HashMap<String, String>,
    files: Files,
) -> Result<(Url, DeltaTable), DeltaSinkError> {
    match load_at(location, storage, files).await? {
        (url, Some(table)) => Ok((url, table)),
        (_, None) => Err(DeltaSinkError::Location {
            location: location.to_string(),
            reason: "there is no Delta table there".into(),
        }),
    }
}

/// What of the table to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Files {
    /// Every live file (for Complete mode's removes, compaction and describe).
    Tracked,
    /// Metadata only: updating it costs the new commits, not the table's
    /// size, which keeps commits as fast at 10,000 versions as at 10.
    Untracked,
}

/// The table at `url` with weir's bounded engine, not loaded, or `None` if
/// there is no table there.
pub(crate) async fn open(
    url: &Url,
    storage: &std::collections::HashMap<String, String>,
    files: Files,
) -> Result<Option<DeltaTable>, DeltaSinkError> {
    let mut builder = DeltaTableBuilder::from_url(url.clone())
        .map_err(delta_err(url))?
        .with_storage_options(storage.clone());
    if files == Files::Untracked {
        builder = builder.without_files();
    }
    let table = engine::bounded(builder.build().map_err(delta_err(url))?);
    // Asking the log first keeps the kernel from logging a missing table as
    // an error.
    if !table.verify_deltatable_existence().await.map_err(delta_err(url))? {
        return Ok(None);
    }
    Ok(Some(table))
}

/// Loads the table at `url`, or `None` if there is no table there.
pub(crate) async fn load(
    url: &Url,
    options: &DeltaSinkOptions,
    files: Files,
) -> Result<Option<DeltaTable>, DeltaSinkError> {
    let Some(mut table) = open(url, &options.storage_options, files).await? else {
        return Ok(None);
    };
    match table.load().await {
        Ok(()) => Ok(Some(table)),
        Err(DeltaTableError::NotATable(_)) => Ok(None),
        Err(e) => Err(delta_err(url)(e)),
    }
}

/// After a commit at `version`: a log checkpoint every
/// `delta.checkpointInterval` commits, then expired-log cleanup, written
/// where the commit is. A failure is logged, never reported: the commit
/// has landed. (The sink writes its checkpoints in the background instead,
/// through [`DueCheckpoint`].)
pub(crate) async fn checkpoint_if_due(table: &DeltaTable, url: &Url, version: u64) {
    if let Some(due) = DueCheckpoint::after(table, url, version) {
        due.write().await;
    }
}

/// The log checkpoint due after a commit, with what writing it needs, so
/// that it can be written apart from the commit (a checkpoint of a fixed
/// version is the same whatever commits after it).
///
/// The checkpoint holds the kernel's reconciled actions from a snapshot it
/// builds at the version with the table's engine, written a row group at a
/// time (see [`crate::log_checkpoint`]); no table with every live file is
/// loaded for it.
pub(crate) struct DueCheckpoint {
    log_store: LogStoreRef,
    url: Url,
    version: u64,
    /// The table's log retention, if it cleans up expired log entries.
    cleanup: Option<std::time::Duration>,
}

impl DueCheckpoint {
    /// The checkpoint due after the commit of `version` to `table`, every
    /// `delta.checkpointInterval` commits (counted as deltalake does).
    pub(crate) fn after(table: &DeltaTable, url: &Url, version: u64) -> Option<Self> {
        let config = table.snapshot().ok()?.table_config();
        if !(version + 1).is_multiple_of(config.checkpoint_interval().get()) {
            return None;
        }
        Some(DueCheckpoint {
            log_store: table.log_store(),
            url: url.clone(),
            version,
            cleanup: config
                .enable_expired_log_cleanup()
                .then(|| config.log_retention_duration()),
        })
    }

    /// The version it summarises.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// Writes it (unless there is one of that version), then removes the
    /// log entries past the table's retention. Returns whether the table
    /// has a checkpoint of the version; a failure is logged, and the next
    /// due checkpoint tries again.
    pub(crate) async fn write(self) -> bool {
        let (url, version, log_store) = (&self.url, self.version, self.log_store.as_ref());
        match log_checkpoint::write(log_store, version).await {
            Ok(written) => tracing::debug!(table = %url, version, ?written, "log checkpoint"),
            Err(e) => {
                tracing::warn!(table = %url, version, error = %e, retryable = e.retryable(), "the commit landed; the log checkpoint after it failed and is retried at the next interval");
                return false;
            }
        }
        if let Some(retention) = self.cleanup {
            let cutoff = chrono::Utc::now().timestamp_millis() - retention.as_millis() as i64;
            if let Err(e) = deltalake::checkpoints::cleanup_expired_logs_for(version, log_store, cutoff, None).await {
                tracing::warn!(table = %url, version, error = %e, "expired-log cleanup failed; the next checkpoint retries it");
            }
        }
        true
    }
}

/// The first log entry of a new table: commit info, the protocol and the
/// metadata that deltalake chooses for the schema, partitioning and
/// properties (a table made in memory shows them). A protocol of writer
/// version 7 (as a `timestamp_ntz` column needs) also lists the legacy
/// features `appendOnly` and `invariants`, as Delta Lake on Spark lists
/// them: Spark takes a NOT NULL column for an invariant and refuses a table
/// whose protocol lists features but not that one.
async fn first_entry(
    schema: &StructType,
    options: &DeltaSinkOptions,
) -> Result<(Action, Action, Bytes), DeltaTableError> {
    let mut dry = CreateBuilder::new()
        .with_location("memory:///")
        .with_columns(schema.fields().cloned())
        .with_partition_columns(options.partition_by.clone())
        .with_configuration(configuration(options));
    if let Some(name) = &options.table_name {
        dry = dry.with_table_name(name.clone());
    }
    let dry = dry.await?;
    let snapshot = dry.snapshot()?;
    let mut protocol = snapshot.protocol().clone();
    if protocol.min_writer_version() >= 7 {
        let mut json = serde_json::to_value(&protocol).map_err(|e| DeltaTableError::Generic(e.to_string()))?;
        let features = json["writerFeatures"]
            .as_array_mut()
            .ok_or_else(|| DeltaTableError::Generic("a protocol of writer version 7 without writer features".into()))?;
        for legacy in ["appendOnly", "invariants"] {
            if !features.iter().any(|f| f == legacy) {
                features.push(legacy.into());
            }
        }
        protocol = serde_json::from_value(json).map_err(|e| DeltaTableError::Generic(e.to_string()))?;
    }
    let info = CommitInfo {
        timestamp: Some(chrono::Utc::now().timestamp_millis()),
        operation: Some("CREATE TABLE".into()),
        engine_info: Some(format!("weir-delta/{}", env!("CARGO_PKG_VERSION"))),
        ..Default::default()
    };
    let (protocol, metadata) = (
        Action::Protocol(protocol),
        Action::Metadata(snapshot.metadata().clone()),
    );
    let entry = crate::entry::encode([Action::CommitInfo(info), protocol.clone(), metadata.clone()].into_iter())
        .map_err(|e| DeltaTableError::Generic(e.to_string()))?;
    Ok((protocol, metadata, entry))
}

fn configuration(options: &DeltaSinkOptions) -> impl Iterator<Item = (String, Option<String>)> + '_ {
    options
        .table_properties
        .iter()
        .map(|(k, v)| (k.clone(), Some(v.clone())))
}

/// Why weir does not partition a Delta table by a column of `data_type`,
/// or `None` if it does.
fn partition_type_refused(data_type: &DataType) -> Option<String> {
    if partition::supported(data_type) {
        return None;
    }
    Some(match data_type {
        // The protocol writes a binary partition value as the string of its
        // bytes; Delta Lake on Spark reads that string back as UTF-8 text,
        // so bytes that are not UTF-8 come back changed (and an empty value
        // as null).
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::FixedSizeBinary(_) => format!(
            "not {data_type}: Delta Lake on Spark reads a binary partition value back as UTF-8 text, so bytes that are not UTF-8 come back changed. Partition by a string of them instead (hex or base64). Nothing was written"
        ),
        _ => format!(
            "weir partitions by strings, integers, dates, booleans, timestamps (in microseconds) and decimals, not {data_type}. Nothing was written"
        ),
    })
}

/// Creates the table from the stream's schema; if another writer created it
/// meanwhile, loads that one.
pub(crate) async fn create(
    url: &Url,
    schema: &Schema,
    options: &DeltaSinkOptions,
) -> Result<DeltaTable, DeltaSinkError> {
    for column in &options.partition_by {
        let field = schema.field_with_name(column).map_err(|_| DeltaSinkError::Partition {
            table: url.to_string(),
            column: column.clone(),
            reason: "the stream has no such column".into(),
        })?;
        if let Some(reason) = partition_type_refused(field.data_type()) {
            return Err(DeltaSinkError::Partition {
                table: url.to_string(),
                column: column.clone(),
                reason,
            });
        }
    }
    let kernel: StructType = schema.try_into_kernel().map_err(|e| DeltaSinkError::SchemaMismatch {
        table: url.to_string(),
        differences: format!("the stream's schema has no Delta equivalent: {e}"),
    })?;
    let (protocol, _, entry) = first_entry(&kernel, options).await.map_err(delta_err(url))?;
    // Where log entries are put if absent, weir writes the first one
    // itself: of writers creating the table at once, exactly one defines
    // it and the others load it. (deltalake's create, losing that race,
    // commits its metadata as the next version and replaces the winner's.)
    let handle = engine::bounded(
        DeltaTableBuilder::from_url(url.clone())
            .map_err(delta_err(url))?
            .with_storage_options(options.storage_options.clone())
            .without_files()
            .build()
            .map_err(delta_err(url))?,
    );
    if handle.log_store().name() == "DefaultLogStore" {
        let written = handle
            .log_store()
            .write_commit_entry(0, CommitOrBytes::LogBytes(entry), uuid::Uuid::new_v4())
            .await;
        match written {
            Ok(()) => tracing::info!(table = %url, "created the Delta table"),
            Err(TransactionError::VersionAlreadyExists(_)) => {
                tracing::info!(table = %url, "another writer created the Delta table first; writing to it")
            }
            Err(source) => return Err(delta_err(url)(DeltaTableError::Transaction { source })),
        }
        return load(url, options, Files::Untracked)
            .await?
            .ok_or_else(|| DeltaSinkError::Location {
                location: url.to_string(),
                reason: "the table's first log entry was written but the table does not load".into(),
            });
    }
    let mut builder = CreateBuilder::new()
        .with_location(url.to_string())
        .with_columns(kernel.fields().cloned())
        .with_partition_columns(options.partition_by.clone())
        .with_storage_options(options.storage_options.clone())
        .with_configuration(configuration(options))
        .with_actions([protocol]);
    if let Some(name) = &options.table_name {
        builder = builder.with_table_name(name.clone());
    }
    match builder.await {
        Ok(table) => {
            tracing::info!(table = %url, "created the Delta table");
            Ok(engine::bounded(table))
        }
        Err(e) => match load(url, options, Files::Untracked).await? {
            Some(table) => Ok(table),
            None => Err(delta_err(url)(e)),
        },
    }
}

/// Fits the stream's `schema` to the table: every stream column must be a
/// table column of the same type (or, with merge_schema, a new nullable
/// column), every non-null table column must be in the stream.
pub(crate) fn layout(
    table: &DeltaTable,
    url: &Url,
    schema: &Schema,
    mode: OutputMode,
    options: &DeltaSinkOptions,
) -> Result<Layout, DeltaSinkError> {
    let snapshot = table.snapshot().map_err(delta_err(url))?;
    let metadata = snapshot.metadata();
    let config = metadata.configuration();
    let unsupported = |feature: &str| DeltaSinkError::Unsupported {
        table: url.to_string(),
        feature: feature.into(),
    };
    protocol::check(snapshot, protocol::Write::Stream(mode)).map_err(|feature| unsupported(&feature))?;
    // Constraints the sink would have to enforce on every row.
    if let Some(key) = config.keys().find(|k| k.starts_with("delta.constraints.")) {
        return Err(unsupported(&format!("a CHECK constraint ({key})")));
    }
    let enforced = ["delta.invariants", "delta.generationExpression", "delta.identity.start"];
    for field in snapshot.schema().fields() {
        if let Some(key) = enforced.iter().find(|k| field.metadata().contains_key(**k)) {
            return Err(unsupported(&format!("{key} on column {:?}", field.name())));
        }
    }
    // Expiring txn actions would expire the exactly-once marker.
    if config.contains_key("delta.setTransactionRetentionDuration") {
        return Err(unsupported(
            "delta.setTransactionRetentionDuration (it expires the txn actions that hold each query's exactly-once marker)",
        ));
    }
    if mode != OutputMode::Append && config.get("delta.appendOnly").is_some_and(|v| v == "true") {
        return Err(unsupported(&format!(
            "delta.appendOnly=true with the {mode} output mode, which removes files"
        )));
    }
    if mode == OutputMode::Update && config.get("delta.enableChangeDataFeed").is_some_and(|v| v == "true") {
        return Err(unsupported(
            "the change data feed (delta.enableChangeDataFeed=true) with the Update output mode: its rewrites write \
             no change files, so a change-feed reader would see rows that did not change as deleted and inserted",
        ));
    }
    let unreadable: Vec<String> = schema
        .fields()
        .iter()
        .filter(|f| {
            matches!(
                f.data_type(),
                DataType::UInt8
                    | DataType::UInt16
                    | DataType::UInt32
                    | DataType::UInt64
                    | DataType::Date64
                    | DataType::Timestamp(TimeUnit::Nanosecond, _)
            )
        })
        .map(|f| format!("{:?} ({})", f.name(), f.data_type()))
        .collect();
    if !unreadable.is_empty() {
        return Err(DeltaSinkError::SchemaMismatch {
            table: url.to_string(),
            differences: format!(
                "columns {} have types Delta readers do not read the same way; cast them (signed integers, date32, timestamps in microseconds) in the query",
                unreadable.join(", ")
            ),
        });
    }
    let table_schema = snapshot.schema();
    let stream: StructType = schema.try_into_kernel().map_err(|e| DeltaSinkError::SchemaMismatch {
        table: url.to_string(),
        differences: format!("the stream's schema has no Delta equivalent: {e}"),
    })?;
    let mut differences = Vec::new();
    let mut added_columns = Vec::new();
    for field in stream.fields() {
        match table_schema.field(field.name()) {
            None if options.merge_schema && field.is_nullable() => added_columns.push(field.clone()),
            None if options.merge_schema => differences.push(format!(
                "new column {:?} is not nullable, so it cannot be added",
                field.name()
            )),
            None => differences.push(format!("column {:?} is not in the table", field.name())),
            Some(t) if t.data_type() != field.data_type() => differences.push(format!(
                "column {:?} is {} in the stream and {} in the table",
                field.name(),
                field.data_type(),
                t.data_type()
            )),
            Some(t) if field.is_nullable() && !t.is_nullable() => differences.push(format!(
                "column {:?} may be null in the stream but not in the table",
                field.name()
            )),
            Some(_) => {}
        }
    }
    let partition_columns: Vec<String> = metadata.partition_columns().to_vec();
    for column in &partition_columns {
        if let Some(field) = schema.fields().iter().find(|f| f.name() == column) {
            if let Some(reason) = partition_type_refused(field.data_type()) {
                return Err(DeltaSinkError::Partition {
                    table: url.to_string(),
                    column: column.clone(),
                    reason,
                });
            }
        }
    }
    for t in table_schema.fields() {
        if stream.field(t.name()).is_none() && (!t.is_nullable() || partition_columns.contains(t.name())) {
            differences.push(format!(
                "the stream lacks column {:?}, which the table requires",
                t.name()
            ));
        }
    }
    if !differences.is_empty() {
        return Err(DeltaSinkError::SchemaMismatch {
            table: url.to_string(),
            differences: differences.join("; "),
        });
    }

    let index_of = |name: &str| schema.index_of(name).ok();
    let mut file_fields: Vec<Field> = Vec::new();
    let mut file_sources = Vec::new();
    let table_and_added = table_schema.fields().chain(added_columns.iter());
    for t in table_and_added.filter(|f| !partition_columns.contains(f.name())) {
        match index_of(t.name()) {
            Some(i) => {
                file_fields.push(schema.field(i).clone());
                file_sources.push(Some(i));
            }
            None => {
                let arrow: Field = t.try_into_arrow().map_err(|e| DeltaSinkError::SchemaMismatch {
                    table: url.to_string(),
                    differences: format!("table column {:?} has no Arrow equivalent: {e}", t.name()),
                })?;
                file_fields.push(arrow);
                file_sources.push(None);
            }
        }
    }
    let table_config = snapshot.table_config();
    let (num_indexed_cols, stats_columns) = stats_settings(config);
    Ok(Layout {
        table_id: metadata.id().to_string(),
        stats_columns,
        partition_indices: partition_columns.iter().filter_map(|c| index_of(c)).collect(),
        partition_columns,
        file_schema: Arc::new(Schema::new(file_fields)),
        file_sources,
        added_columns,
        target_file_size: options
            .target_file_size
            .unwrap_or_else(|| table_config.target_file_size().get()),
        num_indexed_cols,
    })
}

/// Whether a data file's path holds only characters that need no escaping
/// (`[A-Za-z0-9._-=/]`), so that the log's path, its decoded form and the
/// object's key are one string.
pub(crate) fn plain_path(path: &str) -> bool {
    path.chars().all(|c| c.is_ascii_alphanumeric() || "._-=/".contains(c))
}

/// Whether a data file's (decoded) path is absolute (`s3://...`,
/// `file:/...`, `/...`) rather than relative to the table, as shallow
/// clones write: compaction and vacuum address files by their place under
/// the table and refuse such tables.
pub(crate) fn absolute_path(path: &str) -> bool {
    path.starts_with('/') || url::Url::parse(path).is_ok()
}

/// Which columns get statistics: `delta.dataSkippingNumIndexedCols` (-1 for
/// all columns, default 32), unless `delta.dataSkippingStatsColumns` names
/// them.
pub(crate) fn stats_settings(config: &std::collections::HashMap<String, String>) -> (usize, Option<Vec<String>>) {
    let num_indexed_cols = match config
        .get("delta.dataSkippingNumIndexedCols")
        .and_then(|v| v.parse::<i64>().ok())
    {
        Some(n) if n < 0 => usize::MAX,
        Some(n) => n as usize,
        None => 32,
    };
    let stats_columns = config.get("delta.dataSkippingStatsColumns").map(|v| {
        v.split(',')
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .collect()
    });
    (num_indexed_cols, stats_columns)
}

/// The table's metadata with `added` columns, if the table lacks any of them.
pub(crate) fn merged_metadata(
    table: &DeltaTable,
    url: &Url,
    added: &[StructField],
) -> Result<Option<Metadata>, DeltaSinkError> {
    let snapshot = table.snapshot().map_err(delta_err(url))?;
    let schema = snapshot.schema();
    let missing: Vec<StructField> = added
        .iter()
        .filter(|f| schema.field(f.name()).is_none())
        .cloned()
        .collect();
    if missing.is_empty() {
        return Ok(None);
    }
    let fields = schema.fields().cloned().chain(missing);
    let merged = StructType::try_new(fields).map_err(|e| DeltaSinkError::SchemaMismatch {
        table: url.to_string(),
        differences: e.to_string(),
    })?;
    let metadata = snapshot
        .metadata()
        .clone()
        .with_schema(&merged)
        .map_err(|e| delta_err(url)(e.into()))?;
    Ok(Some(metadata))
}
