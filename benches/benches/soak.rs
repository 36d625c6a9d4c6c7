//! Long-run memory: `weir stream` makes 20,000 commits of 100 rows into a
//! fresh table per workload, its resident set sampled every 100 commits,
//! and the curve printed every 1,000. The benchmark fails (exit 1) when a
//! workload's resident memory after 10,000 commits is over 1.5 times what it
//! was after 1,000.
//!
//! The rows come from the rate source, or, for the `kafka-*` workloads,
//! from a topic of JSON payments in 4 partitions filled before the stream
//! starts, 100 records a batch (`--max-offsets-per-trigger 100`), parsed
//! into typed columns. Those use the broker `WEIR_TEST_KAFKA_BOOTSTRAP`
//! names, or start one with `scripts/services/kafka.sh`.
//!
//! The `files` workload runs the `file-sink` example instead (the rate
//! source into the file sink, 4 partition files a batch, its metadata log
//! compacted every 10 batches), on the system allocator as an application
//! of its own would be unless it chooses another; at the end the example
//! reads its output back through the log and checks every row is there
//! once.
//!
//! ```text
//! cargo bench -p weir-benches --bench soak
//! WEIR_BENCH_COMMITS=10000 WEIR_BENCH_SOAK=delta,kafka-delta,files cargo bench -p weir-benches --bench soak
//! ```
//!
//! It builds and runs the release `weir` binary (`cargo build --release -p
//! weir-cli`), so the figures are those of the command users run, with its
//! allocator; and the release `file-sink` example for `files`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use weir_benches::kafka::{produce, Broker, PAYMENT_SCHEMA};
use weir_benches::{release_binary, release_weir};
use weir_test_support::memory::{sample_stream, MemorySample};

/// What a workload runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Run {
    /// `weir stream` from the rate source, with these options beyond the
    /// common ones.
    Rate(&'static [&'static str]),
    /// `weir stream` from the topic of payments, with these options.
    Kafka(&'static [&'static str]),
    /// The `file-sink` example.
    FileSinkExample,
}

/// The workloads, by name.
const WORKLOADS: &[(&str, Run)] = &[
    ("delta", Run::Rate(&["--format", "delta"])),
    (
        "delta-compact",
        Run::Rate(&["--format", "delta", "--compact-every", "100"]),
    ),
    ("iceberg", Run::Rate(&["--format", "iceberg"])),
    (
        "iceberg-compact",
        Run::Rate(&["--format", "iceberg", "--compact-every", "100"]),
    ),
    ("kafka-delta", Run::Kafka(&["--format", "delta"])),
    ("kafka-iceberg", Run::Kafka(&["--format", "iceberg"])),
    ("files", Run::FileSinkExample),
];

/// The topic's partitions, and records a batch.
const PARTITIONS: i32 = 4;
const PER_BATCH: u64 = 100;

/// A topic holding a whole soak's records.
struct Topic {
    _broker: Broker,
    bootstrap: String,
    name: String,
}

impl Topic {
    fn fill(commits: u64) -> Topic {
        let broker = Broker::start();
        let name = weir_test_support::kafka::create_topic(&broker.bootstrap, "soak", PARTITIONS);
        let started = Instant::now();
        produce(&broker.bootstrap, &name, PARTITIONS, commits * PER_BATCH);
        println!(
            "produced {} payments into {name} in {:.1} s",
            commits * PER_BATCH,
            started.elapsed().as_secs_f64()
        );
        Topic {
            bootstrap: broker.bootstrap.clone(),
            _broker: broker,
            name,
        }
    }

    /// `weir stream`'s source options for this topic.
    fn source_args(&self, schema: &Path) -> Vec<String> {
        let mut args: Vec<String> = [
            "--from",
            "kafka",
            "--bootstrap-servers",
            self.bootstrap.as_str(),
            "--topic",
            self.name.as_str(),
            "--starting-offsets",
            "earliest",
            "--max-offsets-per-trigger",
            PER_BATCH.to_string().as_str(),
            "--value-format",
            "json",
            "--schema",
        ]
        .map(str::to_string)
        .into();
        args.push(schema.display().to_string());
        args
    }
}

/// The largest growth allowed from 1,000 commits to 10,000.
const MAX_GROWTH: f64 = 1.5;

fn main() {
    let commits: u64 = std::env::var("WEIR_BENCH_COMMITS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let chosen: Option<Vec<String>> = std::env::var("WEIR_BENCH_SOAK")
        .ok()
        .map(|v| v.split(',').map(str::to_string).collect());
    let runs: Vec<_> = WORKLOADS
        .iter()
        .filter(|(name, _)| chosen.as_ref().is_none_or(|c| c.iter().any(|n| n == name)))
        .collect();
    let topic = runs
        .iter()
        .any(|(_, run)| matches!(run, Run::Kafka(_)))
        .then(|| Topic::fill(commits));
    let needs = |file_sink: bool| {
        runs.iter()
            .any(|(_, run)| matches!(run, Run::FileSinkExample) == file_sink)
    };
    let binaries = Binaries {
        weir: needs(false).then(release_weir),
        file_sink: needs(true).then(|| release_binary("weir-examples", "file-sink")),
    };
    let mut failures = Vec::new();
    for (name, run) in runs {
        let curve = soak(*run, commits, topic.as_ref(), &binaries);
        report(name, &curve);
        let at = |n: u64| {
            curve
                .iter()
                .map(|s| s.memory)
                .find(|m| m.commits == n)
                .map(|m| m.resident)
        };
        if let (Some(early), Some(late)) = (at(1_000), at(10_000.min(commits))) {
            let growth = late as f64 / early as f64;
            println!(
                "{name}: resident memory after {} commits / after 1,000: {growth:.2}",
                10_000.min(commits)
            );
            if growth > MAX_GROWTH {
                failures.push(format!("{name} grew {growth:.2} times"));
            }
        }
    }
    if !failures.is_empty() {
        eprintln!("over {MAX_GROWTH} times: {}", failures.join("; "));
        std::process::exit(1);
    }
}

/// One sample of the stream, and the seconds since it started.
struct Sample {
    memory: MemorySample,
    seconds: f64,
}

/// The release binaries the chosen workloads run, each built once.
struct Binaries {
    weir: Option<PathBuf>,
    file_sink: Option<PathBuf>,
}

/// Runs one workload; `topic` is there for the Kafka ones.
fn soak(run: Run, commits: u64, topic: Option<&Topic>, binaries: &Binaries) -> Vec<Sample> {
    let lake = tempfile::tempdir().unwrap();
    let built = |binary: &Option<PathBuf>| binary.clone().expect("built for the chosen workloads");
    let mut child = match run {
        Run::FileSinkExample => Command::new(built(&binaries.file_sink))
            .arg("--lake")
            .arg(lake.path())
            .args(["--batches", &commits.to_string()])
            .args(["--rows-per-batch", &PER_BATCH.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("the file-sink example starts"),
        Run::Rate(options) | Run::Kafka(options) => {
            let source: Vec<String> = if let Run::Kafka(_) = run {
                let schema = lake.path().join("payment.ddl");
                std::fs::write(&schema, PAYMENT_SCHEMA).unwrap();
                topic
                    .expect("the topic is filled for a Kafka workload")
                    .source_args(&schema)
            } else {
                ["--from", "rate", "--rows-per-batch", PER_BATCH.to_string().as_str()]
                    .map(str::to_string)
                    .into()
            };
            Command::new(built(&binaries.weir))
                .arg("--lake")
                .arg(lake.path().join("weir-lake"))
                .arg("stream")
                .args(source)
                .args(["--to", "lake.bronze.soak"])
                .args([
                    "--max-batches",
                    &commits.to_string(),
                    "--progress",
                    "json",
                    "--checkpoint",
                ])
                .arg(lake.path().join("chk"))
                .args(options)
                .env_remove("WEIR_CONFIG")
                .stdout(Stdio::piped())
                .spawn()
                .expect("the weir command starts")
        }
    };
    let started = Instant::now();
    let mut curve = Vec::new();
    sample_stream(&mut child, 100, |memory| {
        curve.push(Sample {
            memory,
            seconds: started.elapsed().as_secs_f64(),
        })
    });
    assert!(child.wait().unwrap().success(), "{run:?} failed");
    curve
}

fn report(name: &str, curve: &[Sample]) {
    println!("\n{name}: commits, resident MiB, ms per commit over the last 1,000");
    let mut last = (0u64, 0.0f64);
    for s in curve.iter().filter(|s| s.memory.commits.is_multiple_of(1_000)) {
        let MemorySample { commits, resident } = s.memory;
        let ms = (s.seconds - last.1) * 1_000.0 / (commits - last.0) as f64;
        println!("  {commits:>6}  {:>6.1}  {ms:>6.2}", resident as f64 / (1 << 20) as f64);
        last = (commits, s.seconds);
    }
}
