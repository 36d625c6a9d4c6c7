//! Compaction: a partition's small data files rewritten into files of the
//! target size, committed as `remove`s and `add`s with `dataChange=false`
//! in log entries of weir's own, each written with a put-if-absent and
//! rebased over whatever other writers committed meanwhile.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::{new_null_array, RecordBatch};
use arrow_schema::{Field, Schema, SchemaRef};
use bytes::Bytes;
use deltalake::kernel::engine::arrow_conversion::TryIntoArrow;
use deltalake::kernel::transaction::{TransactionError, PROTOCOL};
use deltalake::kernel::{Action, CommitInfo, Remove};
use deltalake::logstore::{CommitOrBytes, LogStore};
use deltalake::table::config::TablePropertiesExt as _;
use deltalake::{DeltaTable, DeltaTableError, ObjectStore};
use object_store::path::Path;
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{json, Value};
use url::Url;

use weir_core::maintenance::{
    on_threads, plan_groups, AbortOnDrop, CompactGroup, CompactOptions, CompactProgress, CompactReport, PlanFile,
    STRICT_CAST,
};

use crate::entry;
use crate::error::DeltaSinkError;
use crate::options::Compression;
use crate::table::{self, Files};
use crate::writer::{delete_files, AddFile, Destination, FileFormat, OpenFile};
use weir_core::partition;

/// How many times a commit is rebased over other writers' commits before
/// the job gives up (each rebase reads only the new log entries).
const MAX_COMMIT_ATTEMPTS: usize = 200;

/// Rows per batch read from an input file.
const READ_BATCH_ROWS: usize = 8192;

/// Inputs up to this size are fetched while the one before is rewritten.
const PREFETCH_BYTES: u64 = 16 << 20;

type ProgressFn = Arc<dyn Fn(CompactProgress) + Send + Sync>;

/// Rewrites the small data files of a Delta table into files of the target
/// size, partition by partition, without changing its rows.
///
/// - Files smaller than three quarters of the target are packed, in the
///   order they were written, into groups of at most the target's bytes,
///   each rewritten as one file; a group with fewer than
///   [`min_input_files`](Compact::min_input_files) files is left alone.
/// - Each commit removes a group's inputs and adds its outputs with
///   `dataChange=false`, so streaming readers of the table skip it.
/// - Commits by other writers meanwhile are read and the commit is rebased
///   on them: appends never fail it; a group one of whose inputs another
///   writer removed is dropped (its outputs deleted) and the rest commit; a
///   change of the table's schema or protocol fails the job with nothing
///   of the uncommitted groups in the table.
/// - A job stopped at any point leaves the table as its last commit left
///   it; files it wrote and did not commit are orphans for
///   [`Vacuum`](crate::Vacuum). Running it again finishes the work.
///
/// ```no_run
/// # async fn f() -> Result<(), weir_delta::DeltaSinkError> {
/// let report = weir_delta::Compact::new("lake/bronze/payments")?
///     .target_file_size(128 << 20)
///     .run()
///     .await?;
/// println!("{} files into {}", report.files_removed, report.files_added);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Compact {
    location: String,
    storage: std::collections::HashMap<String, String>,
    options: CompactOptions,
    compression: Compression,
    progress: Option<ProgressFn>,
}

impl std::fmt::Debug for Compact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compact")
            .field("location", &self.location)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// A live input file of the plan.
#[derive(Debug, Clone)]
struct Input {
    remove: Remove,
    modified: i64,
    /// `numRecords` of its statistics, if it has them.
    rows: Option<u64>,
}

/// A group rewritten and not yet committed.
#[derive(Debug)]
struct Rewritten {
    index: usize,
    inputs: Vec<Remove>,
    outputs: Vec<AddFile>,
}

impl Compact {
    /// A compaction of the table at `location` with the table's target file
    /// size (`delta.targetFileSize`, else 100 MiB), groups of at least two
    /// files, and one commit for the whole job.
    pub fn new(location: &str) -> Result<Self, DeltaSinkError> {
        table::table_url(location)?;
        Ok(Compact {
            location: location.to_string(),
            storage: Default::default(),
            options: CompactOptions::default(),
            compression: Compression::default(),
            progress: None,
        })
    }

    /// Every option at once.
    pub fn with_options(mut self, options: CompactOptions) -> Self {
        self.options = options;
        self.options.min_input_files = self.options.min_input_files.max(2);
        self.options.max_concurrent_rewrites = self.options.max_concurrent_rewrites.max(1);
        self
    }

    /// Object storage options (as `DeltaSink::with_storage_option`).
    pub fn with_storage_options(mut self, storage: std::collections::HashMap<String, String>) -> Self {
        self.storage = storage;
        self
    }

    /// The size of the files written; files under three quarters of it are
    /// inputs.
    pub fn target_file_size(mut self, bytes: u64) -> Self {
        self.options.target_file_size = Some(bytes.max(1));
        self
    }

    /// The fewest files a group must have to be rewritten (at least 2).
    pub fn min_input_files(mut self, files: usize) -> Self {
        self.options.min_input_files = files.max(2);
        self
    }

    /// How many groups are rewritten at once. Peak memory is about this
    /// many times the target file size, whatever the table's size.
    pub fn max_concurrent_rewrites(mut self, groups: usize) -> Self {
        self.options.max_concurrent_rewrites = groups.max(1);
        self
    }

    /// Commit every `groups` groups (partial progress for large tables)
    /// instead of once at the end.
    pub fn groups_per_commit(mut self, groups: usize) -> Self {
        self.options.groups_per_commit = Some(groups.max(1));
        self
    }

    /// Only the partitions where `column` has `value` (`None`: null). Each
    /// call adds a condition; all must hold.
    pub fn partition(mut self, column: impl Into<String>, value: Option<String>) -> Self {
        self.options.partition.insert(column.into(), value);
        self
    }

    /// The Parquet compression of the files written.
    pub fn compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    /// Plans only: report the groups, write nothing.
    pub fn dry_run(mut self, yes: bool) -> Self {
        self.options.dry_run = yes;
        self
    }

    /// Called as the job plans, rewrites and commits.
    pub fn on_progress(mut self, f: impl Fn(CompactProgress) + Send + Sync + 'static) -> Self {
        self.progress = Some(Arc::new(f));
        self
    }

    fn report(&self, event: CompactProgress) {
        if let Some(f) = &self.progress {
            f(event);
        }
    }

    /// Plans, rewrites and commits.
    pub async fn run(&self) -> Result<CompactReport, DeltaSinkError> {
        let started = Instant::now();
        let (url, table) = table::load_existing(&self.location, &self.storage, Files::Tracked).await?;
        let err = |source| DeltaSinkError::Delta {
            table: url.to_string(),
            source,
        };
        let snapshot = table.snapshot().map_err(err)?;
        let read_version = snapshot.version();
        let metadata = snapshot.metadata();
        let config = metadata.configuration();
        let unsupported = |feature: String| DeltaSinkError::Unsupported {
            table: url.to_string(),
            feature,
        };
        PROTOCOL
            .can_write_to(snapshot)
            .map_err(|e| unsupported(format!("its protocol ({e})")))?;
        if config.get("delta.columnMapping.mode").is_some_and(|m| m != "none") {
            return Err(unsupported("column mapping".into()));
        }
        if table.log_store().name() != "DefaultLogStore" {
            return Err(unsupported(format!(
                "a log store without put-if-absent ({}); compaction commits its own log entries",
                table.log_store().name()
            )));
        }
        let partition_columns: Vec<String> = metadata.partition_columns().to_vec();
        if let Some(c) = self.options.partition.keys().find(|c| !partition_columns.contains(c)) {
            return Err(DeltaSinkError::Partition {
                table: url.to_string(),
                column: c.clone(),
                reason: format!(
                    "the filter names a column that is not a partition column (partition columns: {:?})",
                    partition_columns
                ),
            });
        }
        let target = self
            .options
            .target_file_size
            .unwrap_or_else(|| snapshot.table_config().target_file_size().get());
        let raw_paths = raw_paths(url.as_str(), snapshot)?;
        let mut inputs = Vec::new();
        let (mut files_before, mut bytes_before) = (0usize, 0u64);
        for f in snapshot.log_data().iter() {
            files_before += 1;
            bytes_before += u64::try_from(f.size()).unwrap_or(0);
            let remove = f.remove_action(false);
            if table::absolute_path(&remove.path) {
                return Err(DeltaSinkError::Location {
                    location: self.location.clone(),
                    reason: format!(
                        "the table has a file outside its folder's naming ({}, an absolute path, as a shallow clone \
                         has); compaction addresses files under the table and refuses such tables; nothing was \
                         changed",
                        remove.path
                    ),
                });
            }
            inputs.push(Input {
                modified: f.modification_time(),
                rows: f.num_records().map(|n| n as u64),
                remove,
            });
        }
        let groups = self.plan(inputs, &partition_columns, target);
        let mut report = CompactReport {
            dry_run: self.options.dry_run,
            read_version: Some(read_version as i64),
            target_file_size: target,
            files_before,
            bytes_before,
            groups: groups.iter().map(|g| describe_group(g)).collect(),
            ..CompactReport::default()
        };
        self.report(CompactProgress::Planned {
            groups: groups.len(),
            files: groups.iter().map(Vec::len).sum(),
            bytes: report.groups.iter().map(|g| g.bytes).sum(),
        });
        if self.options.dry_run || groups.is_empty() {
            report.duration = started.elapsed();
            return Ok(report);
        }

        let (num_indexed_cols, stats_columns) = table::stats_settings(config);
        let fields = snapshot
            .schema()
            .fields()
            .filter(|f| !partition_columns.contains(f.name()))
            .map(|f| f.try_into_arrow())
            .collect::<Result<Vec<Field>, _>>()
            .map_err(|e| DeltaSinkError::SchemaMismatch {
                table: url.to_string(),
                differences: format!("a column has no Arrow equivalent: {e}"),
            })?;
        let job = Arc::new(Job {
            table: url.to_string(),
            store: table.log_store().object_store(None),
            schema: Arc::new(Schema::new(fields)),
            compression: self.compression,
            num_indexed_cols,
            stats_columns,
            partition_columns,
            target,
            prefix: format!("weir-compact-{}", uuid::Uuid::new_v4()),
            disk: local_disk(&url),
            raw_paths,
        });
        let mut log = LogTail::start(table.log_store().as_ref(), read_version, &url).await?;
        let per_commit = self.options.groups_per_commit.unwrap_or(groups.len());
        let mut indexed: Vec<(usize, Vec<Input>)> = groups.into_iter().enumerate().collect();
        while !indexed.is_empty() {
            let rest = indexed.split_off(per_commit.min(indexed.len()));
            let mut chunk = std::mem::replace(&mut indexed, rest);
            // Groups whose input an earlier commit of another writer removed.
            let before = chunk.len();
            chunk.retain(|(_, g)| g.iter().all(|i| !log.removed.contains(&i.remove.path)));
            report.groups_dropped += before - chunk.len();
            let rewritten = self.rewrite(&job, chunk).await?;
            let outcome = commit(&table, &job, &mut log, rewritten).await?;
            report.groups_dropped += outcome.dropped;
            report.concurrent_commits += outcome.concurrent;
            if let Some(version) = outcome.version {
                report.commits.push(version as i64);
                for g in &outcome.committed {
                    report.count_group(
                        (
                            g.inputs.len(),
                            g.inputs.iter().map(|r| r.size.unwrap_or(0) as u64).sum(),
                        ),
                        (
                            g.outputs.len(),
                            g.outputs.iter().map(|a| a.size as u64).sum(),
                            g.outputs.iter().map(|a| a.rows.max(0) as u64).sum(),
                        ),
                    );
                }
                self.report(CompactProgress::Committed {
                    commit: version as i64,
                    groups: outcome.committed.len(),
                });
                table::checkpoint_if_due(&table, &url, version).await;
            }
        }
        report.duration = started.elapsed();
        tracing::info!(
            table = %url,
            commits = ?report.commits,
            files_removed = report.files_removed,
            files_added = report.files_added,
            groups_dropped = report.groups_dropped,
            "compacted"
        );
        Ok(report)
    }

    /// Groups of small files per partition, in the order they were written
    /// (files with deletion vectors are left alone).
    fn plan(&self, mut inputs: Vec<Input>, partition_columns: &[String], target: u64) -> Vec<Vec<Input>> {
        inputs.sort_by(|a, b| (a.modified, &a.remove.path).cmp(&(b.modified, &b.remove.path)));
        let files = inputs
            .into_iter()
            .filter(|input| input.remove.deletion_vector.is_none())
            .map(|input| {
                let values: BTreeMap<String, Option<String>> = input
                    .remove
                    .partition_values
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .collect();
                let key: Vec<Option<String>> = partition_columns
                    .iter()
                    .map(|c| values.get(c).cloned().flatten())
                    .collect();
                PlanFile {
                    key,
                    values,
                    size: input.remove.size.map_or(u64::MAX, |s| s as u64),
                    file: input,
                }
            });
        plan_groups(files, &self.options, target)
            .into_iter()
            .map(|(_, group)| group)
            .collect()
    }

    /// Rewrites a chunk of groups, `max_concurrent_rewrites` at a time,
    /// on threads of the job's own (see [`on_threads`]). On an error or a
    /// panic the other rewrites stop, and the outputs of the chunk are
    /// deleted: none was committed. (If the job's future is dropped, groups
    /// stop at their next batch; files already finished stay as orphans.)
    async fn rewrite(&self, job: &Arc<Job>, chunk: Vec<(usize, Vec<Input>)>) -> Result<Vec<Rewritten>, DeltaSinkError> {
        let runtime = tokio::runtime::Handle::current();
        let worker = job.clone();
        let rewritten = on_threads(
            "weir-compact",
            chunk,
            self.options.max_concurrent_rewrites,
            move |(index, group), stopped| worker.rewrite_blocking(&runtime, stopped, index, group),
            |group: &Rewritten| {
                self.report(CompactProgress::Rewritten {
                    group: group.index,
                    bytes: group.inputs.iter().map(|r| r.size.unwrap_or(0) as u64).sum(),
                    files_out: group.outputs.len(),
                })
            },
            |reason| DeltaSinkError::CompactionStopped {
                table: job.table.clone(),
                reason,
            },
        )
        .await;
        let mut done = match rewritten {
            Ok(done) => done,
            Err((e, done)) => {
                for g in &done {
                    delete_files(&job.store, &g.outputs).await;
                }
                return Err(e);
            }
        };
        done.sort_by_key(|g| g.index);
        Ok(done)
    }
}

fn describe_group(group: &[Input]) -> CompactGroup {
    let partition = group
        .first()
        .and_then(|f| f.remove.partition_values.clone())
        .unwrap_or_default()
        .into_iter()
        .collect();
    CompactGroup {
        partition,
        files: group.iter().map(|f| f.remove.path.clone()).collect(),
        bytes: group.iter().map(|f| f.remove.size.unwrap_or(0) as u64).sum(),
    }
}

/// What every rewrite of a job shares.
struct Job {
    table: String,
    store: Arc<dyn ObjectStore>,
    schema: SchemaRef,
    compression: Compression,
    num_indexed_cols: usize,
    stats_columns: Option<Vec<String>>,
    partition_columns: Vec<String>,
    /// For the commit info.
    target: u64,
    prefix: String,
    /// For a table on a local disk: its files as its store names them,
    /// written straight from the encoder.
    disk: Option<object_store::local::LocalFileSystem>,
    /// The log's own path of each live file whose path is not plain, by
    /// its decoded path (see [`raw_paths`]).
    raw_paths: HashMap<String, String>,
}

impl Job {
    fn store_err(&self, path: &str) -> impl Fn(object_store::Error) -> DeltaSinkError + '_ {
        let path = path.to_string();
        move |source| DeltaSinkError::Store {
            table: self.table.clone(),
            path: path.clone(),
            source,
        }
    }

    fn parquet_err(&self, path: &str) -> impl Fn(parquet::errors::ParquetError) -> DeltaSinkError + '_ {
        let path = path.to_string();
        move |source| DeltaSinkError::Parquet {
            table: self.table.clone(),
            path: path.clone(),
            source,
        }
    }

    /// Reads a group's files one at a time into one file: at most one input
    /// file (and the next, fetched meanwhile) and the output's open row
    /// group and part are in memory. (A writer's size estimate counts
    /// buffered rows uncompressed, so rolling on it would cut files well
    /// short of the target, and they would be compacted again and again.)
    ///
    /// It runs on a thread of the job's (see [`Compact::rewrite`]): decoding and
    /// encoding are CPU work, and a table on a local disk gets its file
    /// written as row groups close. Store requests (fetches, parts, the
    /// final put) are futures run on `runtime`; the next input's fetch and
    /// the parts upload while this thread encodes. On an error, a row count
    /// that differs from the inputs' statistics, or once `stopped` is set,
    /// the output is deleted.
    fn rewrite_blocking(
        &self,
        runtime: &tokio::runtime::Handle,
        stopped: &AtomicBool,
        index: usize,
        group: Vec<Input>,
    ) -> Result<Option<Rewritten>, DeltaSinkError> {
        let Some(outputs) = self.write_group(runtime, stopped, index, &group)? else {
            return Ok(None);
        };
        let rows_out: i64 = outputs.iter().map(|a| a.rows).sum();
        let rows_in: Option<u64> = group.iter().map(|i| i.rows).sum();
        if rows_in.is_some_and(|n| n != rows_out as u64) {
            runtime.block_on(delete_files(&self.store, &outputs));
            return Err(DeltaSinkError::CompactionStopped {
                table: self.table.clone(),
                reason: format!(
                    "group {index} has {} rows by its files' statistics but {rows_out} were written",
                    rows_in.unwrap_or(0)
                ),
            });
        }
        tracing::debug!(
            group = index,
            files_in = group.len(),
            files_out = outputs.len(),
            rows = rows_out,
            "rewrote a group"
        );
        Ok(Some(Rewritten {
            index,
            inputs: group.into_iter().map(|i| i.remove).collect(),
            outputs,
        }))
    }

    /// The group's output file(s), written (`None` once `stopped` is set); see [`rewrite_blocking`](Self::rewrite_blocking).
    fn write_group(
        &self,
        runtime: &tokio::runtime::Handle,
        stopped: &AtomicBool,
        index: usize,
        group: &[Input],
    ) -> Result<Option<Vec<AddFile>>, DeltaSinkError> {
        let values: Vec<Option<String>> = {
            let pv = group[0].remove.partition_values.clone().unwrap_or_default();
            self.partition_columns
                .iter()
                .map(|c| pv.get(c).cloned().flatten())
                .collect()
        };
        let output = {
            let dir = partition::directory(&self.partition_columns, &values);
            let name = format!(
                "{}-{:04}-000.{}.parquet",
                self.prefix,
                index,
                self.compression.extension()
            );
            if dir.is_empty() {
                name
            } else {
                format!("{dir}/{name}")
            }
        };
        let mut open: Option<OpenFile> = None;
        // A panic (a malformed input can make the decoder panic) still gives
        // the open file up, its upload aborted, before it goes on.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut next: Option<AbortOnDrop<object_store::Result<Bytes>>> = None;
            for (i, input) in group.iter().enumerate() {
                let path = &input.remove.path;
                let bytes: Bytes = match next.take() {
                    Some(fetch) => runtime.block_on(fetch).unwrap_or_else(|e| {
                        Err(object_store::Error::Generic {
                            store: "fetch",
                            source: Box::new(e),
                        })
                    }),
                    None => runtime.block_on(self.fetch(path)),
                }
                .map_err(self.store_err(path))?;
                // The next input is fetched while this one is rewritten (if
                // it is small enough that holding two stays within the bound).
                if let Some(following) = group.get(i + 1) {
                    if following.remove.size.is_some_and(|n| (n as u64) <= PREFETCH_BYTES) {
                        let (store, path) = (self.store.clone(), following.remove.path.clone());
                        next = Some(AbortOnDrop(runtime.spawn(async move { fetch(&store, &path).await })));
                    }
                }
                let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
                    .and_then(|b| b.with_batch_size(READ_BATCH_ROWS).build())
                    .map_err(self.parquet_err(path))?;
                for batch in reader {
                    if stopped.load(Ordering::Relaxed) {
                        return Ok(None);
                    }
                    let batch = batch.map_err(|e| self.parquet_err(path)(e.into()))?;
                    let rows = self.conform(&batch, path)?;
                    let file = match open.as_mut() {
                        Some(f) => f,
                        None => open.insert(self.create(&output, &values)?),
                    };
                    file.encode(&self.table, &rows)?;
                    if file.part_ready() {
                        runtime.block_on(file.send_if_ready(&self.table, &self.store))?;
                    }
                }
            }
            let Some(mut file) = open.take() else {
                return Ok(Some(Vec::new()));
            };
            if let Err(e) = file.close(&self.table) {
                open = Some(file);
                return Err(e);
            }
            let finished = runtime.block_on(file.finish(&self.table, &self.store, &self.partition_columns))?;
            Ok(Some(vec![finished]))
        }));
        if !matches!(result, Ok(Ok(Some(_)))) {
            if let Some(file) = open.take() {
                runtime.block_on(file.abort());
            }
        }
        result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    }

    /// The output file at `output` in the partition with `values`: on disk
    /// for a table on a local disk, else in the store.
    fn create(&self, output: &str, values: &[Option<String>]) -> Result<OpenFile, DeltaSinkError> {
        let format = FileFormat {
            schema: &self.schema,
            compression: self.compression,
            num_indexed_cols: self.num_indexed_cols,
            stats_columns: self.stats_columns.as_deref(),
        };
        let destination = match &self.disk {
            Some(disk) => Destination::Disk(
                Path::parse(output)
                    .map_err(object_store::Error::from)
                    .and_then(|p| disk.path_to_filesystem(&p))
                    .map_err(self.store_err(output))?,
            ),
            None => Destination::Store,
        };
        OpenFile::create_in(&self.table, output.to_string(), values, &format, destination)
    }

    async fn fetch(&self, path: &str) -> object_store::Result<Bytes> {
        fetch(&self.store, path).await
    }

    /// An input file's rows in the table's current columns: a column the
    /// file lacks (added later) is null, a type that differs is cast.
    fn conform(&self, batch: &RecordBatch, path: &str) -> Result<RecordBatch, DeltaSinkError> {
        let mismatch = |differences: String| DeltaSinkError::SchemaMismatch {
            table: self.table.clone(),
            differences: format!("data file {path}: {differences}"),
        };
        let columns = self
            .schema
            .fields()
            .iter()
            .map(|field| match batch.column_by_name(field.name()) {
                Some(c) if c.data_type() == field.data_type() => Ok(c.clone()),
                Some(c) if c.data_type().is_nested() || field.data_type().is_nested() => Err(mismatch(format!(
                    "nested column {:?} is {} in the file and {} in the table; compaction does not convert nested columns",
                    field.name(),
                    c.data_type(),
                    field.data_type()
                ))),
                Some(c) => arrow_cast::cast_with_options(c, field.data_type(), &STRICT_CAST).map_err(|e| {
                    mismatch(format!("column {:?} cannot be read as {}: {e}", field.name(), field.data_type()))
                }),
                None if field.is_nullable() => Ok(new_null_array(field.data_type(), batch.num_rows())),
                None => Err(mismatch(format!("required column {:?} is missing", field.name()))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        RecordBatch::try_new(self.schema.clone(), columns).map_err(|e| mismatch(e.to_string()))
    }
}

/// The local file system a table on a local disk is in, rooted at the
/// table, so its files are named as its store names them.
fn local_disk(url: &Url) -> Option<object_store::local::LocalFileSystem> {
    if url.scheme() != "file" {
        return None;
    }
    let root = url.to_file_path().ok()?;
    object_store::local::LocalFileSystem::new_with_prefix(root).ok()
}

/// An input file's bytes.
async fn fetch(store: &Arc<dyn ObjectStore>, path: &str) -> object_store::Result<Bytes> {
    let location = Path::parse(path).map_err(object_store::Error::from)?;
    store.get(&location).await?.bytes().await
}

/// The log as far as the job has read it: the latest version, and a digest
/// of its entry, so a table deleted and created again is not written as if
/// it were the same table.
struct LogTail {
    version: u64,
    digest: u64,
    /// Every path other writers removed since the planned version: a
    /// group with one of them as input is never committed.
    removed: HashSet<String>,
}

fn digest(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

impl LogTail {
    async fn start(log_store: &dyn LogStore, version: u64, url: &Url) -> Result<Self, DeltaSinkError> {
        let bytes = read_entry(log_store, version, url)
            .await?
            .ok_or_else(|| replaced(url, version))?;
        Ok(LogTail {
            version,
            digest: digest(&bytes),
            removed: HashSet::new(),
        })
    }
}

fn replaced(url: &Url, version: u64) -> DeltaSinkError {
    DeltaSinkError::CompactionStopped {
        table: url.to_string(),
        reason: format!("log entry {version}, which it read, is gone or different: the table was replaced"),
    }
}

async fn read_entry(log_store: &dyn LogStore, version: u64, url: &Url) -> Result<Option<Bytes>, DeltaSinkError> {
    log_store
        .read_commit_entry(version)
        .await
        .map_err(|source| DeltaSinkError::Delta {
            table: url.to_string(),
            source,
        })
}

/// What a commit of rewritten groups came to.
struct Outcome {
    version: Option<u64>,
    committed: Vec<Rewritten>,
    dropped: usize,
    /// Other writers' entries read while committing.
    concurrent: usize,
}

/// Commits `groups` on top of the latest version: reads every entry after
/// the last one read, drops groups an entry removed an input of, and tries
/// again, until the put-if-absent wins.
async fn commit(
    table: &DeltaTable,
    job: &Job,
    log: &mut LogTail,
    mut groups: Vec<Rewritten>,
) -> Result<Outcome, DeltaSinkError> {
    let url = Url::parse(&job.table).map_err(|e| DeltaSinkError::Location {
        location: job.table.clone(),
        reason: e.to_string(),
    })?;
    let log_store = table.log_store();
    let log_store = log_store.as_ref();
    let attempt = uuid::Uuid::new_v4().to_string();
    let (mut dropped, mut concurrent) = (0, 0);
    // Whether a write's outcome was unknown: it may still land, so nothing
    // of this commit is deleted from then on.
    let mut uncertain = false;
    // The entry compaction last read must still be there: otherwise the
    // table was replaced under the job.
    match read_entry(log_store, log.version, &url).await? {
        Some(bytes) if digest(&bytes) == log.digest => {}
        _ => {
            drop_groups(job, &mut groups, "the table was replaced", !uncertain, |_| true).await;
            return Err(replaced(&url, log.version));
        }
    }
    for round in 1..=MAX_COMMIT_ATTEMPTS {
        // Read what other writers committed since.
        loop {
            let next = log.version + 1;
            let Some(bytes) = read_entry(log_store, next, &url).await? else {
                break;
            };
            for action in entry::actions(&bytes) {
                if action["commitInfo"]["weir.attemptId"].as_str() == Some(attempt.as_str()) {
                    // A write that reported an error had landed.
                    log.version = next;
                    log.digest = digest(&bytes);
                    return Ok(Outcome {
                        version: Some(next),
                        committed: groups,
                        dropped,
                        concurrent,
                    });
                }
                if let Some(path) = action["remove"]["path"].as_str() {
                    log.removed.insert(decoded(path));
                }
                if action.get("metaData").is_some() || action.get("protocol").is_some() {
                    drop_groups(job, &mut groups, "the table's metadata changed", !uncertain, |_| true).await;
                    return Err(DeltaSinkError::CompactionStopped {
                        table: job.table.clone(),
                        reason: format!("version {next} changed the table's schema, partitioning or protocol"),
                    });
                }
            }
            log.version = next;
            log.digest = digest(&bytes);
            concurrent += 1;
        }
        let removed = &log.removed;
        dropped += drop_groups(
            job,
            &mut groups,
            "another writer removed one of its inputs",
            !uncertain,
            |g| g.inputs.iter().any(|r| removed.contains(&r.path)),
        )
        .await;
        if groups.is_empty() {
            return Ok(Outcome {
                version: None,
                committed: groups,
                dropped,
                concurrent,
            });
        }
        let version = log.version + 1;
        let bytes = optimize_entry(job, &groups, log.version, &attempt).map_err(|e| DeltaSinkError::Delta {
            table: job.table.clone(),
            source: DeltaTableError::Transaction {
                source: TransactionError::SerializeLogJson { json_err: e },
            },
        })?;
        match log_store
            .write_commit_entry(version, CommitOrBytes::LogBytes(bytes.clone()), uuid::Uuid::new_v4())
            .await
        {
            Ok(()) => {
                log.version = version;
                log.digest = digest(&bytes);
                return Ok(Outcome {
                    version: Some(version),
                    committed: groups,
                    dropped,
                    concurrent,
                });
            }
            Err(TransactionError::VersionAlreadyExists(_)) => {
                tracing::debug!(version, round, "compaction lost a commit race; rebasing");
            }
            Err(e) => {
                // The outcome is unknown: the entry may have landed. The next
                // round reads it and recognises the attempt id; the outputs
                // are kept either way.
                let e = DeltaSinkError::Delta {
                    table: job.table.clone(),
                    source: DeltaTableError::Transaction { source: e },
                };
                if !e.retryable() {
                    return Err(DeltaSinkError::CompactionStopped {
                        table: job.table.clone(),
                        reason: format!(
                            "committing version {version} failed ({e}); whether it landed is unknown, so its files \
                             are kept (the table's history shows it)"
                        ),
                    });
                }
                tracing::warn!(version, round, error = %e, "a compaction commit failed; reading the log to learn whether it landed");
                uncertain = true;
                tokio::time::sleep(Duration::from_millis(100 * round.min(20) as u64)).await;
            }
        }
        if round > 3 {
            let jitter = u64::from(attempt.as_bytes()[0] % 20);
            tokio::time::sleep(Duration::from_millis((round as u64 * 5).min(200) + jitter)).await;
        }
    }
    if uncertain {
        return Err(DeltaSinkError::CompactionStopped {
            table: job.table.clone(),
            reason: format!(
                "{MAX_COMMIT_ATTEMPTS} commit attempts failed or lost races, some with an unknown outcome; its files \
                 are kept (the table's history shows whether one landed)"
            ),
        });
    }
    drop_groups(job, &mut groups, "the job gave up", true, |_| true).await;
    Err(DeltaSinkError::Busy {
        table: job.table.clone(),
        operation: "compaction".into(),
        attempts: MAX_COMMIT_ATTEMPTS,
    })
}

/// Drops the groups `pred` selects, deleting their outputs if `delete`
/// (only when no write of them may still land). Returns how many were
/// dropped.
async fn drop_groups(
    job: &Job,
    groups: &mut Vec<Rewritten>,
    why: &str,
    delete: bool,
    pred: impl Fn(&Rewritten) -> bool,
) -> usize {
    let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(groups).into_iter().partition(|g| pred(g));
    *groups = kept;
    for g in &gone {
        tracing::info!(group = g.index, why, "a compaction group is dropped");
        if delete {
            delete_files(&job.store, &g.outputs).await;
        }
    }
    gone.len()
}

/// A log path as the live files name it (URL-decoded).
fn decoded(path: &str) -> String {
    percent_encoding::percent_decode_str(path)
        .decode_utf8_lossy()
        .into_owned()
}

/// The log entry of a compaction commit.
fn optimize_entry(
    job: &Job,
    groups: &[Rewritten],
    read_version: u64,
    attempt: &str,
) -> Result<Bytes, serde_json::Error> {
    let removes: Vec<&Remove> = groups.iter().flat_map(|g| &g.inputs).collect();
    let adds: Vec<&AddFile> = groups.iter().flat_map(|g| &g.outputs).collect();
    let now = chrono::Utc::now().timestamp_millis();
    let metrics = json!({
        "numRemovedFiles": removes.len().to_string(),
        "numAddedFiles": adds.len().to_string(),
        "numRemovedBytes": removes.iter().map(|r| r.size.unwrap_or(0)).sum::<i64>().to_string(),
        "numAddedBytes": adds.iter().map(|a| a.size).sum::<i64>().to_string(),
    });
    let mut info = CommitInfo {
        timestamp: Some(now),
        operation: Some("OPTIMIZE".into()),
        operation_parameters: Some(
            [
                ("targetSize".to_string(), json!(job.target.to_string())),
                ("predicate".to_string(), json!("[]")),
                ("zOrderBy".to_string(), json!("[]")),
            ]
            .into_iter()
            .collect(),
        ),
        read_version: Some(read_version),
        is_blind_append: Some(false),
        engine_info: Some(format!("weir-delta/{}", env!("CARGO_PKG_VERSION"))),
        ..Default::default()
    };
    info.info.insert("operationMetrics".into(), metrics);
    info.info.insert("weir.operation".into(), json!("compact"));
    info.info.insert("weir.attemptId".into(), Value::from(attempt));
    // A remove names its file exactly as the add did: engines encode some
    // characters (a space, ...) differently, and readers match the two
    // strings as written.
    let mut actions = vec![serde_json::to_value(Action::CommitInfo(info))?];
    for r in removes {
        let mut remove = serde_json::to_value(Action::Remove(Remove {
            deletion_timestamp: Some(now),
            data_change: false,
            ..r.clone()
        }))?;
        if let Some(raw) = job.raw_paths.get(&r.path) {
            remove["remove"]["path"] = Value::from(raw.as_str());
        }
        actions.push(remove);
    }
    for a in adds {
        actions.push(serde_json::to_value(entry::add(a, false))?);
    }
    entry::encode(actions.into_iter())
}

/// The log's own path of every live file whose path has a character
/// outside `[A-Za-z0-9._-=/]` (which engines may escape in different
/// ways), by its decoded path: the `path` column of the table's add
/// actions is as written in the log.
fn raw_paths(
    table: &str,
    snapshot: &deltalake::table::state::DeltaTableState,
) -> Result<HashMap<String, String>, DeltaSinkError> {
    let delta = |source: DeltaTableError| DeltaSinkError::Delta {
        table: table.to_string(),
        source,
    };
    let mut raw_paths = HashMap::new();
    for adds in snapshot.add_actions_batches(false).map_err(delta)? {
        let column = adds.column_by_name("path").ok_or_else(|| {
            delta(DeltaTableError::SchemaMismatch {
                msg: "the live files' add actions have no path column".into(),
            })
        })?;
        let column = arrow_cast::cast(column, &arrow_schema::DataType::Utf8).map_err(|e| delta(e.into()))?;
        let paths = column.as_string::<i32>();
        for raw in paths.iter().flatten().filter(|raw| !table::plain_path(raw)) {
            // Two live files spelled apart but one decoded (`a b`, `a%20b`)
            // would get one remove's spelling: such a table is refused.
            if let Some(other) = raw_paths.insert(decoded(raw), raw.to_string()) {
                if other != raw {
                    return Err(DeltaSinkError::SamePathDecoded {
                        table: table.to_string(),
                        first: other,
                        second: raw.to_string(),
                    });
                }
            }
        }
    }
    Ok(raw_paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        use arrow_schema::DataType;
        Job {
            table: "t".into(),
            store: Arc::new(object_store::memory::InMemory::new()),
            schema: Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("small", DataType::Int32, true),
                Field::new(
                    "s",
                    DataType::Struct(vec![Field::new("a", DataType::Int64, true)].into()),
                    true,
                ),
            ])),
            compression: Compression::default(),
            num_indexed_cols: 32,
            stats_columns: None,
            partition_columns: Vec::new(),
            target: 1 << 20,
            prefix: "p".into(),
            disk: None,
            raw_paths: HashMap::new(),
        }
    }

    fn file(columns: Vec<(&str, arrow_array::ArrayRef)>) -> RecordBatch {
        let fields: Vec<Field> = columns
            .iter()
            .map(|(n, c)| Field::new(*n, c.data_type().clone(), true))
            .collect();
        RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            columns.into_iter().map(|c| c.1).collect(),
        )
        .unwrap()
    }

    #[test]
    fn a_files_columns_are_fitted_to_the_table_or_refused() {
        use arrow_array::{Array, Int64Array, StructArray};
        let j = job();
        // A missing nullable column is null; a type that fits is cast.
        let out = j
            .conform(
                &file(vec![
                    ("small", Arc::new(Int64Array::from(vec![7]))),
                    ("id", Arc::new(Int64Array::from(vec![1]))),
                ]),
                "f",
            )
            .unwrap();
        assert_eq!(
            (out.column(1).data_type(), out.column(2).null_count()),
            (&arrow_schema::DataType::Int32, 1)
        );
        // A value that does not fit fails instead of becoming null.
        let e = j
            .conform(
                &file(vec![
                    ("id", Arc::new(Int64Array::from(vec![1]))),
                    ("small", Arc::new(Int64Array::from(vec![1i64 << 40]))),
                ]),
                "f",
            )
            .unwrap_err();
        assert!(e.to_string().contains("\"small\" cannot be read as"), "{e}");
        // A nested column of another shape is refused, not cast by position.
        let other = StructArray::from(vec![(
            Arc::new(Field::new("b", arrow_schema::DataType::Int64, true)),
            Arc::new(Int64Array::from(vec![5])) as arrow_array::ArrayRef,
        )]);
        let e = j
            .conform(
                &file(vec![
                    ("id", Arc::new(Int64Array::from(vec![1]))),
                    ("s", Arc::new(other)),
                ]),
                "f",
            )
            .unwrap_err();
        assert!(e.to_string().contains("nested column \"s\""), "{e}");
        assert!(out.column(0).len() == 1);
    }

    #[test]
    fn log_paths_are_decoded() {
        assert_eq!(decoded("a=10%3A00/x.parquet"), "a=10:00/x.parquet");
        assert_eq!(decoded("plain/x.parquet"), "plain/x.parquet");
    }
}
