//! The table's live data files, and their rows read back in the table's
//! current columns (by compaction and by Update mode's rewrites).

use std::collections::HashMap;

use arrow_array::{new_null_array, RecordBatch};
use arrow_schema::SchemaRef as ArrowSchemaRef;
use iceberg::io::FileIO;
use iceberg::spec::{DataFile, ManifestContentType, ManifestStatus, TableMetadata};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::PARQUET_FIELD_ID_META_KEY;
use weir_core::maintenance::STRICT_CAST;

use crate::catalog::LoadedTable;
use crate::error::IcebergSinkError;
use crate::reachable::manifests_of;

/// Rows read from a data file at a time.
const READ_BATCH_ROWS: usize = 8192;

/// The current snapshot's live data files.
#[derive(Default)]
pub(crate) struct Live {
    /// With the partition spec of the manifest that lists each.
    pub files: Vec<(DataFile, i32)>,
    /// Each live file's path → the manifest that lists it.
    pub manifest_of: HashMap<String, String>,
}

impl Live {
    /// The live data files of `table`'s current snapshot, with the manifest
    /// that lists each. Delete files are refused: rewriting a data file
    /// without applying them would bring deleted rows back.
    pub(crate) async fn of(io: &FileIO, shown: &str, table: &LoadedTable) -> Result<Live, IcebergSinkError> {
        let err = |context: &str| {
            let context = context.to_string();
            move |source| IcebergSinkError::Iceberg {
                table: shown.to_string(),
                context: context.clone(),
                source: Box::new(source),
            }
        };
        let mut live = Live::default();
        let Some(snapshot) = table.metadata.current_snapshot_id() else {
            return Ok(live);
        };
        let (_, manifests) = manifests_of(io, &table.metadata, snapshot)
            .await
            .map_err(err("read the current snapshot's manifest list"))?;
        for manifest in manifests {
            if manifest.content != ManifestContentType::Data {
                if manifest.has_added_files() || manifest.has_existing_files() {
                    return Err(IcebergSinkError::Unsupported {
                        table: shown.to_string(),
                        feature: "row-level delete files (a rewrite of data files would have to apply them); nothing \
                                  was changed"
                            .into(),
                    });
                }
                continue;
            }
            let loaded = manifest.load_manifest(io).await.map_err(err("read a manifest"))?;
            for entry in loaded
                .entries()
                .iter()
                .filter(|e| e.status() != ManifestStatus::Deleted)
            {
                live.manifest_of.insert(
                    entry.data_file().file_path().to_string(),
                    manifest.manifest_path.clone(),
                );
                live.files.push((entry.data_file().clone(), manifest.partition_spec_id));
            }
        }
        Ok(live)
    }
}

/// The field ids identity partitions of every spec are made of: a file of
/// an older spec may lack such a column, whose values live only in its
/// partition tuple.
pub(crate) fn identity_sources(metadata: &TableMetadata) -> Vec<i32> {
    metadata
        .partition_specs_iter()
        .flat_map(|s| s.fields().iter())
        .filter(|f| f.transform == iceberg::spec::Transform::Identity)
        .map(|f| f.source_id)
        .collect()
}

/// Every row of the data file at `path` of table `shown`: a failed read
/// keeps iceberg's error (and its retryable judgement); a file that does
/// not decode is unreadable.
pub(crate) async fn read(io: &FileIO, shown: &str, path: &str) -> Result<Vec<RecordBatch>, IcebergSinkError> {
    let io_err = |source| IcebergSinkError::Iceberg {
        table: shown.to_string(),
        context: format!("read data file {path}"),
        source: Box::new(source),
    };
    let unreadable = |reason: String| IcebergSinkError::UnreadableFile {
        table: shown.to_string(),
        file: path.to_string(),
        reason,
    };
    let bytes = io.new_input(path).map_err(io_err)?.read().await.map_err(io_err)?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .and_then(|b| b.with_batch_size(READ_BATCH_ROWS).build())
        .map_err(|e| unreadable(e.to_string()))?;
    reader.map(|b| b.map_err(|e| unreadable(e.to_string()))).collect()
}

/// A data file's rows as the table's current columns `target`, matched by
/// field id (so a renamed column is still found): a column the file lacks
/// is null, a primitive whose representation differs is cast (failing
/// rather than losing a value). Refused: a file without field ids
/// (imported files need a name mapping weir does not apply), a missing
/// column an identity partition is made of (`identity_sources`; its values
/// live in the partition tuple), and a nested column whose type differs.
pub(crate) fn conform(
    target: &ArrowSchemaRef,
    identity_sources: &[i32],
    batch: &RecordBatch,
) -> Result<RecordBatch, String> {
    let schema = batch.schema();
    let by_id: HashMap<i32, usize> = schema
        .fields()
        .iter()
        .enumerate()
        .filter_map(|(i, f)| Some((f.metadata().get(PARQUET_FIELD_ID_META_KEY)?.parse().ok()?, i)))
        .collect();
    if by_id.is_empty() && !schema.fields().is_empty() {
        return Err("it has no Parquet field ids (an imported file); weir does not rewrite such files".into());
    }
    let columns = target
        .fields()
        .iter()
        .map(|field| {
            let id: Option<i32> = field
                .metadata()
                .get(PARQUET_FIELD_ID_META_KEY)
                .and_then(|v| v.parse().ok());
            match id.and_then(|id| by_id.get(&id)) {
                Some(&i) if batch.column(i).data_type() == field.data_type() => Ok(batch.column(i).clone()),
                Some(&i) if batch.column(i).data_type().is_nested() || field.data_type().is_nested() => Err(format!(
                    "nested column {:?} is {} in the file and {} in the table; weir does not convert nested columns",
                    field.name(),
                    batch.column(i).data_type(),
                    field.data_type()
                )),
                Some(&i) => arrow_cast::cast_with_options(batch.column(i), field.data_type(), &STRICT_CAST)
                    .map_err(|e| format!("column {:?} cannot be read as {}: {e}", field.name(), field.data_type())),
                None if id.is_some_and(|id| identity_sources.contains(&id)) => Err(format!(
                    "column {:?} is missing from the file and an identity partition is made of it",
                    field.name()
                )),
                None if field.is_nullable() => Ok(new_null_array(field.data_type(), batch.num_rows())),
                None => Err(format!("required column {:?} is missing", field.name())),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(target.clone(), columns).map_err(|e| e.to_string())
}
