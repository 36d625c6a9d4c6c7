//! `weir compact`, run as a process: the plan, the summary, both formats,
//! and compactions killed at random moments.

use std::process::Stdio;
use std::time::Duration;

use crate::common::*;
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::{iceberg, json_ids};

fn stream(lake: &std::path::Path, table: &str, batches: &str, extra: &[&str]) {
    let mut args = vec![
        "stream",
        "--from",
        "rate",
        "--rows-per-batch",
        "10",
        "--to",
        table,
        "--checkpoint",
        table,
        "--max-batches",
        batches,
        "--progress",
        "none",
    ];
    args.extend_from_slice(extra);
    ok(lake, &args);
}

#[test]
fn compact_plans_then_compacts_tables_of_both_formats() {
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    stream(lake, "bronze.d", "8", &[]);
    stream(lake, "bronze.i", "8", &["--format", "iceberg"]);

    for (table, ids) in [
        (
            "bronze.d",
            Box::new(|| delta_ids(&lake.join("weir-lake/warehouse/bronze/d"))) as Box<dyn Fn() -> Vec<i64>>,
        ),
        (
            "bronze.i",
            Box::new(|| {
                let db = lake.join("weir-lake/catalog.db");
                json_ids(&iceberg(&["ids", "pyiceberg", db.to_str().unwrap(), "bronze.i"]).expect("readers present"))
            }),
        ),
    ] {
        let plan = json_lines(&ok(lake, &["compact", table, "--dry-run", "--json"])).remove(0);
        assert_eq!(plan["dry_run"], true);
        assert_eq!(plan["groups"].as_array().unwrap().len(), 1, "{plan}");
        assert_eq!(plan["groups"][0]["files"].as_array().unwrap().len(), 8, "{plan}");
        assert_eq!(plan["commits"].as_array().unwrap().len(), 0);
        let text = ok(lake, &["compact", table, "--dry-run"]);
        assert!(text.contains("would rewrite 1 groups, 8 files"), "{text}");

        let done = ok(lake, &["compact", table]);
        assert!(done.contains("files:   8 -> 1 (removed 8, added 1)"), "{done}");
        assert!(done.contains("rows rewritten: 80"), "{done}");
        assert_exactly_once(&ids(), 0..80);
        let again = json_lines(&ok(lake, &["compact", table, "--json"])).remove(0);
        assert_eq!(again["groups"].as_array().unwrap().len(), 0, "{again}");
    }

    let e = failure(lake, &["compact", "bronze.d", "--where", "zone=eu"]);
    assert!(e.contains("not a partition column"), "{e}");
    let e = failure(lake, &["compact", "bronze.d", "--target-file-size", "12x"]);
    assert!(e.contains("is not a size"), "{e}");
}

#[test]
fn killed_compactions_leave_every_row_once_and_a_rerun_finishes() {
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    stream(lake, "bronze.k", "300", &[]);
    let table = lake.join("weir-lake/warehouse/bronze/k");
    let files = |t: &std::path::Path| {
        let d = weir_test_support::readers::read(&["describe", t.to_str().unwrap()]).expect("readers present");
        d["files"].as_array().unwrap().len()
    };
    assert_eq!(files(&table), 300);
    // Small targets make many groups, one commit each, so kills land
    // between commits as well as inside rewrites.
    let args = [
        "compact",
        "bronze.k",
        "--target-file-size",
        "16KiB",
        "--commit-every",
        "1",
        "--max-concurrent",
        "1",
    ];
    let mut killed = 0;
    for i in 0..10u64 {
        let mut child = weir(lake)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(20 + (i * 37) % 160));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            killed += 1;
        }
        child.wait().unwrap();
        assert_exactly_once(&delta_ids(&table), 0..3000);
    }
    assert!(killed >= 3, "only {killed} runs were killed mid-way");
    // Runs to the end until nothing is left to group.
    for _ in 0..5 {
        let r = json_lines(&ok(
            lake,
            &["compact", "bronze.k", "--target-file-size", "16KiB", "--json"],
        ))
        .remove(0);
        if r["groups"].as_array().unwrap().is_empty() {
            break;
        }
    }
    let plan = json_lines(&ok(
        lake,
        &[
            "compact",
            "bronze.k",
            "--target-file-size",
            "16KiB",
            "--dry-run",
            "--json",
        ],
    ))
    .remove(0);
    assert_eq!(plan["groups"].as_array().unwrap().len(), 0, "{plan}");
    assert!(files(&table) < 50, "{} files left", files(&table));
    assert_exactly_once(&delta_ids(&table), 0..3000);
}

#[test]
fn rewrite_manifests_merges_an_iceberg_tables_small_manifests() {
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    stream(lake, "bronze.m", "5", &["--format", "iceberg"]);
    let plan = json_lines(&ok(lake, &["rewrite-manifests", "bronze.m", "--dry-run", "--json"])).remove(0);
    assert_eq!(
        (plan["small_manifests"].as_u64(), plan["manifests_before"].as_u64()),
        (Some(5), Some(5)),
        "{plan}"
    );
    let done = json_lines(&ok(lake, &["rewrite-manifests", "bronze.m", "--json"])).remove(0);
    assert_eq!(done["manifests_after"], 1, "{done}");
    let db = lake.join("weir-lake/catalog.db");
    let d = iceberg(&["describe", db.to_str().unwrap(), "bronze.m"]).expect("readers present");
    assert_eq!(d["manifests"], 1);
    let ids = json_ids(&iceberg(&["ids", "pyiceberg", db.to_str().unwrap(), "bronze.m"]).expect("readers present"));
    assert_exactly_once(&ids, 0..50);

    stream(lake, "bronze.dm", "2", &[]);
    let e = failure(lake, &["rewrite-manifests", "bronze.dm"]);
    assert!(e.contains("manifests are Iceberg's"), "{e}");
}

#[test]
fn stream_compacts_in_the_background_with_compact_every() {
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    stream(
        lake,
        "bronze.auto",
        "40",
        &[
            "--trigger-interval",
            "50ms",
            "--compact-every",
            "10",
            "--compact-min-files",
            "5",
        ],
    );
    let table = lake.join("weir-lake/warehouse/bronze/auto");
    let optimize = std::fs::read_dir(table.join("_delta_log"))
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains("\"operation\":\"OPTIMIZE\"")))
        .count();
    assert!(optimize >= 1, "no compaction committed");
    assert_exactly_once(&delta_ids(&table), 0..400);
}

/// `--compact-after-files`: once the query has written that many files, a
/// background compaction replaces them (an Iceberg `replace` snapshot),
/// and pyiceberg reads every row once.
#[test]
fn stream_compacts_an_iceberg_table_after_enough_files() {
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    stream(
        lake,
        "bronze.files",
        "30",
        &[
            "--format",
            "iceberg",
            "--trigger-interval",
            "50ms",
            "--compact-after-files",
            "8",
            "--compact-min-files",
            "4",
        ],
    );
    let db = lake.join("weir-lake/catalog.db");
    let d = iceberg(&["describe", db.to_str().unwrap(), "bronze.files"]).expect("readers present");
    let replaced = d["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["summary"]["weir.operation"] == "compact")
        .count();
    assert!(replaced >= 1, "no compaction committed: {d}");
    assert!(d["files"].as_u64().unwrap() < 30, "{d}");
    let ids = json_ids(&iceberg(&["ids", "pyiceberg", db.to_str().unwrap(), "bronze.files"]).expect("readers present"));
    assert_exactly_once(&ids, 0..300);

    let e = failure(
        lake,
        &[
            "stream",
            "--from",
            "rate",
            "--to",
            "bronze.x",
            "--checkpoint",
            "bronze.x",
            "--compact-min-files",
            "3",
        ],
    );
    assert!(
        e.contains("--compact-every") || e.contains("--compact-after-files"),
        "{e}"
    );
}
