//! Kafka throughput, each side timed in the same run, rounds alternating,
//! medians reported:
//!
//! 1. Kafka to Delta and Kafka to Iceberg: `weir stream --from kafka` (the
//!    release binary) reads a topic of JSON payments of about 200 bytes in 8
//!    partitions, 1,250,000 records a batch on a 1 s trigger (so the
//!    trigger does not bound the rate), and commits them; records/s end to
//!    end, against the raw rate of the same librdkafka consumer settings
//!    reading the same topic and doing nothing else.
//!    - With the values as they are (`--value-format raw`), the
//!      rate shows what weir adds to reading: target at least 0.7 of the
//!      raw rate (the median of each round's ratio to its raw consumer).
//!    - With the values parsed into typed columns (`--value-format json`),
//!      the rate is bound by the CPU that parsing and Parquet encoding take;
//!      it is reported with the CPU seconds each million records took, its
//!      ratio to the raw-value run, and its ratio to a bare loop doing the
//!      same work in one thread without weir: the same consumer, each
//!      8,192 values parsed by arrow-json into the same schema and written
//!      to one local Parquet file with zstd(1), weir's default (no
//!      checkpoint, no table, no commit).
//! 2. The peak resident memory of each `weir stream` run: it should follow
//!    the batch size, not the topic.
//! 3. The exactly-once Kafka sink against the at-least-once one, 2,000,000
//!    rows of the rate source as JSON records in batches of 100,000. The
//!    target (at least 0.8) is on the sustained rate: the ratio of the
//!    median batch's time (write and commit) of each. The whole run's rate
//!    is reported beside it, with each run's start-up: the exactly-once
//!    sink's start fences older producers of the query and reads its
//!    marker, a fixed cost of some hundreds of milliseconds per start that
//!    is a large share of a run this short. Both topics exist before the
//!    clock starts, as a query's do after its first run.
//!
//! Before every timed run the disk catches up (`sync`): the tables a run
//! writes and the lakes removed after it are otherwise still being written
//! back while the next run is timed.
//!
//! ```text
//! cargo bench -p weir-benches --bench kafka
//! WEIR_BENCH_KAFKA_RECORDS=1000000 cargo bench -p weir-benches --bench kafka
//! WEIR_BENCH_KAFKA_ONLY=sink cargo bench -p weir-benches --bench kafka
//! ```
//!
//! `WEIR_BENCH_KAFKA_ONLY` runs one part: `tables` (1 and 2) or `sink` (3).
//!
//! It uses the broker `WEIR_TEST_KAFKA_BOOTSTRAP` names, or starts one with
//! `scripts/services/kafka.sh`. The process exits 1 when a target is missed.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message;
use rdkafka::TopicPartitionList;
use weir_benches::kafka::{payment, produce, stream_command, Broker};
use weir_benches::peer::high_water_mark;
use weir_benches::{median, release_weir};
use weir_core::prelude::*;
use weir_kafka::{Guarantee, KafkaSink};
use weir_test_support::kafka;

const PARTITIONS: i32 = 8;
const PER_BATCH: u64 = 1_250_000;
const ROUNDS: usize = 3;
const SINK_ROWS: u64 = 2_000_000;

fn main() {
    let only = std::env::var("WEIR_BENCH_KAFKA_ONLY").ok();
    let broker = Broker::start();
    let mut missed = Vec::new();
    if only.as_deref().is_none_or(|o| o == "tables") {
        tables(&broker, &mut missed);
    }
    if only.as_deref().is_none_or(|o| o == "sink") {
        sinks(&broker, &mut missed);
    }
    drop(broker);
    if !missed.is_empty() {
        eprintln!("targets missed: {}", missed.join("; "));
        std::process::exit(1);
    }
}

/// Kafka into Delta and Iceberg tables: rates against the bare consumer,
/// CPU and peak memory (parts 1 and 2).
fn tables(broker: &Broker, missed: &mut Vec<String>) {
    let records: u64 = std::env::var("WEIR_BENCH_KAFKA_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000_000);
    let weir = release_weir();
    let topic = kafka::create_topic(&broker.bootstrap, "bench", PARTITIONS);
    let started = Instant::now();
    let bytes = produce(&broker.bootstrap, &topic, PARTITIONS, records);
    println!(
        "produced {records} records, {:.0} bytes each, into {PARTITIONS} partitions in {:.1} s",
        bytes as f64 / records as f64,
        started.elapsed().as_secs_f64()
    );

    const WORKLOADS: [(&str, &str); 4] = [
        ("delta", "raw"),
        ("delta", "json"),
        ("iceberg", "raw"),
        ("iceberg", "json"),
    ];
    let (mut raw, mut bare) = (Vec::new(), Vec::new());
    let mut runs: Vec<Vec<Streamed>> = WORKLOADS.iter().map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        settle();
        raw.push(consume_raw(&broker.bootstrap, &topic, records));
        settle();
        bare.push(consume_parse_write(&broker.bootstrap, &topic, records));
        let mut line = format!(
            "round {round}: raw consumer {:.0}/s, bare JSON to Parquet {:.0}/s",
            raw[round], bare[round]
        );
        for (w, (format, values)) in WORKLOADS.iter().enumerate() {
            settle();
            let run = stream(&weir, &broker.bootstrap, &topic, records, format, values);
            line += &format!(", {format} {values} {:.0}/s ({:.0} MiB peak)", run.rate, mib(run.peak));
            runs[w].push(run);
        }
        println!("{line}");
    }
    let paired = |runs: &[Streamed]| median(&runs.iter().zip(&raw).map(|(r, raw)| r.rate / raw).collect::<Vec<_>>());
    let (raw, bare) = (median(&raw), median(&bare));
    let mut rates = Vec::new();
    for ((format, values), runs) in WORKLOADS.iter().zip(&runs) {
        let rate = median(&runs.iter().map(|r| r.rate).collect::<Vec<_>>());
        let cpu = median(&runs.iter().map(|r| r.cpu).collect::<Vec<_>>()) / (records as f64 / 1e6);
        let peak = runs.iter().map(|r| r.peak).max().unwrap_or(0);
        let ratio = rate / raw;
        println!(
            "Kafka to {format}, {values} values: {rate:.0} records/s, {ratio:.2} of the raw consumer's {raw:.0}/s; \
             {cpu:.2} CPU s per million records; peak resident {:.0} MiB",
            mib(peak)
        );
        if *values == "raw" {
            let raw_values = paired(runs);
            println!("  paired with the raw consumer of its round: median {raw_values:.2} (target 0.70)");
            if raw_values < 0.7 {
                missed.push(format!(
                    "kafka to {format} with raw values at {raw_values:.2} of the raw rate (target 0.70)"
                ));
            }
        }
        if *values == "json" {
            println!("  {:.2} times the bare JSON-to-Parquet loop's {bare:.0}/s", rate / bare);
        }
        rates.push(rate);
    }
    println!(
        "parsing JSON into typed columns: {:.2} of the raw-value rate into Delta, {:.2} into Iceberg",
        rates[1] / rates[0],
        rates[3] / rates[2]
    );
}

/// The exactly-once Kafka sink against the at-least-once one (part 3).
fn sinks(broker: &Broker, missed: &mut Vec<String>) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut alo, mut eos) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        for (exactly_once, runs) in [(false, &mut alo), (true, &mut eos)] {
            let run = rt.block_on(sink(&broker.bootstrap, exactly_once));
            println!(
                "round {round}, {}: {:.0} rows/s; start {:.0} ms, per batch: write {:.1} ms, commit {:.1} ms (medians)",
                if exactly_once { "exactly once" } else { "at least once" },
                run.rate,
                run.start_ms,
                run.write_ms,
                run.commit_ms
            );
            runs.push(run);
        }
    }
    let per_batch = |runs: &[SinkRun]| median(&runs.iter().map(|r| r.write_ms + r.commit_ms).collect::<Vec<_>>());
    let rate = |runs: &[SinkRun]| median(&runs.iter().map(|r| r.rate).collect::<Vec<_>>());
    // Paired by round: the machine's speed drifts between rounds.
    let whole = median(&alo.iter().zip(&eos).map(|(a, e)| e.rate / a.rate).collect::<Vec<_>>());
    println!(
        "Kafka sink, whole runs with their start: at least once {:.0} rows/s, exactly once {:.0} rows/s; paired by round: {whole:.2}",
        rate(&alo),
        rate(&eos)
    );
    let sustained = per_batch(&alo) / per_batch(&eos);
    println!(
        "Kafka sink, sustained (median batch, write and commit): at least once {:.1} ms, exactly once {:.1} ms: {sustained:.2} (target 0.80)",
        per_batch(&alo),
        per_batch(&eos)
    );
    if sustained < 0.8 {
        missed.push(format!(
            "the exactly-once sink sustains {sustained:.2} of the at-least-once one"
        ));
    }
}

/// Waits for what earlier runs left to write back (their tables, and the
/// lakes removed after them) to reach the disk, so it does not slow the
/// next run down.
fn settle() {
    let synced = Command::new("sync").status().is_ok_and(|s| s.success());
    assert!(synced, "sync runs");
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// Records per second of a consumer with the Kafka source's settings that
/// reads the whole topic and does nothing else.
fn consume_raw(bootstrap: &str, topic: &str, records: u64) -> f64 {
    let consumer = consumer(bootstrap, topic);
    let started = Instant::now();
    let (mut n, mut bytes) = (0u64, 0u64);
    while n < records {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            bytes += m.unwrap().payload_len() as u64;
            n += 1;
        }
    }
    assert!(bytes > 0);
    n as f64 / started.elapsed().as_secs_f64()
}

/// A consumer with the Kafka source's settings, assigned every partition
/// of `topic` from its start.
fn consumer(bootstrap: &str, topic: &str) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "weir")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("queued.max.messages.kbytes", "16384")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Offset(0)).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    consumer
}

/// Records per second of the bare loop: the raw consumer, each 8,192
/// values parsed by arrow-json into the payment schema and written to one
/// Parquet file with zstd(1), in the loop's thread.
fn consume_parse_write(bootstrap: &str, topic: &str, records: u64) -> f64 {
    const CHUNK: usize = 8192;
    let consumer = consumer(bootstrap, topic);
    let schema = Arc::new(payment_schema());
    let dir = tempfile::tempdir().unwrap();
    let file = std::fs::File::create(dir.path().join("payments.parquet")).unwrap();
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::try_new(1).unwrap()))
        .build();
    let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(properties)).unwrap();
    let mut decoder = arrow_json::ReaderBuilder::new(schema)
        .with_batch_size(CHUNK)
        .build_decoder()
        .unwrap();
    let started = Instant::now();
    let cpu = cpu_seconds(std::process::id());
    let mut n = 0u64;
    while n < records {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            decoder.decode(m.payload().expect("a value")).unwrap();
            decoder.decode(b"\n").unwrap();
            n += 1;
            if decoder.len() == CHUNK {
                writer.write(&decoder.flush().unwrap().unwrap()).unwrap();
            }
        }
    }
    if let Some(batch) = decoder.flush().unwrap() {
        writer.write(&batch).unwrap();
    }
    let written = writer.close().unwrap();
    assert_eq!(written.file_metadata().num_rows() as u64, records);
    let rate = n as f64 / started.elapsed().as_secs_f64();
    if let (Some(before), Some(after)) = (cpu, cpu_seconds(std::process::id())) {
        println!(
            "  bare loop: {rate:.0}/s, {:.2} CPU s per million records (the benchmark's process)",
            (after - before) / (records as f64 / 1e6)
        );
    }
    rate
}

/// The payments' columns as `PAYMENT_SCHEMA` declares them.
fn payment_schema() -> Schema {
    let string = |name| Field::new(name, DataType::Utf8, true);
    Schema::new(vec![
        Field::new("event_id", DataType::Int64, false),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        ),
        Field::new("account_id", DataType::Int64, true),
        string("merchant"),
        Field::new("amount", DataType::Decimal128(18, 2), true),
        string("currency"),
        string("country"),
        string("channel"),
        string("status"),
    ])
}

struct Streamed {
    rate: f64,
    peak: u64,
    /// CPU seconds (user and system) the process took.
    cpu: f64,
}

/// `weir stream --from kafka` over the whole topic into a new table.
fn stream(weir: &Path, bootstrap: &str, topic: &str, records: u64, format: &str, values: &str) -> Streamed {
    let lake = tempfile::tempdir().unwrap();
    let batches = records.div_ceil(PER_BATCH);
    let mut command = stream_command(
        weir,
        lake.path(),
        bootstrap,
        topic,
        records,
        PER_BATCH,
        format,
        values,
        "none",
    );
    let started = Instant::now();
    let mut child = command.spawn().expect("weir starts");
    let (mut peak, mut cpu) = (0, 0.0);
    while child.try_wait().unwrap().is_none() {
        peak = peak.max(high_water_mark(child.id()));
        cpu = cpu_seconds(child.id()).unwrap_or(cpu);
        std::thread::sleep(Duration::from_millis(50));
    }
    let seconds = started.elapsed().as_secs_f64();
    assert!(child.wait().unwrap().success(), "weir stream into {format} failed");
    let committed = last_committed(weir, lake.path());
    assert_eq!(
        committed,
        Some(batches - 1),
        "every batch of the {format} stream committed"
    );
    if let Some(rows) = table_rows(weir, lake.path()) {
        assert_eq!(rows, records, "the {format} table holds every record");
    }
    Streamed {
        rate: records as f64 / seconds,
        peak,
        cpu,
    }
}

/// The CPU seconds (user and system) process `pid` took so far, from
/// `/proc/<pid>/stat` in clock ticks of 1/100 s.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command, which is in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

/// The checkpoint's last committed batch.
fn last_committed(weir: &Path, lake: &Path) -> Option<u64> {
    let out = Command::new(weir)
        .args(["checkpoint", "show", "--json"])
        .arg(lake.join("chk"))
        .output()
        .unwrap();
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).expect("checkpoint show --json");
    s["last_committed"].as_u64()
}

/// The table's rows, where its format records them (Iceberg's snapshot
/// summary).
fn table_rows(weir: &Path, lake: &Path) -> Option<u64> {
    let out = Command::new(weir)
        .arg("--lake")
        .arg(lake.join("weir-lake"))
        .args(["describe", "bench.payments", "--json"])
        .env_remove("WEIR_CONFIG")
        .output()
        .unwrap();
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).expect("describe --json");
    d["rows"].as_u64()
}

/// Rate rows as `key` and a JSON `value`.
fn as_records(batch: RecordBatch) -> Result<RecordBatch, BoxError> {
    let ids = batch.column(0).as_primitive::<Int64Type>();
    let keys: StringArray = ids.values().iter().map(|i| Some((i % 1000).to_string())).collect();
    let values: StringArray = ids.values().iter().map(|i| Some(payment(*i as u64))).collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, true),
        Field::new("value", DataType::Utf8, true),
    ]));
    Ok(RecordBatch::try_new(schema, vec![Arc::new(keys), Arc::new(values)])?)
}

/// Rows per second of the Kafka sink writing the rate source's rows.
/// One run of the Kafka sink.
struct SinkRun {
    rate: f64,
    /// From the start of the query to its first batch's start.
    start_ms: f64,
    /// Medians of the batches' write and commit phases.
    write_ms: f64,
    commit_ms: f64,
}

async fn sink(bootstrap: &str, exactly_once: bool) -> SinkRun {
    let topic = kafka::create_topic(bootstrap, "bench-sink", PARTITIONS);
    let mut sink = KafkaSink::new(bootstrap).topic(&topic).option("linger.ms", "20");
    if exactly_once {
        // The marker topic exists, as it does for a query after its first
        // run (like the data topic, it is made before the clock starts).
        let marker_topic = kafka::create_topic(bootstrap, "bench-markers", 1);
        sink = sink.guarantee(Guarantee::ExactlyOnce { marker_topic });
    }
    let chk = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let batches = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = batches.clone();
    read_stream(RateSource::rows_per_batch(100_000).with_total_rows(SINK_ROWS))
        .map_batches(as_records)
        .write_stream()
        .query_name(format!("bench-{}", uuid::Uuid::new_v4().simple()))
        .checkpoint_location(chk.path())
        .trigger(Trigger::available_now())
        .on_progress(move |p| seen.lock().unwrap().push(p.durations_ms))
        .start(sink)
        .await
        .unwrap()
        .await_termination()
        .await
        .unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    let batches = batches.lock().unwrap();
    let phase = |f: fn(&weir_core::progress::PhaseDurations) -> f64| median(&batches.iter().map(f).collect::<Vec<_>>());
    SinkRun {
        rate: SINK_ROWS as f64 / elapsed,
        start_ms: elapsed * 1e3 - batches.iter().map(|d| d.total).sum::<f64>(),
        write_ms: phase(|d| d.write),
        commit_ms: phase(|d| d.commit),
    }
}
