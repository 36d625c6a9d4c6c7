//! Stateful streaming, as ratios measured in one run.
//!
//! 1. Windowed aggregation: the rate source's rows keyed by `event_id %
//!    100000` (then `% 1000`), per-key sums and counts of one-minute windows of event time
//!    with a ten-minute watermark, in Append mode, through weir in
//!    micro-batches of `WEIR_BENCH_BATCH_ROWS` rows (default 500,000: a
//!    second of a fast stream) into a no-op sink; against one DataFusion
//!    aggregation of the same rows generated the same way. Target: weir's
//!    rows per second at least half of DataFusion's. Prints where weir's
//!    batch time goes (the progress's phases), and the floor: the ratio an
//!    engine would reach that only aggregated and wrote each batch's groups
//!    to disk once, as exactly-once requires.
//! 2. State checkpoint cost per batch as the state grows: a per-key count in
//!    Update mode whose state holds 1k, 100k or 1M keys, then batches that
//!    change 1,000 keys each; the time to write the state (the progress's
//!    `state` phase), median and mean over 500 batches after 100 of warm-up,
//!    and the whole batch's. Snapshots of the whole state are made beside
//!    the batches once the deltas hold half of it (at 1M keys, every 500
//!    batches): the means carry what one takes from the batches it
//!    overlaps. Target: at 1M keys at most 1.5 times the cost at 1k, by
//!    mean.
//!
//! 3. Update mode into a Delta table of 10M rows (one row per key, written
//!    in ten appends of 1M keys, so each file holds a range of keys):
//!    batches of 1,000 changed keys, the commit's milliseconds (the
//!    progress's `commit` phase: reading the keys back, pruning, rewriting,
//!    the log entry) and the bytes of the files it replaced per changed
//!    key; against Python deltalake's `merge` of the same keys on a copy of
//!    the same table. Keys clustered (the newest, as an aggregation's open
//!    windows are) and scattered over every file.
//!
//! Exits 1 when a target of a part it ran was missed.
//!
//! `cargo bench -p weir-benches --bench stateful` (env `WEIR_BENCH_ROWS`,
//! default 10,000,000, scales parts 1 and 3; `WEIR_BENCH_PARTS=1,2,3` picks
//! parts; `WEIR_BENCH_KEYS=100000,1000` picks part 1's key counts).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use weir_benches::{mean, median, part, NoopSink};
use weir_core::prelude::*;
use weir_delta::DeltaSink;
use weir_sql::{col, count, sum, window, StreamSqlExt};
use weir_test_support::copy_dir;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn keyed(stream: ReadStream, keys: i64) -> ReadStream {
    stream.sql(format!("SELECT ts, event_id % {keys} AS key, amount FROM input"))
}

async fn weir_rows_per_second(rows: u64, batch_rows: u64, keys: i64) -> f64 {
    let chk = tempfile::tempdir().expect("tempdir");
    let sink = NoopSink::default();
    let started = Instant::now();
    let q = keyed(
        read_stream(RateSource::rows_per_batch(batch_rows).with_total_rows(rows)),
        keys,
    )
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
    // Where a batch's time goes, for the note on a missed target.
    let phases = q.recent_progress();
    let phase = |f: fn(&weir_core::progress::PhaseDurations) -> f64| {
        median(&phases.iter().map(|p| f(&p.durations_ms)).collect::<Vec<_>>())
    };
    println!(
        "   weir per batch (median ms): read {:.0}, operators and write {:.0}, state {:.0}, commit {:.0}, total {:.0}",
        phase(|d| d.read),
        phase(|d| d.write),
        phase(|d| d.state),
        phase(|d| d.commit),
        phase(|d| d.total)
    );
    let batch_ms: f64 = phases.iter().map(|p| p.durations_ms.total).sum();
    println!(
        "   weir: {} batches, {batch_ms:.0} ms in batches, {:.0} ms from start to end",
        phases.len(),
        weir_benches::ms(elapsed)
    );
    assert!(sink.rows() > 0, "closed windows were emitted");
    rows as f64 / elapsed.as_secs_f64()
}

async fn datafusion_rows_per_second(rows: u64, batch_rows: u64, keys: i64) -> f64 {
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
         FROM (SELECT ts, event_id % {keys} AS key, amount FROM input) GROUP BY 1, 2"
    );
    let out = ctx.sql(&sql).await.expect("plan").collect().await.expect("run");
    let elapsed = started.elapsed();
    assert!(out.iter().map(|b| b.num_rows()).sum::<usize>() > 0);
    rows as f64 / elapsed.as_secs_f64()
}

/// What an exactly-once engine cannot avoid: a batch's groups are open
/// windows the next batch may add to, so before the batch commits they
/// must be on disk once. Writes that many bytes (a group's partial row is
/// 40: window start, key, sum, count) and syncs them, once per batch of
/// the run back to back (a disk syncs a burst faster than a steady
/// stream), and prints the ratio an engine would reach if it did nothing
/// else besides one aggregation.
fn durable_floor(batches: u64, batch_rows: u64, keys: i64, df_rows_per_second: f64) {
    // One row a millisecond: a minute window holds 60,000 rows.
    let per_window = keys.min(60_000) as u64;
    let windows = batch_rows.div_ceil(60_000) + 1;
    let groups = (windows * per_window).min(batch_rows);
    let bytes = vec![7u8; groups as usize * 40];
    let dir = tempfile::tempdir().expect("tempdir");
    let mut times = Vec::new();
    for i in 0..batches.max(5) {
        let started = Instant::now();
        let mut file = std::fs::File::create(dir.path().join(i.to_string())).expect("create");
        std::io::Write::write_all(&mut file, &bytes).expect("write");
        file.sync_all().expect("sync");
        times.push(weir_benches::ms(started.elapsed()));
    }
    let write = median(&times);
    let aggregate = batch_rows as f64 / df_rows_per_second * 1000.0;
    println!(
        "   floor: a batch's ~{groups} groups written once durably ({:.1} MB, synced, {} batches back to back) take {write:.1} ms (median) against one aggregation's {aggregate:.1} ms a batch: no exactly-once engine passes ratio {:.2} here",
        bytes.len() as f64 / 1e6,
        batches.max(5),
        aggregate / (aggregate + write)
    );
}

fn keys(from: i64, to: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![Field::new("key", DataType::Int64, false)]));
    RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(from..to))]).expect("batch")
}

/// Batches after the one that fills the state before measuring: the fill
/// is one delta of the whole state, so a snapshot falls due ten batches
/// on, an artifact of how the bench makes a large state.
const WARM_UP: i64 = 100;
/// Batches measured: at 1M keys and 1,000 changed keys a batch, one
/// period between snapshots (the deltas hold half the state after 500), so
/// the mean carries its share of the snapshots made beside the batches.
const MEASURED: i64 = 500;

/// The state-writing and whole times of [`MEASURED`] batches changing
/// 1,000 keys each, after a first batch that fills the state with `size`
/// keys and [`WARM_UP`] more, in ms.
struct StateCost {
    state: Vec<f64>,
    total: Vec<f64>,
}

async fn state_cost(size: i64) -> StateCost {
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
    let mut cost = StateCost {
        state: Vec::new(),
        total: Vec::new(),
    };
    for n in 0..=WARM_UP + MEASURED {
        // Batch 0 filled the state; batch n holds the keys added after it.
        while q.last_progress().is_none_or(|p| p.batch_id.0 < n as u64) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if n > WARM_UP {
            let durations = q.last_progress().expect("progress").durations_ms;
            cost.state.push(durations.state);
            cost.total.push(durations.total);
        }
        let lo = (n * 1000) % size.max(1000);
        input.add_batch(keys(lo, lo + 1000)).expect("add");
    }
    q.stop_and_wait().await.expect("stop");
    cost
}

/// Changed keys per Update batch, and batches measured per layout.
const CHANGED: i64 = 1_000;
const UPDATE_BATCHES: usize = 5;

/// One row per key `0..rows` in `table`, in the aggregation's output schema
/// (`event_id`, `count`), ten appends of a tenth each.
async fn keyed_table(table: &Path, rows: i64, schema: SchemaRef) {
    let chk = tempfile::tempdir().expect("tempdir");
    let input = MemoryStream::new(schema.clone());
    let q = read_stream(input.clone())
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::processing_time(Duration::ZERO))
        .start(DeltaSink::try_new(table.to_str().unwrap()).expect("sink"))
        .await
        .expect("start");
    let tenth = rows / 10;
    for i in 0..10 {
        // One append (one micro-batch) at a time.
        let seen = q.recent_progress().len();
        let ids = Int64Array::from_iter_values(i * tenth..(i + 1) * tenth);
        let ones = Int64Array::from_iter_values((0..tenth).map(|_| 1));
        input
            .add_batch(RecordBatch::try_new(schema.clone(), vec![Arc::new(ids), Arc::new(ones)]).expect("batch"))
            .expect("add");
        while q.recent_progress().len() <= seen {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    q.stop_and_wait().await.expect("write the table");
}

/// The counting query Update mode runs, over a stream of keys.
fn counting(input: &MemoryStream) -> ReadStream {
    read_stream(input.clone()).group_by([col("event_id")]).agg([count()])
}

/// The bytes of `add` and `remove` actions in the table's newest log entry.
fn last_entry_bytes(table: &Path) -> (u64, u64) {
    let log = table.join("_delta_log");
    let newest = std::fs::read_dir(&log)
        .expect("log")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .max()
        .expect("an entry");
    let (mut added, mut removed) = (0, 0);
    for line in std::fs::read_to_string(newest).expect("read").lines() {
        let action: serde_json::Value = serde_json::from_str(line).expect("json");
        if let Some(size) = action["add"]["size"].as_u64() {
            added += size;
        }
        if let Some(size) = action["remove"]["size"].as_u64() {
            removed += size;
        }
    }
    (added, removed)
}

/// weir's Update commits of `batches` (each a set of keys) into `table`:
/// per batch, commit ms, bytes removed, bytes added.
async fn weir_updates(table: &Path, batches: &[Vec<i64>]) -> Vec<(f64, u64, u64)> {
    let chk = tempfile::tempdir().expect("tempdir");
    let schema = Arc::new(Schema::new(vec![Field::new("event_id", DataType::Int64, false)]));
    let input = MemoryStream::new(schema.clone());
    let q = counting(&input)
        .write_stream()
        .checkpoint_location(chk.path())
        .output_mode(OutputMode::Update)
        .trigger(Trigger::processing_time(Duration::ZERO))
        .start(DeltaSink::try_new(table.to_str().unwrap()).expect("sink"))
        .await
        .expect("start");
    let mut out = Vec::new();
    for keys in batches {
        let seen = q.recent_progress().len();
        let ids = Int64Array::from(keys.clone());
        input
            .add_batch(RecordBatch::try_new(schema.clone(), vec![Arc::new(ids)]).expect("batch"))
            .expect("add");
        while q.recent_progress().len() <= seen {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let commit = q.last_progress().expect("progress").durations_ms.commit;
        let (added, removed) = last_entry_bytes(table);
        out.push((commit, removed, added));
    }
    q.stop_and_wait().await.expect("stop");
    out
}

fn python_merges(table: &Path, batches: &[Vec<i64>]) -> Option<serde_json::Value> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".venv-readers/bin/python");
    if !python.exists() {
        eprintln!("NOTE: .venv-readers is missing (scripts/test.sh makes it); the Python comparison is left out");
        return None;
    }
    let keys = table.with_extension("keys.json");
    std::fs::write(&keys, serde_json::to_vec(batches).expect("json")).expect("write keys");
    let out = std::process::Command::new(python)
        .arg(root.join("benches/python/delta_merge.py"))
        .arg(table)
        .arg(&keys)
        .output()
        .expect("run python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Some(serde_json::from_slice(&out.stdout).expect("json"))
}

async fn update_commits(rows: i64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("source");
    let schema = {
        let keys = MemoryStream::new(Arc::new(Schema::new(vec![Field::new(
            "event_id",
            DataType::Int64,
            false,
        )])));
        counting(&keys).schema().expect("schema")
    };
    let started = Instant::now();
    keyed_table(&source, rows, schema).await;
    let files = std::fs::read_dir(&source)
        .expect("table")
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "parquet"))
        .count();
    println!(
        "   a table of {rows} rows in {files} files, written in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let clustered: Vec<Vec<i64>> = (0..UPDATE_BATCHES as i64)
        .map(|b| (rows - (b + 1) * CHANGED..rows - b * CHANGED).collect())
        .collect();
    let scattered: Vec<Vec<i64>> = (0..UPDATE_BATCHES as i64)
        .map(|b| (0..CHANGED).map(|i| (i * 10_007 + b * 101) % rows).collect())
        .collect();
    for (name, batches) in [("clustered", &clustered), ("scattered", &scattered)] {
        let (weir_table, python_table) = (
            dir.path().join(format!("weir-{name}")),
            dir.path().join(format!("py-{name}")),
        );
        copy_dir(&source, &weir_table);
        copy_dir(&source, &python_table);
        let weir = weir_updates(&weir_table, batches).await;
        let ms: Vec<f64> = weir.iter().map(|w| w.0).collect();
        let removed: Vec<f64> = weir.iter().map(|w| w.1 as f64 / CHANGED as f64).collect();
        let added: Vec<f64> = weir.iter().map(|w| w.2 as f64 / CHANGED as f64).collect();
        println!(
            "   {name} keys: weir median {:.1} ms a commit, {:.0} bytes replaced and {:.0} written per changed key",
            median(&ms),
            median(&removed),
            median(&added)
        );
        if let Some(py) = python_merges(&python_table, batches) {
            let list = |k: &str| -> Vec<f64> { serde_json::from_value(py[k].clone()).expect("numbers") };
            let (pms, prem, padd) = (list("ms"), list("removed_bytes"), list("added_bytes"));
            let per_key = |v: &[f64]| median(&v.iter().map(|b| b / CHANGED as f64).collect::<Vec<_>>());
            println!(
                "   {name} keys: Python deltalake merge median {:.1} ms, {:.0} bytes replaced and {:.0} written per changed key; weir's time {:.2}x of merge's",
                median(&pms),
                per_key(&prem),
                per_key(&padd),
                median(&ms) / median(&pms)
            );
        }
    }
}

#[tokio::main]
async fn main() {
    let mut missed = Vec::new();
    if part(1) {
        let rows = env("WEIR_BENCH_ROWS", 10_000_000);
        let batch = env("WEIR_BENCH_BATCH_ROWS", 500_000);
        // 100k keys: at a row a millisecond nearly every row is a group of
        // its own, so each batch changes about as many state keys as it has
        // rows; 1k keys: each group gathers rows.
        let key_counts: Vec<i64> = match std::env::var("WEIR_BENCH_KEYS") {
            Ok(v) => v
                .split(',')
                .map(|k| k.trim().parse().expect("WEIR_BENCH_KEYS: numbers"))
                .collect(),
            Err(_) => vec![100_000, 1_000],
        };
        for keys in key_counts {
            println!(
                "1. windowed aggregation of {rows} rows ({keys} keys, one-minute windows), micro-batches of {batch} rows"
            );
            let mut ratios = Vec::new();
            let mut df_rates = Vec::new();
            // Five rounds, alternating: disk syncs and page faults vary
            // from round to round, and the median of five steadies the
            // ratio.
            for round in 0..5 {
                let w = weir_rows_per_second(rows, batch, keys).await;
                let d = datafusion_rows_per_second(rows, batch, keys).await;
                df_rates.push(d);
                println!(
                    "   round {round}: weir {w:.0} rows/s, one DataFusion aggregation {d:.0} rows/s, ratio {:.2}",
                    w / d
                );
                ratios.push(w / d);
            }
            let ratio = median(&ratios);
            println!("   median ratio {ratio:.2} (target at least 0.5)");
            if ratio < 0.5 {
                missed.push(format!("1. at {keys} keys: {ratio:.2}"));
            }
            durable_floor(rows.div_ceil(batch), batch, keys, median(&df_rates));
        }
    }
    if part(2) {
        println!("2. state written per batch (1,000 keys changed), by keys in the state");
        let mut base = None;
        let mut growth = 0.0;
        for size in [1_000, 100_000, 1_000_000] {
            let cost = state_cost(size).await;
            let (med, avg) = (median(&cost.state), mean(&cost.state));
            let (whole_med, whole_avg) = (median(&cost.total), mean(&cost.total));
            let b = *base.get_or_insert((med, avg, whole_avg));
            println!(
                "   {size:>9} keys: state median {med:.2} ms ({:.2}x of 1k), mean {avg:.2} ms ({:.2}x of 1k); whole batch median {whole_med:.2} ms, mean {whole_avg:.2} ms ({:.2}x of 1k)",
                med / b.0,
                avg / b.1,
                whole_avg / b.2
            );
            growth = avg / b.1;
        }
        println!("   target: at 1M keys at most 1.5 times the cost at 1k (by mean)");
        if growth > 1.5 {
            missed.push(format!("2. {growth:.2}x"));
        }
    }
    if part(3) {
        let rows = env("WEIR_BENCH_ROWS", 10_000_000) as i64;
        println!("3. Update mode: commits of {CHANGED} changed keys into a Delta table of {rows} rows");
        update_commits(rows).await;
    }
    if !missed.is_empty() {
        println!("missed: {}", missed.join("; "));
        std::process::exit(1);
    }
}
