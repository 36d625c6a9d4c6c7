//! The Iceberg sink, as ratios measured in one run.
//!
//! 1. Throughput with 1M-row batches: weir's Iceberg sink (writing and
//!    committing) against iceberg's own writers writing the same Parquet
//!    files with no commit.
//! 2. Commit latency of 1,000-row batches at a table history of 10, 1,000
//!    and 10,000 snapshots (the history is made of 1-row batches;
//!    `WEIR_BENCH_HISTORY=1000` stops at 1,000), and the size of the
//!    metadata file every commit writes at the top level.
//! 3. 1,000-row micro-batches, exactly once, against pyiceberg loading the
//!    table and reading the last batch id before each `append` (left out
//!    with a notice if the readers' Python environment is missing).
//! 4. Part 2 again with an `ExpiryPolicy` on the sink (every 100 commits,
//!    the last 100 snapshots kept): the history a streaming table keeps.
//!
//! `cargo bench -p weir-benches --bench iceberg`; `WEIR_BENCH_PARTS=2` runs
//! part 2 alone.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::DataFileFormat;
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::location_generator::{DefaultFileNameGenerator, DefaultLocationGenerator};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use weir_benches::{latency_by_history, mean, median, part, print_latencies, python_per_batch};
use weir_catalog::SqlCatalog;
use weir_core::prelude::*;
use weir_iceberg::{Catalog, ExpiryPolicy, IcebergSink};

const TABLE: &str = "bench.t";

async fn catalog(lake: &Path) -> Arc<SqlCatalog> {
    let uri = format!("sqlite://{}", lake.join("catalog.db").display());
    Arc::new(
        SqlCatalog::connect("lake", &uri, lake.join("wh").to_str().unwrap())
            .await
            .unwrap(),
    )
}

/// Runs the rate source into the table until batch `last`, returning the
/// progress of this run's batches.
async fn stream(lake: &Path, chk: &Path, name: &str, rows: u64, last: u64) -> Vec<QueryProgress> {
    stream_with(lake, chk, name, rows, last, None).await
}

async fn stream_with(
    lake: &Path,
    chk: &Path,
    name: &str,
    rows: u64,
    last: u64,
    expiry: Option<ExpiryPolicy>,
) -> Vec<QueryProgress> {
    let mut sink = IcebergSink::try_new(catalog(lake).await, TABLE).unwrap();
    if let Some(policy) = expiry {
        sink = sink.with_snapshot_expiry(policy);
    }
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
    // The table exists before timing starts, as for the baseline.
    stream(dir.path(), &dir.path().join("c0"), "setup", 1, 0).await;
    let started = Instant::now();
    stream(dir.path(), &dir.path().join("c"), "bench", rows, batches - 1).await;
    (rows * batches) as f64 / started.elapsed().as_secs_f64()
}

/// iceberg's writers (Parquet, rolling, data file) writing the same rows as
/// the same Parquet files, with no commit.
async fn iceberg_rows_per_second(rows: u64, batches: u64) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    stream(dir.path(), &dir.path().join("c0"), "setup", 1, 0).await;
    let cat = catalog(dir.path()).await;
    let table = cat
        .load(&weir_iceberg::parse_ident(TABLE).unwrap())
        .await
        .unwrap()
        .unwrap();
    let schema = table.metadata.current_schema().clone();
    let arrow = Arc::new(schema_to_arrow_schema(&schema).unwrap());
    let locations = DefaultLocationGenerator::new(&table.metadata).unwrap();
    let started = Instant::now();
    for b in 0..batches {
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .build();
        let rolling = RollingFileWriterBuilder::new(
            ParquetWriterBuilder::new(props, schema.clone()),
            128 * 1024 * 1024,
            cat.file_io().clone(),
            locations.clone(),
            DefaultFileNameGenerator::new(format!("baseline-{b}"), None, DataFileFormat::Parquet),
        );
        let mut writer = DataFileWriterBuilder::new(rolling).build(None).await.unwrap();
        let (from, to) = (b * rows, (b + 1) * rows);
        for lo in (from..to).step_by(64 * 1024) {
            let batch = RateSource::generate(lo, (lo + 64 * 1024).min(to));
            let columns = batch
                .columns()
                .iter()
                .zip(arrow.fields())
                .map(|(c, f)| arrow_cast::cast(c, f.data_type()).unwrap())
                .collect();
            writer
                .write(RecordBatch::try_new(arrow.clone(), columns).unwrap())
                .await
                .unwrap();
        }
        writer.close().await.unwrap();
    }
    (rows * batches) as f64 / started.elapsed().as_secs_f64()
}

/// The size of the largest `*.metadata.json` under `dir`.
fn largest_metadata_file(dir: &Path) -> u64 {
    let mut largest = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            largest = largest.max(largest_metadata_file(&path));
        } else if path.to_string_lossy().ends_with(".metadata.json") {
            largest = largest.max(entry.metadata().map(|m| m.len()).unwrap_or(0));
        }
    }
    largest
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
            base.push(iceberg_rows_per_second(rows, batches).await);
        }
        let (weir, base) = (mean(&weir), mean(&base));
        println!("1. throughput, {batches} batches of {rows} rows (mean of 3 alternating rounds):");
        println!("   weir Iceberg sink (write + commit) {weir:>12.0} rows/s");
        println!("   iceberg writers (write only)       {base:>12.0} rows/s");
        println!(
            "   ratio weir / iceberg               {:>12.2}   (target >= 0.9)",
            weir / base
        );
    }

    if part(2) {
        let levels: Vec<u64> = [10, 1_000, 10_000].into_iter().filter(|l| *l <= top).collect();
        let history = tempfile::tempdir().unwrap();
        let lake = history.path().to_path_buf();
        let latencies = latency_by_history(&levels, 20, |name, chk, rows, last| {
            let lake = lake.clone();
            async move { stream(&lake, &chk, name, rows, last).await }
        })
        .await;
        print_latencies(
            "2. 1,000-row batches by table history (median of 19 batches):",
            &latencies,
            "snapshots",
        );
        // Every commit writes (and syncs) a metadata file listing every
        // snapshot: its size at the top level is the floor under the ratio.
        println!(
            "   metadata file at {} snapshots: {:.1} MB",
            latencies.last().unwrap().0,
            largest_metadata_file(&lake) as f64 / 1e6
        );
    }

    if part(3) {
        let n = 300;
        let dir = tempfile::tempdir().unwrap();
        let progress = stream(dir.path(), &dir.path().join("c"), "bench", 1000, n - 1).await;
        let totals: Vec<f64> = progress.iter().map(|p| p.durations_ms.total).collect();
        let weir_first = median(&totals[1..21]);
        let weir_last = median(&totals[totals.len() - 20..]);
        let phase =
            |f: fn(&QueryProgress) -> f64| median(&progress[progress.len() - 20..].iter().map(f).collect::<Vec<_>>());
        println!("3. {n} exactly-once micro-batches of 1,000 rows (medians of the first and last 20):");
        println!("   weir          {weir_first:>7.2} ms per batch at first, {weir_last:>7.2} ms at {n}");
        println!(
            "   weir at {n}, by phase: plan {:.2}, write {:.2}, commit {:.2}, record {:.2} ms",
            phase(|p| p.durations_ms.plan),
            phase(|p| p.durations_ms.write),
            phase(|p| p.durations_ms.commit),
            phase(|p| p.durations_ms.record)
        );
        if let Some(py) = python_per_batch("iceberg_microbatches.py", n) {
            let py_first = median(&py[1..21]);
            let py_last = median(&py[py.len() - 20..]);
            println!("   pyiceberg     {py_first:>7.2} ms per batch at first, {py_last:>7.2} ms at {n}");
            println!(
                "   ratio pyiceberg / weir at {n} {:>7.2}   (target >= 5)",
                py_last / weir_last
            );
        }
    }

    if part(4) {
        // The answer to a growing history: the sink expires snapshots in the
        // background, so the metadata file stays small.
        let policy = ExpiryPolicy {
            table_properties_first: false,
            ..ExpiryPolicy::STREAMING
        };
        let levels: Vec<u64> = [10, 10_000].into_iter().filter(|l| *l <= top.max(10)).collect();
        let history = tempfile::tempdir().unwrap();
        let lake = history.path().to_path_buf();
        let latencies = latency_by_history(&levels, 20, |name, chk, rows, last| {
            let lake = lake.clone();
            async move { stream_with(&lake, &chk, name, rows, last, Some(policy)).await }
        })
        .await;
        print_latencies(
            "4. the same with ExpiryPolicy { every 100 commits, the last 100 snapshots kept }:",
            &latencies,
            "commits",
        );
        let table = catalog(&lake)
            .await
            .load(&weir_iceberg::parse_ident(TABLE).unwrap())
            .await
            .unwrap()
            .unwrap();
        let size = std::fs::metadata(table.metadata_location.trim_start_matches("file://"))
            .map(|m| m.len())
            .unwrap_or(0);
        println!(
            "   at the end: {} snapshots, metadata file {:.2} MB",
            table.metadata.snapshots().len(),
            size as f64 / 1e6
        );
    }
}
