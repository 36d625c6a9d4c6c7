//! Delta and Iceberg tables as the static side of a stream-static join.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use weir_catalog::{CatalogError, Catalogs, TableReader};
use weir_core::BoxError;
use weir_sql::StaticTable;

use crate::Error;

/// A table read whole by a [`TableReader`].
#[derive(Debug)]
struct ReadTable {
    reader: TableReader,
    schema: SchemaRef,
}

#[async_trait::async_trait]
impl StaticTable for ReadTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    async fn version(&self) -> Result<Option<i64>, BoxError> {
        self.reader.version().await.map_err(judged)
    }

    async fn read(&self) -> Result<(Option<i64>, Vec<RecordBatch>), BoxError> {
        let rows = self.reader.rows().await.map_err(judged)?;
        Ok((rows.version, rows.batches))
    }
}

/// A catalog's or table's error, marked transient when trying again may
/// mend it (so the query's error is retryable).
fn judged(error: CatalogError) -> BoxError {
    if error.retryable() {
        weir_core::transient(error)
    } else {
        Box::new(error)
    }
}

async fn of(reader: TableReader) -> Result<Arc<dyn StaticTable>, Error> {
    // The columns the query is planned with, from the table as it is now
    // (its metadata: the rows are read by the first batch).
    let schema = reader.schema().await?;
    Ok(Arc::new(ReadTable { reader, schema }))
}

/// The table `name` of `catalogs` (Delta or Iceberg) as the static side of
/// a stream-static join ([`weir_sql::StreamSqlExt::join_static`]): each
/// batch reads it whole when its version changed. It must exist.
pub async fn static_table(catalogs: &Catalogs, name: &str) -> Result<Arc<dyn StaticTable>, Error> {
    of(catalogs.table(name).reader().await?).await
}

/// The Delta table at `location` (a path or URL) as the static side of a
/// stream-static join.
pub async fn static_delta_table(location: &str) -> Result<Arc<dyn StaticTable>, Error> {
    of(TableReader::delta(location)).await
}
