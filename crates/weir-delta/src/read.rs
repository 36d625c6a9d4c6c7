//! A table's live rows, read whole: what a stream joins with.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use buoyant_kernel::engine::arrow_conversion::TryFromKernel;
use buoyant_kernel::engine::arrow_data::ArrowEngineData;
use buoyant_kernel::snapshot::SnapshotRef;
use buoyant_kernel::{Engine, Snapshot};
use deltalake::DeltaTableError;
use url::Url;

use crate::error::DeltaSinkError;
use crate::table::{self, table_url, Files};

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

/// The table's URL, without creating anything: a local path must exist.
fn resolve(location: &str) -> Result<Url, DeltaSinkError> {
    if location.contains("://") {
        return table_url(location);
    }
    let absolute = std::fs::canonicalize(location).map_err(|_| missing(location))?;
    Url::from_directory_path(&absolute).map_err(|()| missing(location))
}

/// Runs `read` on the table's newest kernel snapshot, on the blocking
/// pool (the kernel's reads block).
async fn on_snapshot<T: Send + 'static>(
    location: &str,
    storage: &HashMap<String, String>,
    read: impl FnOnce(SnapshotRef, Arc<dyn Engine>) -> Result<T, buoyant_kernel::Error> + Send + 'static,
) -> Result<T, DeltaSinkError> {
    let table = table::open(&resolve(location)?, storage, Files::Untracked)
        .await?
        .ok_or_else(|| missing(location))?;
    let log_store = table.log_store();
    let root = log_store.transaction_url(None).map_err(delta_err(location))?;
    // The engine is made on the runtime, and lists the log from its last
    // checkpoint (a log whose old commits were cleaned up reads the same).
    let engine = log_store.engine(None);
    tokio::task::spawn_blocking(move || {
        let snapshot = Snapshot::builder_for(root).build(engine.as_ref())?;
        read(snapshot, engine)
    })
    .await
    .map_err(|e| delta_err(location)(DeltaTableError::Generic(format!("the read stopped: {e}"))))?
    .map_err(|e| delta_err(location)(DeltaTableError::from(e)))
}

/// The newest version of the table at `location`: its protocol and
/// metadata are read from the last log checkpoint on, not its files.
pub async fn latest_version(location: &str, storage: &HashMap<String, String>) -> Result<u64, DeltaSinkError> {
    on_snapshot(location, storage, |snapshot, _| Ok(snapshot.version())).await
}

/// The columns of the table at `location` at its newest version, as
/// [`read_rows`] reports them, without reading its files.
pub async fn table_schema(location: &str, storage: &HashMap<String, String>) -> Result<SchemaRef, DeltaSinkError> {
    on_snapshot(location, storage, |snapshot, _| {
        Ok(Arc::new(Schema::try_from_kernel(snapshot.schema().as_ref())?))
    })
    .await
}

/// Every live row of the table at `location`, at its newest version. The
/// Delta kernel reads them: deletion vectors, partition values and column
/// mapping are applied, and a reader feature it does not know is refused.
pub async fn read_rows(location: &str, storage: &HashMap<String, String>) -> Result<TableRows, DeltaSinkError> {
    on_snapshot(location, storage, |snapshot, engine| {
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
}
