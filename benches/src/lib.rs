//! Shared pieces of weir's benchmarks.

pub mod kafka;
pub mod peer;
pub mod s3;
pub mod service;
pub mod spark_report;
pub mod svg;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use weir_core::protocol::{decide_commit, CommitDecision, SinkIdentity, SinkMarker};
use weir_core::sink::{BatchContext, CommitMessage, CommitOutcome, DataWriter, Sink};
use weir_core::{QueryId, QueryName, Result};

/// A sink that counts rows and keeps its marker in memory: the engine's cost
/// without a table format's.
#[derive(Debug, Clone, Default)]
pub struct NoopSink {
    rows: Arc<AtomicU64>,
    marker: Arc<Mutex<Option<SinkMarker>>>,
}

impl NoopSink {
    /// Rows the sink was handed.
    pub fn rows(&self) -> u64 {
        self.rows.load(Ordering::Relaxed)
    }
}

struct CountingWriter {
    rows: Arc<AtomicU64>,
    partition_id: usize,
}

#[async_trait]
impl DataWriter for CountingWriter {
    async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        self.rows.fetch_add(batch.num_rows() as u64, Ordering::Relaxed);
        Ok(())
    }
    async fn commit(self: Box<Self>) -> Result<CommitMessage> {
        CommitMessage::new(self.partition_id, &())
    }
    async fn abort(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

#[async_trait]
impl Sink for NoopSink {
    fn identity(&self) -> SinkIdentity {
        SinkIdentity::new("noop", "bench")
    }
    async fn marker(&self, _name: &QueryName, _known_ids: &[QueryId]) -> Result<Option<SinkMarker>> {
        Ok(*self.marker.lock().unwrap())
    }
    fn create_writer(&self, _batch: &BatchContext, partition_id: usize) -> Result<Box<dyn DataWriter>> {
        Ok(Box::new(CountingWriter {
            rows: self.rows.clone(),
            partition_id,
        }))
    }
    async fn commit(&self, batch: &BatchContext, _messages: Vec<CommitMessage>) -> Result<CommitOutcome> {
        let mut marker = self.marker.lock().unwrap();
        if let CommitDecision::AlreadyCommitted(m) = decide_commit(*marker, batch.commit_facts())? {
            return Ok(CommitOutcome::AlreadyCommitted(m));
        }
        *marker = Some(SinkMarker {
            query_id: batch.query_id,
            batch_id: batch.batch_id,
        });
        Ok(CommitOutcome::Committed { version: None })
    }
}

/// Milliseconds of a duration.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The mean.
pub fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

/// The median: a batch's cost in steady state, not skewed by the occasional
/// batch that merges manifests or shares the cores with a log checkpoint.
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Milliseconds per batch of `script` (under `benches/python`) run with the
/// readers' Python on a fresh directory, `batches` batches of 1,000 rows;
/// `None`, with a notice, if `.venv-readers` is missing.
pub fn python_per_batch(script: &str, batches: u64) -> Option<Vec<f64>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".venv-readers/bin/python");
    if !python.exists() {
        eprintln!("NOTE: .venv-readers is missing (scripts/test.sh makes it); the Python comparison is left out");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(python)
        .arg(root.join("benches/python").join(script))
        .arg(dir.path().join("t"))
        .arg(batches.to_string())
        .arg("1000")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Some(
        json["per_batch_ms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect(),
    )
}

/// Median total and commit milliseconds of `n` 1,000-row batches of a query
/// named `measured`, once the table's history (1-row batches of a query
/// named `history`) reaches each of `levels` commits. `run(name,
/// checkpoint, rows per batch, last batch)` streams the rate source into the
/// table under test and returns the run's progress.
pub async fn latency_by_history<F, Fut>(levels: &[u64], n: u64, run: F) -> Vec<(u64, f64, f64)>
where
    F: Fn(&'static str, std::path::PathBuf, u64, u64) -> Fut,
    Fut: std::future::Future<Output = Vec<weir_core::progress::QueryProgress>>,
{
    let dir = tempfile::tempdir().unwrap();
    let (chk_small, chk_big) = (dir.path().join("small"), dir.path().join("big"));
    let mut out = Vec::new();
    let mut history = 0u64; // commits of the 1-row query so far
    let mut big_last: Option<u64> = None;
    for &level in levels {
        let target = level.saturating_sub(big_last.map(|b| b + 1).unwrap_or(0));
        if target > history {
            run("history", chk_small.clone(), 1, target - 1).await;
            history = target;
        }
        let first = big_last.map(|b| b + 1).unwrap_or(0);
        let last = first + n - 1;
        // The first batch of a run pays for loading the table: leave it out.
        let progress: Vec<_> = run("measured", chk_big.clone(), 1000, last)
            .await
            .into_iter()
            .skip(1)
            .collect();
        let total = median(&progress.iter().map(|p| p.durations_ms.total).collect::<Vec<_>>());
        let commit = median(&progress.iter().map(|p| p.durations_ms.commit).collect::<Vec<_>>());
        out.push((level, total, commit));
        big_last = Some(last);
    }
    out
}

/// Whether part `n` of a benchmark runs: every part unless
/// `WEIR_BENCH_PARTS` lists some (`WEIR_BENCH_PARTS=2,3`).
pub fn part(n: u32) -> bool {
    match std::env::var("WEIR_BENCH_PARTS") {
        Ok(parts) => parts.split(',').any(|p| p.trim().parse() == Ok(n)),
        Err(_) => true,
    }
}

/// Prints a latency part of a table benchmark under `title`: the latencies of
/// [`latency_by_history`] at each level (`unit` names a level: `commits`,
/// `snapshots`) and the ratio of the top level to the first.
pub fn print_latencies(title: &str, latencies: &[(u64, f64, f64)], unit: &str) {
    println!("{title}");
    for (level, total, commit) in latencies {
        println!("   {level:>6} {unit}: {total:>7.2} ms per batch, {commit:>7.2} ms in the commit");
    }
    if let (Some(first), Some(last)) = (latencies.first(), latencies.last()) {
        println!(
            "   ratio at {} / at {}   {:>7.2}   (target <= 1.5 at 10,000)",
            last.0,
            first.0,
            last.1 / first.1
        );
    }
}

/// Builds the release `weir` command (`cargo build --release -p weir-cli`)
/// and returns its path: benchmarks that time or measure the command users
/// run, with its allocator, run it.
pub fn release_weir() -> std::path::PathBuf {
    release_binary("weir-cli", "weir")
}

/// Builds binary `bin` of workspace package `package` in release and
/// returns its path.
///
/// It builds in a target directory of its own, `target/bench-bins`: one
/// package's build enables other features of the shared dependencies than
/// the benchmarks' build does, and in one target directory a dependency
/// whose own features agree but whose dependencies' differ is kept once,
/// so each build would compile much of the other's tree again. And it
/// builds without the variables `cargo bench` sets to run a benchmark
/// (`CARGO_MANIFEST_DIR` and the like): build scripts watch some of them
/// (ring's watches `CARGO_MANIFEST_DIR`), so a build from a benchmark and
/// one from a shell would each compile the tree again.
pub fn release_binary(package: &str, bin: &str) -> std::path::PathBuf {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace");
    let target = workspace.join("target").join("bench-bins");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    command
        .args(["build", "--release", "--locked", "--quiet", "-p", package, "--bin", bin])
        .arg("--target-dir")
        .arg(&target)
        .current_dir(workspace);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        let set_for_a_run = key.starts_with("CARGO_MANIFEST_")
            || key.starts_with("CARGO_PKG_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "OUT_DIR",
            ]
            .contains(&&*key);
        if set_for_a_run {
            command.env_remove(&*key);
        }
    }
    let status = command.status().expect("cargo runs");
    assert!(status.success(), "building {bin} failed");
    target.join("release").join(bin)
}
