//! Long-run memory: `weir stream` makes 20,000 commits of 100 rows into a
//! fresh table per workload, its resident set sampled every 100 commits,
//! and the curve printed every 1,000. The benchmark fails (exit 1) when a
//! workload's resident memory after 10,000 commits is over 1.5 times what it
//! was after 1,000.
//!
//! ```text
//! cargo bench -p weir-benches --bench soak
//! WEIR_BENCH_COMMITS=10000 WEIR_BENCH_SOAK=delta,delta-compact cargo bench -p weir-benches --bench soak
//! ```
//!
//! It builds and runs the release `weir` binary (`cargo build --release -p
//! weir-cli`), so the figures are those of the command users run, with its
//! allocator.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use weir_benches::release_weir;
use weir_test_support::memory::{sample_stream, MemorySample};

/// The workloads: a name and `weir stream`'s options beyond the common ones.
const WORKLOADS: &[(&str, &[&str])] = &[
    ("delta", &["--format", "delta"]),
    ("delta-compact", &["--format", "delta", "--compact-every", "100"]),
    ("iceberg", &["--format", "iceberg"]),
    ("iceberg-compact", &["--format", "iceberg", "--compact-every", "100"]),
];

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
    let weir = release_weir();
    let mut failures = Vec::new();
    for (name, options) in WORKLOADS {
        if chosen.as_ref().is_some_and(|c| !c.iter().any(|n| n == name)) {
            continue;
        }
        let curve = soak(&weir, commits, options);
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

fn soak(weir: &PathBuf, commits: u64, options: &[&str]) -> Vec<Sample> {
    let lake = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut child = Command::new(weir)
        .arg("--lake")
        .arg(lake.path().join("weir-lake"))
        .args([
            "stream",
            "--from",
            "rate",
            "--rows-per-batch",
            "100",
            "--to",
            "lake.bronze.soak",
        ])
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
        .expect("the weir command starts");
    let mut curve = Vec::new();
    sample_stream(&mut child, 100, |memory| {
        curve.push(Sample {
            memory,
            seconds: started.elapsed().as_secs_f64(),
        })
    });
    assert!(child.wait().unwrap().success(), "weir stream {options:?} failed");
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
