//! Stateful streaming, as ratios measured in one run.
//!
//! 1. Windowed aggregation: the rate source's rows keyed by `event_id %
//!    100000`, per-key sums and counts of one-minute windows of event time
//!    with a ten-minute watermark, in Append mode, through weir in
//!    micro-batches of `WEIR_BENCH_BATCH_ROWS` rows (default 500,000: a
//!    second of a fast stream) into a no-op sink; against one DataFusion
//!    aggregation of the same rows generated the same way. Target: weir's
//!    rows per second at least half of DataFusion's.
//! 2. State checkpoint cost per batch as the state grows: a per-key count in
//!    Update mode whose state holds 1k, 100k or 1M keys, then batches that
//!    change 1,000 keys each; the time to write the state (the progress's
//!    `state` phase), median and mean over 30 batches (the mean includes a
//!    snapshot every tenth version). Target: at 1M keys at most 1.5 times
//!    the cost at 1k.
//!
//! `cargo bench -p weir-benches --bench stateful` (env `WEIR_BENCH_ROWS`,
//! default 10,000,000, scales part 1; `WEIR_BENCH_PARTS=1,2` picks parts).

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use weir_benches::{mean, median, part, NoopSink};
use weir_core::prelude::*;
use weir_sql::{col, count, sum, window, StreamSqlExt};

const KEYS: i64 = 100_000;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn keyed(stream: ReadStream) -> ReadStream {
    stream.sql(format!("SELECT ts, event_id % {KEYS} AS key, amount FROM input"))
}

async fn weir_rows_per_second(rows: u64, batch_rows: u64) -> f64 {
    let chk = tempfile::tempdir().expect("tempdir");
    let sink = NoopSink::default();
    let started = Instant::now();
    let q = keyed(read_stream(
        RateSource::rows_per_batch(batch_rows).with_total_rows(rows),
    ))
    .with_watermark("ts", Duration::from_secs(600))
    .group_by([window("ts", Duration::from_secs(60)), col("key")])
    .agg([sum("amount"), count()])
    .write_stream()
    .checkpoint_location(chk.path())
    .output_mode(OutputMode::Append)
    .trigger(Trigger::available_now())
    .start(sink.clone())
    .await
    .expect("start");
    q.await_termination().await.expect("run");
    let elapsed = started.elapsed();
    assert!(sink.rows() > 0, "closed windows were emitted");
    rows as f64 / elapsed.as_secs_f64()
}

async fn datafusion_rows_per_second(rows: u64, batch_rows: u64) -> f64 {
    let started = Instant::now();
    let chunks: Vec<RecordBatch> = (0..rows)
        .step_by(batch_rows as usize)
        .map(|lo| RateSource::generate(lo, (lo + batch_rows).min(rows)))
        .collect();
    let ctx = SessionContext::new();
    let table = MemTable::try_new(RateSource::output_schema(), vec![chunks]).expect("table");
    ctx.register_table("input", Arc::new(table)).expect("register");
    let sql = format!(
        "SELECT date_bin(INTERVAL '1 minute', ts) AS window_start, key, sum(amount), count(*) \
         FROM (SELECT ts, event_id % {KEYS} AS key, amount FROM input) GROUP BY 1, 2"
    );
    let out = ctx.sql(&sql).await.expect("plan").collect().await.expect("run");
    let elapsed = started.elapsed();
    assert!(out.iter().map(|b| b.num_rows()).sum::<usize>() > 0);
    rows as f64 / elapsed.as_secs_f64()
}

fn keys(from: i64, to: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("key", DataType::Int64, false)]));
    RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(from..to))]).expect("batch")
}

/// The state-writing time of 30 batches changing 1,000 keys each, after a
/// first batch that fills the state with `size` keys: (median, mean) ms.
async fn state_cost(size: i64) -> (f64, f64) {
    let chk = tempfile::tempdir().expect("tempdir");
    let input = MemoryStream::new(keys(0, 1).schema());
    input.add_batch(keys(0, size)).expect("add");
    let q = read_stream(input.clone())
        .group_by([col("key")])
        .agg([count()])
        .write_stream()
        .checkpoint_location(chk.path())
        .output_mode(OutputMode::Update)
        .trigger(Trigger::processing_time(Duration::ZERO))
        .start(MemorySink::new("counts"))
        .await
        .expect("start");
    let mut seen = 0;
    let mut costs = Vec::new();
    for n in 0..=30i64 {
        while q.recent_progress().len() <= seen {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        seen = q.recent_progress().len();
        if n > 0 {
            costs.push(q.last_progress().expect("progress").durations_ms.state);
        }
        let lo = (n * 1000) % size.max(1000);
        input.add_batch(keys(lo, lo + 1000)).expect("add");
    }
    q.stop_and_wait().await.expect("stop");
    (median(&costs), mean(&costs))
}

#[tokio::main]
async fn main() {
    if part(1) {
        let rows = env("WEIR_BENCH_ROWS", 10_000_000);
        let batch = env("WEIR_BENCH_BATCH_ROWS", 500_000);
        println!(
            "1. windowed aggregation of {rows} rows ({KEYS} keys, one-minute windows), micro-batches of {batch} rows"
        );
        let mut ratios = Vec::new();
        for round in 0..3 {
            let w = weir_rows_per_second(rows, batch).await;
            let d = datafusion_rows_per_second(rows, batch).await;
            println!(
                "   round {round}: weir {w:.0} rows/s, one DataFusion aggregation {d:.0} rows/s, ratio {:.2}",
                w / d
            );
            ratios.push(w / d);
        }
        println!("   median ratio {:.2} (target at least 0.5)", median(&ratios));
    }
    if part(2) {
        println!("2. state written per batch (1,000 keys changed), by keys in the state");
        let mut base = None;
        for size in [1_000, 100_000, 1_000_000] {
            let (med, avg) = state_cost(size).await;
            let b = *base.get_or_insert((med, avg));
            println!(
                "   {size:>9} keys: median {med:.2} ms ({:.2}x of 1k), mean {avg:.2} ms ({:.2}x of 1k)",
                med / b.0,
                avg / b.1
            );
        }
        println!("   target: at 1M keys at most 1.5 times the cost at 1k");
    }
}
