//! Update mode into a Delta table: each batch's rows replace the table's
//! rows of the same groups, copy-on-write, in the batch's own commit.
//!
//! The batch's files hold the groups it changed. Their keys are read back;
//! every live file that may hold one of them (by its partition values and
//! its key columns' statistics) is read, and where it does, written again
//! without those rows. The commit removes each such file and adds its
//! rewrite beside the batch's files and the query's `txn`: a group's old
//! row and new row are never both visible, and a replayed batch, finding
//! its marker, changes nothing.

use std::collections::{HashMap, HashSet};

use arrow_array::{ArrayRef, BooleanArray, RecordBatch};
use arrow_row::{RowConverter, SortField};
use arrow_schema::{DataType, Field, Schema};
use buoyant_kernel::expressions::Scalar as Stat;
use deltalake::kernel::{LogicalFileView, Remove};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use super::*;
use crate::data_file::{conform, fetch, raw_paths};
use crate::open_file::{FileFormat, OpenFile};
use weir_core::partition;
use weir_core::sink::prune::may_hold;

/// Rows read from a data file at a time.
const READ_BATCH_ROWS: usize = 8192;

/// The keys of the groups a batch changed.
pub(super) struct Keys {
    /// The key columns that are partition columns.
    partition: Vec<String>,
    /// The key columns data files hold, typed as the table types them.
    data: SchemaRef,
    converter: RowConverter,
    /// By the values of the partition key columns.
    groups: HashMap<Vec<Option<String>>, Group>,
}

/// The keys of one combination of partition key values.
struct Group {
    /// Their data columns, encoded as rows.
    rows: HashSet<Box<[u8]>>,
    /// Their data columns, to prune files by statistics.
    columns: Vec<ArrayRef>,
}

/// What the batch's commit changes besides adding its files.
#[derive(Debug, Default)]
pub(super) struct Rewrite {
    /// The files holding rows of the batch's groups.
    pub removes: Vec<Remove>,
    /// Their other rows, written again.
    pub adds: Vec<AddFile>,
    /// Files read because their statistics did not rule them out.
    pub read: usize,
}

/// Refuses a key Update mode cannot replace rows by: a string key column
/// that is a partition column, since Delta stores an empty string
/// partition value as null, which would make the groups `""` and null one.
pub(super) fn check_key(
    table: &str,
    partition_columns: &[String],
    schema: &SchemaRef,
    key: &[String],
) -> Result<(), DeltaSinkError> {
    for column in key.iter().filter(|c| partition_columns.contains(c)) {
        let string = schema.field_with_name(column).is_ok_and(|f| is_string(f.data_type()));
        if string {
            return Err(DeltaSinkError::Unsupported {
                table: table.to_string(),
                feature: format!(
                    "the string key column {column:?} as a partition column in Update mode: Delta stores an empty \
                     string partition value as null, so the groups \"\" and null would be one; partition by \
                     another column"
                ),
            });
        }
    }
    Ok(())
}

fn is_string(data_type: &DataType) -> bool {
    match data_type {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
        DataType::Dictionary(_, values) => is_string(values),
        _ => false,
    }
}

impl Keys {
    /// The keys of the rows in the batch's files `new`.
    pub(super) async fn read(
        table: &str,
        store: &Arc<dyn deltalake::ObjectStore>,
        layout: &Layout,
        key: &[String],
        new: &[AddFile],
    ) -> Result<Keys, DeltaSinkError> {
        let (partition, data): (Vec<String>, Vec<String>) =
            key.iter().cloned().partition(|c| layout.partition_columns.contains(c));
        let fields: Vec<Field> = data
            .iter()
            .map(|c| {
                layout
                    .file_schema
                    .field_with_name(c)
                    .cloned()
                    .map_err(|_| DeltaSinkError::NoUpdateKey {
                        table: table.to_string(),
                    })
            })
            .collect::<Result<_, _>>()?;
        let data = Arc::new(Schema::new(fields));
        let converter = row_converter(table, &data)?;
        let mut batches: HashMap<Vec<Option<String>>, Vec<RecordBatch>> = HashMap::new();
        let mut rows_by_partition: HashMap<Vec<Option<String>>, usize> = HashMap::new();
        for file in new {
            let values: Vec<Option<String>> = partition
                .iter()
                .map(|c| file.partition_values.get(c).cloned().flatten())
                .collect();
            if data.fields().is_empty() {
                // The key is the partition: the file's place says it all,
                // and one row a partition is one row a group.
                let n = rows_by_partition.entry(values.clone()).or_insert(0usize);
                *n += usize::try_from(file.rows).unwrap_or(0);
                if *n > 1 {
                    return Err(DeltaSinkError::DuplicateGroup {
                        table: table.to_string(),
                        columns: key.to_vec(),
                        rows: *n,
                        groups: 1,
                    });
                }
            }
            let rows = batches.entry(values).or_default();
            if data.fields().is_empty() {
                continue;
            }
            for batch in read_file(table, store, &file.path).await? {
                rows.push(conform(table, &data, &batch, &file.path)?);
            }
        }
        let mut groups = HashMap::with_capacity(batches.len());
        for (values, rows) in batches {
            if data.fields().is_empty() {
                let columns = Vec::new();
                groups.insert(
                    values,
                    Group {
                        rows: HashSet::new(),
                        columns,
                    },
                );
                continue;
            }
            let all = arrow_select::concat::concat_batches(&data, &rows).map_err(parquet_err(table, ""))?;
            let encoded = converter
                .convert_columns(all.columns())
                .map_err(parquet_err(table, ""))?;
            let group = Group {
                rows: encoded.iter().map(|r| Box::from(r.as_ref())).collect(),
                columns: all.columns().to_vec(),
            };
            if group.rows.len() < all.num_rows() {
                return Err(DeltaSinkError::DuplicateGroup {
                    table: table.to_string(),
                    columns: key.to_vec(),
                    rows: all.num_rows(),
                    groups: group.rows.len(),
                });
            }
            groups.insert(values, group);
        }
        Ok(Keys {
            partition,
            data,
            converter,
            groups,
        })
    }

    /// The keys that may be in `file`, whose `remove` action is given.
    fn group_of(&self, remove: &Remove) -> Option<&Group> {
        let values = remove.partition_values.as_ref();
        let of_file: Vec<Option<String>> = self
            .partition
            .iter()
            .map(|c| values.and_then(|v| v.get(c).cloned().flatten()))
            .collect();
        self.groups.get(&of_file)
    }

    /// Whether `file`'s statistics leave room for one of `group`'s keys
    /// (see [`may_hold`]).
    fn may_hold(&self, file: &LogicalFileView, group: &Group) -> bool {
        let (min, max) = (file.min_values(), file.max_values());
        let bounds: Vec<_> = self
            .data
            .fields()
            .iter()
            .map(|f| {
                let lower = min.as_ref().and_then(|s| stat_of(s, f.name()));
                let upper = max.as_ref().and_then(|s| stat_of(s, f.name()));
                (lower, upper)
            })
            .collect();
        may_hold(&group.columns, &bounds)
    }
}

/// The batch's rewrite of the table's live files (`table` is loaded with
/// them) that hold rows of its groups. On an error, the files it wrote are
/// deleted.
pub(super) async fn rewrite(
    sink: &DeltaSink,
    table: &DeltaTable,
    ctx: &BatchContext,
    keys: &Keys,
    try_number: usize,
) -> Result<Rewrite, DeltaSinkError> {
    let Prepared { store, .. } = sink.prepared()?;
    let mut out = Rewrite::default();
    if let Err(e) = rewrite_into(sink, table, ctx, keys, try_number, &mut out).await {
        // No commit names them.
        delete_files(&store, &out.adds).await;
        return Err(e);
    }
    Ok(out)
}

async fn rewrite_into(
    sink: &DeltaSink,
    table: &DeltaTable,
    ctx: &BatchContext,
    keys: &Keys,
    try_number: usize,
    out: &mut Rewrite,
) -> Result<(), DeltaSinkError> {
    let Prepared { layout, store, .. } = sink.prepared()?;
    let name = sink.url.to_string();
    let snapshot = table.snapshot().map_err(|e| sink.err(e))?;
    // Each remove names its file exactly as the log's add did (engines
    // escape paths differently).
    let raw_paths = raw_paths(&name, snapshot)?;
    for file in snapshot.log_data().iter() {
        let mut remove = file.remove_action(true);
        let Some(group) = keys.group_of(&remove) else { continue };
        let path = remove.path.clone();
        if let Some(raw) = raw_paths.get(&path) {
            remove.path = raw.clone();
        }
        if keys.data.fields().is_empty() {
            // The key is the partition: every row of the file is replaced.
            refuse_unreadable(&name, &file, &path)?;
            out.removes.push(remove);
            continue;
        }
        if !keys.may_hold(&file, group) {
            continue;
        }
        refuse_unreadable(&name, &file, &path)?;
        out.read += 1;
        let mut kept = Vec::new();
        let mut dropped = 0;
        for batch in read_file(&name, &store, &path).await? {
            let rows = conform(&name, &layout.file_schema, &batch, &path)?;
            let key_columns: Vec<ArrayRef> = keys
                .data
                .fields()
                .iter()
                .map(|f| rows.column_by_name(f.name()).expect("conformed to the table").clone())
                .collect();
            let encoded = keys
                .converter
                .convert_columns(&key_columns)
                .map_err(parquet_err(&name, &path))?;
            let keep: BooleanArray = encoded.iter().map(|r| Some(!group.rows.contains(r.as_ref()))).collect();
            dropped += keep.false_count();
            let rows = arrow_select::filter::filter_record_batch(&rows, &keep).map_err(parquet_err(&name, &path))?;
            if rows.num_rows() > 0 {
                kept.push(rows);
            }
        }
        if dropped == 0 {
            continue;
        }
        if !kept.is_empty() {
            let n = out.adds.len();
            let added = write_kept(sink, &layout, &store, ctx, &remove, kept, try_number, n).await?;
            out.adds.push(added);
        }
        out.removes.push(remove);
    }
    Ok(())
}

/// Refuses a file the rewrite cannot read whole: one with a deletion vector
/// (its deleted rows would come back) or outside the table's folder (a
/// shallow clone's).
fn refuse_unreadable(table: &str, file: &LogicalFileView, path: &str) -> Result<(), DeltaSinkError> {
    let feature = if file.deletion_vector_descriptor().is_some() {
        format!(
            "deletion vectors (data file {path} has one, and Update mode's rewrite of it would bring its deleted \
             rows back)"
        )
    } else if crate::table::absolute_path(path) {
        format!(
            "data files outside the table's folder ({path}, as a shallow clone has), which Update mode would have \
             to rewrite"
        )
    } else {
        return Ok(());
    };
    Err(DeltaSinkError::Unsupported {
        table: table.to_string(),
        feature,
    })
}

/// Writes the rows a rewritten file keeps into a new file of its partition.
#[allow(clippy::too_many_arguments)]
async fn write_kept(
    sink: &DeltaSink,
    layout: &Layout,
    store: &Arc<dyn deltalake::ObjectStore>,
    ctx: &BatchContext,
    remove: &Remove,
    kept: Vec<RecordBatch>,
    try_number: usize,
    n: usize,
) -> Result<AddFile, DeltaSinkError> {
    let name = sink.url.to_string();
    let of_file = remove.partition_values.clone().unwrap_or_default();
    let values: Vec<Option<String>> = layout
        .partition_columns
        .iter()
        .map(|c| of_file.get(c).cloned().flatten())
        .collect();
    let dir = partition::directory(&layout.partition_columns, &values);
    // Unique per attempt and try: a lost try's files are never overwritten.
    let file_name = format!(
        "part-{:05}-{}-{}-u{:03}-{:05}.{}.parquet",
        ctx.batch_id.0,
        ctx.query_id,
        ctx.attempt_id,
        try_number,
        n,
        sink.options.compression.extension()
    );
    let path = if dir.is_empty() {
        file_name
    } else {
        format!("{dir}/{file_name}")
    };
    let format = FileFormat {
        schema: &layout.file_schema,
        compression: sink.options.compression,
        num_indexed_cols: layout.num_indexed_cols,
        stats_columns: layout.stats_columns.as_deref(),
    };
    let mut file = OpenFile::create(&name, path, &values, &format)?;
    for rows in &kept {
        if let Err(e) = file.write(&name, store, rows).await {
            file.abort().await;
            return Err(e);
        }
    }
    file.finish(&name, store, &layout.partition_columns).await
}

/// Every row of the data file at `path`.
async fn read_file(
    table: &str,
    store: &Arc<dyn deltalake::ObjectStore>,
    path: &str,
) -> Result<Vec<RecordBatch>, DeltaSinkError> {
    let bytes = fetch(store, path).await.map_err(|source| DeltaSinkError::Store {
        table: table.to_string(),
        path: path.to_string(),
        source,
    })?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .and_then(|b| b.with_batch_size(READ_BATCH_ROWS).build())
        .map_err(|source| DeltaSinkError::Unreadable {
            table: table.to_string(),
            path: path.to_string(),
            source,
        })?;
    reader.map(|b| b.map_err(|e| parquet_err(table, path)(e))).collect()
}

fn row_converter(table: &str, data: &SchemaRef) -> Result<RowConverter, DeltaSinkError> {
    let fields = data
        .fields()
        .iter()
        .map(|f| SortField::new(f.data_type().clone()))
        .collect();
    RowConverter::new(fields).map_err(parquet_err(table, ""))
}

fn parquet_err<'a>(table: &'a str, path: &'a str) -> impl Fn(arrow_schema::ArrowError) -> DeltaSinkError + 'a {
    move |e| DeltaSinkError::Unreadable {
        table: table.to_string(),
        path: path.to_string(),
        source: e.into(),
    }
}

/// The statistic of `column` in a file's minimum or maximum values, as a
/// one-element array.
fn stat_of(stats: &Stat, column: &str) -> Option<ArrayRef> {
    let Stat::Struct(values) = stats else { return None };
    let i = values.fields().iter().position(|f| f.name() == column)?;
    let value = values.values().get(i)?;
    if value.is_null() {
        return None;
    }
    value.to_array(1).ok()
}

#[cfg(test)]
mod tests {
    use arrow_schema::Field;

    use super::*;

    #[test]
    fn a_string_key_that_is_a_partition_column_is_refused() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("merchant", DataType::Utf8, true),
            Field::new(
                "code",
                DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8)),
                true,
            ),
            Field::new("day", DataType::Int64, true),
        ]));
        let key = |c: &[&str]| c.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let check = |partitions: &[&str], k: &[&str]| check_key("t", &key(partitions), &schema, &key(k));
        assert!(matches!(
            check(&["merchant"], &["merchant", "day"]),
            Err(DeltaSinkError::Unsupported { .. })
        ));
        assert!(matches!(
            check(&["code"], &["code"]),
            Err(DeltaSinkError::Unsupported { .. })
        ));
        // A string key in the files, or an integer key as the partition: fine.
        assert!(check(&["day"], &["merchant", "day"]).is_ok());
        assert!(check(&[], &["merchant"]).is_ok());
    }
}
