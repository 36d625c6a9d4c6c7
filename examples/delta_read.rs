//! Reading a Delta table back in the examples: the event ids of the files
//! its log lists (files of failed attempts are not among them).

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use weir_core::BoxError;

/// The `event_id` column of every row of the local Delta table at
/// `location`.
pub async fn delta_event_ids(location: &str) -> Result<Vec<i64>, BoxError> {
    let table = deltalake::open_table(deltalake::ensure_table_uri(location)?).await?;
    let mut ids = Vec::new();
    for uri in table.get_file_uris()? {
        let path = uri.strip_prefix("file://").unwrap_or(&uri).to_string();
        for batch in ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path)?)?.build()? {
            let batch = batch?;
            let column = batch.column_by_name("event_id").ok_or("no event_id column")?;
            ids.extend(column.as_primitive::<Int64Type>().values().iter().copied());
        }
    }
    Ok(ids)
}
