//! Compaction, as ratios measured in one run.
//!
//! A Delta table of 1,000 files of about 1 MiB (micro-batches of the rate
//! source with an incompressible `payload` column, one file each) is
//! compacted into 128 MiB files, two rewrites at once, by:
//!
//! 1. arrow-rs alone: the same files read and rewritten with `parquet`'s
//!    `ArrowWriter`, in groups of up to 128 MiB, no table and no commit;
//! 2. weir's `Compact` on a copy of the table;
//! 3. Python deltalake's `optimize.compact()` on another copy (skipped with
//!    a notice if the readers' Python environment is missing).
//!
//! Then one round on an Iceberg table of the same kind of files: weir's
//! Iceberg `Compact` against arrow-rs alone.
//!
//! Reported: the median times of three alternating rounds (each on a fresh
//! copy, with the disk synced between phases), the median of the rounds'
//! ratios of weir's speed to arrow-rs alone's (target at least 0.8),
//! Python's time over weir's, and each one's peak memory growth against the
//! bound of target size x concurrency.
//!
//! `cargo bench -p weir-benches --bench compact`; `WEIR_BENCH_ROUNDS=5` runs more rounds, `WEIR_BENCH_FILES=200`
//! makes a smaller table.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use weir_benches::median;
use weir_core::maintenance::CompactProgress;
use weir_core::prelude::*;
use weir_delta::{Compact, DeltaSink};
use weir_test_support::with_payload;

const TARGET: u64 = 128 << 20;
const CONCURRENCY: usize = 2;
/// Rows of the rate source with its payload that make about 1 MiB.
const ROWS_PER_FILE: u64 = 26_000;

/// Alternating rounds of arrow-rs alone and weir (`WEIR_BENCH_ROUNDS`,
/// default 3).
fn rounds_setting() -> usize {
    std::env::var("WEIR_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1)
}

fn files_setting() -> u64 {
    std::env::var("WEIR_BENCH_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// The process's resident set now and its peak since the last reset, in
/// bytes (Linux).
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU seconds the process has used so far, all threads, user and system
/// (Linux `/proc/self/stat`, in clock ticks of 1/100 s).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// Resets the peak resident set to the current one (Linux `clear_refs` 5).
fn reset_peak() -> u64 {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    memory().0
}

/// Flushes written files to disk, so one measured phase does not pay for
/// the writeback of what the one before wrote.
fn settle() {
    let _ = std::process::Command::new("sync").status();
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// The data files of a table just written (each live), in the order written.
fn data_files(table: &Path) -> Vec<(PathBuf, u64)> {
    let mut files: Vec<(PathBuf, u64)> = std::fs::read_dir(table)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "parquet"))
        .map(|e| (e.path(), e.metadata().unwrap().len()))
        .collect();
    files.sort();
    files
}

/// arrow-rs alone: groups of up to the target's bytes, each read file by
/// file into one `ArrowWriter`, `CONCURRENCY` groups at a time.
fn arrow_alone(files: Vec<(PathBuf, u64)>, out: &Path) -> (u64, u64) {
    let mut groups: Vec<Vec<PathBuf>> = vec![Vec::new()];
    let mut bytes = 0;
    for (path, size) in files {
        if bytes + size > TARGET && !groups.last().unwrap().is_empty() {
            groups.push(Vec::new());
            bytes = 0;
        }
        bytes += size;
        groups.last_mut().unwrap().push(path);
    }
    std::fs::create_dir_all(out).unwrap();
    let queue = Arc::new(Mutex::new(groups.into_iter().enumerate().collect::<Vec<_>>()));
    let written = Arc::new(Mutex::new((0u64, 0u64)));
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (queue, written, out) = (queue.clone(), written.clone(), out.to_path_buf());
            std::thread::spawn(move || loop {
                let Some((n, group)) = queue.lock().unwrap().pop() else {
                    break;
                };
                let props = WriterProperties::builder()
                    .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap()))
                    .build();
                let file = std::fs::File::create(out.join(format!("group-{n}.parquet"))).unwrap();
                let mut writer: Option<ArrowWriter<std::fs::File>> = None;
                let mut rows = 0;
                for path in group {
                    let bytes = Bytes::from(std::fs::read(path).unwrap());
                    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
                        .unwrap()
                        .with_batch_size(8192)
                        .build()
                        .unwrap();
                    for batch in reader {
                        let batch = batch.unwrap();
                        rows += batch.num_rows() as u64;
                        let w = writer.get_or_insert_with(|| {
                            ArrowWriter::try_new(file.try_clone().unwrap(), batch.schema(), Some(props.clone()))
                                .unwrap()
                        });
                        w.write(&batch).unwrap();
                    }
                }
                writer.unwrap().close().unwrap();
                let mut w = written.lock().unwrap();
                w.0 += 1;
                w.1 += rows;
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let w = *written.lock().unwrap();
    w
}

fn python_optimize(table: &Path) -> Option<serde_json::Value> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".venv-readers/bin/python");
    if !python.exists() {
        eprintln!("NOTE: .venv-readers is missing (scripts/test.sh makes it); the Python comparison is left out");
        return None;
    }
    let out = std::process::Command::new(python)
        .arg(root.join("benches/python/delta_optimize.py"))
        .arg(table)
        .arg(TARGET.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

#[tokio::main]
async fn main() {
    let files = files_setting();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("source");
    println!("making a Delta table of {files} files ...");
    with_payload(ROWS_PER_FILE)
        .write_stream()
        .checkpoint_location(dir.path().join("chk"))
        .writer_parallelism(1)
        .stop_after_batch(BatchId(files - 1))
        .start(DeltaSink::try_new(source.to_str().unwrap()).unwrap())
        .await
        .unwrap()
        .await_termination()
        .await
        .unwrap();
    let inputs = data_files(&source);
    let total: u64 = inputs.iter().map(|(_, s)| s).sum();
    let rows = files * ROWS_PER_FILE;
    println!(
        "compaction of {} files ({:.2} MiB each, {:.0} MiB, {rows} rows) into {} MiB files, {CONCURRENCY} rewrites at once",
        inputs.len(),
        mib(total) / inputs.len() as f64,
        mib(total),
        TARGET >> 20
    );
    let python_table = dir.path().join("python");
    copy_dir(&source, &python_table);

    // Alternating rounds on a fresh copy each, the medians reported: the
    // disk's own variation moves single runs by 10% and more.
    let (mut arrow_times, mut weir_times, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut arrow_peak, mut weir_peak, mut arrow_files) = (0, 0, 0);
    let mut report = Default::default();
    for round in 0..rounds_setting() {
        let weir_table = dir.path().join(format!("weir-{round}"));
        let arrow_out = dir.path().join(format!("arrow-{round}"));
        copy_dir(&source, &weir_table);

        settle();
        let before = reset_peak();
        let (started, cpu) = (Instant::now(), cpu_seconds());
        let (files_out, arrow_rows) = arrow_alone(inputs.clone(), &arrow_out);
        let arrow_time = started.elapsed().as_secs_f64();
        let arrow_cpu = cpu_seconds() - cpu;
        arrow_peak = arrow_peak.max(memory().1.saturating_sub(before));
        arrow_files = files_out;
        assert_eq!(arrow_rows, rows);

        settle();
        let before = reset_peak();
        let (started, cpu) = (Instant::now(), cpu_seconds());
        // When the plan was made, the last group rewritten, the commit made.
        let marks = Arc::new(Mutex::new([0.0f64; 3]));
        let seen = marks.clone();
        let done: weir_core::maintenance::CompactReport = Compact::new(weir_table.to_str().unwrap())
            .unwrap()
            .with_target_file_size(TARGET)
            .with_max_concurrent_rewrites(CONCURRENCY)
            .with_progress(move |event| {
                let at = started.elapsed().as_secs_f64();
                let mut marks = seen.lock().unwrap();
                match event {
                    CompactProgress::Planned { .. } => marks[0] = at,
                    CompactProgress::Rewritten { .. } => marks[1] = at,
                    CompactProgress::Committed { .. } => marks[2] = at,
                    _ => {}
                }
            })
            .await
            .unwrap();
        let weir_time = started.elapsed().as_secs_f64();
        let [planned, rewritten, committed] = *marks.lock().unwrap();
        let weir_cpu = cpu_seconds() - cpu;
        weir_peak = weir_peak.max(memory().1.saturating_sub(before));
        assert_eq!(done.rows, rows, "{done:?}");
        assert_eq!(done.files_removed as u64, files);
        println!(
            "   round {round}: arrow-rs alone {arrow_time:.2} s ({arrow_cpu:.1} s of CPU), weir {weir_time:.2} s ({weir_cpu:.1} s of CPU), ratio {:.2}",
            arrow_time / weir_time
        );
        println!(
            "            weir: planning {planned:.2} s, rewriting {:.2} s, commit {:.2} s, after the commit {:.2} s",
            rewritten - planned,
            committed - rewritten,
            weir_time - committed
        );
        arrow_times.push(arrow_time);
        weir_times.push(weir_time);
        ratios.push(arrow_time / weir_time);
        report = done;
        let _ = std::fs::remove_dir_all(&weir_table);
        let _ = std::fs::remove_dir_all(&arrow_out);
    }
    let (arrow_time, weir_time) = (median(&arrow_times), median(&weir_times));
    let ratio = median(&ratios);

    println!("   arrow-rs alone (read + rewrite, no table): {arrow_time:>7.2} s   {arrow_files} files (median)");
    println!(
        "   weir Compact (rewrite + commit):           {weir_time:>7.2} s   {} files in {} commit (median)",
        report.files_added,
        report.commits.len()
    );
    println!(
        "   weir's speed / arrow-rs alone's            {ratio:>7.2}   (median of the rounds' ratios; target >= 0.8)"
    );
    settle();
    if let Some(py) = python_optimize(&python_table) {
        let secs = py["seconds"].as_f64().unwrap();
        println!(
            "   Python deltalake optimize.compact():       {secs:>7.2} s   {} files",
            py["files_added"]
        );
        println!(
            "   Python's time / weir's                     {:>7.2}",
            secs / weir_time
        );
        println!(
            "   Python's peak resident set                 {:>7.0} MiB",
            py["max_rss_mib"].as_f64().unwrap_or(0.0)
        );
    }
    let bound = TARGET * CONCURRENCY as u64;
    println!(
        "   peak memory growth: weir {:.0} MiB, arrow-rs alone {:.0} MiB; bound target x concurrency = {:.0} MiB, table {:.0} MiB   ({})",
        mib(weir_peak),
        mib(arrow_peak),
        mib(bound),
        mib(total),
        if weir_peak <= bound { "within the bound" } else { "OVER the bound" }
    );

    iceberg_round(files).await;
}

/// Every Parquet file under `dir`, in name order, with its size.
fn parquet_under(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = e.path();
        if path.is_dir() {
            out.extend(parquet_under(&path));
        } else if path.extension().is_some_and(|x| x == "parquet") {
            out.push((path, e.metadata().unwrap().len()));
        }
    }
    out.sort();
    out
}

/// One round on an Iceberg table (SQL catalog on SQLite, local warehouse)
/// of the same files: weir's Iceberg `Compact` against arrow-rs alone.
/// (An Iceberg table names its files by absolute path, so the rounds
/// above, on copies, are not repeated here.)
async fn iceberg_round(files: u64) {
    let dir = tempfile::tempdir().unwrap();
    let uri = format!("sqlite://{}", dir.path().join("catalog.db").display());
    let catalog = Arc::new(
        weir_catalog::SqlCatalog::connect("lake", &uri, dir.path().join("wh").to_str().unwrap())
            .await
            .unwrap(),
    );
    println!("making an Iceberg table of {files} files ...");
    with_payload(ROWS_PER_FILE)
        .write_stream()
        .checkpoint_location(dir.path().join("chk"))
        .writer_parallelism(1)
        .stop_after_batch(BatchId(files - 1))
        .start(weir_iceberg::IcebergSink::try_new(catalog.clone(), "bench.t").unwrap())
        .await
        .unwrap()
        .await_termination()
        .await
        .unwrap();
    let inputs = parquet_under(&dir.path().join("wh"));
    assert_eq!(inputs.len() as u64, files);

    settle();
    let before = reset_peak();
    let (started, cpu) = (Instant::now(), cpu_seconds());
    let (_, arrow_rows) = arrow_alone(inputs, &dir.path().join("arrow"));
    let arrow_time = started.elapsed().as_secs_f64();
    let arrow_cpu = cpu_seconds() - cpu;
    let arrow_peak = memory().1.saturating_sub(before);
    assert_eq!(arrow_rows, files * ROWS_PER_FILE);

    settle();
    let before = reset_peak();
    let (started, cpu) = (Instant::now(), cpu_seconds());
    let catalog: Arc<dyn weir_iceberg::Catalog> = catalog;
    let done = weir_iceberg::Compact::new(catalog, "bench.t")
        .unwrap()
        .with_target_file_size(TARGET)
        .with_max_concurrent_rewrites(CONCURRENCY)
        .await
        .unwrap();
    let weir_time = started.elapsed().as_secs_f64();
    let weir_cpu = cpu_seconds() - cpu;
    let weir_peak = memory().1.saturating_sub(before);
    assert_eq!(done.rows, files * ROWS_PER_FILE, "{done:?}");
    println!("Iceberg, one round on the same kind of table:");
    println!(
        "   arrow-rs alone {arrow_time:.2} s ({arrow_cpu:.1} s of CPU), weir's Iceberg Compact {weir_time:.2} s ({weir_cpu:.1} s of CPU, {} files in {} commit)",
        done.files_added,
        done.commits.len()
    );
    println!(
        "   weir's speed / arrow-rs alone's            {:>7.2}",
        arrow_time / weir_time
    );
    println!(
        "   peak memory growth: weir {:.0} MiB, arrow-rs alone {:.0} MiB (bound {:.0} MiB)",
        mib(weir_peak),
        mib(arrow_peak),
        mib(TARGET * CONCURRENCY as u64)
    );
}
