//! The `weir` command, run as a process: streams into tables by name, read
//! back by Python deltalake and pyiceberg; kills, Ctrl-C, and bad input.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::{iceberg, json_ids};

#[test]
fn stream_stops_at_max_batches_resumes_and_is_described() {
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    let stream = |max: &str| {
        ok(
            lake,
            &[
                "stream",
                "--from",
                "rate",
                "--rows-per-batch",
                "100",
                "--to",
                "bronze.payments",
                "--checkpoint",
                "chk",
                "--max-batches",
                max,
                "--progress",
                "json",
            ],
        )
    };
    let first = json_lines(&stream("3"));
    assert_eq!(
        first
            .iter()
            .map(|p| p["batch_id"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [0, 1, 2]
    );
    for p in &first {
        assert_eq!(p["input_rows"], 100);
        for phase in ["plan", "write", "commit", "total"] {
            assert!(p["durations_ms"][phase].as_f64().unwrap() >= 0.0, "{p}");
        }
    }
    let table = lake.join("weir-lake/warehouse/bronze/payments");
    assert_exactly_once(&delta_ids(&table), 0..300);

    // Counting earlier runs: two more batches, then none.
    let second = json_lines(&stream("5"));
    assert_eq!(
        second
            .iter()
            .map(|p| p["batch_id"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [3, 4]
    );
    assert!(stream("5").is_empty());
    assert_exactly_once(&delta_ids(&table), 0..500);

    let tables = json_lines(&ok(lake, &["tables", "--json"]));
    assert_eq!(tables.len(), 1);
    assert_eq!(
        (tables[0]["name"].as_str(), tables[0]["format"].as_str()),
        (Some("lake.bronze.payments"), Some("delta"))
    );
    let d = json_lines(&ok(lake, &["describe", "bronze.payments", "--json"])).remove(0);
    assert_eq!(d["queries"][0]["query_name"], "lake.bronze.payments");
    assert_eq!(d["queries"][0]["batch_id"], 4);
    assert_eq!(d["files"], 5);
    let history = json_lines(&ok(lake, &["history", "lake.bronze.payments", "--json"]));
    let batches: Vec<_> = history.iter().filter_map(|h| h["batch_id"].as_i64()).collect();
    assert_eq!(batches, [4, 3, 2, 1, 0]);
    assert_eq!(last_committed(lake, "chk"), Some(4));

    let e = failure(lake, &["expire", "bronze.payments"]);
    assert!(e.contains("snapshot expiry is for Iceberg tables"), "{e}");
    // Vacuum: nothing to delete within the default retention; a short one
    // is refused unless forced.
    let v = json_lines(&ok(lake, &["vacuum", "bronze.payments", "--dry-run", "--json"])).remove(0);
    assert_eq!(v["files"], serde_json::json!([]));
    let e = failure(lake, &["vacuum", "bronze.payments", "--retain", "1h"]);
    assert!(e.contains("shorter than the table's"), "{e}");
    let v = ok(lake, &["vacuum", "bronze.payments", "--retain", "0s", "--force"]);
    assert!(v.contains("deleted 0 files"), "{v}");

    // A new checkpoint for the same query name is a lost checkpoint.
    let e = failure(
        lake,
        &[
            "stream",
            "--from",
            "rate",
            "--to",
            "bronze.payments",
            "--checkpoint",
            "chk2",
        ],
    );
    assert!(
        e.contains("already has output") && e.contains("take_over_output"),
        "{e}"
    );
    assert_exactly_once(&delta_ids(&table), 0..500);
}

#[test]
fn iceberg_tables_take_a_format_and_partitioning() {
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    ok(
        lake,
        &[
            "stream",
            "--from",
            "rate",
            "--rows-per-batch",
            "80",
            "--to",
            "silver.events",
            "--format",
            "iceberg",
            "--partition-by",
            "day(ts)",
            "--checkpoint",
            "chk",
            "--max-batches",
            "2",
            "--progress",
            "none",
        ],
    );
    let db = lake.join("weir-lake/catalog.db");
    let ids =
        json_ids(&iceberg(&["ids", "pyiceberg", db.to_str().unwrap(), "silver.events"]).expect("readers present"));
    assert_exactly_once(&ids, 0..160);
    let d = json_lines(&ok(lake, &["describe", "silver.events", "--json"])).remove(0);
    assert_eq!(d["format"], "iceberg");
    assert_eq!(d["rows"], 160);
    assert_eq!(d["partition_by"], serde_json::json!(["day(ts)"]));
    assert_eq!(d["queries"][0]["batch_id"], 1);

    // Expiry: a dry run plans, the real one leaves one snapshot and every row.
    let plan = json_lines(&ok(
        lake,
        &["expire", "silver.events", "--older-than", "0s", "--dry-run", "--json"],
    ))
    .remove(0);
    assert_eq!(plan["expired"].as_array().unwrap().len(), 1);
    let keep_two = [
        "expire",
        "silver.events",
        "--older-than",
        "0s",
        "--retain-last",
        "2",
        "--dry-run",
        "--json",
    ];
    let plan = json_lines(&ok(lake, &keep_two)).remove(0);
    assert_eq!(plan["expired"], serde_json::json!([]), "--retain-last 2 keeps both");
    assert_eq!(json_lines(&ok(lake, &["history", "silver.events", "--json"])).len(), 2);
    let done = ok(lake, &["expire", "silver.events", "--older-than", "0s"]);
    assert!(done.contains("expired 1 snapshots of silver.events (1 kept)"), "{done}");
    assert_eq!(json_lines(&ok(lake, &["history", "silver.events", "--json"])).len(), 1);
    let ids =
        json_ids(&iceberg(&["ids", "pyiceberg", db.to_str().unwrap(), "silver.events"]).expect("readers present"));
    assert_exactly_once(&ids, 0..160);

    // Nothing is an orphan; a threshold short enough to take a commit in
    // flight is refused.
    let report = json_lines(&ok(
        lake,
        &["remove-orphans", "silver.events", "--older-than", "1h", "--json"],
    ))
    .remove(0);
    assert_eq!(report["orphans"], serde_json::json!([]));
    assert!(report["listed"].as_u64().unwrap() > 0);
    let e = failure(lake, &["remove-orphans", "silver.events", "--older-than", "5m"]);
    assert!(e.contains("commit in flight"), "{e}");
}

#[test]
fn the_files_source_reads_each_new_file_once() {
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    let input = lake.join("input");
    std::fs::create_dir_all(&input).unwrap();
    let write = |name: &str, ids: std::ops::Range<i64>| {
        let lines: Vec<String> = ids.map(|i| format!(r#"{{"event_id": {i}, "note": "n{i}"}}"#)).collect();
        std::fs::write(input.join(name), lines.join("\n") + "\n").unwrap();
    };
    write("a.json", 0..10);
    write("b.json", 10..25);
    let stream = |max: &str| {
        ok(
            lake,
            &[
                "stream",
                "--from",
                "files",
                "--path",
                input.to_str().unwrap(),
                "--file-format",
                "json",
                "--max-files-per-batch",
                "1",
                "--to",
                "raw.notes",
                "--checkpoint",
                "chk",
                "--max-batches",
                max,
            ],
        )
    };
    stream("2");
    let table = lake.join("weir-lake/warehouse/raw/notes");
    assert_exactly_once(&delta_ids(&table), 0..25);
    write("c.json", 25..30);
    stream("3");
    assert_exactly_once(&delta_ids(&table), 0..30);
}

#[test]
fn killed_and_restarted_runs_end_with_exactly_max_batches() {
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    let args = [
        "stream",
        "--from",
        "rate",
        "--rows-per-batch",
        "10",
        "--to",
        "bronze.kill",
        "--checkpoint",
        "chk",
        "--max-batches",
        "600",
        "--progress",
        "none",
    ];
    // SIGKILL at spread-out moments (a fixed sequence: the test repeats).
    let mut killed = 0;
    for i in 0..12u64 {
        let mut child = weir(lake)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(30 + (i * 23) % 120));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            killed += 1;
        }
        child.wait().unwrap();
    }
    assert!(killed >= 6, "only {killed} runs were killed mid-way");
    ok(lake, &args);
    assert_exactly_once(&delta_ids(&lake.join("weir-lake/warehouse/bronze/kill")), 0..6000);
    assert_eq!(last_committed(lake, "chk"), Some(599));
}

#[test]
fn ctrl_c_stops_after_the_running_batch() {
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    let mut child = weir(lake)
        .args([
            "stream",
            "--from",
            "rate",
            "--rows-per-batch",
            "40",
            "--to",
            "bronze.live",
            "--checkpoint",
            "chk",
            "--trigger-interval",
            "100ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..3 {
        let line = lines.next().unwrap().unwrap();
        assert!(line.starts_with("batch"), "{line}");
    }
    let interrupted = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "Ctrl-C is a clean stop");
    let last = last_committed(lake, "chk").unwrap();
    assert!(last >= 2);
    let ids = delta_ids(&lake.join("weir-lake/warehouse/bronze/live"));
    assert_exactly_once(&ids, 0..(last as i64 + 1) * 40);
}

#[test]
fn bad_input_fails_with_a_message_that_names_it() {
    let lake = tempfile::tempdir().unwrap();
    let lake = lake.path();
    let cases: [(&[&str], &str); 6] = [
        (
            &["stream", "--from", "rate", "--to", "payments", "--checkpoint", "c"],
            "needs a namespace",
        ),
        (
            &["stream", "--from", "rate", "--to", "nope.a.b", "--checkpoint", "c"],
            "no catalog named \"nope\"",
        ),
        (
            &["stream", "--from", "files", "--to", "a.b", "--checkpoint", "c"],
            "--path",
        ),
        (
            &[
                "stream",
                "--from",
                "rate",
                "--to",
                "a.b",
                "--checkpoint",
                "c",
                "--trigger-interval",
                "5 parsecs",
            ],
            "--trigger-interval",
        ),
        (&["describe", "bronze.none"], "does not exist"),
        (&["checkpoint", "show", "missing"], "no checkpoint at missing"),
    ];
    for (args, says) in cases {
        let e = failure(lake, args);
        assert!(e.contains(says), "weir {args:?}: {e}");
    }
    let e = failure(lake, &["stream", "--from", "rate", "--checkpoint", "c"]);
    assert!(e.contains("--to"), "{e}");
    let e = failure(lake, &["expire", "a.b", "--older-than", "a week"]);
    assert!(e.contains("--older-than"), "{e}");
    let e = failure(
        lake,
        &[
            "stream",
            "--from",
            "rate",
            "--to",
            "a.b",
            "--checkpoint",
            "c",
            "--expire-every",
            "10",
        ],
    );
    assert!(e.contains("snapshot expiry policy is for Iceberg tables"), "{e}");
    let e = failure(
        lake,
        &[
            "stream",
            "--from",
            "rate",
            "--to",
            "a.b",
            "--checkpoint",
            "c",
            "--max-batches",
            "3",
            "--take-over-output",
        ],
    );
    assert!(e.contains("cannot be used with --take-over-output"), "{e}");
    // Both --config and --lake: ambiguous (the helper passes --lake).
    let e = failure(lake, &["--config", "weir.toml", "tables"]);
    assert!(e.contains("--config and --lake"), "{e}");
}
