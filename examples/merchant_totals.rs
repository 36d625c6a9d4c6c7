//! The second query of "one stream, three sinks": per-merchant totals of
//! each second of event time, with a two-second watermark, in Append mode,
//! into a table by name in an embedded lake (SQLite catalog, Delta or
//! Iceberg). Each window lands once, when the watermark has passed its end.
//! The query stops after `--total-batches` batches (counting earlier runs),
//! so a run that is killed and restarted ends at the same batch.
//!
//! ```text
//! cargo run -p weir-examples --bin merchant-totals -- --lake lake --format iceberg \
//!     --rows-per-batch 500 --total-batches 200
//! ```

use std::time::Duration;

use weir::catalog::Config;
use weir::prelude::*;
use weir::sql::{avg, col, count, max, sum, window};

const USAGE: &str =
    "usage: merchant-totals --lake DIR [--format delta|iceberg] [--rows-per-batch R] [--total-batches B]";

struct Options {
    lake: String,
    format: TableFormat,
    rows_per_batch: u64,
    total_batches: u64,
}

fn options() -> std::result::Result<Options, String> {
    let mut o = Options {
        lake: String::new(),
        format: TableFormat::Delta,
        rows_per_batch: 500,
        total_batches: 100,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--lake" => o.lake = value()?,
            "--format" => {
                o.format = match value()?.as_str() {
                    "delta" => TableFormat::Delta,
                    "iceberg" => TableFormat::Iceberg,
                    other => return Err(format!("unknown format {other}\n{USAGE}")),
                }
            }
            "--rows-per-batch" => o.rows_per_batch = value()?.parse().map_err(|e| format!("{flag}: {e}"))?,
            "--total-batches" => o.total_batches = value()?.parse().map_err(|e| format!("{flag}: {e}"))?,
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    if o.lake.is_empty() {
        return Err(format!("--lake is required\n{USAGE}"));
    }
    Ok(o)
}

async fn run(o: Options) -> Result<()> {
    let catalogs = Catalogs::new(Config::embedded(std::path::Path::new(&o.lake)));
    let totals = read_stream(RateSource::rows_per_batch(o.rows_per_batch))
        .sql("SELECT ts, account_id % 5 AS merchant_id, amount FROM input")
        .with_watermark("ts", Duration::from_secs(2))
        .group_by([window("ts", Duration::from_secs(1)), col("merchant_id")])
        .agg([sum("amount"), count(), max("amount"), avg("amount")]);
    let query = totals
        .write_stream()
        .query_name("merchant-totals")
        .checkpoint_location(format!("{}/chk/merchant-totals", o.lake))
        .output_mode(OutputMode::Append)
        .stop_after_batch(BatchId(o.total_batches.max(1) - 1))
        .to_table_in(
            &catalogs,
            "silver.merchant_totals",
            TableOptions::new().format(o.format),
        )
        .await?;
    query.await_termination().await?;
    Ok(())
}

#[tokio::main]
async fn main() {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(o).await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
