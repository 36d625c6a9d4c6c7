//! `weir stream` killed (SIGKILL) at random moments while the sink's
//! background maintenance runs beside its batches: Iceberg's manifest
//! merges and expiry, Delta's log checkpoints, each made to fall due every
//! few commits. Every id lands once, and the table references no file that
//! is gone.

use std::ops::Range;
use std::path::Path;

use weir_test_support::assert_exactly_once;
use weir_test_support::kill::kill_repeatedly;
use weir_test_support::readers::{alter, iceberg, json_ids, read};

use crate::common::{lake_with_readers, last_committed, ok, weir};

const ROWS: i64 = 10;
const KILLS: u32 = 20;

/// `weir stream` of the rate source into `table`, `batches` batches in
/// all, `extra` added.
fn args(table: &str, format: &str, batches: u64, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["stream", "--from", "rate", "--rows-per-batch", "10", "--to", table];
    args.extend(["--format", format, "--checkpoint", "chk", "--progress", "none"]);
    args.extend(extra);
    let mut args: Vec<String> = args.into_iter().map(String::from).collect();
    args.extend(["--max-batches".into(), batches.to_string()]);
    args
}

/// Runs one batch of `args` (the table exists then), lets `tune` set the
/// table's properties, then kills `KILLS` runs of a stream that would not
/// end by itself (a batch every 5 ms at most), checks the table with
/// `between` (given the last batch committed), and finishes 50 batches
/// past that one. Returns the ids the table must hold.
fn through_kills(
    lake: &Path,
    args: impl Fn(u64, &[&str]) -> Vec<String>,
    tune: impl FnOnce(),
    between: impl FnOnce(u64),
) -> Range<i64> {
    let ok_with = |args: Vec<String>| ok(lake, &args.iter().map(String::as_str).collect::<Vec<_>>());
    ok_with(args(1, &[]));
    tune();
    let paced = args(1_000_000, &["--trigger-interval", "5ms"]);
    let ended = kill_repeatedly(
        || {
            let mut weir = weir(lake);
            weir.args(&paced);
            weir
        },
        KILLS,
        150..900,
    );
    assert_eq!(ended, 0, "a stream of a million batches ended by itself");
    let before = last_committed(lake, "chk").expect("batches committed");
    eprintln!("{KILLS} kills, batches 0..={before} committed");
    assert!(before >= 60, "only batches 0..={before} committed between kills");
    between(before);
    let batches = before + 51;
    ok_with(args(batches, &[]));
    assert_eq!(last_committed(lake, "chk"), Some(batches - 1));
    0..batches as i64 * ROWS
}

#[test]
fn iceberg_killed_while_merging_manifests_and_expiring_lands_every_id_once() {
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    let db = lake.join("weir-lake/catalog.db");
    let db = db.to_str().unwrap();
    let expiry = ["--expire-every", "20", "--expire-retain", "5"];
    let args = |batches, extra: &[&str]| args("bronze.merges", "iceberg", batches, &[&expiry[..], extra].concat());
    let tune = || {
        let set = ["manage", db, "bronze.merges", "property"];
        let key = "commit.manifest.min-count-to-merge";
        iceberg(&[&set[..], &[key, "5"]].concat()).expect("readers present");
    };
    // The killed runs expired snapshots themselves: fewer are left than
    // they committed.
    let between = |before: u64| {
        let d = iceberg(&["describe", db, "bronze.merges"]).expect("readers present");
        let left = d["snapshots"].as_array().unwrap().len() as u64;
        assert!(left <= before, "{left} snapshots of {} commits", before + 1);
    };
    let ids = through_kills(lake, args, tune, between);
    for reader in ["pyiceberg", "duckdb"] {
        let out = iceberg(&["ids", reader, db, "bronze.merges"]).expect("readers present");
        assert_exactly_once(&json_ids(&out), ids.clone());
    }
    // Every manifest a snapshot lists exists, merged ones among them, and
    // expiry kept the history short.
    let out = iceberg(&["manifests", db, "bronze.merges"]).expect("readers present");
    let snapshots = out["snapshots"].as_array().unwrap();
    let mut merged = 0;
    for snapshot in snapshots {
        for m in snapshot["manifests"].as_array().unwrap() {
            let path = m.as_str().unwrap().trim_start_matches("file://");
            assert!(Path::new(path).exists(), "a snapshot lists {path}, which is gone");
            merged += usize::from(path.contains("-merged-"));
        }
    }
    assert!(merged >= 1, "no snapshot lists a merged manifest");
    assert!(
        snapshots.len() < 100,
        "{} snapshots of {} commits",
        snapshots.len(),
        ids.end / ROWS
    );
}

#[test]
fn delta_killed_while_writing_log_checkpoints_lands_every_id_once() {
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    let table = lake.join("weir-lake/warehouse/bronze/checkpoints");
    let path = table.to_str().unwrap();
    let args = |batches, extra: &[&str]| args("bronze.checkpoints", "delta", batches, extra);
    let tune = || {
        alter(&["set-property", path, "delta.checkpointInterval", "5"]).expect("readers present");
    };
    let ids = through_kills(lake, args, tune, |_| {});
    for reader in ["deltalake", "duckdb"] {
        let out = read(&["ids", reader, path]).expect("readers present");
        assert_exactly_once(&json_ids(&out), ids.clone());
    }
    // Log checkpoints were written between the kills; the newest one is
    // whole (every reader above started from it).
    let checkpoints = std::fs::read_dir(table.join("_delta_log"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains(".checkpoint.")
        })
        .count();
    assert!(checkpoints >= 1, "no log checkpoint was written");
}
