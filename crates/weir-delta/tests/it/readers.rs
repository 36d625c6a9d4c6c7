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

/// The table's JSON log entries, oldest first.
pub fn log_entries(table: &Path) -> Vec<std::path::PathBuf> {
    let mut entries: Vec<_> = std::fs::read_dir(table.join("_delta_log"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    entries.sort();
    entries
}

/// The actions of the table's JSON log entries, oldest entry first.
pub fn log_actions(table: &Path) -> Vec<serde_json::Value> {
    log_entries(table)
        .iter()
        .flat_map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            text.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Rewrites every JSON log entry's text with `change`, as another engine
/// might have written it.
pub fn rewrite_log(table: &Path, change: impl Fn(&str) -> String) {
    for entry in log_entries(table) {
        let text = std::fs::read_to_string(&entry).unwrap();
        std::fs::write(&entry, change(&text)).unwrap();
    }
}
