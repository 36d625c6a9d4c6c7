//! Stream-static joins against Delta and Iceberg tables by name (and a
//! Delta table by path): each batch sees the table as it is when the batch
//! starts, so a row added to the table between batches joins from the next
//! batch on.
#![cfg(feature = "sql")]

use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use weir::catalog::{Catalogs, TableFormat, TableOptions};
use weir::prelude::*;
use weir::sql::{StaticTable, StreamSqlExt};
use weir::ToTable;

fn merchants_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("name", DataType::Utf8, false),
    ]))
}

fn merchants(ids: std::ops::Range<i64>) -> RecordBatch {
    RecordBatch::try_new(
        merchants_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids.clone())),
            Arc::new(StringArray::from_iter_values(ids.map(|i| format!("merchant {i}")))),
        ],
    )
    .unwrap()
}

fn payments_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("event_id", DataType::Int64, false),
        Field::new("merchant_id", DataType::Int64, false),
    ]))
}

/// Payments `ids`, each to merchant `id % 6`.
fn payments(ids: std::ops::Range<i64>) -> RecordBatch {
    RecordBatch::try_new(
        payments_schema(),
        vec![
            Arc::new(Int64Array::from_iter_values(ids.clone())),
            Arc::new(Int64Array::from_iter_values(ids.map(|i| i % 6))),
        ],
    )
    .unwrap()
}

/// Appends `rows` to the table `name` in one committed batch, by a query
/// of its own (`chk` names its checkpoint).
async fn append(catalogs: &Catalogs, chk: &std::path::Path, name: &str, options: TableOptions, rows: RecordBatch) {
    let input = MemoryStream::new(merchants_schema());
    input.add_batch(rows).unwrap();
    let q = read_stream(input)
        .write_stream()
        .query_name(chk.file_name().unwrap().to_str().unwrap())
        .checkpoint_location(chk)
        .trigger(Trigger::available_now())
        .to_table_in(catalogs, name, options)
        .await
        .unwrap();
    q.await_termination().await.unwrap();
}

/// (event id, merchant name) of every joined row.
fn joined(sink: &MemorySink) -> Vec<(i64, String)> {
    let mut rows: Vec<(i64, String)> = sink
        .batches()
        .iter()
        .flat_map(|b| {
            let ids = b.column(0).as_primitive::<Int64Type>().clone();
            let names = b.column(1).as_string::<i32>().clone();
            (0..b.num_rows()).map(move |r| (ids.value(r), names.value(r).to_string()))
        })
        .collect();
    rows.sort();
    rows
}

/// Payments joined with the merchants table, by `merchant_id`.
fn joining(input: &MemoryStream, merchants: Arc<dyn StaticTable>, chk: &std::path::Path) -> StreamWriter {
    read_stream(input.clone())
        .join_static(
            "merchants",
            merchants,
            "SELECT p.event_id, m.name FROM input p JOIN merchants m ON p.merchant_id = m.id",
        )
        .write_stream()
        .checkpoint_location(chk)
}

/// The joined rows of payments `ids`: (event id, merchant name).
fn named(ids: impl Iterator<Item = i64>) -> Vec<(i64, String)> {
    ids.map(|i| (i, format!("merchant {}", i % 6))).collect()
}

async fn wait_for_batches(q: &StreamingQuery, n: usize) {
    for _ in 0..2000 {
        if q.recent_progress().len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the query did not run {n} batches: {:?}", q.exception());
}

async fn join_sees_each_version(options: TableOptions, by_path: bool) {
    let format = format!("{options:?}");
    let lake = tempfile::tempdir().unwrap();
    let catalogs = Catalogs::new(weir::catalog::Config::embedded(lake.path()));
    // Merchants 0 to 4; merchant 5 comes later.
    let dim = |n: &str| lake.path().join(format!("chk-dim-{n}"));
    append(
        &catalogs,
        &dim("first"),
        "dim.merchants",
        options.clone(),
        merchants(0..5),
    )
    .await;
    let table: Arc<dyn StaticTable> = if by_path {
        let location = lake.path().join("warehouse/dim/merchants");
        weir::static_delta_table(location.to_str().unwrap()).await.unwrap()
    } else {
        weir::static_table(&catalogs, "dim.merchants").await.unwrap()
    };
    assert_eq!(table.schema().fields().len(), 2);
    let input = MemoryStream::new(payments_schema());
    let sink = MemorySink::new("joined");
    let q = joining(&input, table, &lake.path().join("chk"))
        .trigger(Trigger::processing_time(Duration::ZERO))
        .start(sink.clone())
        .await
        .unwrap();
    input.add_batch(payments(0..12)).unwrap();
    wait_for_batches(&q, 1).await;
    // Merchant 5 is not in the table yet: its payments (5 and 11) join nothing.
    let first = named((0..12).filter(|i| i % 6 != 5));
    assert_eq!(joined(&sink), first, "{format:?}");
    append(&catalogs, &dim("second"), "dim.merchants", options, merchants(5..6)).await;
    input.add_batch(payments(12..24)).unwrap();
    wait_for_batches(&q, 2).await;
    q.stop_and_wait().await.unwrap();
    let all = named((0..24).filter(|i| *i >= 12 || i % 6 != 5));
    assert_eq!(joined(&sink), all, "{format:?}: the second batch reads the new version");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_table_by_name_is_read_as_of_each_batch() {
    join_sees_each_version(TableOptions::new().format(TableFormat::Delta), false).await;
}

/// The partition column comes from the log, not the files: the kernel puts
/// it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_delta_table_is_read_with_its_partition_column() {
    let options = TableOptions::new().format(TableFormat::Delta).partition_by(["name"]);
    join_sees_each_version(options, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_table_by_path_is_read_as_of_each_batch() {
    join_sees_each_version(TableOptions::new().format(TableFormat::Delta), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_iceberg_table_by_name_is_read_as_of_each_batch() {
    join_sees_each_version(TableOptions::new().format(TableFormat::Iceberg), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_iceberg_table_is_read_with_its_partition_column() {
    let options = TableOptions::new().format(TableFormat::Iceberg).partition_by(["name"]);
    join_sees_each_version(options, false).await;
}

/// A table that does not exist is refused when the join is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_refused_by_name() {
    let lake = tempfile::tempdir().unwrap();
    let catalogs = Catalogs::new(weir::catalog::Config::embedded(lake.path()));
    let err = weir::static_table(&catalogs, "dim.nothing").await.unwrap_err();
    assert!(err.to_string().contains("dim.nothing"), "{err}");
}

/// A Delta table whose first commits were cleaned up after a log
/// checkpoint (as weir's sink does after the retention) is read from the
/// checkpoint on; a missing path is refused and nothing is created there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_table_with_a_cleaned_log_is_read_and_a_missing_one_refused() {
    let lake = tempfile::tempdir().unwrap();
    let catalogs = Catalogs::new(weir::catalog::Config::embedded(lake.path()));
    let options = TableOptions::new().format(TableFormat::Delta);
    let dim = |n: &str| lake.path().join(format!("chk-dim-{n}"));
    append(
        &catalogs,
        &dim("first"),
        "dim.merchants",
        options.clone(),
        merchants(0..3),
    )
    .await;
    append(&catalogs, &dim("second"), "dim.merchants", options, merchants(3..6)).await;
    let location = lake.path().join("warehouse/dim/merchants");
    let location = location.to_str().unwrap();
    weir::delta::checkpoint_log(location, &Default::default())
        .await
        .unwrap();
    let log = std::path::Path::new(location).join("_delta_log");
    std::fs::remove_file(log.join(format!("{:020}.json", 0))).unwrap();
    let table = weir::static_delta_table(location).await.unwrap();
    let input = MemoryStream::new(payments_schema());
    input.add_batch(payments(0..12)).unwrap();
    let sink = MemorySink::new("joined");
    let q = joining(&input, table, &lake.path().join("chk"))
        .trigger(Trigger::available_now())
        .start(sink.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    assert_eq!(joined(&sink), named(0..12));

    let missing = lake.path().join("no-such-table");
    let err = weir::static_delta_table(missing.to_str().unwrap()).await.unwrap_err();
    assert!(err.to_string().contains("no Delta table"), "{err}");
    assert!(!missing.exists(), "a read creates nothing");
}
