//! The Delta sink under SIGKILL and under two concurrent copies of a query,
//! read back by Python deltalake and DuckDB.

use crate::common;

use std::path::Path;

use std::process::{Command, Stdio};
use weir_test_support::{copy_dir, readers};

const ROWS_PER_BATCH: u64 = 20;

fn stream(table: &Path, checkpoint: &Path, total_batches: u64) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_delta-stream"));
    cmd.arg("--table")
        .arg(table)
        .arg("--checkpoint")
        .arg(checkpoint)
        .args(["--query-name", "payments-bronze"])
        .args(["--rows-per-batch", &ROWS_PER_BATCH.to_string()])
        .args(["--total-batches", &total_batches.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

#[test]
fn every_event_exactly_once_in_delta_after_random_sigkills() {
    let dir = tempfile::tempdir().unwrap();
    let (table, chk) = (dir.path().join("payments"), dir.path().join("chk"));
    let total = 3000;
    let killed = common::kill_and_restart(|| stream(&table, &chk, total), 24, 150, 400);
    assert!(killed >= 20, "only {killed} kills landed mid-run");
    common::assert_delta_exactly_once(&table, (total * ROWS_PER_BATCH) as i64);
    let Some(txn) = readers::read(&["txn", table.to_str().unwrap(), "payments-bronze"]) else {
        return;
    };
    assert_eq!(txn["payments-bronze"], total - 1, "the marker is the last batch");
}

#[test]
fn two_processes_running_copies_of_one_query_write_each_batch_once() {
    let dir = tempfile::tempdir().unwrap();
    let (table, a, b) = (dir.path().join("payments"), dir.path().join("a"), dir.path().join("b"));
    let first = stream(&table, &a, 2).output().unwrap();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    copy_dir(&a, &b);
    let total = 150;
    common::run_two_copies(stream(&table, &a, total), stream(&table, &b, total));
    common::assert_delta_exactly_once(&table, (total * ROWS_PER_BATCH) as i64);
}
