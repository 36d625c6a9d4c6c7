//! weir against Spark Structured Streaming (pyspark in local[2] with two
//! shuffle partitions, Delta Lake on Spark and Iceberg's Spark runtime):
//! the same workloads from the rate source into a fresh table of each
//! format, each side timed in the same run, rounds alternating, medians
//! reported. weir runs as users run it, the release `weir stream` with its
//! defaults; Spark as `benches/python/spark_stream.py`.
//!
//! 1. 300 batches of 1,000 rows back to back: ms per batch (median of the
//!    first 50 after five of warm-up and of the last 50, p99 and max after
//!    warm-up), total seconds, start to first batch, peak memory. weir's
//!    figures are medians over `WEIR_BENCH_WEIR_ROUNDS` (default 5) rounds,
//!    the paired ones and more of its own. Targets:
//!    weir at least 30 times faster per batch at 300; weir's p99 at most 3
//!    times its median; weir's start under a tenth of Spark's; weir's peak
//!    memory under a quarter of Spark's.
//! 2. 1,000 batches of 100 rows: the median of batches 900-1,000 over that
//!    of 10-110. Target: at most 1.5 for weir.
//! 3. One batch of 10M rows: rows per second and peak memory. Targets: at
//!    least twice Spark's rate, under a quarter of its memory.
//! 4. Kafka to a table: `WEIR_BENCH_KAFKA_RECORDS` (default 5,000,000)
//!    JSON payments of about 200 bytes in 8 partitions of a topic written
//!    before the clock starts, read from its start, each value parsed into
//!    typed columns, on a 1 s trigger of at most 1,250,000 records a
//!    batch, until every record is in the table: records per second end to
//!    end (process start to the last batch committed) and in the batches
//!    alone, and peak memory. weir is `weir stream --from kafka
//!    --value-format json`, Spark its Kafka source with `from_json`
//!    (`benches/python/spark_kafka.py`). Target: weir's peak memory under
//!    a quarter of Spark's. The broker is the suite's
//!    (`WEIR_TEST_KAFKA_BOOTSTRAP`) or one `scripts/services/kafka.sh`
//!    starts.
//! 5. Compaction of 1,000 small files (`WEIR_BENCH_SMALL_FILES`) in a table
//!    weir made: `weir compact` start to end against Spark's `OPTIMIZE` or
//!    `rewrite_data_files` statement alone. Target: at least 1.5 times as
//!    fast.
//! 6. Cold start on history: a table of 10,000 commits that weir made
//!    (`WEIR_BENCH_HISTORY`), then each side starts a query of its own that
//!    appends one batch of 1,000 rows: process start to that batch. Target:
//!    under a tenth of Spark's.
//!
//! ```text
//! cargo bench -p weir-benches --bench spark
//! WEIR_BENCH_PARTS=1 WEIR_BENCH_FORMATS=iceberg WEIR_BENCH_ROUNDS=1 cargo bench -p weir-benches --bench spark
//! ```
//!
//! Spark needs the readers' Python and Spark's jars (`scripts/test.sh`
//! makes them); `WEIR_BENCH_SPARK=0` runs weir's side alone (Spark's 1,000
//! batches take many minutes). Results go to
//! `target/bench-results/spark.json` (workloads not run keep their last
//! results there), plots of them to `docs/benchmarks/`; the process exits 1
//! when a target is missed.

use std::path::Path;

use serde_json::{json, Value};
use weir_benches::kafka::{produce, stream_command, Broker};
use weir_benches::peer::{
    percentile, run, run_whole, spark_command, spark_command_on, spark_compact_command, spark_kafka_command,
    weir_command, weir_command_on, Run,
};
use weir_benches::{median, part, release_weir};

/// Batches of warm-up left out of per-batch figures.
const WARM_UP: usize = 5;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Both sides of one workload, round after round (Spark's empty if it
/// did not run).
struct Sides {
    weir: Vec<Run>,
    spark: Vec<Run>,
}

impl Sides {
    /// `figures` of each side that ran, by name.
    fn each(&self, figures: impl Fn(&[Run]) -> Value) -> Vec<(&'static str, Value)> {
        let mut out = vec![("weir", figures(&self.weir))];
        if !self.spark.is_empty() {
            out.push(("spark", figures(&self.spark)));
        }
        out
    }
}

/// Runs weir's side and, unless `WEIR_BENCH_SPARK=0` or Spark is missing,
/// Spark's, alternating, `rounds` times; then weir's alone until it has
/// run `WEIR_BENCH_WEIR_ROUNDS` (default 5) times, since a round of weir's
/// takes seconds and one of Spark's minutes: weir's tail (p99 over p50)
/// varies from round to round with the disk, and its median over five
/// rounds says more than that of one or two.
fn both(weir: &Path, format: &str, rounds: usize, batches: u64, rows: u64, partitions: u32) -> Sides {
    let with_spark = spark_wanted();
    let mut sides = Sides {
        weir: Vec::new(),
        spark: Vec::new(),
    };
    for round in 1..=rounds {
        let dir = round_dir();
        let ours = run(weir_command(weir, format, &dir.join("weir"), batches, rows));
        assert_eq!(ours.batch_ms.len() as u64, batches, "weir ran every batch");
        eprintln!("  {format} round {round}: weir {:.1} s", ours.last_batch_s);
        sides.weir.push(ours);
        let spark = match with_spark {
            true => spark_command(format, &dir.join("spark"), batches, rows, partitions),
            false => None,
        };
        let Some(spark) = spark else { continue };
        let theirs = run(spark);
        assert_eq!(theirs.batch_ms.len() as u64, batches, "Spark ran every batch");
        let in_table = theirs.table_rows.expect("Spark counts its table");
        assert!(in_table >= batches * rows, "Spark's table holds {in_table} rows");
        eprintln!("  {format} round {round}: Spark {:.1} s", theirs.last_batch_s);
        sides.spark.push(theirs);
    }
    let weir_rounds = env_or("WEIR_BENCH_WEIR_ROUNDS", 5).max(rounds);
    while sides.weir.len() < weir_rounds {
        let dir = round_dir();
        let ours = run(weir_command(weir, format, &dir.join("weir"), batches, rows));
        assert_eq!(ours.batch_ms.len() as u64, batches, "weir ran every batch");
        sides.weir.push(ours);
    }
    let tails: Vec<String> = sides.weir.iter().map(|r| format!("{:.2}", tail(r))).collect();
    eprintln!("  {format}: weir's p99 over p50 by round: {}", tails.join(", "));
    sides
}

/// Every round's directory, kept until the benchmark ends (see
/// [`round_dir`]).
static KEPT: std::sync::Mutex<Vec<tempfile::TempDir>> = std::sync::Mutex::new(Vec::new());

/// A fresh directory for one round, kept until the benchmark ends: deleting
/// a round's thousands of files just before the next round (or workload)
/// starts slows its file creation (by a quarter of weir's time per batch
/// here: ext4 without a journal passes over the inodes freed in the last
/// half minute), which would measure the cleanup.
fn round_dir() -> std::path::PathBuf {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().to_path_buf();
    KEPT.lock().unwrap_or_else(|e| e.into_inner()).push(dir);
    path
}

/// Whether Spark's side runs: unless `WEIR_BENCH_SPARK=0`.
fn spark_wanted() -> bool {
    std::env::var("WEIR_BENCH_SPARK").as_deref() != Ok("0")
}

/// How Spark finds the table `bench.payments` weir made in the embedded
/// catalog at `lake`: the Delta table's path, or the catalog's SQLite file.
fn made_by_weir(lake: &Path, format: &str) -> std::path::PathBuf {
    match format {
        "delta" => lake.join("warehouse/bench/payments"),
        _ => lake.join("catalog.db"),
    }
}

/// The median over rounds of `f` of each run.
fn over(runs: &[Run], f: impl Fn(&Run) -> f64) -> f64 {
    median(&runs.iter().map(f).collect::<Vec<_>>())
}

/// The median of batches `from..to`.
fn window(run: &Run, from: usize, to: usize) -> f64 {
    let n = run.batch_ms.len();
    median(&run.batch_ms[from.min(n - 1)..to.clamp(from.min(n - 1) + 1, n)])
}

/// The batches after warm-up.
fn steady(run: &Run) -> &[f64] {
    &run.batch_ms[WARM_UP.min(run.batch_ms.len() - 1)..]
}

/// A run's p99 over its p50, after warm-up.
fn tail(run: &Run) -> f64 {
    percentile(steady(run), 0.99) / percentile(steady(run), 0.5)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

fn get(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(f64::NAN)
}

/// Targets met and missed.
#[derive(Default)]
struct Targets(Vec<String>);

impl Targets {
    fn check(&mut self, ok: bool, what: String) {
        println!("   {} {what}", if ok { "met   " } else { "MISSED" });
        if !ok {
            self.0.push(what);
        }
    }
}

/// Workload 1: 300 batches of 1,000 rows.
fn small_batches(weir: &Path, format: &str, rounds: usize, targets: &mut Targets) -> Value {
    println!("{format}, 300 batches of 1,000 rows, {rounds} rounds");
    let s = both(weir, format, rounds, 300, 1_000, 1);
    let sides = s.each(|runs| {
        json!({
            "early_p50_ms": over(runs, |r| window(r, WARM_UP, WARM_UP + 50)),
            "late_p50_ms": over(runs, |r| window(r, 250, 300)),
            "p50_ms": over(runs, |r| percentile(steady(r), 0.5)),
            "p99_ms": over(runs, |r| percentile(steady(r), 0.99)),
            "max_ms": over(runs, |r| percentile(steady(r), 1.0)),
            "tail": over(runs, tail),
            "tail_by_round": runs.iter().map(tail).collect::<Vec<_>>(),
            "total_s": over(runs, |r| r.last_batch_s),
            "first_batch_s": over(runs, |r| r.first_batch_s),
            "peak_mib": over(runs, |r| mib(r.peak_bytes)),
            "per_batch_ms": runs[0].batch_ms,
        })
    });
    for (name, v) in &sides {
        println!(
            "   {name:>5}: {:>7.1} ms per batch early, {:>7.1} at 300 (p50 {:.1}, p99 {:.1}, max {:.1}); {:.1} s in all, {:.2} s to the first batch, {:.0} MiB peak",
            get(v, "early_p50_ms"),
            get(v, "late_p50_ms"),
            get(v, "p50_ms"),
            get(v, "p99_ms"),
            get(v, "max_ms"),
            get(v, "total_s"),
            get(v, "first_batch_s"),
            get(v, "peak_mib"),
        );
    }
    let w = &sides[0].1;
    // Each round's own p99 over its own p50, the median of those.
    let ratio = get(w, "tail");
    targets.check(
        ratio <= 3.0,
        format!("{format}: weir's p99 {ratio:.2} times its p50, the median of its rounds (target <= 3)"),
    );
    if let Some((_, sp)) = sides.get(1) {
        let speedup = get(sp, "late_p50_ms") / get(w, "late_p50_ms");
        targets.check(
            speedup >= 30.0,
            format!("{format}: weir {speedup:.0} times faster per batch at 300 (target >= 30)"),
        );
        let start = get(w, "first_batch_s") / get(sp, "first_batch_s");
        targets.check(
            start < 0.1,
            format!("{format}: weir's start to first batch {start:.3} of Spark's (target < 0.1)"),
        );
        let memory = get(w, "peak_mib") / get(sp, "peak_mib");
        targets.check(
            memory < 0.25,
            format!("{format}: weir's peak memory {memory:.3} of Spark's (target < 0.25)"),
        );
    }
    Value::Object(sides.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// Workload 2: 1,000 batches of 100 rows.
fn growth(weir: &Path, format: &str, rounds: usize, targets: &mut Targets) -> Value {
    println!("{format}, 1,000 batches of 100 rows, {rounds} rounds");
    let s = both(weir, format, rounds, 1_000, 100, 1);
    let sides = s.each(|runs| {
        json!({
            "early_p50_ms": over(runs, |r| window(r, 10, 110)),
            "late_p50_ms": over(runs, |r| window(r, 900, 1_000)),
            "growth": over(runs, |r| window(r, 900, 1_000) / window(r, 10, 110)),
            "p99_ms": over(runs, |r| percentile(steady(r), 0.99)),
            "max_ms": over(runs, |r| percentile(steady(r), 1.0)),
            "per_batch_ms": runs[0].batch_ms,
        })
    });
    for (name, v) in &sides {
        println!(
            "   {name:>5}: {:>7.1} ms per batch at 10-110, {:>7.1} at 900-1,000: growth {:.2} (p99 {:.1}, max {:.1})",
            get(v, "early_p50_ms"),
            get(v, "late_p50_ms"),
            get(v, "growth"),
            get(v, "p99_ms"),
            get(v, "max_ms"),
        );
    }
    let g = get(&sides[0].1, "growth");
    targets.check(
        g <= 1.5,
        format!("{format}: weir's growth over 1,000 batches {g:.2} (target <= 1.5)"),
    );
    Value::Object(sides.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// Workload 3: one batch of many rows.
fn one_batch(weir: &Path, format: &str, rounds: usize, targets: &mut Targets) -> Value {
    let rows: u64 = env_or("WEIR_BENCH_BIG_ROWS", 10_000_000);
    println!("{format}, one batch of {rows} rows, {rounds} rounds");
    let s = both(weir, format, rounds, 1, rows, 2);
    let sides = s.each(|runs| {
        json!({
            "rows_per_s": over(runs, |r| rows as f64 / (r.batch_ms[0] / 1e3)),
            "peak_mib": over(runs, |r| mib(r.peak_bytes)),
        })
    });
    for (name, v) in &sides {
        println!(
            "   {name:>5}: {:>10.0} rows/s, {:.0} MiB peak",
            get(v, "rows_per_s"),
            get(v, "peak_mib")
        );
    }
    if let [(_, w), (_, sp)] = &sides[..] {
        let rate = get(w, "rows_per_s") / get(sp, "rows_per_s");
        targets.check(
            rate >= 2.0,
            format!("{format}: weir's rate {rate:.2} times Spark's (target >= 2)"),
        );
        let memory = get(w, "peak_mib") / get(sp, "peak_mib");
        targets.check(
            memory < 0.25,
            format!("{format}: weir's peak memory {memory:.3} of Spark's (target < 0.25)"),
        );
    }
    Value::Object(sides.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

/// The topic workload 4 reads, written once for every format and round.
struct Topic {
    broker: Broker,
    name: String,
    records: u64,
}

/// Kafka partitions of workload 4's topic.
const KAFKA_PARTITIONS: i32 = 8;
/// Workload 4's records a trigger at most (`maxOffsetsPerTrigger`).
const KAFKA_PER_TRIGGER: u64 = 1_250_000;

impl Topic {
    fn make() -> Topic {
        let records: u64 = env_or("WEIR_BENCH_KAFKA_RECORDS", 5_000_000);
        let broker = Broker::start();
        let name = weir_test_support::kafka::create_topic(&broker.bootstrap, "payments", KAFKA_PARTITIONS);
        let started = std::time::Instant::now();
        produce(&broker.bootstrap, &name, KAFKA_PARTITIONS, records);
        eprintln!(
            "  {records} records into {KAFKA_PARTITIONS} partitions in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        Topic { broker, name, records }
    }
}

/// Workload 4: Kafka to a table.
fn kafka_to_table(weir: &Path, format: &str, rounds: usize, topic: &Topic, targets: &mut Targets) -> Value {
    let records = topic.records;
    println!("{format}, Kafka to table: {records} JSON records, 1 s trigger, {rounds} rounds");
    let with_spark = spark_wanted();
    let mut sides = Sides {
        weir: Vec::new(),
        spark: Vec::new(),
    };
    let (bootstrap, name) = (topic.broker.bootstrap.as_str(), topic.name.as_str());
    for round in 1..=rounds {
        let dir = round_dir();
        let ours = run(stream_command(
            weir,
            &dir.join("weir"),
            bootstrap,
            name,
            records,
            KAFKA_PER_TRIGGER,
            format,
            "json",
            "json",
        ));
        assert_eq!(ours.rows, records, "weir wrote every record once");
        eprintln!("  {format} round {round}: weir {:.1} s", ours.last_batch_s);
        sides.weir.push(ours);
        let spark = match with_spark {
            true => spark_kafka_command(format, &dir.join("spark"), bootstrap, name, records, KAFKA_PER_TRIGGER),
            false => None,
        };
        let Some(spark) = spark else { continue };
        let theirs = run(spark);
        assert_eq!(theirs.rows, records, "Spark wrote every record once");
        assert_eq!(
            theirs.table_rows,
            Some(records),
            "Spark's table holds every record, parsed"
        );
        eprintln!("  {format} round {round}: Spark {:.1} s", theirs.last_batch_s);
        sides.spark.push(theirs);
    }
    let sides = sides.each(|runs| {
        json!({
            "records_per_s": over(runs, |r| records as f64 / r.last_batch_s),
            "in_batches_per_s": over(runs, |r| records as f64 / (r.batch_ms.iter().sum::<f64>() / 1e3)),
            "seconds": over(runs, |r| r.last_batch_s),
            "first_batch_s": over(runs, |r| r.first_batch_s),
            "peak_mib": over(runs, |r| mib(r.peak_bytes)),
        })
    });
    for (name, v) in &sides {
        println!(
            "   {name:>5}: {:>9.0} records/s end to end ({:.1} s), {:.0}/s in its batches, {:.0} MiB peak",
            get(v, "records_per_s"),
            get(v, "seconds"),
            get(v, "in_batches_per_s"),
            get(v, "peak_mib")
        );
    }
    if let [(_, w), (_, sp)] = &sides[..] {
        println!(
            "   weir {:.1} times Spark's records/s end to end, {:.1} times in the batches",
            get(w, "records_per_s") / get(sp, "records_per_s"),
            get(w, "in_batches_per_s") / get(sp, "in_batches_per_s")
        );
        let memory = get(w, "peak_mib") / get(sp, "peak_mib");
        targets.check(
            memory < 0.25,
            format!("{format}: weir's peak memory from Kafka {memory:.3} of Spark's (target < 0.25)"),
        );
    }
    let mut out = serde_json::Map::new();
    out.insert("records".into(), json!(records));
    out.extend(sides.into_iter().map(|(k, v)| (k.to_string(), v)));
    Value::Object(out)
}

/// Workload 5: compaction of a table of `WEIR_BENCH_SMALL_FILES` (default
/// 1,000) small files that weir made, one commit of 100 rows each: weir's
/// `weir compact`, start to end, against Spark's statement alone (Delta's
/// `OPTIMIZE`, Iceberg's `rewrite_data_files`, in a session already up, as
/// a user's would be). Each side compacts a table of its own, made the
/// same way, rounds alternating.
fn compaction(weir: &Path, format: &str, rounds: usize, targets: &mut Targets) -> Value {
    let files: u64 = env_or("WEIR_BENCH_SMALL_FILES", 1_000);
    println!("{format}, compaction of {files} small files, {rounds} rounds");
    let with_spark = spark_wanted();
    let make = |dir: &Path| {
        let lake = dir.join("weir-lake");
        let made = run(weir_command_on(weir, format, &lake, &dir.join("chk"), files, 100));
        assert_eq!(made.batch_ms.len() as u64, files, "weir made every file");
        lake
    };
    let mut sides = Sides {
        weir: Vec::new(),
        spark: Vec::new(),
    };
    for round in 1..=rounds {
        let dir = round_dir();
        let lake = make(&dir.join("weir"));
        let mut command = std::process::Command::new(weir);
        command
            .arg("--lake")
            .arg(&lake)
            .args(["compact", "bench.payments", "--json"])
            .env_remove("WEIR_CONFIG");
        let ours = run_whole(command);
        eprintln!("  {format} round {round}: weir {:.2} s", ours.last_batch_s);
        sides.weir.push(ours);
        if !with_spark {
            continue;
        }
        let lake = make(&dir.join("spark"));
        let existing = made_by_weir(&lake, format);
        let Some(spark) = spark_compact_command(format, &dir.join("spark"), &existing) else {
            continue;
        };
        let theirs = run(spark);
        assert_eq!(
            theirs.table_rows,
            Some(files * 100),
            "Spark's compaction kept every row"
        );
        eprintln!("  {format} round {round}: Spark {:.2} s", theirs.batch_ms[0] / 1e3);
        sides.spark.push(theirs);
    }
    let sides = sides.each(|runs| {
        json!({
            "seconds": over(runs, |r| r.batch_ms[0] / 1e3),
            "peak_mib": over(runs, |r| mib(r.peak_bytes)),
        })
    });
    for (name, v) in &sides {
        println!(
            "   {name:>5}: {:.2} s, {:.0} MiB peak",
            get(v, "seconds"),
            get(v, "peak_mib")
        );
    }
    if let [(_, w), (_, sp)] = &sides[..] {
        let speedup = get(sp, "seconds") / get(w, "seconds");
        targets.check(
            speedup >= 1.5,
            format!("{format}: weir's compaction {speedup:.1} times as fast as Spark's (target >= 1.5)"),
        );
    }
    let mut out = serde_json::Map::new();
    out.insert("files".into(), json!(files));
    out.extend(sides.into_iter().map(|(k, v)| (k.to_string(), v)));
    Value::Object(out)
}

/// Workload 6: process start to the first committed batch on a table of
/// `WEIR_BENCH_HISTORY` (default 10,000) commits that weir made with its
/// defaults; each side starts a new query (a checkpoint of its own) that
/// appends one batch of 1,000 rows to it, rounds alternating.
fn cold_start(weir: &Path, format: &str, rounds: usize, targets: &mut Targets) -> Value {
    let commits: u64 = env_or("WEIR_BENCH_HISTORY", 10_000);
    println!("{format}, start to the first batch on a table of {commits} commits, {rounds} rounds");
    let dir = round_dir();
    let lake = dir.join("weir-lake");
    let made = run(weir_command_on(weir, format, &lake, &dir.join("chk-made"), commits, 10));
    assert_eq!(made.batch_ms.len() as u64, commits, "weir made every commit");
    eprintln!("  {format}: {commits} commits made in {:.0} s", made.last_batch_s);
    let existing = made_by_weir(&lake, format);
    let with_spark = spark_wanted();
    let mut sides = Sides {
        weir: Vec::new(),
        spark: Vec::new(),
    };
    for round in 1..=rounds {
        let chk = dir.join(format!("chk-weir-{round}"));
        let mut command = weir_command_on(weir, format, &lake, &chk, 1, 1_000);
        // A query of its own: the table's name names the one that made it.
        command.args(["--query-name", &format!("cold-start-{round}")]);
        let ours = run(command);
        assert_eq!(ours.batch_ms.len(), 1, "weir ran its batch");
        eprintln!("  {format} round {round}: weir {:.2} s", ours.first_batch_s);
        sides.weir.push(ours);
        let spark_dir = dir.join(format!("spark-{round}"));
        let spark = match with_spark {
            true => spark_command_on(format, &spark_dir, 1, 1_000, 1, Some(&existing)),
            false => None,
        };
        let Some(spark) = spark else { continue };
        let theirs = run(spark);
        assert_eq!(theirs.batch_ms.len(), 1, "Spark ran its batch");
        let in_table = theirs.table_rows.expect("Spark counts its table");
        assert!(in_table >= commits * 10 + 1_000, "the table holds {in_table} rows");
        eprintln!("  {format} round {round}: Spark {:.2} s", theirs.first_batch_s);
        sides.spark.push(theirs);
    }
    let sides = sides.each(|runs| {
        json!({
            "first_batch_s": over(runs, |r| r.first_batch_s),
            "batch_ms": over(runs, |r| r.batch_ms[0]),
            "peak_mib": over(runs, |r| mib(r.peak_bytes)),
        })
    });
    for (name, v) in &sides {
        println!(
            "   {name:>5}: {:.2} s to the first batch (the batch {:.0} ms), {:.0} MiB peak",
            get(v, "first_batch_s"),
            get(v, "batch_ms"),
            get(v, "peak_mib"),
        );
    }
    if let [(_, w), (_, sp)] = &sides[..] {
        let start = get(w, "first_batch_s") / get(sp, "first_batch_s");
        targets.check(
            start < 0.1,
            format!("{format}: weir's start on {commits} commits {start:.3} of Spark's (target < 0.1)"),
        );
    }
    let mut out = serde_json::Map::new();
    out.insert("commits".into(), json!(commits));
    out.insert("made_s".into(), json!(made.last_batch_s));
    out.extend(sides.into_iter().map(|(k, v)| (k.to_string(), v)));
    Value::Object(out)
}

fn main() {
    let rounds: usize = env_or("WEIR_BENCH_ROUNDS", 2);
    let formats = std::env::var("WEIR_BENCH_FORMATS").unwrap_or_else(|_| "delta,iceberg".into());
    let weir = release_weir();
    let mut results = serde_json::Map::new();
    let mut targets = Targets::default();
    let mut topic: Option<Topic> = None;
    for format in formats.split(',').map(str::trim) {
        if part(1) {
            let v = small_batches(&weir, format, rounds, &mut targets);
            results.insert(format!("{format}_300x1000"), v);
        }
        if part(2) {
            let v = growth(&weir, format, rounds, &mut targets);
            results.insert(format!("{format}_1000x100"), v);
        }
        if part(3) {
            let v = one_batch(&weir, format, rounds, &mut targets);
            results.insert(format!("{format}_one_batch"), v);
        }
        if part(4) {
            let topic = topic.get_or_insert_with(Topic::make);
            let v = kafka_to_table(&weir, format, rounds, topic, &mut targets);
            results.insert(format!("{format}_kafka"), v);
        }
        if part(5) {
            let v = compaction(&weir, format, rounds, &mut targets);
            results.insert(format!("{format}_compaction"), v);
        }
        if part(6) {
            let v = cold_start(&weir, format, rounds, &mut targets);
            results.insert(format!("{format}_cold_start"), v);
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = root.join("target/bench-results");
    std::fs::create_dir_all(&out).expect("results directory");
    let path = out.join("spark.json");
    // The workloads not run this time keep their last results.
    let mut all = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Map<String, Value>>(&b).ok())
        .unwrap_or_default();
    all.extend(results);
    let all = Value::Object(all);
    std::fs::write(&path, serde_json::to_string_pretty(&all).expect("json")).expect("results written");
    println!("results in {}", path.display());
    let plots = weir_benches::spark_report::write_plots(&all, &root.join("docs/benchmarks")).expect("plots written");
    for plot in plots {
        println!("plot {}", plot.display());
    }
    KEPT.lock().unwrap_or_else(|e| e.into_inner()).clear();
    if !targets.0.is_empty() {
        eprintln!("targets missed: {}", targets.0.join("; "));
        std::process::exit(1);
    }
}
