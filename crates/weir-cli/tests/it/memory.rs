//! A long stream keeps a flat resident memory: `weir stream`'s resident set,
//! sampled as its batches land, is no larger after 5,000 commits than 1.5
//! times what it was after 1,000 (it used to grow by about 27 KB a commit).
//! Memory, unlike time, is steady enough to test; the 20,000-commit curve is
//! the soak benchmark's.

use std::process::Stdio;

use weir_test_support::assert_exactly_once;
use weir_test_support::memory::{sample_stream, MemorySample};

use crate::common::{delta_ids, lake_with_readers, weir};

const COMMITS: u64 = 5_000;
const ROWS: u64 = 100;

/// The median resident memory of `samples` taken between `from` and `to` commits.
fn median(samples: &[MemorySample], from: u64, to: u64) -> u64 {
    let mut window: Vec<u64> = samples
        .iter()
        .filter(|s| (from..=to).contains(&s.commits))
        .map(|s| s.resident)
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
    let mut samples = Vec::new();
    sample_stream(&mut child, 100, |s| samples.push(s));
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
        samples
            .iter()
            .map(|s| (s.commits, s.resident >> 20))
            .collect::<Vec<_>>()
    );

    let ids = delta_ids(&lake.path().join("weir-lake/warehouse/bronze/m"));
    assert_exactly_once(&ids, 0..(COMMITS * ROWS) as i64);
}
