//! The quickstart as the README runs it: twice on one lake, the second run
//! going on from the first, then the table read back by Python deltalake
//! and DuckDB.

use std::path::Path;
use std::process::Command;

use weir_test_support::{assert_exactly_once, readers};

const ROWS_PER_BATCH: u64 = 1000;

/// Runs the quickstart for `batches` more batches on `lake`; its output.
fn quickstart(lake: &Path, batches: u64) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_quickstart"))
        .arg("--lake")
        .arg(lake)
        .args(["--batches", &batches.to_string()])
        .args(["--rows-per-batch", &ROWS_PER_BATCH.to_string()])
        .env_remove("WEIR_LAKE")
        .env_remove("WEIR_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the quickstart failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_quickstart_run_twice_on_one_lake_holds_every_payment_once() {
    let dir = tempfile::tempdir().unwrap();
    let first = quickstart(dir.path(), 5);
    assert!(first.contains("streaming up to batch 4 "), "{first}");
    assert!(first.contains("read back 5000 payments, 5000 distinct ids"), "{first}");
    let second = quickstart(dir.path(), 3);
    assert!(
        second.contains("streaming up to batch 7 "),
        "the second run goes on: {second}"
    );
    assert!(
        second.contains("read back 8000 payments, 8000 distinct ids"),
        "{second}"
    );

    let table = dir.path().join("warehouse/bronze/payments");
    let n = (8 * ROWS_PER_BATCH) as i64;
    for reader in ["deltalake", "duckdb"] {
        let Some((ids, cents)) = readers::event_ids_with(reader, table.to_str().unwrap()) else {
            continue;
        };
        assert_exactly_once(&ids, 0..n);
        assert_eq!(cents, Some(readers::rate_amount_cents(n)), "{reader}: amount checksum");
    }
}
