//! Reading the table's data files back: fetched whole, and their rows put
//! in the table's current columns.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{new_null_array, RecordBatch};
use arrow_schema::SchemaRef;
use bytes::Bytes;
use deltalake::{DeltaTableError, ObjectStore};
use object_store::path::Path;
use object_store::ObjectStoreExt;
use weir_core::maintenance::STRICT_CAST;

use crate::error::DeltaSinkError;
use crate::table;

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

/// A log path as the live files name it (URL-decoded).
pub(crate) fn decoded(path: &str) -> String {
    percent_encoding::percent_decode_str(path)
        .decode_utf8_lossy()
        .into_owned()
}

/// The log's own path of every live file whose path has a character
/// outside `[A-Za-z0-9._-=/]` (which engines may escape in different
/// ways), by its decoded path: the `path` column of the table's add
/// actions is as written in the log.
pub(crate) fn raw_paths(
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
