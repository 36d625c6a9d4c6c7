//! A long stream keeps a flat resident memory: `weir stream`'s resident set,
//! sampled as its batches land, is no larger after 5,000 commits than 1.5
//! times what it was after 1,000, for either format under the command's
//! defaults (a Delta stream used to grow by about 27 KB a commit).
//! Memory, unlike time, is steady enough to test; the 20,000-commit curve is
//! the soak benchmark's.

use std::process::Stdio;

use weir_test_support::assert_exactly_once;
use weir_test_support::memory::{sample_stream, MemorySample};
use weir_test_support::readers::{iceberg, json_ids};

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

/// Runs `weir stream` for [`COMMITS`] commits of [`ROWS`] rows from the rate
/// source into `lake.bronze.m` with `format`'s defaults, and checks that its
/// resident memory near the end is at most 1.5 times that near 1,000 commits.
fn stream_keeps_a_flat_memory(lake: &std::path::Path, format: &str) {
    let rate = ["--from", "rate", "--rows-per-batch", &ROWS.to_string()].map(String::from);
    source_keeps_a_flat_memory(lake, format, &rate);
}

/// The same for a stream from `source` (its `weir stream` options).
fn source_keeps_a_flat_memory(lake: &std::path::Path, format: &str, source: &[String]) {
    let mut child = weir(lake)
        .arg("stream")
        .args(source)
        .args(["--max-batches", &COMMITS.to_string(), "--to", "lake.bronze.m"])
        .args(["--format", format, "--checkpoint", "chk", "--progress", "json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut samples = Vec::new();
    sample_stream(&mut child, 100, |s| samples.push(s));
    assert!(child.wait().unwrap().success());

    let early = median(&samples, 500, 1_000);
    let late = median(&samples, COMMITS - 500, COMMITS);
    eprintln!(
        "{format}: resident memory {} MiB after 1,000 commits, {} MiB after {COMMITS}",
        early >> 20,
        late >> 20
    );
    assert!(
        late as f64 <= 1.5 * early as f64,
        "{format}: resident memory grew from {} MiB after 1,000 commits to {} MiB after {COMMITS}: {:?}",
        early >> 20,
        late >> 20,
        samples
            .iter()
            .map(|s| (s.commits, s.resident >> 20))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_long_delta_stream_keeps_a_flat_resident_memory() {
    let Some(lake) = lake_with_readers() else { return };
    stream_keeps_a_flat_memory(lake.path(), "delta");
    let ids = delta_ids(&lake.path().join("weir-lake/warehouse/bronze/m"));
    assert_exactly_once(&ids, 0..(COMMITS * ROWS) as i64);
}

/// Under the defaults an Iceberg stream expires its old snapshots, so its
/// memory follows the 100 snapshots kept, not the 5,000 made.
#[test]
fn a_long_iceberg_stream_keeps_a_flat_resident_memory() {
    let Some(lake) = lake_with_readers() else { return };
    stream_keeps_a_flat_memory(lake.path(), "iceberg");
    let db = lake.path().join("weir-lake/catalog.db");
    let ids = json_ids(&iceberg(&["ids", "pyiceberg", db.to_str().unwrap(), "bronze.m"]).expect("readers present"));
    assert_exactly_once(&ids, 0..(COMMITS * ROWS) as i64);
    let d = iceberg(&["describe", db.to_str().unwrap(), "bronze.m"]).expect("readers present");
    let snapshots = d["snapshots"].as_array().map(Vec::len);
    assert!(
        snapshots.is_some_and(|n| (100..=200).contains(&n)),
        "the default expiry keeps the newest 100 snapshots (and up to 100 made since it last ran): {snapshots:?}"
    );
}

/// A Kafka-sourced stream too: the reader's prefetch and the chunks it hands
/// on follow the batch, not the 500,000 records of the topic.
#[test]
fn a_long_kafka_stream_keeps_a_flat_resident_memory() {
    let Some(kafka) = crate::kafka::bootstrap() else { return };
    let Some(lake) = lake_with_readers() else { return };
    let topic = crate::kafka::create_topic(&kafka, "memory");
    let total = (COMMITS * ROWS) as i64;
    crate::kafka::produce_payments(&kafka, &topic, 0..total, 50_000, std::time::Duration::ZERO);
    let schema = crate::kafka::payment_schema(lake.path());
    let source = [
        "--from",
        "kafka",
        "--bootstrap-servers",
        &kafka,
        "--topic",
        &topic,
        "--starting-offsets",
        "earliest",
        "--max-offsets-per-trigger",
        &ROWS.to_string(),
        "--value-format",
        "json",
        "--schema",
        &schema,
    ]
    .map(String::from);
    source_keeps_a_flat_memory(lake.path(), "delta", &source);
    let ids = delta_ids(&lake.path().join("weir-lake/warehouse/bronze/m"));
    assert_exactly_once(&ids, 0..total);
}
