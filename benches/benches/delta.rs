//! The Delta sink, as ratios measured in one run.
//!
//! 1. Throughput with 1M-row batches: weir's Delta sink against deltalake's
//!    own `RecordBatchWriter` writing and committing the same batches.
//! 2. Commit latency of 1,000-row batches at a table history of 10, 1,000
//!    and 10,000 commits (the history is made of 1-row batches).
//! 3. 1,000-row micro-batches, exactly once, against Python deltalake
//!    checking the txn version before each `write_deltalake` (skipped with a
//!    notice if the readers' Python environment is missing).
//!
//! `cargo bench -p weir-benches --bench delta`; `WEIR_BENCH_HISTORY=1000`
//! stops the history at 1,000 commits for a quicker run; `WEIR_BENCH_PARTS=2`
//! runs part 2 alone.

use std::path::Path;
use std::time::Instant;

use deltalake::writer::{DeltaWriter as _, RecordBatchWriter};
use weir_benches::{latency_by_history, mean, median, part, print_latencies, python_per_batch};
use weir_core::prelude::*;
use weir_delta::DeltaSink;

fn url(path: &Path) -> url::Url {
    std::fs::create_dir_all(path).unwrap();
    url::Url::from_directory_path(std::fs::canonicalize(path).unwrap()).unwrap()
}

/// Runs the rate source into the table until batch `last`, returning the
/// progress of this run's batches.
async fn stream(table: &Path, chk: &Path, name: &str, rows: u64, last: u64) -> Vec<QueryProgress> {
    let sink = DeltaSink::try_new(table.to_str().unwrap()).unwrap();
    let q = read_stream(RateSource::rows_per_batch(rows))
        .write_stream()
        .query_name(name)
        .checkpoint_location(chk)
        .stop_after_batch(BatchId(last))
        .start(sink)
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    q.recent_progress()
}

async fn weir_rows_per_second(rows: u64, batches: u64) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    stream(&dir.path().join("t"), &dir.path().join("c"), "bench", rows, batches - 1).await;
    (rows * batches) as f64 / started.elapsed().as_secs_f64()
}

async fn deltalake_rows_per_second(rows: u64, batches: u64) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    // The table exists before timing starts, as weir's is created once.
    let sink_dir = dir.path().join("t");
    stream(&sink_dir, &dir.path().join("c"), "bench", 1, 0).await;
    let mut table = deltalake::open_table(url(&sink_dir)).await.unwrap();
    let started = Instant::now();
    for b in 0..batches {
        let mut writer = RecordBatchWriter::for_table(&table).unwrap();
        let (from, to) = (b * rows, (b + 1) * rows);
        for lo in (from..to).step_by(64 * 1024) {
            writer
                .write(RateSource::generate(lo, (lo + 64 * 1024).min(to)))
                .await
                .unwrap();
        }
        writer.flush_and_commit(&mut table).await.unwrap();
    }
    (rows * batches) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let top: u64 = std::env::var("WEIR_BENCH_HISTORY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);

    if part(1) {
        let (rows, batches) = (1_000_000, 5);
        weir_rows_per_second(rows, 1).await;
        let (mut weir, mut base) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            weir.push(weir_rows_per_second(rows, batches).await);
            base.push(deltalake_rows_per_second(rows, batches).await);
        }
        let (weir, base) = (mean(&weir), mean(&base));
        println!("1. throughput, {batches} batches of {rows} rows (mean of 3 alternating rounds):");
        println!("   weir Delta sink          {weir:>12.0} rows/s");
        println!("   deltalake RecordBatchWriter {base:>9.0} rows/s");
        println!("   ratio weir / deltalake   {:>12.2}   (target >= 0.9)", weir / base);
    }

    if part(2) {
        let levels: Vec<u64> = [10, 1_000, 10_000].into_iter().filter(|l| *l <= top).collect();
        let history = tempfile::tempdir().unwrap();
        let table = history.path().join("t");
        let latencies = latency_by_history(&levels, 20, |name, chk, rows, last| {
            let table = table.clone();
            async move { stream(&table, &chk, name, rows, last).await }
        })
        .await;
        print_latencies(
            "2. 1,000-row batches by table history (median of 19 batches):",
            &latencies,
            "commits",
        );
    }

    if part(3) {
        let n = 300;
        let dir = tempfile::tempdir().unwrap();
        let progress = stream(&dir.path().join("t"), &dir.path().join("c"), "bench", 1000, n - 1).await;
        let totals: Vec<f64> = progress.iter().map(|p| p.durations_ms.total).collect();
        let weir_first = median(&totals[1..21]);
        let weir_last = median(&totals[totals.len() - 20..]);
        println!("3. {n} exactly-once micro-batches of 1,000 rows (medians of the first and last 20):");
        println!("   weir          {weir_first:>7.2} ms per batch at first, {weir_last:>7.2} ms at {n}");
        let phase =
            |f: fn(&QueryProgress) -> f64| median(&progress[progress.len() - 20..].iter().map(f).collect::<Vec<_>>());
        if std::env::var_os("WEIR_BENCH_DUMP").is_some() {
            for p in &progress[progress.len() - 20..] {
                let d = p.durations_ms;
                eprintln!(
                    "batch {} total {:.1} plan {:.1} write {:.1} commit {:.1} record {:.1}",
                    p.batch_id, d.total, d.plan, d.write, d.commit, d.record
                );
            }
        }
        println!(
            "   weir at {n}, by phase: plan {:.2}, read {:.2}, write {:.2}, commit {:.2}, record {:.2} ms",
            phase(|p| p.durations_ms.plan),
            phase(|p| p.durations_ms.read),
            phase(|p| p.durations_ms.write),
            phase(|p| p.durations_ms.commit),
            phase(|p| p.durations_ms.record)
        );
        if let Some(py) = python_per_batch("delta_microbatches.py", n) {
            let py_first = median(&py[1..21]);
            let py_last = median(&py[py.len() - 20..]);
            println!("   Python deltalake {py_first:>7.2} ms per batch at first, {py_last:>7.2} ms at {n}");
            println!(
                "   ratio Python / weir at {n} {:>7.2}   (target >= 5)",
                py_last / weir_last
            );
        }
    }
}
