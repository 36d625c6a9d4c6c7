//! `weir stream` with its checkpoint on S3 (SeaweedFS, started by
//! scripts/test.sh): kills, a second process on the checkpoint, a holder
//! paused past its lease's expiry, and kills with the table on S3 too.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use weir_test_support::assert_exactly_once;

use crate::common::s3::s3;
use crate::common::*;
use weir_test_support::readers::{iceberg, json_ids, read};

/// Killed at spread-out moments 36 times: each restart takes the killed
/// run's lease at once (its process is gone), and the table holds every id
/// once.
#[test]
fn killed_runs_with_the_checkpoint_on_s3_end_with_exactly_max_batches() {
    let Some(s3) = s3("kill") else { return };
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    let args = [
        "stream",
        "--from",
        "rate",
        "--rows-per-batch",
        "10",
        "--to",
        "bronze.kill_s3",
        "--checkpoint",
        &s3.chk,
        "--max-batches",
        "1000",
        "--progress",
        "none",
    ];
    let mut killed = 0;
    for i in 0..36u64 {
        let mut child = s3
            .weir(lake)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(60 + (i * 37) % 240));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            killed += 1;
        }
        child.wait().unwrap();
    }
    assert!(killed >= 30, "only {killed} runs were killed mid-way");
    let before = s3.show(lake)["last_committed"].as_u64();
    // The killed runs made progress between kills: each took the lease.
    assert!(
        before.is_some_and(|b| b >= 10),
        "killed runs committed up to {before:?}"
    );
    let out = s3.weir(lake).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_exactly_once(&delta_ids(&lake.join("weir-lake/warehouse/bronze/kill_s3")), 0..10_000);
    let status = s3.show(lake);
    assert_eq!(status["last_committed"], 999, "{status}");
    assert_eq!(status["location"], s3.chk.trim_end_matches('/'), "{status}");
}

fn signal(child: &Child, signal: &str) {
    let sent = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

/// A second process on a checkpoint in use is refused; the holder, paused
/// (SIGSTOP) past its lease's expiry, is replaced by a third process with
/// the next epoch; resumed, it stops with an error and writes nothing, and
/// the new holder's batches are each in the table once.
#[test]
fn a_paused_holder_is_replaced_and_resumed_writes_nothing() {
    let Some(s3) = s3("paused") else { return };
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    let stream = |extra: &[&str]| {
        let mut args = vec![
            "stream",
            "--from",
            "rate",
            "--rows-per-batch",
            "10",
            "--to",
            "bronze.paused",
            "--checkpoint",
            &s3.chk,
            "--checkpoint-option",
            "lease_ttl_ms=6000",
            "--checkpoint-option",
            "lease_renew_ms=500",
            "--checkpoint-option",
            "lease_clock_skew_ms=1000",
        ];
        args.extend_from_slice(extra);
        let mut command = s3.weir(lake);
        command.args(args);
        command
    };
    let mut holder = stream(&["--trigger-interval", "100ms", "--progress", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    for _ in 0..3 {
        let line = lines.next().unwrap().unwrap();
        assert!(line.contains("batch_id"), "{line}");
    }
    // Read on, so that a full pipe never blocks the holder.
    let drained = std::thread::spawn(move || lines.count());

    let second = stream(&["--max-batches", "100"]).output().unwrap();
    let refused = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success() && refused.contains("in use"), "{refused}");

    signal(&holder, "-STOP");
    let third = stream(&["--max-batches", "60", "--progress", "none"]).output().unwrap();
    signal(&holder, "-CONT");
    assert!(third.status.success(), "{}", String::from_utf8_lossy(&third.stderr));

    // Resumed, the old holder finds its lease gone and stops.
    let mut waited = 0;
    let status = loop {
        if let Some(status) = holder.try_wait().unwrap() {
            break status;
        }
        if waited == 600 {
            holder.kill().unwrap();
            holder.wait().unwrap();
            panic!("the resumed holder went on running after it was replaced");
        }
        std::thread::sleep(Duration::from_millis(100));
        waited += 1;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut holder.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "the paused holder went on: {stderr}");
    assert!(stderr.contains("lease"), "{stderr}");
    drained.join().unwrap();
    assert_eq!(s3.show(lake)["last_committed"], 59);
    assert_exactly_once(&delta_ids(&lake.join("weir-lake/warehouse/bronze/paused")), 0..600);
}

/// Checkpoint and table both on S3, killed 30 times or more: every id once,
/// read by the format's Python reader and by DuckDB.
fn kill_loop_with_everything_on_s3(format: &str) {
    let Some(s3) = s3(&format!("everything-{format}")) else {
        return;
    };
    let Some(dir) = lake_with_readers() else { return };
    let lake = dir.path();
    let config = s3.tables_config(lake, &format!("sqlite://{}/catalog.db", lake.display()), format);
    let args = [
        "stream",
        "--from",
        "rate",
        "--rows-per-batch",
        "10",
        "--to",
        "bronze.kill",
        "--checkpoint",
        &s3.chk,
        "--max-batches",
        "400",
        "--progress",
        "none",
    ];
    let mut killed = 0;
    for i in 0..34u64 {
        let mut child = s3
            .weir_with(&config)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(150 + (i * 37) % 300));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            killed += 1;
        }
        child.wait().unwrap();
    }
    assert!(killed >= 30, "only {killed} runs were killed mid-way");
    let before = s3.show(lake)["last_committed"].as_u64();
    eprintln!("{format}: {killed} kills, batches 0 to {before:?} committed by the killed runs");
    assert!(
        before.is_some_and(|b| b >= 10),
        "killed runs committed up to {before:?}"
    );
    let out = s3.weir_with(&config).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let described = s3
        .weir_with(&config)
        .args(["describe", "bronze.kill", "--json"])
        .output()
        .unwrap();
    assert!(
        described.status.success(),
        "{}",
        String::from_utf8_lossy(&described.stderr)
    );
    let described: Value = serde_json::from_slice(&described.stdout).unwrap();
    let location = described["location"].as_str().expect("a location").to_string();
    assert!(location.starts_with("s3://"), "{described}");
    for reader in ["python", "duckdb"] {
        let ids = match (format, reader) {
            ("delta", "python") => json_ids(&read(&["ids", "deltalake", &location]).expect("readers present")),
            ("delta", _) => json_ids(&read(&["ids", "duckdb", &location]).expect("readers present")),
            (_, "python") => {
                let db = lake.join("catalog.db");
                json_ids(&iceberg(&["ids", "pyiceberg", db.to_str().unwrap(), "bronze.kill"]).expect("readers present"))
            }
            _ => {
                let db = lake.join("catalog.db");
                json_ids(&iceberg(&["ids", "duckdb", db.to_str().unwrap(), "bronze.kill"]).expect("readers present"))
            }
        };
        assert_exactly_once(&ids, 0..4_000);
    }
    assert_eq!(s3.show(lake)["last_committed"], 399);
}

#[test]
fn killed_runs_with_checkpoint_and_delta_table_on_s3_land_every_id_once() {
    kill_loop_with_everything_on_s3("delta");
}

#[test]
fn killed_runs_with_checkpoint_and_iceberg_table_on_s3_land_every_id_once() {
    kill_loop_with_everything_on_s3("iceberg");
}
