//! The payments example: one stream into a Delta table, an Iceberg table
//! and a keyed store, run twice, then read back by Python deltalake and
//! pyiceberg as well as by the program itself.

use std::process::Command;

use weir_test_support::readers::{iceberg, json_ids, python, read};

const ROWS: i64 = 400;

fn command(lake: &std::path::Path, batches: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_payments"));
    c.arg("--lake")
        .arg(lake)
        .args(["--batches", batches, "--rows-per-batch", &ROWS.to_string()]);
    c
}

fn payments(lake: &std::path::Path, batches: &str) {
    let out = command(lake, batches).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "payments failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("every payment exactly once in all three sinks"),
        "{stdout}"
    );
}

/// The rate source's payment ids of `batches` batches from `cents` up.
fn expected(batches: i64, cents: i128) -> Vec<i64> {
    (0..batches * ROWS)
        .filter(|i| (*i as i128 * 7919) % 100_000 >= cents)
        .collect()
}

fn sorted(mut ids: Vec<i64>) -> Vec<i64> {
    ids.sort_unstable();
    ids
}

#[test]
fn three_sinks_each_hold_their_payments_once_across_runs() {
    if python().is_none() {
        return;
    }
    let lake = tempfile::tempdir().unwrap();
    // The first run dies right after a sink committed batch 1, before the
    // checkpoint recorded it: the next run replays that batch.
    let crashed = command(lake.path(), "3")
        .env("WEIR_CRASH_AT", "after_sink_commit@1")
        .output()
        .unwrap();
    assert!(!crashed.status.success(), "the crash point aborts the process");
    payments(lake.path(), "2");
    payments(lake.path(), "2");

    // Each query ran to its own last batch (the crash stopped them at
    // different ones): each sink holds the payments of whole batches from
    // 0, every one once.
    let whole_batches = |ids: Vec<i64>, cents: i128| -> i64 {
        let ids = sorted(ids);
        let n = (3..=6).find(|n| expected(*n, cents) == ids);
        n.unwrap_or_else(|| panic!("{} ids are not whole batches, once each", ids.len()))
    };
    let bronze = lake.path().join("warehouse/bronze/payments");
    let ids = json_ids(&read(&["ids", "deltalake", bronze.to_str().unwrap()]).expect("readers present"));
    whole_batches(ids, 0);

    let db = lake.path().join("catalog.db");
    let out = iceberg(&["ids", "pyiceberg", db.to_str().unwrap(), "risk.high_value"]).expect("readers present");
    whole_batches(json_ids(&out), 90_000);
}
