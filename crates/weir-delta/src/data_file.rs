//! Reading the table's data files back: fetched whole, and their rows put
//! in the table's current columns.

use std::sync::Arc;

use arrow_array::{new_null_array, RecordBatch};
use arrow_schema::SchemaRef;
use bytes::Bytes;
use deltalake::ObjectStore;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use weir_core::maintenance::STRICT_CAST;

use crate::error::DeltaSinkError;

/// A data file's bytes.
pub(crate) async fn fetch(store: &Arc<dyn ObjectStore>, path: &str) -> object_store::Result<Bytes> {
    let location = Path::parse(path).map_err(object_store::Error::from)?;
    store.get(&location).await?.bytes().await
}

/// A data file's rows in the table's current columns `schema`: a column
/// the file lacks (added later) is null, a type that differs is cast.
pub(crate) fn conform(
    table: &str,
    schema: &SchemaRef,
    batch: &RecordBatch,
    path: &str,
) -> Result<RecordBatch, DeltaSinkError> {
    let mismatch = |differences: String| DeltaSinkError::SchemaMismatch {
        table: table.to_string(),
        differences: format!("data file {path}: {differences}"),
    };
    let columns = schema
        .fields()
        .iter()
        .map(|field| match batch.column_by_name(field.name()) {
            Some(c) if c.data_type() == field.data_type() => Ok(c.clone()),
            Some(c) if c.data_type().is_nested() || field.data_type().is_nested() => Err(mismatch(format!(
                "nested column {:?} is {} in the file and {} in the table; weir does not convert nested columns",
                field.name(),
                c.data_type(),
                field.data_type()
            ))),
            Some(c) => arrow_cast::cast_with_options(c, field.data_type(), &STRICT_CAST).map_err(|e| {
                mismatch(format!(
                    "column {:?} cannot be read as {}: {e}",
                    field.name(),
                    field.data_type()
                ))
            }),
            None if field.is_nullable() => Ok(new_null_array(field.data_type(), batch.num_rows())),
            None => Err(mismatch(format!("required column {:?} is missing", field.name()))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| mismatch(e.to_string()))
}
