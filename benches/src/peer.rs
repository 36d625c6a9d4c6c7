//! Running a streaming process to compare: `weir stream` or Spark
//! Structured Streaming (`benches/python/spark_stream.py`), each printing a
//! JSON line per batch, timed and measured from outside the same way.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a process must live to count towards a run's memory (in
/// samples, one every 50 ms).
pub const LONG_LIVED: u32 = 10;

/// One run of a streaming process.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// Each batch's own duration as the engine reports it, in milliseconds,
    /// by batch id.
    pub batch_ms: Vec<f64>,
    /// Seconds from the process's start to its first batch's report.
    pub first_batch_s: f64,
    /// Seconds from the process's start to its last batch's report.
    pub last_batch_s: f64,
    /// The peak resident memory of the process and of its children that
    /// live at least [`LONG_LIVED`] samples (each one's high-water mark,
    /// summed), in bytes. Short-lived children are left out: Hadoop's local file system
    /// runs shell commands from Spark's JVM, and a child forked from it
    /// shows the JVM's pages until it runs its command.
    pub peak_bytes: u64,
    /// Rows in the table at the end, when the process reports them.
    pub table_rows: Option<u64>,
    /// Rows the batches wrote, summed over the batches that report them
    /// (`rows` on Spark's side, `output_rows` on weir's).
    pub rows: u64,
}

/// Runs `command` to its end, reading a JSON object per line from its
/// stdout: `{"batch": N, "ms": M, "rows": R}` (Spark's side) or weir's
/// progress (`batch_id`, `durations_ms.total`, `output_rows`), and
/// `{"done": rows}`.
///
/// # Panics
/// If the process fails or reports no batch: a benchmark has no answer
/// then.
pub fn run(command: Command) -> Run {
    run_with(command, false)
}

/// As [`run`], for a command that reports no batch (a maintenance job):
/// its one "batch" is the whole process, start to end.
pub fn run_whole(command: Command) -> Run {
    run_with(command, true)
}

fn run_with(mut command: Command, whole: bool) -> Run {
    let started = Instant::now();
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the process starts");
    let pid = child.id();
    let stopped = Arc::new(AtomicBool::new(false));
    // By process: its high-water mark and how many samples saw it.
    let peaks = Arc::new(Mutex::new(std::collections::HashMap::<u32, (u64, u32)>::new()));
    let sampler = {
        let (stopped, peaks) = (stopped.clone(), peaks.clone());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                let mut peaks = peaks.lock().unwrap();
                for p in tree(pid) {
                    let hwm = high_water_mark(p);
                    let (peak, seen) = peaks.entry(p).or_default();
                    *peak = (*peak).max(hwm);
                    *seen += 1;
                }
                drop(peaks);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || {
        // The last lines, to show if the process fails.
        let mut tail = std::collections::VecDeque::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tail.len() == 40 {
                tail.pop_front();
            }
            tail.push_back(line);
        }
        Vec::from(tail).join("\n")
    });
    let mut out = Run::default();
    let mut batches: Vec<(u64, f64)> = Vec::new();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line.expect("stdout reads");
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if let Some(rows) = json["done"].as_u64() {
            out.table_rows = Some(rows);
            continue;
        }
        let batch = json["batch"].as_u64().or_else(|| json["batch_id"].as_u64());
        let ms = json["ms"].as_f64().or_else(|| json["durations_ms"]["total"].as_f64());
        out.rows += json["rows"]
            .as_u64()
            .or_else(|| json["output_rows"].as_u64())
            .unwrap_or(0);
        if let (Some(batch), Some(ms)) = (batch, ms) {
            let at = started.elapsed().as_secs_f64();
            if batches.is_empty() {
                out.first_batch_s = at;
            }
            out.last_batch_s = at;
            batches.push((batch, ms));
        }
    }
    let status = child.wait().expect("the process ends");
    if whole {
        let at = started.elapsed().as_secs_f64();
        (out.first_batch_s, out.last_batch_s) = (at, at);
        batches = vec![(0, at * 1e3)];
    }
    stopped.store(true, Ordering::Relaxed);
    sampler.join().expect("the sampler");
    let errors = errors.join().unwrap_or_default();
    assert!(status.success(), "{command:?} failed ({status}):\n{errors}");
    assert!(!batches.is_empty(), "{command:?} reported no batch:\n{errors}");
    batches.sort_by_key(|(b, _)| *b);
    out.batch_ms = batches.into_iter().map(|(_, ms)| ms).collect();
    let peaks = peaks.lock().unwrap();
    let counted = peaks.iter().filter(|(p, (_, seen))| **p == pid || *seen >= LONG_LIVED);
    out.peak_bytes = counted.map(|(_, (peak, _))| peak).sum();
    out
}

/// `pid` and its descendants.
fn tree(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // The fields after the command, which is in parentheses.
        let parent = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok());
        if let Some(parent) = parent {
            parents.push((p, parent));
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let of = found[i];
        found.extend(parents.iter().filter(|(_, parent)| *parent == of).map(|(p, _)| *p));
        i += 1;
    }
    found
}

/// The peak resident set of process `pid` so far (`VmHWM`), in bytes (0
/// once it is gone).
pub fn high_water_mark(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Spark's compaction of a table weir made (`existing`, as for
/// [`spark_command_on`]): `benches/python/spark_compact.py`, Delta's
/// `OPTIMIZE` or Iceberg's `rewrite_data_files`, timed by itself. `None`,
/// with a notice, without the readers' Python or Spark's jars.
pub fn spark_compact_command(format: &str, dir: &Path, existing: &Path) -> Option<Command> {
    let mut command = Command::new(spark_python()?);
    command
        .arg(workspace().join("benches/python/spark_compact.py"))
        .arg(format)
        .arg(dir)
        .arg(existing);
    Some(command)
}

/// Spark's side: `benches/python/spark_stream.py` with the readers' Python
/// (`.venv-readers`, which has pyspark), `batches` batches of `rows` rows
/// in `partitions` partitions into a fresh `format` table under `dir`.
/// `None`, with a notice, without that Python or Spark's jars.
pub fn spark_command(format: &str, dir: &Path, batches: u64, rows: u64, partitions: u32) -> Option<Command> {
    spark_command_on(format, dir, batches, rows, partitions, None)
}

/// As [`spark_command`], appending to a table weir made when `existing`
/// names it: a Delta table's path, or the SQLite file of weir's embedded
/// catalog for Iceberg (see `benches/python/spark_stream.py`).
pub fn spark_command_on(
    format: &str,
    dir: &Path,
    batches: u64,
    rows: u64,
    partitions: u32,
    existing: Option<&Path>,
) -> Option<Command> {
    let python = spark_python()?;
    let mut command = Command::new(python);
    command
        .arg(workspace().join("benches/python/spark_stream.py"))
        .arg(format)
        .arg(dir)
        .args([batches.to_string(), rows.to_string(), partitions.to_string()]);
    if let Some(existing) = existing {
        command.arg(existing);
    }
    Some(command)
}

/// Spark's side of Kafka to a table: `benches/python/spark_kafka.py`,
/// Spark's Kafka source reading `topic` from its start into a fresh
/// `format` table under `dir`, at most `per_trigger` records a trigger,
/// until `records` are written. `None`, with a notice, as for
/// [`spark_command`].
pub fn spark_kafka_command(
    format: &str,
    dir: &Path,
    bootstrap: &str,
    topic: &str,
    records: u64,
    per_trigger: u64,
) -> Option<Command> {
    let mut command = Command::new(spark_python()?);
    command
        .arg(workspace().join("benches/python/spark_kafka.py"))
        .arg(format)
        .arg(dir)
        .args([bootstrap, topic])
        .args([records.to_string(), per_trigger.to_string()]);
    Some(command)
}

/// weir's side: the release `weir stream` (`weir`), the rate source,
/// `batches` batches of `rows` rows into a fresh `format` table of the
/// embedded catalog under `dir`, its defaults otherwise.
pub fn weir_command(weir: &Path, format: &str, dir: &Path, batches: u64, rows: u64) -> Command {
    weir_command_on(weir, format, &dir.join("weir-lake"), &dir.join("chk"), batches, rows)
}

/// As [`weir_command`], on the embedded catalog at `lake` with the
/// checkpoint `checkpoint`: a second query appends to the table a first
/// one made.
pub fn weir_command_on(weir: &Path, format: &str, lake: &Path, checkpoint: &Path, batches: u64, rows: u64) -> Command {
    let mut command = Command::new(weir);
    command
        .arg("--lake")
        .arg(lake)
        .args(["stream", "--from", "rate", "--rows-per-batch", &rows.to_string()])
        .args(["--to", "bench.payments", "--format", format])
        .args([
            "--max-batches",
            &batches.to_string(),
            "--progress",
            "json",
            "--checkpoint",
        ])
        .arg(checkpoint)
        .env_remove("WEIR_CONFIG");
    command
}

/// The readers' Python (which has pyspark), if it and Spark's jars are
/// there; else a notice.
fn spark_python() -> Option<PathBuf> {
    let root = workspace();
    let python = root.join(".venv-readers/bin/python");
    if !python.exists() || !root.join(".cache/spark-jars").is_dir() {
        eprintln!(
            "NOTE: .venv-readers or .cache/spark-jars is missing (scripts/test.sh makes them); Spark is left out"
        );
        return None;
    }
    Some(python)
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `q` quantile (0 to 1) of `xs`, nearest rank.
pub fn percentile(xs: &[f64], q: f64) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let xs: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&xs, 0.5), 50.0);
        assert_eq!(percentile(&xs, 0.99), 99.0);
        assert_eq!(percentile(&xs, 1.0), 100.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
    }

    #[test]
    fn a_run_reads_both_kinds_of_lines_and_measures_the_tree() {
        let script = r#"echo '{"batch": 1, "ms": 4.5, "rows": 3}'; echo 'not json'; echo '{"batch_id": 0, "durations_ms": {"total": 2.0}, "output_rows": 5}'; sleep 1 & wait; echo '{"done": 7}'"#;
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        let run = run(command);
        assert_eq!(run.batch_ms, vec![2.0, 4.5]);
        assert_eq!(run.table_rows, Some(7));
        assert_eq!(run.rows, 8);
        assert!(run.first_batch_s <= run.last_batch_s);
        assert!(run.peak_bytes > 0);
    }

    #[test]
    #[should_panic(expected = "failed")]
    fn a_failed_run_panics_with_its_errors() {
        let mut command = Command::new("sh");
        command.args(["-c", "echo '{\"batch\": 0, \"ms\": 1}'; echo broken >&2; exit 3"]);
        run(command);
    }
}
