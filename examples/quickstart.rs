//! The quickstart: a stream of payments into the table
//! `lake.bronze.payments`, exactly once, on the embedded default lake
//! (`./weir-lake`, or `--lake DIR` / `WEIR_LAKE`): catalog `lake` is SQLite
//! at `<lake>/catalog.db`, tables live under `<lake>/warehouse`, and a new
//! table is Delta.
//!
//! Each run streams `--batches N` more micro-batches of `--rows-per-batch R`
//! payments from the deterministic rate source, printing each batch's
//! progress, then reads the table back (the files its Delta log lists) and
//! checks that every payment id is there exactly once.
//!
//! ```text
//! cargo run --release -p weir-examples --bin quickstart -- --batches 10
//! ```

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use weir::catalog::Config;
use weir::checkpoint::Checkpoint;
use weir::prelude::*;

const TABLE: &str = "lake.bronze.payments";

struct Options {
    lake: PathBuf,
    batches: u64,
    total_batches: Option<u64>,
    rows_per_batch: u64,
    quiet: bool,
}

fn parse_options() -> std::result::Result<Options, String> {
    let mut options = Options {
        lake: weir::catalog::lake_dir(None),
        batches: 10,
        total_batches: None,
        rows_per_batch: 10_000,
        quiet: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--lake" => options.lake = PathBuf::from(value()?),
            "--batches" => options.batches = value()?.parse().map_err(|e| format!("--batches: {e}"))?,
            "--rows-per-batch" => {
                options.rows_per_batch = value()?.parse().map_err(|e| format!("--rows-per-batch: {e}"))?
            }
            "--total-batches" => {
                options.total_batches = Some(value()?.parse().map_err(|e| format!("--total-batches: {e}"))?)
            }
            "--quiet" => options.quiet = true,
            "-h" | "--help" => {
                return Err(
                    "usage: quickstart [--lake DIR] [--batches N | --total-batches N] [--rows-per-batch R] [--quiet]"
                        .into(),
                );
            }
            other => return Err(format!("unknown option {other}; see --help")),
        }
    }
    Ok(options)
}

/// Every row of the Delta table at `location`: (rows, distinct payment ids).
async fn read_back(location: &str) -> std::result::Result<(usize, usize), BoxError> {
    let url = deltalake::ensure_table_uri(location)?;
    let table = deltalake::open_table(url).await?;
    let (mut rows, mut ids) = (0, HashSet::new());
    for uri in table.get_file_uris()? {
        let path = uri.strip_prefix("file://").unwrap_or(&uri).to_string();
        for batch in ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path)?)?.build()? {
            let batch = batch?;
            rows += batch.num_rows();
            let column = batch.column_by_name("event_id").ok_or("no event_id column")?;
            ids.extend(column.as_primitive::<Int64Type>().values().iter().copied());
        }
    }
    Ok((rows, ids.len()))
}

#[tokio::main]
async fn main() -> std::result::Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter("warn")
        .with_writer(std::io::stderr)
        .init();
    let options = parse_options().map_err(|e| -> BoxError { e.into() })?;
    let catalogs = Catalogs::new(Config::embedded(&options.lake));
    let checkpoint = options.lake.join("checkpoints/payments-bronze");

    let before = Checkpoint::open_local(&checkpoint)?.status().await?.last_committed;
    // --total-batches counts earlier runs, so a killed and restarted run
    // ends at the same batch; --batches adds to what earlier runs did.
    let last = match options.total_batches {
        Some(total) => BatchId(total.max(1) - 1),
        None => BatchId(before.map(|b| b.0 + 1).unwrap_or(0) + options.batches.max(1) - 1),
    };
    println!(
        "streaming up to batch {last} ({} payments each) into {TABLE} (checkpoint {})",
        options.rows_per_batch,
        checkpoint.display()
    );
    let quiet = options.quiet;
    let query = read_stream(RateSource::rows_per_batch(options.rows_per_batch))
        .write_stream()
        .checkpoint_location(&checkpoint)
        .trigger(Trigger::processing_time(Duration::ZERO))
        .stop_after_batch(last)
        .on_progress(move |p| {
            if !quiet {
                println!(
                    "batch {:>4}: {:>7} rows in {:>7.1} ms ({:.0} rows/s)",
                    p.batch_id, p.input_rows, p.durations_ms.total, p.processed_rows_per_second
                )
            }
        })
        .to_table_in(&catalogs, TABLE, TableOptions::new())
        .await?;
    query.await_termination().await?;

    let table = catalogs.describe(TABLE).await?;
    println!(
        "{} is a {} table at {}: version {}, {} files, {} bytes",
        table.name,
        table.format,
        table.location,
        table.version.unwrap_or_default(),
        table.files,
        table.bytes
    );
    let (rows, distinct) = read_back(&table.location).await?;
    let expected = (last.0 + 1) * options.rows_per_batch;
    println!("read back {rows} payments, {distinct} distinct ids; expected {expected}");
    if rows as u64 != expected || distinct != rows {
        return Err(format!("the table does not hold every payment exactly once ({rows} rows, {distinct} ids)").into());
    }
    println!("every payment exactly once");
    Ok(())
}
