//! Compaction: a partition's small data files rewritten into files of the
//! target size, committed as `remove`s and `add`s with `dataChange=false`
//! in log entries of weir's own, each written with a put-if-absent and
//! rebased over whatever other writers committed meanwhile.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::{Field, Schema, SchemaRef};
use bytes::Bytes;
use deltalake::kernel::engine::arrow_conversion::TryIntoArrow;
use deltalake::kernel::transaction::TransactionError;
use deltalake::kernel::{Action, CommitInfo, Remove};
use deltalake::logstore::{CommitOrBytes, LogStore};
use deltalake::table::config::TablePropertiesExt as _;
use deltalake::{DeltaTable, DeltaTableError, ObjectStore};
use object_store::path::Path;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::{json, Value};
use url::Url;

use weir_core::maintenance::{
    on_threads, plan_groups, AbortOnDrop, CompactGroup, CompactOptions, CompactProgress, CompactReport, PlanFile,
};

use crate::data_file::{conform, decoded, fetch, raw_paths};
use crate::entry;
use crate::error::DeltaSinkError;
use crate::log_cursor::LogCursor;
use crate::open_file::{AddFile, Destination, FileFormat, OpenFile};
use crate::options::Compression;
use crate::table::{self, Files};
use crate::writer::delete_files;
use weir_core::partition;

/// How many times a commit is rebased over other writers' commits before
/// the job gives up (each rebase reads only the new log entries).
const MAX_COMMIT_ATTEMPTS: usize = 200;

/// Rows per batch read from an input file.
const READ_BATCH_ROWS: usize = 8192;

/// Inputs up to this size are fetched while the one before is rewritten.
const PREFETCH_BYTES: u64 = 16 << 20;

type ProgressFn = Arc<dyn Fn(CompactProgress) + Send + Sync>;

mod commit;
mod rewrite;

use commit::*;
use rewrite::*;

/// Rewrites the small data files of a Delta table into files of the target
/// size, partition by partition, without changing its rows.
///
/// - Files smaller than three quarters of the target are packed, in the
///   order they were written, into groups of at most the target's bytes,
///   each rewritten as one file; a group with fewer than
///   [`with_min_input_files`](Compact::with_min_input_files) files is left alone.
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
/// - Peak memory is about
///   [`with_max_concurrent_rewrites`](Compact::with_max_concurrent_rewrites)
///   times the target file size, whatever the table's size.
///
/// ```no_run
/// # async fn f() -> Result<(), weir_delta::DeltaSinkError> {
/// let report = weir_delta::Compact::new("lake/bronze/payments")?
///     .with_target_file_size(128 << 20)
///     .await?;
/// println!("{} files into {}", report.files_removed, report.files_added);
/// # Ok(()) }
/// ```
#[must_use = "a job does nothing until it is awaited"]
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

weir_core::awaitable!(Compact => Result<CompactReport, DeltaSinkError>);

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

    weir_core::compact_setters!(options, progress);
    weir_core::compact_setters_renamed!();

    /// Object storage options (as `DeltaSink::with_storage_option`).
    pub fn with_storage_options(mut self, storage: std::collections::HashMap<String, String>) -> Self {
        self.storage = storage;
        self
    }

    /// The Parquet compression of the files written.
    pub fn with_compression(mut self, compression: Compression) -> Self {
        self.compression = compression;
        self
    }

    weir_core::renamed!(compression => with_compression(compression: Compression));

    fn report(&self, event: CompactProgress) {
        if let Some(f) = &self.progress {
            f(event);
        }
    }

    /// Plans, rewrites and commits; awaiting the job does the same.
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
        crate::protocol::check(snapshot, crate::protocol::Write::Compaction).map_err(unsupported)?;
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
