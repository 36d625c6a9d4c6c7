//! Payments into a directory of Parquet files, exactly once through the
//! file sink's metadata log, partitioned by a bucket of the account.
//!
//!     cargo run -p weir-examples --bin file-sink -- [--lake DIR] [--batches N | --total-batches N] [--rows-per-batch N] [--quiet]
//!
//! Output goes to `<lake>/files/payments`, the checkpoint to
//! `<lake>/checkpoints/files-payments`. The program reads the output back
//! through the log and checks every payment is there exactly once.

#[path = "lake_options.rs"]
mod lake_options;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{RecordBatch, StringArray};
use weir_core::prelude::*;
use weir_files::{FileLog, FileSink};

use crate::lake_options::LakeOptions;

/// The rate source's rows with `bucket` (`b0` to `b3`, from the account).
fn with_bucket(batch: RecordBatch) -> std::result::Result<RecordBatch, BoxError> {
    let accounts = batch.column(2).as_primitive::<Int64Type>();
    let buckets: StringArray = accounts.iter().map(|a| a.map(|a| format!("b{}", a % 4))).collect();
    let mut fields: Vec<arrow_schema::Field> = batch.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(arrow_schema::Field::new("bucket", arrow_schema::DataType::Utf8, true));
    let mut columns = batch.columns().to_vec();
    columns.push(Arc::new(buckets));
    Ok(RecordBatch::try_new(
        Arc::new(arrow_schema::Schema::new(fields)),
        columns,
    )?)
}

#[tokio::main]
async fn main() -> std::result::Result<(), BoxError> {
    let options = LakeOptions::init("file-sink", 10, 1_000)?;
    let checkpoint = options.lake.join("checkpoints/files-payments");
    let output = options.lake.join("files/payments");
    let last = options.last_batch(&checkpoint).await?;
    println!(
        "streaming up to batch {last} into {} through its metadata log",
        output.display()
    );
    let quiet = options.quiet;
    let sink = FileSink::try_new(output.to_str().ok_or("a non-UTF-8 path")?)?.with_partition_by(["bucket"]);
    let query = read_stream(RateSource::rows_per_batch(options.rows_per_batch))
        .map_batches(with_bucket)
        .write_stream()
        .query_name("files-payments")
        .checkpoint_location(&checkpoint)
        .trigger(Trigger::processing_time(Duration::ZERO))
        .stop_after_batch(last)
        .on_progress(move |p| {
            if !quiet {
                println!(
                    "batch {:>4}: {:>7} rows in {:>7.1} ms",
                    p.batch_id, p.input_rows, p.durations_ms.total
                )
            }
        })
        .start(sink)
        .await?;
    query.await_termination().await?;

    let log = FileLog::open(output.to_str().ok_or("a non-UTF-8 path")?, &Default::default())?;
    let mut rows = 0;
    let mut ids = HashSet::new();
    for b in log.read().await? {
        rows += b.num_rows();
        ids.extend(b.column(0).as_primitive::<Int64Type>().values().iter().copied());
    }
    let expected = (last.0 + 1) * options.rows_per_batch;
    println!(
        "read back {rows} payments through the log, {} distinct ids; expected {expected}",
        ids.len()
    );
    if rows as u64 != expected || ids.len() != rows {
        return Err(format!(
            "the output does not hold every payment exactly once ({rows} rows, {} ids)",
            ids.len()
        )
        .into());
    }
    println!("every payment exactly once");
    Ok(())
}
