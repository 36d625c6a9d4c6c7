//! The worked example's windowed totals under SIGKILL: the merchant-totals
//! program is killed at random moments and restarted, twenty times and
//! more, then run to the end; each window the watermark closed must be in
//! the table once with the totals of all its rows, as DuckDB and the
//! format's Python reader read it.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Int64Type, TimestampMicrosecondType};
use weir_core::source::RateSource;
use weir_test_support::readers::{iceberg, python, read};

use crate::common;

const TOTAL_BATCHES: u64 = 1500;
const ROWS_PER_BATCH: u64 = 100;
const KILLS: usize = 22;

fn program(lake: &Path, format: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_merchant-totals"));
    cmd.arg("--lake")
        .arg(lake)
        .args(["--format", format])
        .args(["--total-batches", &TOTAL_BATCHES.to_string()])
        .args(["--rows-per-batch", &ROWS_PER_BATCH.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// [window start ms, merchant, cents, count] of every window the watermark
/// of the last batch closed, from all the input at once.
fn expected() -> Vec<Vec<i64>> {
    let rows = RateSource::generate(0, TOTAL_BATCHES * ROWS_PER_BATCH);
    let ts = rows.column(1).as_primitive::<TimestampMicrosecondType>();
    let accounts = rows.column(2).as_primitive::<Int64Type>();
    let amounts = rows.column(3).as_primitive::<Decimal128Type>();
    let mut groups: BTreeMap<(i64, i64), (i64, i64)> = BTreeMap::new();
    for r in 0..rows.num_rows() {
        let ms = ts.value(r) / 1000;
        let g = groups
            .entry((ms - ms.rem_euclid(1000), accounts.value(r) % 5))
            .or_default();
        g.0 += amounts.value(r) as i64;
        g.1 += 1;
    }
    // The last batch's watermark: the latest event time of the batches
    // before it, less two seconds.
    let before_last = (TOTAL_BATCHES - 1) * ROWS_PER_BATCH - 1;
    let watermark = ts.value(before_last as usize) / 1000 - 2000;
    groups
        .into_iter()
        .filter(|((start, _), _)| start + 1000 <= watermark)
        .map(|((start, merchant), (cents, n))| vec![start, merchant, cents, n])
        .collect()
}

fn groups(out: serde_json::Value) -> Vec<Vec<i64>> {
    serde_json::from_value(out["groups"].clone()).expect("groups")
}

fn killed_and_restarted(format: &str) -> tempfile::TempDir {
    let lake = tempfile::tempdir().unwrap();
    let killed = common::kill_and_restart(|| program(lake.path(), format), KILLS, 30, 250);
    assert!(
        killed >= 20,
        "only {killed} kills landed; the runs are too fast for the test"
    );
    lake
}

#[test]
fn window_totals_in_delta_are_exact_after_random_sigkills() {
    if python().is_none() {
        return;
    }
    let lake = killed_and_restarted("delta");
    let table = lake.path().join("warehouse/silver/merchant_totals");
    let want = expected();
    assert!(want.len() > 100, "{} windows", want.len());
    for reader in ["deltalake", "duckdb"] {
        let got = groups(read(&["window-totals", reader, table.to_str().unwrap()]).expect("readers present"));
        assert_eq!(got, want, "{reader}");
    }
}

#[test]
fn window_totals_in_iceberg_are_exact_after_random_sigkills() {
    if python().is_none() {
        return;
    }
    let lake = killed_and_restarted("iceberg");
    let db = lake.path().join("catalog.db");
    let want = expected();
    for reader in ["pyiceberg", "duckdb"] {
        let got = groups(
            iceberg(&["window-totals", reader, db.to_str().unwrap(), "silver.merchant_totals"])
                .expect("readers present"),
        );
        assert_eq!(got, want, "{reader}");
    }
}
