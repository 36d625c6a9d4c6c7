//! Compaction: a partition's small data files rewritten into files of the
//! target size, committed as one `replace` snapshot by weir's commit layer,
//! validated on every attempt against the table as it is then.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::io::FileIO;
use iceberg::spec::{DataFile, TableMetadata};
use iceberg::writer::file_writer::location_generator::DefaultLocationGenerator;
use iceberg::TableIdent;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use weir_core::sink::DataWriter;

use weir_core::maintenance::{
    on_threads, plan_groups, CompactGroup, CompactOptions, CompactProgress, CompactReport, PlanFile,
};

use crate::catalog::{after_swap, parse_ident, shown, Catalog, LoadedTable, Swap};
use crate::commit::{Change, Producer, Replaced, Request};
use crate::data_files::{conform, identity_sources, Live};
use crate::error::IcebergSinkError;
use crate::reachable::{delete_quietly, load_existing};
use crate::table::{self, Layout};
use crate::writer::{self, IcebergWriter, WriterContext};

/// How many times a lost swap is validated and tried again.
const MAX_ATTEMPTS: usize = 200;

/// Rows per batch read from an input file.
const READ_BATCH_ROWS: usize = 8192;

type ProgressFn = Arc<dyn Fn(CompactProgress) + Send + Sync>;

mod commit;
mod rewrite;

use commit::*;
use rewrite::*;

/// Rewrites the small data files of an Iceberg table into files of the
/// target size, partition by partition, without changing its rows.
///
/// - Data files smaller than three quarters of the target
///   (`write.target-file-size-bytes`) are packed into groups of at most the
///   target's bytes, per partition, each rewritten as one file; a group
///   with fewer than [`with_min_input_files`](Compact::with_min_input_files) files is
///   left alone.
/// - After partition evolution, small files of an older spec are grouped by
///   their own partition and rewritten into the default spec: one output
///   per partition of the default spec their rows fall in.
/// - Each commit is one `replace` snapshot: its manifests mark the inputs
///   deleted and add the outputs. It is built on the table as it is at the
///   swap, every time: files appended meanwhile stay; a group one of whose
///   inputs is no longer live (removed or rewritten by another writer) is
///   dropped and its outputs deleted; the rest commit. A stale view is
///   never committed.
/// - Tables with row-level delete files are refused (rewriting their data
///   files would need the deletes applied).
/// - A job stopped at any point leaves the table as its last swap left
///   it; files it wrote and did not commit are orphans for
///   [`RemoveOrphanFiles`](crate::RemoveOrphanFiles).
/// - Peak memory is bounded by
///   [`with_max_concurrent_rewrites`](Compact::with_max_concurrent_rewrites)
///   writers' row groups, whatever the table's size.
///
/// ```no_run
/// # async fn f(catalog: std::sync::Arc<dyn weir_iceberg::Catalog>) -> Result<(), weir_iceberg::IcebergSinkError> {
/// let report = weir_iceberg::Compact::new(catalog, "bronze.payments")?
///     .with_target_file_size(128 << 20)
///     .await?;
/// println!("{} files into {}", report.files_removed, report.files_added);
/// # Ok(()) }
/// ```
#[must_use = "a job does nothing until it is awaited"]
#[derive(Clone)]
pub struct Compact {
    catalog: Arc<dyn Catalog>,
    ident: TableIdent,
    options: CompactOptions,
    progress: Option<ProgressFn>,
}

weir_core::awaitable!(Compact => Result<CompactReport, IcebergSinkError>);

impl std::fmt::Debug for Compact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compact")
            .field("table", &shown(&self.ident))
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// A group rewritten and not yet committed.
struct Rewritten {
    index: usize,
    inputs: Vec<DataFile>,
    outputs: Vec<DataFile>,
}

impl Compact {
    /// A compaction of the table `name` (`namespace.table`) of `catalog`,
    /// with the table's target file size, groups of at least two files and
    /// one commit for the whole job.
    pub fn new(catalog: Arc<dyn Catalog>, name: &str) -> Result<Self, IcebergSinkError> {
        Ok(Compact {
            catalog,
            ident: parse_ident(name)?,
            options: CompactOptions::default(),
            progress: None,
        })
    }

    weir_core::compact_setters!(options, progress);
    weir_core::compact_setters_renamed!();

    fn report(&self, event: CompactProgress) {
        if let Some(f) = &self.progress {
            f(event);
        }
    }

    fn shown(&self) -> String {
        shown(&self.ident)
    }

    fn iceberg_err(&self, context: &str) -> impl Fn(iceberg::Error) -> IcebergSinkError + '_ {
        let context = context.to_string();
        move |source| IcebergSinkError::Iceberg {
            table: self.shown(),
            context: context.clone(),
            source: Box::new(source),
        }
    }

    /// Plans, rewrites and commits; awaiting the job does the same.
    pub async fn run(&self) -> Result<CompactReport, IcebergSinkError> {
        let started = Instant::now();
        let base = load_existing(self.catalog.as_ref(), &self.ident).await?;
        let metadata = &base.metadata;
        let table_layout = self.layout(metadata)?;
        let target = self.options.target_file_size.unwrap_or(table_layout.target_file_size);
        let spec = metadata.default_partition_spec().clone();
        let unknown: Vec<&String> = self
            .options
            .partition
            .keys()
            .filter(|k| !spec.fields().iter().any(|f| &f.name == *k))
            .collect();
        if !unknown.is_empty() {
            return Err(IcebergSinkError::Unsupported {
                table: self.shown(),
                feature: format!(
                    "a partition filter on {unknown:?}, which are not partition fields (partition fields: {:?}); nothing was changed",
                    spec.fields().iter().map(|f| &f.name).collect::<Vec<_>>()
                ),
            });
        }
        let live = self.live_files(&base).await?;
        let mut report = CompactReport {
            dry_run: self.options.dry_run,
            read_version: metadata.current_snapshot_id(),
            target_file_size: target,
            files_before: live.files.len(),
            bytes_before: live.files.iter().map(|(f, _)| f.file_size_in_bytes()).sum(),
            ..CompactReport::default()
        };
        let groups = self.plan(metadata, live.files, target);
        report.groups = groups
            .iter()
            .map(|(spec, g)| self.describe(metadata, *spec, g))
            .collect();
        let groups: Vec<Vec<DataFile>> = groups.into_iter().map(|(_, g)| g).collect();
        self.report(CompactProgress::Planned {
            groups: groups.len(),
            files: groups.iter().map(Vec::len).sum(),
            bytes: report.groups.iter().map(|g| g.bytes).sum(),
        });
        if self.options.dry_run || groups.is_empty() {
            report.duration = started.elapsed();
            return Ok(report);
        }
        // One file per group: a group's inputs are at most the target's
        // bytes, and rolling on a writer's estimate would cut files short
        // (to be compacted again and again).
        let layout = Arc::new(Layout {
            target_file_size: u64::from(u32::MAX).max(target.saturating_mul(2)),
            ..table_layout
        });
        let locations =
            DefaultLocationGenerator::new(metadata).map_err(self.iceberg_err("derive the data location"))?;
        // Of every spec: a file of an older spec may lack a column whose
        // values live only in its partition tuple.
        let identity_sources = identity_sources(metadata);
        let job = Arc::new(Job {
            table: self.shown(),
            file_io: self.catalog.file_io().clone(),
            layout,
            identity_sources,
            locations,
            prefix: format!("weir-compact-{}", uuid::Uuid::new_v4()),
        });
        let mut since = metadata.current_snapshot_id();
        let per_commit = self.options.groups_per_commit.unwrap_or(groups.len());
        let mut indexed: Vec<(usize, Vec<DataFile>)> = groups.into_iter().enumerate().collect();
        while !indexed.is_empty() {
            let rest = indexed.split_off(per_commit.min(indexed.len()));
            let chunk = std::mem::replace(&mut indexed, rest);
            let rewritten = self.rewrite(&job, chunk).await?;
            let Committed {
                snapshot,
                groups: committed,
                dropped,
                concurrent,
            } = self.commit(&base, since, &job, rewritten).await?;
            report.groups_dropped += dropped;
            report.concurrent_commits += concurrent;
            if let Some(snapshot_id) = snapshot {
                since = Some(snapshot_id);
                report.commits.push(snapshot_id);
                for g in &committed {
                    report.count_group(
                        (g.inputs.len(), g.inputs.iter().map(|f| f.file_size_in_bytes()).sum()),
                        (
                            g.outputs.len(),
                            g.outputs.iter().map(|f| f.file_size_in_bytes()).sum(),
                            g.outputs.iter().map(|f| f.record_count()).sum(),
                        ),
                    );
                }
                self.report(CompactProgress::Committed {
                    commit: snapshot_id,
                    groups: committed.len(),
                });
            }
        }
        report.duration = started.elapsed();
        tracing::info!(
            table = %self.shown(),
            commits = ?report.commits,
            files_removed = report.files_removed,
            files_added = report.files_added,
            groups_dropped = report.groups_dropped,
            "compacted"
        );
        Ok(report)
    }

    /// The table's columns as the sink writes them.
    fn layout(&self, metadata: &TableMetadata) -> Result<Layout, IcebergSinkError> {
        let arrow = schema_to_arrow_schema(metadata.current_schema())
            .map_err(self.iceberg_err("convert the table's schema to Arrow"))?;
        table::layout(&self.shown(), metadata, &arrow, false)
    }

    async fn live_files(&self, table: &LoadedTable) -> Result<Live, IcebergSinkError> {
        Live::of(self.catalog.file_io(), &self.shown(), table).await
    }

    /// Groups of small files per partition of their spec, in the order
    /// their manifests list them, each with its spec id. A partition filter
    /// (on fields of the default spec) selects files whose own spec has
    /// those fields with those values.
    fn plan(&self, metadata: &TableMetadata, files: Vec<(DataFile, i32)>, target: u64) -> Vec<(i32, Vec<DataFile>)> {
        let files = files.into_iter().map(|(file, spec_id)| {
            let values = partition_values(metadata, spec_id, &file);
            PlanFile {
                key: (spec_id, format!("{values:?}")),
                values,
                size: file.file_size_in_bytes(),
                file,
            }
        });
        plan_groups(files, &self.options, target)
            .into_iter()
            .map(|((spec_id, _), group)| (spec_id, group))
            .collect()
    }

    fn describe(&self, metadata: &TableMetadata, spec_id: i32, group: &[DataFile]) -> CompactGroup {
        CompactGroup {
            partition: group
                .first()
                .map(|f| partition_values(metadata, spec_id, f))
                .unwrap_or_default(),
            files: group.iter().map(|f| f.file_path().to_string()).collect(),
            bytes: group.iter().map(|f| f.file_size_in_bytes()).sum(),
        }
    }

    /// Rewrites a chunk of groups, `max_concurrent_rewrites` at a time,
    /// each on a thread of the job's own that drives the rewrite there (see
    /// [`on_threads`]). On an error or a panic the other rewrites stop, and
    /// the chunk's outputs are deleted: none was committed.
    async fn rewrite(
        &self,
        job: &Arc<Job>,
        chunk: Vec<(usize, Vec<DataFile>)>,
    ) -> Result<Vec<Rewritten>, IcebergSinkError> {
        let runtime = tokio::runtime::Handle::current();
        let worker = job.clone();
        let rewritten = on_threads(
            "weir-compact",
            chunk,
            self.options.max_concurrent_rewrites,
            move |(index, group), stopped| runtime.block_on(worker.rewrite(index, group, stopped)),
            |group: &Rewritten| {
                self.report(CompactProgress::Rewritten {
                    group: group.index,
                    bytes: group.inputs.iter().map(|f| f.file_size_in_bytes()).sum(),
                    files_out: group.outputs.len(),
                })
            },
            |reason| IcebergSinkError::CompactionStopped {
                table: self.shown(),
                reason,
            },
        )
        .await;
        let mut done = match rewritten {
            Ok(done) => done,
            Err((e, done)) => {
                for g in &done {
                    writer::delete_files(&job.file_io, &g.outputs).await;
                }
                return Err(e);
            }
        };
        done.sort_by_key(|g| g.index);
        Ok(done)
    }
}

/// A file's partition values by partition field name, as Iceberg shows them.
fn partition_values(metadata: &TableMetadata, spec_id: i32, file: &DataFile) -> BTreeMap<String, Option<String>> {
    let Some(spec) = metadata.partition_spec_by_id(spec_id) else {
        return BTreeMap::new();
    };
    let Ok(partition_type) = spec.partition_type(metadata.current_schema()) else {
        return BTreeMap::new();
    };
    spec.fields()
        .iter()
        .zip(partition_type.fields())
        .zip(file.partition().iter())
        .map(|((field, typed), value)| {
            let shown = value.map(|v| field.transform.to_human_string(&typed.field_type, Some(v)));
            (field.name.clone(), shown)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use arrow_array::{ArrayRef, Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};

    use super::*;
    use parquet::arrow::PARQUET_FIELD_ID_META_KEY;

    fn job(partition_by: &[String]) -> Job {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("zone", DataType::Utf8, true),
            Field::new("note", DataType::Utf8, true),
            Field::new("small", DataType::Int32, true),
        ]);
        let metadata = table::new_metadata("t.t", "file:///w/t", &schema, partition_by, &HashMap::new()).unwrap();
        let arrow = schema_to_arrow_schema(metadata.current_schema()).unwrap();
        let layout = table::layout("t.t", &metadata, &arrow, false).unwrap();
        let spec = metadata.default_partition_spec();
        Job {
            table: "t.t".into(),
            file_io: crate::local_file_io(),
            identity_sources: spec
                .fields()
                .iter()
                .filter(|f| f.transform == iceberg::spec::Transform::Identity)
                .map(|f| f.source_id)
                .collect(),
            layout: Arc::new(layout),
            locations: DefaultLocationGenerator::new(&metadata).unwrap(),
            prefix: "p".into(),
        }
    }

    /// A file's batch: `(name, field id, column)`.
    fn file(columns: Vec<(&str, Option<i32>, ArrayRef)>) -> RecordBatch {
        let fields: Vec<Field> = columns
            .iter()
            .map(|(name, id, c)| {
                let f = Field::new(*name, c.data_type().clone(), true);
                match id {
                    Some(id) => {
                        f.with_metadata(HashMap::from([(PARQUET_FIELD_ID_META_KEY.to_string(), id.to_string())]))
                    }
                    None => f,
                }
            })
            .collect();
        RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            columns.into_iter().map(|c| c.2).collect(),
        )
        .unwrap()
    }

    #[test]
    fn columns_are_matched_by_field_id_and_missing_ones_are_null() {
        let j = job(&[]);
        // `zone` renamed in the file, `note` absent.
        let out = j
            .conform(&file(vec![
                ("old_zone", Some(2), Arc::new(StringArray::from(vec!["eu", "us"]))),
                ("id", Some(1), Arc::new(Int64Array::from(vec![1, 2]))),
            ]))
            .unwrap();
        assert_eq!(out.num_rows(), 2);
        assert_eq!(
            out.column(1).as_any().downcast_ref::<StringArray>().unwrap().value(1),
            "us"
        );
        assert_eq!(out.column(2).null_count(), 2);
    }

    #[test]
    fn files_without_ids_or_identity_columns_and_lossy_casts_are_refused() {
        let j = job(&[]);
        let e = j
            .conform(&file(vec![("id", None, Arc::new(Int64Array::from(vec![1])))]))
            .unwrap_err();
        assert!(e.contains("no Parquet field ids"), "{e}");
        let e = j
            .conform(&file(vec![(
                "id",
                Some(1),
                Arc::new(StringArray::from(vec!["not a number"])) as ArrayRef,
            )]))
            .unwrap_err();
        assert!(e.contains("cannot be read as"), "{e}");
        // A nullable column: a lossy cast would have made a null.
        let e = j
            .conform(&file(vec![
                ("id", Some(1), Arc::new(Int64Array::from(vec![1])) as ArrayRef),
                ("small", Some(4), Arc::new(Int64Array::from(vec![1i64 << 40]))),
            ]))
            .unwrap_err();
        assert!(e.contains("\"small\" cannot be read as"), "{e}");
        let j = job(&["zone".to_string()]);
        let e = j
            .conform(&file(vec![("id", Some(1), Arc::new(Int64Array::from(vec![1])))]))
            .unwrap_err();
        assert!(e.contains("identity partition"), "{e}");
    }
}
