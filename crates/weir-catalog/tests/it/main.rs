//! Tables by name on every kind of catalog, written by streams and read
//! back by other engines (Python deltalake, pyiceberg).

mod jobs;
mod path;
mod rest;
mod rest_errors;
mod sql;

use std::path::Path;

use weir_catalog::TableSink;
use weir_core::prelude::*;
use weir_core::source::RateSource;
use weir_test_support::readers::{iceberg, json_ids, python, read};
use weir_test_support::service;

/// Streams batches 0..=last of `rows` rate rows into the table.
async fn stream_into(target: &TableSink, chk: &Path, rows: u64, last: u64) {
    let q = read_stream(RateSource::rows_per_batch(rows))
        .write_stream()
        .checkpoint_location(chk)
        .stop_after_batch(BatchId(last))
        .start_arc(target.sink.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
}

/// A local location as a path (`file:///x` -> `/x`).
fn local(location: &str) -> &str {
    location.strip_prefix("file://").unwrap_or(location)
}

/// The event ids of a Delta table, read by Python deltalake.
fn delta_ids(location: &str) -> Vec<i64> {
    json_ids(&read(&["ids", "deltalake", local(location)]).expect("readers present"))
}

/// The event ids of an Iceberg table, read by pyiceberg.
fn iceberg_ids(catalog: &str, table: &str) -> Vec<i64> {
    json_ids(&iceberg(&["ids", "pyiceberg", catalog, table]).expect("readers present"))
}

/// The tables pyiceberg lists in a namespace.
fn pyiceberg_tables(catalog: &str, namespace: &str) -> Vec<String> {
    let out = iceberg(&["list", catalog, namespace]).expect("readers present");
    out["tables"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

/// Whether the readers are installed (outside CI they may be missing).
fn readers() -> bool {
    if python().is_none() {
        eprintln!("the independent readers are missing; scripts/test.sh installs them");
        return false;
    }
    true
}
