//! A table's live rows, read whole: what a stream joins with.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use futures::TryStreamExt;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::TableMetadata;
use iceberg::table::Table;
use iceberg::{Runtime, TableIdent};

use crate::catalog::{shown, Catalog, LoadedTable};
use crate::error::IcebergSinkError;
use crate::reachable::load_existing;

/// An Iceberg table's live rows at one snapshot.
#[derive(Debug, Clone)]
pub struct TableRows {
    /// The snapshot they are of (`None`: the table has none yet).
    pub snapshot_id: Option<i64>,
    /// The table's columns.
    pub schema: SchemaRef,
    /// The rows.
    pub batches: Vec<RecordBatch>,
}

/// The table's current snapshot id (one catalog lookup and its metadata
/// file).
pub async fn current_snapshot(catalog: &dyn Catalog, ident: &TableIdent) -> Result<Option<i64>, IcebergSinkError> {
    Ok(load_existing(catalog, ident).await?.metadata.current_snapshot_id())
}

/// The columns of the table's current snapshot, as [`read_rows`] reports
/// them, without reading its files.
pub async fn table_schema(catalog: &dyn Catalog, ident: &TableIdent) -> Result<SchemaRef, IcebergSinkError> {
    let LoadedTable { metadata, .. } = load_existing(catalog, ident).await?;
    snapshot_columns(&metadata, ident)
}

/// The arrow columns of `metadata`'s current snapshot (its table's schema
/// before the first snapshot): a column added since, without a new
/// snapshot, is not among them, as a scan does not read it.
fn snapshot_columns(metadata: &TableMetadata, ident: &TableIdent) -> Result<SchemaRef, IcebergSinkError> {
    let err = |context: &str, source: iceberg::Error| IcebergSinkError::Iceberg {
        table: shown(ident),
        context: context.to_string(),
        source: Box::new(source),
    };
    let columns = match metadata.current_snapshot() {
        Some(snapshot) => snapshot.schema(metadata).map_err(|e| err("its snapshot's schema", e))?,
        None => metadata.current_schema().clone(),
    };
    Ok(Arc::new(
        schema_to_arrow_schema(&columns).map_err(|e| err("its schema", e))?,
    ))
}

/// Every live row of the table at its current snapshot, read by the
/// iceberg crate's scan: position and equality delete files are applied,
/// and what it cannot read is an error, never rows left out.
pub async fn read_rows(catalog: &dyn Catalog, ident: &TableIdent) -> Result<TableRows, IcebergSinkError> {
    let err = |context: &str| {
        let table = shown(ident);
        let context = context.to_string();
        move |source: iceberg::Error| IcebergSinkError::Iceberg {
            table: table.clone(),
            context: context.clone(),
            source: Box::new(source),
        }
    };
    let LoadedTable {
        metadata,
        metadata_location,
    } = load_existing(catalog, ident).await?;
    let schema = snapshot_columns(&metadata, ident)?;
    let table = Table::builder()
        .metadata(metadata)
        .metadata_location(metadata_location)
        .identifier(ident.clone())
        .file_io(catalog.file_io().clone())
        .runtime(Runtime::try_current().map_err(err("the runtime"))?)
        .readonly(true)
        .build()
        .map_err(err("opening it"))?;
    let scan = table.scan().build().map_err(err("planning its scan"))?;
    let snapshot_id = scan.snapshot().map(|s| s.snapshot_id());
    let batches: Vec<RecordBatch> = scan
        .to_arrow()
        .await
        .map_err(err("reading it"))?
        .try_collect()
        .await
        .map_err(err("reading it"))?;
    Ok(TableRows {
        snapshot_id,
        schema,
        batches: batches.into_iter().filter(|b| b.num_rows() > 0).collect(),
    })
}
