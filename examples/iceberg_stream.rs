//! Streams the deterministic rate source into an Iceberg table of a SQL
//! catalog until the checkpoint holds `--total-batches` batches (counting
//! earlier runs), so a run that is killed and restarted ends at the same
//! batch.
//!
//! ```text
//! cargo run -p weir-examples --bin iceberg-stream -- --catalog sqlite://lake/catalog.db \
//!     --warehouse lake/warehouse --table bronze.payments --checkpoint chk/payments \
//!     --rows-per-batch 1000 --total-batches 100
//! ```

use std::sync::Arc;

use weir_core::prelude::*;
use weir_iceberg::{IcebergSink, SqlCatalog};

struct Options {
    catalog: String,
    warehouse: String,
    table: String,
    checkpoint: String,
    query_name: String,
    rows_per_batch: u64,
    total_batches: u64,
    partition_by: Vec<String>,
}

fn parse() -> std::result::Result<Options, String> {
    let mut o = Options {
        catalog: String::new(),
        warehouse: String::new(),
        table: String::new(),
        checkpoint: String::new(),
        query_name: "iceberg-stream".into(),
        rows_per_batch: 1000,
        total_batches: 10,
        partition_by: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--catalog" => o.catalog = value()?,
            "--warehouse" => o.warehouse = value()?,
            "--table" => o.table = value()?,
            "--checkpoint" => o.checkpoint = value()?,
            "--query-name" => o.query_name = value()?,
            "--rows-per-batch" => o.rows_per_batch = value()?.parse().map_err(|e| format!("{flag}: {e}"))?,
            "--total-batches" => o.total_batches = value()?.parse().map_err(|e| format!("{flag}: {e}"))?,
            "--partition-by" => o.partition_by.push(value()?),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if o.catalog.is_empty() || o.warehouse.is_empty() || o.table.is_empty() || o.checkpoint.is_empty() {
        return Err("usage: iceberg-stream --catalog URI --warehouse DIR --table NAMESPACE.TABLE --checkpoint DIR [--query-name N] [--rows-per-batch R] [--total-batches B] [--partition-by FIELD]".into());
    }
    Ok(o)
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let options = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(options).await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn run(o: Options) -> Result<()> {
    let catalog = SqlCatalog::connect("lake", &o.catalog, &o.warehouse).await?;
    let sink = IcebergSink::try_new(Arc::new(catalog), &o.table)?.with_partition_by(o.partition_by);
    let query = read_stream(RateSource::rows_per_batch(o.rows_per_batch))
        .write_stream()
        .query_name(o.query_name)
        .checkpoint_location(o.checkpoint)
        .stop_after_batch(BatchId(o.total_batches.max(1) - 1))
        .start(sink)
        .await?;
    query.await_termination().await
}
