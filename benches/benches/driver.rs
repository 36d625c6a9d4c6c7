//! Driver overhead and throughput of weir-core, as ratios to a baseline
//! measured in the same run.
//!
//! 1. Overhead per batch: 1-row batches into a no-op sink, with the two
//!    durable checkpoint writes (`offsets/N`, `commits/N`) of every batch,
//!    against the same two durable writes made directly.
//! 2. Throughput: 1M-row batches from the rate source into a no-op sink,
//!    against a plain pipeline that generates the same rows and moves them
//!    through bounded channels into counting tasks, as the engine does.
//!
//! `cargo bench -p weir-benches --bench driver` (env `WEIR_BENCH_BATCHES`
//! scales the first part).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use weir_benches::{ms, NoopSink};
use weir_core::checkpoint::{CheckpointStore, LocalStore};
use weir_core::prelude::*;

async fn engine_per_batch(batches: u64) -> Duration {
    let chk = tempfile::tempdir().expect("tempdir");
    let sink = NoopSink::default();
    let started = Instant::now();
    let q = read_stream(RateSource::rows_per_batch(1))
        .write_stream()
        .checkpoint_location(chk.path())
        .writer_parallelism(1)
        .stop_after_batch(BatchId(batches - 1))
        .start(sink.clone())
        .await
        .expect("start");
    q.await_termination().await.expect("run");
    let elapsed = started.elapsed();
    assert_eq!(sink.rows(), batches);
    elapsed / batches as u32
}

async fn raw_writes_per_batch(batches: u64) -> Duration {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Arc::new(LocalStore::open(dir.path()).expect("store"));
    let entry = Bytes::from_static(br#"{"version":1,"batch_id":0,"timestamp_ms":0,"watermark_ms":0,"sources":[]}"#);
    let started = Instant::now();
    for n in 0..batches {
        store
            .put_if_absent(&format!("offsets/{n}"), entry.clone())
            .await
            .expect("write");
        store
            .put_if_absent(&format!("commits/{n}"), entry.clone())
            .await
            .expect("write");
    }
    started.elapsed() / batches as u32
}

async fn engine_rows_per_second(rows_per_batch: u64, batches: u64) -> f64 {
    let chk = tempfile::tempdir().expect("tempdir");
    let sink = NoopSink::default();
    let started = Instant::now();
    let q = read_stream(RateSource::rows_per_batch(rows_per_batch))
        .write_stream()
        .checkpoint_location(chk.path())
        .stop_after_batch(BatchId(batches - 1))
        .start(sink.clone())
        .await
        .expect("start");
    q.await_termination().await.expect("run");
    let elapsed = started.elapsed();
    assert_eq!(sink.rows(), rows_per_batch * batches);
    sink.rows() as f64 / elapsed.as_secs_f64()
}

/// The same rows moved the way the engine moves them (generated on one
/// task, round-robin through bounded channels into counting tasks), with no
/// checkpoint, protocol or sink: what the engine adds is the difference.
async fn pipeline_rows_per_second(rows_per_batch: u64, batches: u64) -> f64 {
    let started = Instant::now();
    let mut rows = 0;
    let writers = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    for b in 0..batches {
        let (from, to) = (b * rows_per_batch, (b + 1) * rows_per_batch);
        let mut senders = Vec::new();
        let mut tasks = Vec::new();
        for _ in 0..writers {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<arrow_array::RecordBatch>(2);
            senders.push(tx);
            tasks.push(tokio::spawn(async move {
                let mut n = 0u64;
                while let Some(batch) = rx.recv().await {
                    n += batch.num_rows() as u64;
                }
                n
            }));
        }
        for (i, lo) in (from..to).step_by(64 * 1024).enumerate() {
            let batch = RateSource::generate(lo, (lo + 64 * 1024).min(to));
            senders[i % writers].send(batch).await.expect("send");
        }
        drop(senders);
        for t in tasks {
            rows += t.await.expect("task");
        }
    }
    assert_eq!(rows, rows_per_batch * batches);
    rows as f64 / started.elapsed().as_secs_f64()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

#[tokio::main]
async fn main() {
    let batches: u64 = std::env::var("WEIR_BENCH_BATCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let rounds = 3;
    // Warm the file system and the allocator once.
    engine_per_batch(20).await;
    raw_writes_per_batch(20).await;

    // Rounds alternate between weir and its baseline; medians are compared.
    let (mut engine, mut raw) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        engine.push(ms(engine_per_batch(batches).await));
        raw.push(ms(raw_writes_per_batch(batches).await));
    }
    let (engine, raw) = (median(engine), median(raw));
    println!("driver overhead, 1-row batches, {batches} batches, median of {rounds} rounds:");
    println!("  weir per batch            {engine:>9.3} ms");
    println!("  two durable writes        {raw:>9.3} ms");
    println!("  ratio weir / writes       {:>9.2}", engine / raw);

    let (rows, n) = (1_000_000, 5);
    pipeline_rows_per_second(rows, 1).await;
    engine_rows_per_second(rows, 1).await;
    let (mut generated, mut engine_rps) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        generated.push(pipeline_rows_per_second(rows, n).await);
        engine_rps.push(engine_rows_per_second(rows, n).await);
    }
    let (generated, engine_rps) = (median(generated), median(engine_rps));
    println!("throughput, {n} batches of {rows} rows, median of {rounds} rounds:");
    println!("  weir                      {engine_rps:>12.0} rows/s");
    println!("  plain pipeline            {generated:>12.0} rows/s");
    println!("  ratio weir / pipeline     {:>12.2}", engine_rps / generated);
    println!(
        "{}",
        serde_json::json!({
            "bench": "driver",
            "overhead_ms_per_batch": engine,
            "durable_writes_ms_per_batch": raw,
            "overhead_ratio": engine / raw,
            "rows_per_second": engine_rps,
            "pipeline_rows_per_second": generated,
            "throughput_ratio": engine_rps / generated,
        })
    );
}
