//! Exactly once through `foreach_batch`: a stream of payments where every
//! batch is written by a function as one Parquet file named after its batch
//! id, so a batch replayed after a crash rewrites the same file. The engine's
//! SIGKILL test runs this program (`examples/tests/it/kill.rs`).
//!
//! Each run streams `--batches N` more micro-batches of `--rows-per-batch R`
//! payments from the deterministic rate source into `<lake>/foreach/payments`
//! (`--lake DIR`, default `./weir-lake`), then reads
//! every file back and checks that each payment id is there exactly once.
//!
//! ```text
//! cargo run --release -p weir-examples --bin foreach-batch-files -- --batches 10
//! ```

#[path = "lake_options.rs"]
mod lake_options;

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::RecordBatch;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use weir_core::prelude::*;

use crate::lake_options::LakeOptions;

/// Writes a batch's rows to `<dir>/batch-<N>.parquet`, replacing any file of
/// an earlier attempt at the same batch in one rename.
fn write_batch_file(dir: &Path, batches: &[RecordBatch], batch_id: BatchId) -> std::result::Result<(), BoxError> {
    std::fs::create_dir_all(dir)?;
    let target = dir.join(format!("batch-{:010}.parquet", batch_id.0));
    let tmp = dir.join(format!(".batch-{:010}.parquet.tmp", batch_id.0));
    let file = std::fs::File::create(&tmp)?;
    let mut writer = ArrowWriter::try_new(file, RateSource::output_schema(), None)?;
    for b in batches {
        writer.write(b)?;
    }
    writer.into_inner()?.sync_all()?;
    std::fs::rename(&tmp, &target)?;
    Ok(())
}

/// Reads every batch file and returns (rows, distinct payment ids).
fn read_back(dir: &Path) -> std::result::Result<(usize, usize), BoxError> {
    let mut rows = 0;
    let mut ids = HashSet::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "parquet") {
            continue;
        }
        for batch in ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&path)?)?.build()? {
            let batch = batch?;
            rows += batch.num_rows();
            ids.extend(batch.column(0).as_primitive::<Int64Type>().values().iter().copied());
        }
    }
    Ok((rows, ids.len()))
}

#[tokio::main]
async fn main() -> std::result::Result<(), BoxError> {
    let options = LakeOptions::init("foreach-batch-files", 10, 10_000)?;
    let checkpoint = options.lake.join("checkpoints/foreach-payments");
    let output = options.lake.join("foreach/payments");

    let last = options.last_batch(&checkpoint).await?;
    println!(
        "streaming up to batch {last} ({} payments each) into {} (checkpoint {})",
        options.rows_per_batch,
        output.display(),
        checkpoint.display()
    );
    let quiet = options.quiet;

    let files = output.clone();
    let query = read_stream(RateSource::rows_per_batch(options.rows_per_batch))
        .write_stream()
        .query_name("foreach-payments")
        .checkpoint_location(&checkpoint)
        .trigger(Trigger::processing_time(Duration::ZERO))
        .stop_after_batch(last)
        .on_progress(move |p| {
            if quiet {
                return;
            }
            println!(
                "batch {:>4}: {:>7} rows in {:>7.1} ms ({:.0} rows/s)",
                p.batch_id, p.input_rows, p.durations_ms.total, p.processed_rows_per_second
            )
        })
        .foreach_batch(move |batches, batch_id| {
            let files = files.clone();
            async move { tokio::task::spawn_blocking(move || write_batch_file(&files, &batches, batch_id)).await? }
        })
        .await?;
    query.await_termination().await?;

    let (rows, distinct) = read_back(&output)?;
    let expected = (last.0 + 1) * options.rows_per_batch;
    println!("read back {rows} payments, {distinct} distinct ids; expected {expected}");
    if rows as u64 != expected || distinct != rows {
        return Err(
            format!("the output does not hold every payment exactly once ({rows} rows, {distinct} ids)").into(),
        );
    }
    println!("every payment exactly once");
    Ok(())
}
