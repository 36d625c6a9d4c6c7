//! Reading tables back: with the independent readers where installed (see
//! `weir_test_support::readers`), else through deltalake-rs.

use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

pub use weir_test_support::readers::{python, read};

/// The event ids in the table: Python deltalake where installed, else
/// weir's own reading of the table's files through deltalake-rs.
pub async fn event_ids(table: &Path) -> Vec<i64> {
    if python().is_some() {
        let (ids, _) =
            weir_test_support::readers::event_ids_with("deltalake", &table.to_string_lossy()).expect("reader present");
        return ids;
    }
    let url = url::Url::from_directory_path(std::fs::canonicalize(table).unwrap()).unwrap();
    let table = match deltalake::open_table(url).await {
        Ok(t) => t,
        Err(deltalake::DeltaTableError::NotATable(_)) => return Vec::new(),
        Err(e) => panic!("open the table: {e}"),
    };
    let mut ids = Vec::new();
    for uri in table.get_file_uris().unwrap() {
        let path = url::Url::parse(&uri).unwrap().to_file_path().unwrap();
        let reader = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap())
            .unwrap()
            .build()
            .unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            if let Some(col) = batch.column_by_name("event_id") {
                ids.extend(col.as_primitive::<Int64Type>().values().iter().copied());
            }
        }
    }
    ids
}
