//! The engine under SIGKILL: the foreach-batch-files example is killed at random moments
//! and restarted, twenty times and more, then run to the end; every
//! payment id must be in its output exactly once, none missing.

use crate::common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

const TOTAL_BATCHES: u64 = 3000;
const ROWS_PER_BATCH: u64 = 50;
const KILLS: usize = 24;

fn program(lake: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_foreach-batch-files"));
    cmd.arg("--lake")
        .arg(lake)
        .args(["--total-batches", &TOTAL_BATCHES.to_string()])
        .args(["--rows-per-batch", &ROWS_PER_BATCH.to_string(), "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

fn ids_in(dir: &Path) -> HashMap<i64, usize> {
    let mut counts = HashMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "parquet") {
            continue;
        }
        for batch in ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path).unwrap())
            .unwrap()
            .build()
            .unwrap()
        {
            for id in batch.unwrap().column(0).as_primitive::<Int64Type>().values() {
                *counts.entry(*id).or_default() += 1;
            }
        }
    }
    counts
}

#[test]
fn every_payment_exactly_once_after_random_sigkills() {
    let lake = tempfile::tempdir().unwrap();
    let killed = common::kill_and_restart(|| program(lake.path()), KILLS, 30, 250);
    assert!(
        killed >= 20,
        "only {killed} kills landed; the runs are too fast for the test"
    );

    let counts = ids_in(&lake.path().join("foreach/payments"));
    let expected = (TOTAL_BATCHES * ROWS_PER_BATCH) as i64;
    let missing: Vec<i64> = (0..expected).filter(|id| !counts.contains_key(id)).take(10).collect();
    let repeated: Vec<(&i64, &usize)> = counts.iter().filter(|(_, n)| **n > 1).take(10).collect();
    let unexpected: Vec<&i64> = counts
        .keys()
        .filter(|id| !(0..expected).contains(*id))
        .take(10)
        .collect();
    assert!(missing.is_empty(), "missing ids: {missing:?}");
    assert!(repeated.is_empty(), "repeated ids: {repeated:?}");
    assert!(unexpected.is_empty(), "unexpected ids: {unexpected:?}");
    assert_eq!(counts.len() as i64, expected);
}

#[test]
fn weir_crash_at_aborts_the_process_at_each_named_point() {
    let lake = tempfile::tempdir().unwrap();
    let points = [
        "after_offsets_written",
        "after_data_written",
        "after_sink_commit",
        "after_commit_log",
    ];
    for (i, point) in points.iter().enumerate() {
        let batch = 2 * i + 1;
        let out = program(lake.path())
            .env("WEIR_CRASH_AT", format!("{point}@{batch}"))
            .output()
            .unwrap();
        assert!(!out.status.success(), "{point}: the process must die there");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("crash point fired"),
            "{point}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let last = program(lake.path()).output().unwrap();
    assert!(last.status.success(), "{}", String::from_utf8_lossy(&last.stderr));
    let counts = ids_in(&lake.path().join("foreach/payments"));
    let expected = (TOTAL_BATCHES * ROWS_PER_BATCH) as i64;
    assert_eq!(counts.len() as i64, expected);
    assert!(counts.values().all(|n| *n == 1));
    assert!((0..expected).all(|id| counts.contains_key(&id)));
}

/// The file sink under SIGKILL: every payment exactly once through the
/// metadata log, while a plain listing of the directory may also hold
/// files of killed attempts.
#[test]
fn every_payment_exactly_once_through_the_file_log_after_random_sigkills() {
    let lake = tempfile::tempdir().unwrap();
    let total: u64 = 600;
    let rows: u64 = 50;
    let program = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_file-sink"));
        cmd.arg("--lake")
            .arg(lake.path())
            .args(["--total-batches", &total.to_string()])
            .args(["--rows-per-batch", &rows.to_string(), "--quiet"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd
    };
    let killed = common::kill_and_restart(program, 22, 30, 250);
    assert!(
        killed >= 20,
        "only {killed} kills landed; the runs are too fast for the test"
    );

    let out = lake.path().join("files/payments");
    let log = weir_files::FileLog::open(out.to_str().unwrap(), &Default::default()).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let batches = rt.block_on(log.read()).unwrap();
    let mut through_log: HashMap<i64, usize> = HashMap::new();
    for b in &batches {
        for id in b.column(0).as_primitive::<Int64Type>().values() {
            *through_log.entry(*id).or_default() += 1;
        }
    }
    let expected = (total * rows) as i64;
    assert_eq!(through_log.len() as i64, expected, "ids missing through the log");
    assert!(through_log.values().all(|n| *n == 1), "an id twice through the log");
    assert!((0..expected).all(|id| through_log.contains_key(&id)));

    // A plain listing also reads files no entry lists (killed attempts'):
    // its rows are the log's plus the orphans', so the difference is the
    // orphans' rows, which the log-aware reader leaves out.
    let orphans = rt.block_on(log.orphans(std::time::Duration::ZERO)).unwrap();
    let rows_of = |path: &Path| {
        ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap())
            .map(|b| b.metadata().file_metadata().num_rows() as u64)
            .unwrap_or(0)
    };
    let mut plain_rows = 0;
    for dir in std::fs::read_dir(&out).unwrap().flatten().filter(|e| e.path().is_dir()) {
        for file in std::fs::read_dir(dir.path()).unwrap().flatten() {
            if file.path().extension().is_some_and(|x| x == "parquet") {
                plain_rows += rows_of(&file.path());
            }
        }
    }
    let orphan_rows: u64 = orphans.iter().map(|o| rows_of(&out.join(&o.path))).sum();
    eprintln!(
        "{} rows through the log, {plain_rows} in a plain listing, {} orphans",
        expected,
        orphans.len()
    );
    assert_eq!(plain_rows, expected as u64 + orphan_rows);
}
