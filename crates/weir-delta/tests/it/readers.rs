//! Reading tables back: with the independent readers of
//! `integration/readers` (Python deltalake, DuckDB) where their environment
//! exists, which `scripts/test.sh` creates and CI requires.

use std::path::{Path, PathBuf};
use std::process::Command;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The readers' Python, if its environment exists. In CI it must.
pub fn python() -> Option<PathBuf> {
    let python = std::env::var_os("WEIR_READERS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv-readers/bin/python"));
    if python.exists() {
        return Some(python);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "the independent readers are missing ({}); scripts/test.sh installs them",
        python.display()
    );
    None
}

/// Runs `read_table.py` with `args`; `None` (with a notice) when the
/// readers are not installed outside CI.
pub fn read(args: &[&str]) -> Option<serde_json::Value> {
    let Some(python) = python() else {
        eprintln!("SKIPPED: the independent readers are not installed; run scripts/test.sh to install them");
        return None;
    };
    let out = Command::new(python)
        .arg(workspace().join("integration/readers/read_table.py"))
        .args(args)
        .output()
        .expect("run the reader");
    assert!(
        out.status.success(),
        "reader {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).expect("the reader prints JSON"))
}

/// The event ids in the table, by `reader` (`deltalake` or `duckdb`).
pub fn event_ids_with(reader: &str, table: &Path) -> Option<Vec<i64>> {
    let json = read(&["ids", reader, &table.to_string_lossy()])?;
    Some(
        json["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_i64().expect("an integer id"))
            .collect(),
    )
}

/// The event ids in the table: Python deltalake where installed, else
/// weir's own reading of the table's files through deltalake-rs.
pub async fn event_ids(table: &Path) -> Vec<i64> {
    if python().is_some() {
        return event_ids_with("deltalake", table).expect("reader present");
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
