//! Vacuum and log upkeep: files of failed writes and of old versions go
//! once past the retention, and every live row stays readable by Python
//! deltalake.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use weir_test_support::operators::CountByKey;

use weir_core::prelude::*;
use weir_core::source::RateSource;
use weir_delta::{checkpoint_log, DeltaSink, Vacuum};
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::{json_ids, python, read};

use crate::readers::{log_entries, rewrite_log};

async fn stream(table: &Path, chk: &Path, mode: OutputMode, last: u64) {
    let mut rows = read_stream(RateSource::rows_per_batch(100));
    if mode == OutputMode::Complete {
        // The whole result every batch: each id once, with its count.
        rows = rows.with_operator(CountByKey::new("ids", "event_id"));
    }
    let q = rows
        .write_stream()
        .checkpoint_location(chk)
        .output_mode(mode)
        .stop_after_batch(BatchId(last))
        .start(DeltaSink::try_new(table.to_str().unwrap()).unwrap())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
}

fn ids(table: &Path) -> Vec<i64> {
    json_ids(&read(&["ids", "deltalake", table.to_str().unwrap()]).expect("readers present"))
}

fn parquet_files(table: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(table).unwrap().flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "parquet") {
            out.push(path);
        }
    }
    out
}

/// A vacuum of `table` with no retention (forced): what no version
/// references goes at once.
fn forced_vacuum(table: &Path) -> Vacuum {
    Vacuum::new(table.to_str().unwrap())
        .unwrap()
        .with_retention(Duration::ZERO)
        .with_force(true)
}

/// A file no commit added, as a failed write leaves, `age` old.
fn stray(table: &Path, age: Duration) -> PathBuf {
    let path = table.join(format!("part-stray-{}.parquet", age.as_secs()));
    std::fs::write(&path, b"not a committed file").unwrap();
    let file = std::fs::File::options().write(true).open(&path).unwrap();
    file.set_modified(SystemTime::now() - age).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vacuum_deletes_old_strays_and_keeps_every_live_file() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    stream(&table, &dir.path().join("chk"), OutputMode::Append, 3).await;
    let old = stray(&table, Duration::from_secs(10 * 86_400));
    let young = stray(&table, Duration::from_secs(60));

    let plan = Vacuum::new(table.to_str().unwrap())
        .unwrap()
        .with_dry_run(true)
        .await
        .unwrap();
    assert_eq!(plan.files.len(), 1, "{plan:?}");
    assert!(plan.files[0].ends_with("part-stray-864000.parquet"), "{plan:?}");
    assert!(old.exists());

    let done = Vacuum::new(table.to_str().unwrap()).unwrap().await.unwrap();
    assert_eq!(done.files, plan.files);
    assert!(!old.exists());
    assert!(young.exists(), "a young file may be a write in flight");
    assert_exactly_once(&ids(&table), 0..400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_retention_is_refused_unless_forced() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    // Complete mode: each batch replaces the files of the one before.
    stream(&table, &dir.path().join("chk"), OutputMode::Complete, 2).await;
    assert_eq!(parquet_files(&table).len(), 3);

    let location = table.to_str().unwrap();
    let e = Vacuum::new(location)
        .unwrap()
        .with_retention(Duration::from_secs(3600))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("shorter than the table's"), "{e}");
    // Within the default retention the removed files stay for time travel.
    assert!(Vacuum::new(location).unwrap().await.unwrap().files.is_empty());

    let done = Vacuum::new(location)
        .unwrap()
        .with_retention(Duration::ZERO)
        .with_force(true)
        .await
        .unwrap();
    assert_eq!(done.files.len(), 2, "{done:?}");
    assert_eq!(parquet_files(&table).len(), 1);
    assert_exactly_once(&ids(&table), 0..300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_checkpoint_is_written_on_demand() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    stream(&table, &dir.path().join("chk"), OutputMode::Append, 4).await;
    let report = checkpoint_log(table.to_str().unwrap(), &Default::default())
        .await
        .unwrap();
    let name = format!("{:020}.checkpoint.parquet", report.checkpoint_version);
    assert!(table.join("_delta_log").join(&name).exists(), "{name}");
    assert_eq!(report.entries_deleted, 0, "every entry is within the log retention");
    assert_exactly_once(&ids(&table), 0..500);
}

/// Every data file under `dir`, relative to `table`, in any folder.
fn data_files_under(table: &Path, dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() && !path.ends_with("_delta_log") {
            out.extend(data_files_under(table, &path));
        } else if path.extension().is_some_and(|e| e == "parquet") {
            out.push(path.strip_prefix(table).unwrap().to_string_lossy().into_owned());
        }
    }
    out.sort();
    out
}

/// The rate source with a `zone` partition column whose values hold `:`
/// and ` ` (folders `zone=10%3A00%20utc`, log paths `zone=10%253A00%2520utc`).
pub(crate) fn with_zones(b: arrow_array::RecordBatch) -> std::result::Result<arrow_array::RecordBatch, BoxError> {
    let zones: Vec<&str> = (0..b.num_rows()).map(|i| ["10:00 utc", "11:00 utc"][i % 2]).collect();
    let mut fields = b.schema().fields().to_vec();
    fields.push(std::sync::Arc::new(arrow_schema::Field::new(
        "zone",
        arrow_schema::DataType::Utf8,
        false,
    )));
    let mut columns = b.columns().to_vec();
    columns.push(std::sync::Arc::new(arrow_array::StringArray::from(zones)));
    Ok(arrow_array::RecordBatch::try_new(
        std::sync::Arc::new(arrow_schema::Schema::new(fields)),
        columns,
    )?)
}

/// Folders whose names hold escapes and spaces reach vacuum's plan spelled
/// in more than one way: it still deletes exactly the compacted inputs and
/// the stray file, never a live file, and reports each file once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vacuum_matches_escaped_and_spaced_partition_folders() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let q = read_stream(RateSource::rows_per_batch(10))
        .map_batches(with_zones)
        .write_stream()
        .checkpoint_location(dir.path().join("chk"))
        .stop_after_batch(BatchId(3))
        .start(
            DeltaSink::try_new(table.to_str().unwrap())
                .unwrap()
                .with_partition_by(["zone"]),
        )
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let written = data_files_under(&table, &table);
    let compacted = weir_delta::Compact::new(table.to_str().unwrap())
        .unwrap()
        .await
        .unwrap();
    assert_eq!(compacted.files_added, 2, "{compacted:?}");
    let live: Vec<String> = data_files_under(&table, &table)
        .into_iter()
        .filter(|f| !written.contains(f))
        .collect();
    assert_eq!(live.len(), 2);
    std::fs::write(
        table.join("zone=10%3A00%20utc/part-stray.parquet"),
        b"not a committed file",
    )
    .unwrap();
    let mut expected = written.clone();
    expected.push("zone=10%3A00%20utc/part-stray.parquet".into());
    expected.sort();

    // Inputs written 10 days ago but removed just now stay for the default
    // retention (readers of the version before need them), however the
    // plan spells their removal; only what no version references goes.
    let ten_days_ago = SystemTime::now() - Duration::from_secs(10 * 86_400);
    for f in &expected {
        let file = std::fs::File::options().write(true).open(table.join(f)).unwrap();
        file.set_modified(ten_days_ago).unwrap();
    }
    let plan = Vacuum::new(table.to_str().unwrap())
        .unwrap()
        .with_dry_run(true)
        .await
        .unwrap();
    assert_eq!(plan.files, vec!["zone=10%3A00%20utc/part-stray.parquet".to_string()]);

    let vacuum = || forced_vacuum(&table);
    let plan = vacuum().with_dry_run(true).await.unwrap();
    assert_eq!(plan.files, expected, "the compacted inputs and the stray, no live file");
    assert_eq!(
        data_files_under(&table, &table).len(),
        expected.len() + 2,
        "a dry run deletes nothing"
    );
    let done = vacuum().await.unwrap();
    assert_eq!(done.files, expected);
    assert_eq!(data_files_under(&table, &table), live);
    assert_exactly_once(&ids(&table), 0..40);
    // The log still holds the removals: neither a plan nor a vacuum
    // reports files the vacuum already deleted.
    assert_eq!(vacuum().with_dry_run(true).await.unwrap().files, Vec::<String>::new());
    assert_eq!(vacuum().await.unwrap().files, Vec::<String>::new());
}

/// Gives the table's first live file a deletion vector, as an engine's
/// DELETE would: a commit upgrading the protocol, removing the file and
/// adding it again with the vector. Returns the file's path.
fn add_a_deletion_vector(table: &Path) -> String {
    let entries = log_entries(table);
    let first = std::fs::read_to_string(entries.last().unwrap()).unwrap();
    let add = first
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find_map(|a| a.get("add").cloned())
        .unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    let mut with_vector = add.clone();
    with_vector["deletionVector"] = serde_json::json!({
        "storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 1, "sizeInBytes": 36, "cardinality": 1
    });
    let actions = [
        serde_json::json!({"commitInfo": {"timestamp": now, "operation": "DELETE"}}),
        serde_json::json!({"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
            "readerFeatures": ["deletionVectors"], "writerFeatures": ["deletionVectors"]}}),
        serde_json::json!({"remove": {"path": add["path"], "deletionTimestamp": now, "dataChange": true, "size": add["size"]}}),
        serde_json::json!({"add": with_vector}),
    ];
    let text: Vec<String> = actions.iter().map(|a| a.to_string()).collect();
    let next = table.join("_delta_log").join(format!("{:020}.json", entries.len()));
    std::fs::write(next, text.join("\n")).unwrap();
    add["path"].as_str().unwrap().to_string()
}

/// Deletion vectors live in files of their own that the log names apart
/// from the data files: vacuum refuses such a table, deleting nothing, and
/// compaction leaves the file with a vector as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vacuum_refuses_a_table_with_deletion_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    stream(&table, &dir.path().join("chk"), OutputMode::Append, 2).await;
    let with_vector = add_a_deletion_vector(&table);
    let before = parquet_files(&table).len();
    let e = forced_vacuum(&table).await.unwrap_err();
    assert!(e.to_string().contains("deletion vectors"), "{e}");
    assert_eq!(parquet_files(&table).len(), before);
    let compacted = weir_delta::Compact::new(table.to_str().unwrap())
        .unwrap()
        .await
        .unwrap();
    assert_eq!(
        (compacted.files_removed, compacted.files_added),
        (2, 1),
        "{compacted:?}"
    );
    assert!(
        compacted.groups.iter().all(|g| !g.files.contains(&with_vector)),
        "{compacted:?}"
    );
}

/// A table whose log names its files by absolute path (as shallow clones
/// do) is refused by compaction and vacuum alike, with nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_file_paths_are_refused_by_compaction_and_vacuum() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    stream(&table, &dir.path().join("chk"), OutputMode::Append, 2).await;
    let root = url::Url::from_directory_path(std::fs::canonicalize(&table).unwrap()).unwrap();
    rewrite_log(&table, |text| {
        text.replace("\"path\":\"part-", &format!("\"path\":\"{root}part-"))
    });
    let before = parquet_files(&table).len();
    let entries = std::fs::read_dir(table.join("_delta_log")).unwrap().count();

    let e = weir_delta::Compact::new(table.to_str().unwrap())
        .unwrap()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("an absolute path"), "{e}");
    let e = forced_vacuum(&table).await.unwrap_err();
    assert!(e.to_string().contains("an absolute path"), "{e}");
    assert_eq!(parquet_files(&table).len(), before);
    assert_eq!(std::fs::read_dir(table.join("_delta_log")).unwrap().count(), entries);
}
