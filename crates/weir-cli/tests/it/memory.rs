//! A long stream keeps a flat resident memory: `weir stream`'s resident set,
//! sampled as its batches land, is no larger after 5,000 commits than 1.5
//! times what it was after 1,000 (it used to grow by about 27 KB a commit).
//! Memory, unlike time, is steady enough to test; the 20,000-commit curve is
//! the soak benchmark's.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use weir_test_support::assert_exactly_once;

use crate::common::{delta_ids, lake_with_readers, weir};

const COMMITS: u64 = 5_000;
const ROWS: u64 = 100;

/// The resident set of process `pid` in bytes (`VmRSS`).
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("a Linux /proc");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status");
    kib * 1024
}

/// The median of `samples` taken after between `from` and `to` commits.
fn median(samples: &[(u64, u64)], from: u64, to: u64) -> u64 {
    let mut window: Vec<u64> = samples
        .iter()
        .filter(|(c, _)| (from..=to).contains(c))
        .map(|(_, b)| *b)
        .collect();
    assert!(
        window.len() >= 5,
        "too few samples between {from} and {to}: {samples:?}"
    );
    window.sort_unstable();
    window[window.len() / 2]
}

#[test]
fn a_long_delta_stream_keeps_a_flat_resident_memory() {
    let Some(lake) = lake_with_readers() else { return };
    let mut child = weir(lake.path())
        .args(["stream", "--from", "rate", "--rows-per-batch", &ROWS.to_string()])
        .args(["--max-batches", &COMMITS.to_string(), "--to", "lake.bronze.m"])
        .args(["--format", "delta", "--checkpoint", "chk", "--progress", "json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut samples = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let progress: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        let commits = progress["batch_id"].as_u64().unwrap() + 1;
        if commits.is_multiple_of(100) {
            samples.push((commits, resident_bytes(pid)));
        }
    }
    assert!(child.wait().unwrap().success());

    let early = median(&samples, 500, 1_000);
    let late = median(&samples, COMMITS - 500, COMMITS);
    eprintln!(
        "resident memory: {} MiB after 1,000 commits, {} MiB after {COMMITS}",
        early >> 20,
        late >> 20
    );
    assert!(
        late as f64 <= 1.5 * early as f64,
        "resident memory grew from {} MiB after 1,000 commits to {} MiB after {COMMITS}: {:?}",
        early >> 20,
        late >> 20,
        samples.iter().map(|(c, b)| (c, b >> 20)).collect::<Vec<_>>()
    );

    let ids = delta_ids(&lake.path().join("weir-lake/warehouse/bronze/m"));
    assert_exactly_once(&ids, 0..(COMMITS * ROWS) as i64);
}
