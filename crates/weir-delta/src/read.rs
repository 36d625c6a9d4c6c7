//! A table's live rows, read whole: what a stream joins with.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use buoyant_kernel::engine::arrow_conversion::TryFromKernel;
use buoyant_kernel::engine::arrow_data::ArrowEngineData;
use buoyant_kernel::Snapshot;
use deltalake::{DeltaTableBuilder, DeltaTableError};

use crate::engine;
use crate::error::DeltaSinkError;
use crate::table::table_url;

/// A Delta table's live rows at one version.
#[derive(Debug, Clone)]
pub struct TableRows {
    /// The table version they are of.
    pub version: u64,
    /// The table's columns (partition columns included).
    pub schema: SchemaRef,
    /// The rows.
    pub batches: Vec<RecordBatch>,
}

fn delta_err(location: &str) -> impl Fn(DeltaTableError) -> DeltaSinkError + '_ {
    move |source| DeltaSinkError::Delta {
        table: location.to_string(),
        source,
    }
}

fn missing(location: &str) -> DeltaSinkError {
    DeltaSinkError::Location {
        location: location.to_string(),
        reason: "there is no Delta table there".into(),
    }
}

/// The newest version of the table at `location`, from a listing of its
/// log (nothing is replayed).
pub async fn latest_version(location: &str, storage: &HashMap<String, String>) -> Result<u64, DeltaSinkError> {
    let url = table_url(location)?;
    let table = engine::bounded(
        DeltaTableBuilder::from_url(url)
            .map_err(delta_err(location))?
            .with_storage_options(storage.clone())
            .build()
            .map_err(delta_err(location))?,
    );
    if !table.verify_deltatable_existence().await.map_err(delta_err(location))? {
        return Err(missing(location));
    }
    table.get_latest_version().await.map_err(delta_err(location))
}

/// Every live row of the table at `location`, at its newest version. The
/// Delta kernel reads them: deletion vectors, partition values and column
/// mapping are applied, and a reader feature it does not know is refused.
pub async fn read_rows(location: &str, storage: &HashMap<String, String>) -> Result<TableRows, DeltaSinkError> {
    let url = table_url(location)?;
    let table = engine::bounded(
        DeltaTableBuilder::from_url(url.clone())
            .map_err(delta_err(location))?
            .with_storage_options(storage.clone())
            .build()
            .map_err(delta_err(location))?,
    );
    if !table.verify_deltatable_existence().await.map_err(delta_err(location))? {
        return Err(missing(location));
    }
    let log_store = table.log_store();
    let root = log_store.transaction_url(None).map_err(delta_err(location))?;
    // The engine is made on the runtime; the kernel's reads block, so they
    // run on the blocking pool.
    let engine = log_store.engine(None);
    let read = tokio::task::spawn_blocking(move || -> Result<TableRows, buoyant_kernel::Error> {
        let snapshot = Snapshot::builder_for(root).build(engine.as_ref())?;
        let version = snapshot.version();
        let schema: Schema = Schema::try_from_kernel(snapshot.schema().as_ref())?;
        let scan = snapshot.scan_builder().build()?;
        let mut batches = Vec::new();
        for data in scan.execute(engine.clone())? {
            let batch: RecordBatch = ArrowEngineData::try_from_engine_data(data?)?.into();
            if batch.num_rows() > 0 {
                batches.push(batch);
            }
        }
        Ok(TableRows {
            version,
            schema: Arc::new(schema),
            batches,
        })
    })
    .await
    .map_err(|e| delta_err(location)(DeltaTableError::Generic(format!("the read stopped: {e}"))))?;
    read.map_err(|e| delta_err(location)(DeltaTableError::from(e)))
}
