//! The Iceberg sink under SIGKILL and under two concurrent copies of a
//! query, read back through the same SQLite catalog by pyiceberg and DuckDB.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};

use weir_test_support::{assert_exactly_once, copy_dir, readers};

const ROWS_PER_BATCH: u64 = 20;
const TABLE: &str = "bronze.payments";

fn stream(lake: &Path, checkpoint: &Path, total_batches: u64) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_iceberg-stream"));
    cmd.arg("--catalog")
        .arg(format!("sqlite://{}", lake.join("catalog.db").display()))
        .arg("--warehouse")
        .arg(lake.join("warehouse"))
        .args(["--table", TABLE])
        .arg("--checkpoint")
        .arg(checkpoint)
        .args(["--query-name", "payments-bronze"])
        .args(["--rows-per-batch", &ROWS_PER_BATCH.to_string()])
        .args(["--total-batches", &total_batches.to_string()])
        .args(["--partition-by", "bucket(4, account_id)"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// Checks every event id `0..n` exactly once with both readers, and the
/// amounts; returns the table's description.
fn assert_table_exactly_once(lake: &Path, n: i64) -> Option<serde_json::Value> {
    let db = lake.join("catalog.db");
    for reader in ["pyiceberg", "duckdb"] {
        let (ids, cents) = readers::iceberg_ids(reader, db.to_str().unwrap(), TABLE)?;
        assert_exactly_once(&ids, 0..n);
        assert_eq!(cents, Some(readers::rate_amount_cents(n)), "{reader}: amount checksum");
    }
    readers::iceberg(&["describe", db.to_str().unwrap(), TABLE])
}

#[test]
fn every_event_exactly_once_in_iceberg_after_random_sigkills() {
    let dir = tempfile::tempdir().unwrap();
    let (lake, chk) = (dir.path().join("lake"), dir.path().join("chk"));
    let total = 1200;
    let killed = common::kill_and_restart(|| stream(&lake, &chk, total), 24, 150, 400);
    assert!(killed >= 20, "only {killed} kills landed mid-run");
    let Some(d) = assert_table_exactly_once(&lake, (total * ROWS_PER_BATCH) as i64) else {
        return;
    };
    assert_eq!(
        d["properties"]["weir.query.payments-bronze.batch-id"],
        (total - 1).to_string()
    );
    let batches: Vec<u64> = d["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["summary"]["weir.batch-id"].as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(
        batches,
        (0..total).collect::<Vec<_>>(),
        "one snapshot per batch, in order"
    );
}

#[test]
fn two_processes_running_copies_of_one_query_write_each_batch_once() {
    let dir = tempfile::tempdir().unwrap();
    let lake = dir.path().join("lake");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let first = stream(&lake, &a, 2).output().unwrap();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    copy_dir(&a, &b);
    let total = 150;
    common::run_two_copies(stream(&lake, &a, total), stream(&lake, &b, total));
    assert_table_exactly_once(&lake, (total * ROWS_PER_BATCH) as i64);
}
