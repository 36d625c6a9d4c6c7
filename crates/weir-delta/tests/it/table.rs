//! The Delta table as other engines see it: partitions, txn entries, commit
//! info, schema checks and evolution, log checkpoints, file sizes.

use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use weir_core::prelude::*;
use weir_core::source::RateSource;
use weir_delta::DeltaSink;
use weir_test_support::readers::event_ids_with;
use weir_test_support::{assert_exactly_once, assert_whole_batches};

use crate::readers;

/// The rate source, `rows` per batch.
fn rate(rows: u64) -> ReadStream {
    read_stream(RateSource::rows_per_batch(rows))
}

/// The rate source with one more column, nullable, made from the event ids.
fn with_column(
    rows_per_batch: u64,
    name: &'static str,
    column: impl Fn(&Int64Array) -> ArrayRef + Send + Sync + 'static,
) -> ReadStream {
    rate(rows_per_batch).map_batches(move |b| {
        let values = column(b.column(0).as_primitive::<Int64Type>());
        let mut fields: Vec<Field> = b.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new(name, values.data_type().clone(), true));
        let mut columns = b.columns().to_vec();
        columns.push(values);
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
    })
}

/// The rate source with one more string column, made from each event id.
pub(crate) fn with_string_column(rows_per_batch: u64, name: &'static str, value: fn(i64) -> String) -> ReadStream {
    with_column(rows_per_batch, name, move |ids| {
        Arc::new(ids.iter().map(|v| v.map(value)).collect::<StringArray>())
    })
}

/// The rate source with a `bucket` column (`event_id % 3` as a string).
pub(crate) fn bucketed(rows_per_batch: u64) -> ReadStream {
    with_string_column(rows_per_batch, "bucket", |v| format!("b{}", v % 3))
}

async fn run(stream: ReadStream, chk: &Path, sink: DeltaSink, name: &str, last: u64) -> Result<StreamingQuery> {
    let q = stream
        .write_stream()
        .query_name(name)
        .checkpoint_location(chk)
        .stop_after_batch(BatchId(last))
        .start(sink)
        .await?;
    q.await_termination().await?;
    Ok(q)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_table_reads_the_same_in_duckdb_and_deltalake() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("payments");
    let sink = DeltaSink::try_new(table.to_str().unwrap())
        .unwrap()
        .with_partition_by(["bucket"]);
    let q = run(bucketed(500), &dir.path().join("chk"), sink, "payments-bronze", 3)
        .await
        .unwrap();

    let Some(describe) = readers::read(&["describe", table.to_str().unwrap()]) else {
        return;
    };
    assert_eq!(describe["partition_columns"], serde_json::json!(["bucket"]));
    let files = describe["files"].as_array().unwrap();
    let mut buckets: Vec<&str> = files
        .iter()
        .map(|f| f["partition_values"]["bucket"].as_str().unwrap())
        .collect();
    buckets.sort_unstable();
    buckets.dedup();
    assert_eq!(buckets, vec!["b0", "b1", "b2"]);
    let records: i64 = files
        .iter()
        .map(|f| f["num_records"].as_i64().expect("stats have numRecords"))
        .sum();
    assert_eq!(records, 2000);

    for reader in ["deltalake", "duckdb"] {
        let json = readers::read(&["ids", reader, table.to_str().unwrap()]).unwrap();
        let ids: Vec<i64> = json["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect();
        assert_exactly_once(&ids, 0..2000);
        assert_eq!(
            json["amount_cents"].as_i64(),
            Some(weir_test_support::readers::rate_amount_cents(2000)),
            "{reader}: the amounts"
        );
    }

    // The marker and the commit info, as other engines read them.
    let name_app = "payments-bronze".to_string();
    let owner_app = format!("payments-bronze@{}", q.id());
    let txn = readers::read(&["txn", table.to_str().unwrap(), &name_app, &owner_app]).unwrap();
    assert_eq!(txn[&name_app], 3);
    assert_eq!(txn[&owner_app], 3);
    let commit = &describe["last_commit"];
    assert_eq!(commit["operation"], "STREAMING UPDATE");
    assert_eq!(commit["operationParameters"]["epochId"], "3");
    assert_eq!(commit["operationParameters"]["queryId"], q.id().to_string());
    assert_eq!(commit["weir.queryName"], "payments-bronze");
    assert_eq!(commit["weir.batchId"], 3);
}

/// Partition values that need escaping, one row each, with the folder the
/// protocol puts the row's file in and the start of the file's `add.path`
/// in the log. The folder is `zone=` and the value escaped as Hive escapes
/// it (a space too); null and the empty string are both the default
/// partition. `add.path` is that relative path as a URI: its `%` become
/// `%25` and each byte of a non-ASCII character is escaped. (Spark leaves
/// non-ASCII characters as they are; a URI reader decodes both spellings
/// to the same folder.)
const SPELLED: [(Option<&str>, &str, &str); 8] = [
    (Some("10:00 utc"), "zone=10%3A00%20utc", "zone=10%253A00%2520utc/"),
    (Some("50%"), "zone=50%25", "zone=50%2525/"),
    (Some("a/b"), "zone=a%2Fb", "zone=a%252Fb/"),
    (Some("k=v"), "zone=k%3Dv", "zone=k%253Dv/"),
    (Some("z\u{fc}rich"), "zone=z\u{fc}rich", "zone=z%C3%BCrich/"),
    (
        Some("\u{6771}\u{4eac}"),
        "zone=\u{6771}\u{4eac}",
        "zone=%E6%9D%B1%E4%BA%AC/",
    ),
    (
        Some(""),
        "zone=__HIVE_DEFAULT_PARTITION__",
        "zone=__HIVE_DEFAULT_PARTITION__/",
    ),
    (
        None,
        "zone=__HIVE_DEFAULT_PARTITION__",
        "zone=__HIVE_DEFAULT_PARTITION__/",
    ),
];

/// Pins the spelling of partitioned files as written today, so that an
/// upgrade of the log's serialisation cannot change it unnoticed: each
/// value's folder on disk, its file's `add.path` in the raw log (which
/// decodes to that folder), and `add.partitionValues` holding the value
/// itself, null for null and for the empty string (the protocol reads an
/// empty partition value as null; Spark writes null).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_folders_and_log_paths_are_spelled_as_the_protocol_asks() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let zoned = with_column(SPELLED.len() as u64, "zone", |ids| {
        let zones = ids
            .iter()
            .map(|id| id.and_then(|id| SPELLED.get(id as usize)).and_then(|s| s.0));
        Arc::new(zones.collect::<StringArray>())
    });
    let sink = DeltaSink::try_new(table.to_str().unwrap())
        .unwrap()
        .with_partition_by(["zone"]);
    let q = zoned
        .write_stream()
        .checkpoint_location(dir.path().join("c"))
        // One writer: one file per partition.
        .writer_parallelism(1)
        .stop_after_batch(BatchId(0))
        .start(sink)
        .await
        .unwrap();
    q.await_termination().await.unwrap();

    let mut folders: Vec<String> = std::fs::read_dir(&table)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name != "_delta_log")
        .collect();
    folders.sort_unstable();
    let mut expected_folders: Vec<&str> = SPELLED.iter().map(|s| s.1).collect();
    expected_folders.sort_unstable();
    expected_folders.dedup();
    assert_eq!(folders, expected_folders, "the table's folders");

    let adds: Vec<serde_json::Value> = readers::log_actions(&table)
        .into_iter()
        .filter_map(|a| a.get("add").cloned())
        .collect();
    assert_eq!(
        adds.len(),
        expected_folders.len(),
        "one file per partition, null and empty string sharing one: {adds:#?}"
    );
    let mut files = std::collections::BTreeMap::new();
    for (id, (value, folder, logged)) in SPELLED.into_iter().enumerate() {
        let add = adds
            .iter()
            .find(|a| a["path"].as_str().is_some_and(|p| p.starts_with(logged)))
            .unwrap_or_else(|| panic!("no add.path starts with {logged} (for {value:?}): {adds:#?}"));
        let path = add["path"].as_str().unwrap();
        let name = &path[logged.len()..];
        assert!(
            name.starts_with("part-00000-")
                && name.ends_with(".parquet")
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)),
            "a file name that needs no escaping: {path}"
        );
        let decoded = percent_encoding::percent_decode_str(path).decode_utf8().unwrap();
        assert_eq!(decoded, format!("{folder}/{name}"), "{path} decoded");
        let file = table.join(&*decoded);
        assert!(file.is_file(), "{path}: no file at {decoded}");
        let ids = files.entry(decoded.into_owned()).or_insert_with(|| file_ids(&file));
        assert!(
            ids.contains(&(id as i64)),
            "the row of {value:?} is not in {path}: {ids:?}"
        );
        let raw = match value {
            Some(v) if !v.is_empty() => serde_json::Value::String(v.to_string()),
            _ => serde_json::Value::Null,
        };
        assert_eq!(
            add["partitionValues"],
            serde_json::json!({ "zone": raw }),
            "{path} (for {value:?})"
        );
    }
    let ids: Vec<i64> = files.into_values().flatten().collect();
    assert_exactly_once(&ids, 0..SPELLED.len() as i64);

    if readers::python().is_none() {
        return;
    }
    for reader in ["deltalake", "duckdb"] {
        let (ids, _) = event_ids_with(reader, table.to_str().unwrap()).expect("readers present");
        assert_exactly_once(&ids, 0..SPELLED.len() as i64);
    }
    // The values as Python deltalake reads them back from the log.
    let describe = readers::read(&["describe", table.to_str().unwrap()]).expect("readers present");
    let mut read: Vec<Option<String>> = describe["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["partition_values"]["zone"].as_str().map(str::to_string))
        .collect();
    read.sort_unstable();
    let mut expected: Vec<Option<String>> = SPELLED
        .iter()
        .map(|s| s.0.filter(|v| !v.is_empty()).map(str::to_string))
        .collect();
    expected.sort_unstable();
    expected.dedup();
    assert_eq!(read, expected, "the partition values another reader sees");
}

/// The event ids in one data file, read straight from the disk.
fn file_ids(file: &Path) -> Vec<i64> {
    ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(file).unwrap())
        .unwrap()
        .build()
        .unwrap()
        .flat_map(|b| {
            let b = b.unwrap();
            b.column_by_name("event_id")
                .unwrap()
                .as_primitive::<Int64Type>()
                .values()
                .to_vec()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_does_not_fit_the_table_is_refused_by_column() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let sink = || DeltaSink::try_new(table.to_str().unwrap()).unwrap();
    run(rate(10), &dir.path().join("a"), sink(), "a", 0).await.unwrap();

    // `amount` as a string, and a new column.
    let other = rate(10).map_batches(|b| {
        let schema = Schema::new(vec![
            Field::new("event_id", DataType::Int64, false),
            Field::new("amount", DataType::Utf8, false),
            Field::new("note", DataType::Utf8, true),
        ]);
        let n = b.num_rows();
        Ok(RecordBatch::try_new(
            Arc::new(schema),
            vec![
                b.column(0).clone(),
                Arc::new(StringArray::from(vec!["x"; n])),
                Arc::new(StringArray::from(vec![Some("y"); n])),
            ],
        )?)
    });
    let err = run(other, &dir.path().join("b"), sink(), "b", 0).await.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("\"amount\" is string in the stream and decimal(18,2) in the table"),
        "{msg}"
    );
    assert!(msg.contains("\"note\" is not in the table"), "{msg}");
    assert!(msg.contains("merge_schema"), "{msg}");
    let ids = readers::event_ids(&table).await;
    assert_exactly_once(&ids, 0..10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_schema_adds_new_nullable_columns_in_the_batch_commit() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let sink = || DeltaSink::try_new(table.to_str().unwrap()).unwrap();
    run(rate(10), &dir.path().join("a"), sink(), "a", 1).await.unwrap();

    let with_note = with_string_column(10, "note", |v| format!("n{v}"));
    let err = run(with_note.clone(), &dir.path().join("b"), sink(), "b", 0)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("\"note\" is not in the table"), "{err}");
    run(with_note, &dir.path().join("b"), sink().with_merge_schema(true), "b", 1)
        .await
        .unwrap();

    // A stream without the new column still writes (nulls).
    run(rate(10), &dir.path().join("a"), sink(), "a", 2).await.unwrap();

    let Some(describe) = readers::read(&["describe", table.to_str().unwrap()]) else {
        return;
    };
    let names: Vec<&str> = describe["schema"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f[0].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["event_id", "ts", "account_id", "amount", "note"]);
    // Query a wrote ids 0..20 then 20..30; query b wrote 0..20 with notes.
    let mut ids = readers::event_ids(&table).await;
    ids.sort_unstable();
    let mut expected: Vec<i64> = (0..30).chain(0..20).collect();
    expected.sort_unstable();
    assert_eq!(ids, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_is_checkpointed_at_the_tables_interval() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let sink = DeltaSink::try_new(table.to_str().unwrap())
        .unwrap()
        .with_table_property("delta.checkpointInterval", "5");
    run(rate(7), &dir.path().join("c"), sink, "q", 11).await.unwrap();
    // Twelve commits at an interval of five: two checkpoints (deltalake
    // writes one after every fifth commit counting version 0).
    let log = table.join("_delta_log");
    let mut checkpoints: Vec<u64> = std::fs::read_dir(&log)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().to_string();
            name.strip_suffix(".checkpoint.parquet").map(|v| v.parse().unwrap())
        })
        .collect();
    checkpoints.sort_unstable();
    assert_eq!(checkpoints.len(), 2, "{checkpoints:?}");
    let last: serde_json::Value =
        serde_json::from_slice(&std::fs::read(log.join("_last_checkpoint")).unwrap()).unwrap();
    assert_eq!(last["version"].as_u64(), checkpoints.last().copied());
    assert_exactly_once(&readers::event_ids(&table).await, 0..84);
    // The marker survives in the checkpoint: a restart resumes exactly.
    let sink = DeltaSink::try_new(table.to_str().unwrap()).unwrap();
    run(rate(7), &dir.path().join("c"), sink, "q", 13).await.unwrap();
    assert_exactly_once(&readers::event_ids(&table).await, 0..98);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_written_beside_the_commits_hold_the_whole_table() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let sink = DeltaSink::try_new(table.to_str().unwrap())
        .unwrap()
        .with_table_property("delta.checkpointInterval", "2");
    // A checkpoint falls due every other commit while the last is still
    // being written: they are written in turn, never holding a commit.
    run(rate(5), &dir.path().join("c"), sink, "q", 39).await.unwrap();
    let log = table.join("_delta_log");
    let last: serde_json::Value =
        serde_json::from_slice(&std::fs::read(log.join("_last_checkpoint")).unwrap()).unwrap();
    let newest = last["version"].as_u64().unwrap();
    // The query waited for its last checkpoint as it finished.
    assert_eq!(newest, 39);
    // Without the commits it summarises, the newest checkpoint alone gives
    // every row and the query's marker.
    for v in 0..=newest {
        std::fs::remove_file(log.join(format!("{v:020}.json"))).unwrap();
    }
    assert_exactly_once(&readers::event_ids(&table).await, 0..200);
    let sink = DeltaSink::try_new(table.to_str().unwrap()).unwrap();
    run(rate(5), &dir.path().join("c"), sink, "q", 41).await.unwrap();
    assert_exactly_once(&readers::event_ids(&table).await, 0..210);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_partition_column_is_refused_with_the_reason_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let keyed = with_column(10, "key", |ids| {
        Arc::new(
            ids.iter()
                .map(|v| v.map(|v| vec![0xff, v as u8]))
                .collect::<BinaryArray>(),
        )
    });
    let sink = DeltaSink::try_new(table.to_str().unwrap())
        .unwrap()
        .with_partition_by(["key"]);
    let err = run(keyed, &dir.path().join("c"), sink, "q", 0).await.unwrap_err();
    let msg = err.to_string();
    for part in [
        "partition column \"key\"",
        "not Binary",
        "UTF-8",
        "hex or base64",
        "Nothing was written",
    ] {
        assert!(msg.contains(part), "{part:?} not in: {msg}");
    }
    assert!(!err.retryable(), "{msg}");
    assert!(!table.join("_delta_log").exists(), "a refused table was begun");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_roll_at_the_target_size() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let sink = DeltaSink::try_new(table.to_str().unwrap())
        .unwrap()
        .with_target_file_size(256 * 1024);
    let q = rate(300_000)
        .write_stream()
        .checkpoint_location(dir.path().join("c"))
        .writer_parallelism(1)
        .stop_after_batch(BatchId(0))
        .start(sink)
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let files: Vec<std::fs::DirEntry> = std::fs::read_dir(&table)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".zstd.parquet"))
        .collect();
    assert!(files.len() >= 3, "{} files for ~2 MiB at a 256 KiB target", files.len());
    let name = files[0].file_name().to_string_lossy().to_string();
    assert!(
        name.starts_with("part-00000-") && name.contains(&q.id().to_string()),
        "{name}"
    );
    assert_exactly_once(&readers::event_ids(&table).await, 0..300_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_queries_writing_the_same_table_are_rebased_not_failed() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let sink = || DeltaSink::try_new(table.to_str().unwrap()).unwrap();
    // Create the table first so both queries start against it.
    run(rate(1), &dir.path().join("init"), sink(), "init", 0).await.unwrap();
    let shifted = |offset: i64| {
        rate(50).map_batches(move |b| {
            let ids: Int64Array = b.column(0).as_primitive::<Int64Type>().unary(|v| v + offset);
            let mut columns = b.columns().to_vec();
            columns[0] = Arc::new(ids);
            Ok(RecordBatch::try_new(b.schema(), columns)?)
        })
    };
    let (chk_a, chk_b) = (dir.path().join("a"), dir.path().join("b"));
    let (a, b) = tokio::join!(
        run(shifted(1_000), &chk_a, sink(), "a", 29),
        run(shifted(1_000_000), &chk_b, sink(), "b", 29),
    );
    a.expect("query a never fails for b's commits");
    b.expect("query b never fails for a's commits");
    let mut ids = readers::event_ids(&table).await;
    ids.sort_unstable();
    let mut expected: Vec<i64> = std::iter::once(0)
        .chain(1_000..2_500)
        .chain(1_000_000..1_001_500)
        .collect();
    expected.sort_unstable();
    assert_eq!(ids, expected);
}

/// I2: a reader polling the table while batches of several files each are
/// committed sees whole batches only: ids `0..k * rows`, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_see_whole_batches_or_none() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    // Three source chunks per batch, over two writers: several files each.
    let rows = 150_000u64;
    let sink = DeltaSink::try_new(table.to_str().unwrap())
        .unwrap()
        .with_target_file_size(64 * 1024);
    let query = rate(rows)
        .write_stream()
        .checkpoint_location(dir.path().join("c"))
        .writer_parallelism(2)
        // Paced so that the reader (a process per look) looks while batches land.
        .trigger(Trigger::processing_time(std::time::Duration::from_millis(1500)))
        .stop_after_batch(BatchId(4))
        .start(sink)
        .await
        .unwrap();
    let mut seen = std::collections::BTreeSet::new();
    while query.is_active() {
        if table.join("_delta_log").exists() {
            let ids = readers::event_ids(&table).await;
            seen.insert(assert_whole_batches(&ids, rows));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    query.await_termination().await.unwrap();
    let files = std::fs::read_dir(&table)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".parquet"))
        .count();
    assert!(files >= 10, "{files} files: every batch spans several");
    assert_exactly_once(&readers::event_ids(&table).await, 0..(5 * rows) as i64);
    assert!(!seen.is_empty(), "the reader never looked while the query ran");
    eprintln!("the reader saw the table at {seen:?} batches");
}
