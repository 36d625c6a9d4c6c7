//! The commit rate of one table with 1, 2 and 4 writers: N `weir stream`
//! processes (release), each a query of its own with its own checkpoint,
//! append 100-row batches of the rate source back to back to one table on
//! S3 through one catalog, per format and catalog (Delta and Iceberg in
//! the SQL catalog on PostgreSQL; Iceberg in the REST catalog).
//!
//! It prints, per setup and number of writers: the table's commits a
//! second while all N run, each writer's, the median batch and commit
//! phase, and the commit races lost per landed commit (from the sinks'
//! debug log, which names each commit's attempt).
//!
//! ```text
//! cargo bench -p weir-benches --bench writers
//! WEIR_BENCH_WRITERS=1,2,4 WEIR_BENCH_COMMITS=200 WEIR_BENCH_SETUPS=delta-postgres cargo bench -p weir-benches --bench writers
//! ```
//!
//! It uses the S3 and PostgreSQL the suite's variables name
//! (`WEIR_TEST_S3_ENDPOINT`, `WEIR_TEST_POSTGRES_URL`), or starts them with
//! `scripts/services/`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use weir_benches::release_weir;
use weir_benches::s3::S3Service;
use weir_benches::service::Postgres;

/// A format in a catalog.
#[derive(Debug, Clone, Copy)]
struct Setup {
    name: &'static str,
    format: &'static str,
    rest: bool,
}

const SETUPS: &[Setup] = &[
    Setup {
        name: "delta-postgres",
        format: "delta",
        rest: false,
    },
    Setup {
        name: "iceberg-postgres",
        format: "iceberg",
        rest: false,
    },
    Setup {
        name: "iceberg-rest",
        format: "iceberg",
        rest: true,
    },
];

/// What one writer did.
struct Writer {
    /// When each batch's progress line came, from the run's start.
    done: Vec<f64>,
    total_ms: Vec<f64>,
    commit_ms: Vec<f64>,
    /// Races lost per commit, summed, and the commits the log named.
    lost: u64,
    logged: u64,
}

/// A run of `writers` processes on one fresh table.
struct Run {
    /// Commits a second of the table while every writer ran.
    rate: f64,
    writers: Vec<Writer>,
}

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn config(dir: &Path, setup: Setup, s3: &S3Service, pg: &Postgres) -> PathBuf {
    let key = std::env::var("AWS_ACCESS_KEY_ID").expect("S3 credentials");
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").expect("S3 credentials");
    let catalog = if setup.rest {
        let uri = std::env::var("WEIR_TEST_ICEBERG_REST_URI").expect("the REST catalog");
        let warehouse = std::env::var("WEIR_TEST_ICEBERG_REST_WAREHOUSE").expect("the REST warehouse");
        format!("type = \"rest\"\nuri = \"{uri}\"\nwarehouse = \"{warehouse}\"\ncredential = \"{key}:{secret}\"\n")
    } else {
        format!(
            "type = \"sql\"\nuri = \"{}\"\nwarehouse = \"{}\"\nformat = \"{}\"\n",
            pg.url,
            s3.url(&format!("bench-writers/{}", uuid::Uuid::new_v4())),
            setup.format
        )
    };
    let text = format!(
        "default_catalog = \"lake\"\n\n[catalogs.lake]\n{catalog}\n[catalogs.lake.storage]\n\
         \"s3.endpoint\" = \"{}\"\n\"s3.region\" = \"us-east-1\"\n\
         \"s3.access-key-id\" = \"{key}\"\n\"s3.secret-access-key\" = \"{secret}\"\n",
        s3.endpoint
    );
    let file = dir.join("weir.toml");
    std::fs::write(&file, text).unwrap();
    file
}

/// The number after `field=` in a commit's log line (after its message),
/// its colours stripped.
fn field(line: &str, field: &str) -> Option<u64> {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    // After the message: the span's fields come before it.
    let message = plain.find("committed to ")?;
    let at = message + plain[message..].find(&format!(" {field}="))? + field.len() + 2;
    plain[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

fn run(weir: &Path, setup: Setup, writers: usize, commits: u64, s3: &S3Service, pg: &Postgres) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), setup, s3, pg);
    let table = format!("bench_{}.events", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    // The table exists before the writers start: its creation is not
    // what is measured.
    let created = Command::new(weir)
        .env("WEIR_CONFIG", &config)
        .args(["stream", "--from", "rate", "--rows-per-batch", "1", "--to", &table])
        .args(["--format", setup.format, "--query-name", "create", "--max-batches", "1"])
        .arg("--checkpoint")
        .arg(dir.path().join("chk-create"))
        .args(["--progress", "none"])
        .output()
        .unwrap();
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let started = Instant::now();
    let children: Vec<_> = (0..writers)
        .map(|w| {
            let mut child = Command::new(weir)
                .env("WEIR_CONFIG", &config)
                .env("NO_COLOR", "1")
                .env("WEIR_LOG", "warn,weir_delta::sink=debug,weir_iceberg::sink=debug")
                .args(["stream", "--from", "rate", "--rows-per-batch", "100", "--to", &table])
                .args(["--query-name", &format!("writer-{w}"), "--progress", "json"])
                .args(["--max-batches", &commits.to_string()])
                .arg("--checkpoint")
                .arg(dir.path().join(format!("chk-{w}")))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("weir runs");
            let stdout = BufReader::new(child.stdout.take().unwrap());
            let stderr = BufReader::new(child.stderr.take().unwrap());
            let progress = std::thread::spawn(move || {
                let mut writer = Writer {
                    done: vec![],
                    total_ms: vec![],
                    commit_ms: vec![],
                    lost: 0,
                    logged: 0,
                };
                for line in stdout.lines() {
                    let line = line.unwrap();
                    writer.done.push(started.elapsed().as_secs_f64());
                    let p: serde_json::Value = serde_json::from_str(&line).expect("a progress line");
                    writer
                        .total_ms
                        .push(p["durations_ms"]["total"].as_f64().unwrap_or(f64::NAN));
                    writer
                        .commit_ms
                        .push(p["durations_ms"]["commit"].as_f64().unwrap_or(f64::NAN));
                }
                writer
            });
            let log = std::thread::spawn(move || {
                let (mut lost, mut logged, mut errors) = (0, 0, vec![]);
                for line in stderr.lines() {
                    let line = line.unwrap();
                    if line.contains("committed to Delta") || line.contains("committed to Iceberg") {
                        logged += 1;
                        lost += field(&line, "attempt").map_or(0, |a| a.saturating_sub(1));
                    } else if line.contains("ERROR") || line.starts_with("error") {
                        errors.push(line);
                    }
                }
                (lost, logged, errors)
            });
            (child, progress, log)
        })
        .collect();
    let mut done = vec![];
    for (mut child, progress, log) in children {
        let status = child.wait().unwrap();
        let mut writer = progress.join().unwrap();
        let (lost, logged, errors) = log.join().unwrap();
        assert!(status.success(), "a writer failed: {errors:?}");
        assert_eq!(writer.done.len() as u64, commits, "a writer's batches");
        writer.lost = lost;
        writer.logged = logged;
        done.push(writer);
    }
    // The window in which every writer ran: from the last writer's fifth
    // batch to the first writer's last.
    let from = done.iter().map(|w| w.done[4]).fold(f64::MIN, f64::max);
    let to = done.iter().map(|w| *w.done.last().unwrap()).fold(f64::MAX, f64::min);
    assert!(
        to - from > 1.0,
        "the {writers} writers overlapped for {:.2} s only (first and last batch of each: {:?}); raise WEIR_BENCH_COMMITS",
        to - from,
        done.iter().map(|w| (w.done[0], *w.done.last().unwrap())).collect::<Vec<_>>()
    );
    let within = done
        .iter()
        .flat_map(|w| &w.done)
        .filter(|t| **t > from && **t <= to)
        .count();
    Run {
        rate: within as f64 / (to - from),
        writers: done,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    weir_benches::median(&v)
}

fn main() {
    let writers: Vec<usize> = env_list("WEIR_BENCH_WRITERS", "1,2,4")
        .iter()
        .map(|n| n.parse().expect("WEIR_BENCH_WRITERS: numbers"))
        .collect();
    let commits: u64 = std::env::var("WEIR_BENCH_COMMITS")
        .ok()
        .map(|n| n.parse().expect("WEIR_BENCH_COMMITS: a number"))
        .unwrap_or(150);
    assert!(commits >= 10, "WEIR_BENCH_COMMITS: at least 10");
    let chosen = env_list("WEIR_BENCH_SETUPS", "delta-postgres,iceberg-postgres,iceberg-rest");
    let weir = release_weir();
    let s3 = S3Service::start();
    let pg = Postgres::start();
    println!("{commits} commits of 100 rows per writer, back to back; table and catalog as named");
    println!(
        "{:<18} {:>7} {:>10} {:>12} {:>12} {:>12} {:>14}",
        "setup", "writers", "commits/s", "per writer", "batch p50", "commit p50", "lost/commit"
    );
    for setup in SETUPS.iter().filter(|s| chosen.iter().any(|c| c == s.name)) {
        let mut single = None;
        for &n in &writers {
            let run = run(&weir, *setup, n, commits, &s3, &pg);
            let batch = median(run.writers.iter().flat_map(|w| w.total_ms[5..].to_vec()).collect());
            let commit = median(run.writers.iter().flat_map(|w| w.commit_ms[5..].to_vec()).collect());
            let logged: u64 = run.writers.iter().map(|w| w.logged).sum();
            let lost: u64 = run.writers.iter().map(|w| w.lost).sum();
            let base = *single.get_or_insert(run.rate);
            println!(
                "{:<18} {:>7} {:>10.1} {:>12.1} {:>9.1} ms {:>9.1} ms {:>14.3}   ({:.2}x one writer)",
                setup.name,
                n,
                run.rate,
                run.rate / n as f64,
                batch,
                commit,
                lost as f64 / logged.max(1) as f64,
                run.rate / base
            );
        }
    }
}
