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
//! cargo run --release -p weir-quickstart -- --batches 10
//! ```

#[path = "../../delta_read.rs"]
mod delta_read;
#[path = "../../lake_options.rs"]
mod lake_options;

use std::collections::HashSet;
use std::time::Duration;

use weir::catalog::Config;
use weir::prelude::*;

use crate::delta_read::delta_event_ids;
use crate::lake_options::LakeOptions;

const TABLE: &str = "lake.bronze.payments";

#[tokio::main]
async fn main() -> std::result::Result<(), BoxError> {
    let options = LakeOptions::init("quickstart", 10, 10_000)?;
    let catalogs = Catalogs::new(Config::embedded(&options.lake));
    let checkpoint = options.lake.join("checkpoints/payments-bronze");

    let last = options.last_batch(&checkpoint).await?;
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
    let ids = delta_event_ids(&table.location).await?;
    let (rows, distinct) = (ids.len(), ids.iter().collect::<HashSet<_>>().len());
    let expected = (last.0 + 1) * options.rows_per_batch;
    println!("read back {rows} payments, {distinct} distinct ids; expected {expected}");
    if rows as u64 != expected || distinct != rows {
        return Err(format!("the table does not hold every payment exactly once ({rows} rows, {distinct} ids)").into());
    }
    println!("every payment exactly once");
    Ok(())
}
