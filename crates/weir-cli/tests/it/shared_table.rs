//! Several `weir stream` processes, each a query of its own with its own
//! checkpoint, append to one table on S3 through one catalog (PostgreSQL
//! for Delta and Iceberg, the REST catalog for Iceberg): killed at random,
//! restarted, and each process's ids are in the table once.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::Value;
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::{iceberg, json_ids, read};

use crate::common::s3::s3;
use crate::common::*;

/// Processes on the table.
const WRITERS: i64 = 3;
/// Input files per process, and rows per file.
const FILES: i64 = 400;
const ROWS: i64 = 10;

/// Writes process `w`'s input: files of ids `w * FILES * ROWS ..`, so
/// the processes' ids never meet.
fn write_input(dir: &Path, w: i64) {
    std::fs::create_dir_all(dir).unwrap();
    for f in 0..FILES {
        let first = (w * FILES + f) * ROWS;
        let lines: Vec<String> = (first..first + ROWS)
            .map(|i| format!(r#"{{"event_id": {i}, "writer": {w}, "amount": {}.25}}"#, i % 100))
            .collect();
        std::fs::write(dir.join(format!("part-{f:03}.json")), lines.join("\n") + "\n").unwrap();
    }
}

struct Writer {
    input: std::path::PathBuf,
    chk: String,
    name: String,
}

impl Writer {
    fn args<'a>(&'a self, table: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "stream",
            "--from",
            "files",
            "--path",
            self.input.to_str().unwrap(),
            "--file-format",
            "json",
            "--max-files-per-batch",
            "1",
            "--to",
            table,
            "--query-name",
            &self.name,
            "--checkpoint",
            &self.chk,
            "--progress",
            "none",
        ];
        args.extend_from_slice(extra);
        args
    }
}

/// The catalog the processes share.
#[derive(Debug, Clone, Copy)]
enum Catalog {
    /// The SQL catalog on PostgreSQL.
    Postgres,
    /// The Iceberg REST catalog of the test SeaweedFS.
    Rest,
}

/// Three processes start together on a table that does not exist yet (on
/// the REST catalog, one that a first batch of one process made), and are
/// killed at staggered random moments twelve times each; then each
/// runs to the end of its input. Every id is in the table once, read by
/// the format's Python reader and by DuckDB, and each query's marker is
/// its last batch.
fn writers_killed_at_random(format: &str, catalog: Catalog) {
    let Some(s3) = s3(&format!("shared-{format}")) else {
        return;
    };
    let service = match catalog {
        Catalog::Postgres => "WEIR_TEST_POSTGRES_URL",
        Catalog::Rest => "WEIR_TEST_ICEBERG_REST_URI",
    };
    let Some(uri) = weir_test_support::service(service) else {
        return;
    };
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    let (config, reader_catalog) = match catalog {
        Catalog::Postgres => (s3.tables_config(lake, &uri, format), uri.clone()),
        Catalog::Rest => {
            let warehouse =
                std::env::var("WEIR_TEST_ICEBERG_REST_WAREHOUSE").unwrap_or_else(|_| "s3://weirtables/".into());
            (
                s3.rest_config(lake, &uri, &warehouse),
                format!("rest+{uri}#{warehouse}"),
            )
        }
    };
    // A namespace of the test's own in the shared database.
    let table = format!("shared_{}.events", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let writers: Vec<Writer> = (0..WRITERS)
        .map(|w| {
            let input = lake.join(format!("input-{w}"));
            write_input(&input, w);
            Writer {
                input,
                chk: s3.checkpoint(&format!("w{w}")),
                name: format!("writer-{w}"),
            }
        })
        .collect();

    // WEIR_KILL_SEED repeats a run's kill moments.
    let seed: u64 = std::env::var("WEIR_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    eprintln!("{format} ({catalog:?}): kill seed {seed}");
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ seed;
    let mut next = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    if let Catalog::Rest = catalog {
        // SeaweedFS's catalog checks and creates a table in two steps, so
        // processes creating one table at once may each be told they made
        // it, a late one replacing a table another has committed to (which
        // that process then refuses by its uuid: docs/catalogs.md). The
        // first writer makes the table with one batch before the others
        // start; the SQL catalog's creates are atomic and race here.
        let out = s3
            .weir_with(&config)
            .args(writers[0].args(&table, &["--max-batches", "1"]))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let mut killed = 0;
    let logs = lake.join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    for round in 0..12 {
        let mut children: Vec<(Child, u64, std::path::PathBuf)> = writers
            .iter()
            .map(|w| {
                let log = logs.join(format!("{}-{round}.log", w.name));
                let child = s3
                    .weir_with(&config)
                    .args(w.args(&table, &[]))
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log).unwrap())
                    .spawn()
                    .unwrap();
                (child, 200 + next(900), log)
            })
            .collect();
        children.sort_by_key(|(_, at, _)| *at);
        let mut waited = 0;
        for (child, at, log) in &mut children {
            std::thread::sleep(Duration::from_millis(*at - waited));
            waited = *at;
            match child.try_wait().unwrap() {
                None => {
                    child.kill().unwrap();
                    killed += 1;
                }
                // A run ends by itself only when it fails: its input is
                // far from read.
                Some(status) => panic!(
                    "a run ended by itself ({status}) in round {round}:\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                ),
            }
            child.wait().unwrap();
        }
    }
    assert_eq!(killed, 12 * WRITERS, "every run was killed mid-way");
    let committed: Vec<Option<u64>> = writers
        .iter()
        .map(|w| s3.show_at(lake, &w.chk)["last_committed"].as_u64())
        .collect();
    eprintln!("{format} ({catalog:?}): {killed} kills; batches committed by the killed runs: {committed:?}");
    assert!(
        committed.iter().all(|c| c.is_some()),
        "a writer committed nothing: {committed:?}"
    );

    // Each runs to the end of its input, beside the others: none fails on
    // the others' commits.
    let finals: Vec<Child> = writers
        .iter()
        .map(|w| {
            s3.weir_with(&config)
                .args(w.args(&table, &["--available-now"]))
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in finals {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    let described = s3
        .weir_with(&config)
        .args(["describe", &table, "--json"])
        .output()
        .unwrap();
    assert!(
        described.status.success(),
        "{}",
        String::from_utf8_lossy(&described.stderr)
    );
    let described: Value = serde_json::from_slice(&described.stdout).unwrap();
    for w in &writers {
        let status = s3.show_at(lake, &w.chk);
        assert_eq!(status["last_committed"], FILES - 1, "{status}");
        let marker = described["queries"]
            .as_array()
            .expect("queries")
            .iter()
            .find(|q| q["query_name"] == w.name.as_str())
            .unwrap_or_else(|| panic!("no marker of {}: {described}", w.name));
        assert_eq!(marker["batch_id"], FILES - 1, "{described}");
    }
    let location = described["location"].as_str().expect("a location").to_string();
    assert!(location.starts_with("s3://"), "{described}");
    let all = 0..WRITERS * FILES * ROWS;
    for reader in ["python", "duckdb"] {
        let ids = match (format, reader) {
            ("delta", "python") => read(&["ids", "deltalake", &location]),
            ("delta", _) => read(&["ids", "duckdb", &location]),
            (_, "python") => iceberg(&["ids", "pyiceberg", &reader_catalog, &table]),
            _ => iceberg(&["ids", "duckdb", &reader_catalog, &table]),
        };
        assert_exactly_once(&json_ids(&ids.expect("readers present")), all.clone());
    }
}

#[test]
fn three_processes_on_one_delta_table_on_s3_killed_at_random_land_every_id_once() {
    writers_killed_at_random("delta", Catalog::Postgres);
}

#[test]
fn three_processes_on_one_iceberg_table_on_s3_killed_at_random_land_every_id_once() {
    writers_killed_at_random("iceberg", Catalog::Postgres);
}

#[test]
fn three_processes_on_one_iceberg_table_in_the_rest_catalog_killed_at_random_land_every_id_once() {
    writers_killed_at_random("iceberg", Catalog::Rest);
}
