//! Snapshot expiry: rows and markers stay, files only expired snapshots
//! referenced go, and a batch replayed after expiry is still a no-op.

use std::path::Path;
use std::sync::Arc;
use weir_test_support::operators::CountByKey;

use weir_core::crash::{CrashPoint, CrashPoints};
use weir_core::prelude::*;
use weir_core::source::RateSource;
use weir_iceberg::{Catalog, ExpireSnapshots};
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::{iceberg, json_ids, python};

use crate::conformance::{event_ids, sqlite_harness, SqlHarness};

const TABLE: &str = "bronze.payments";

async fn stream(h: &SqlHarness, chk: &Path, mode: OutputMode, last: u64, crash: Option<CrashPoints>) -> Result<()> {
    let mut rows = read_stream(RateSource::rows_per_batch(100));
    if mode == OutputMode::Complete {
        // The whole result every batch: each id once, with its count.
        rows = rows.with_operator(CountByKey::new("ids", "event_id"));
    }
    let mut writer = rows
        .write_stream()
        .query_name("payments-bronze")
        .checkpoint_location(chk)
        .output_mode(mode)
        .stop_after_batch(BatchId(last));
    if let Some(points) = crash {
        writer = writer.crash_points(points);
    }
    writer.start(h.sink_on(TABLE).await).await?.await_termination().await
}

fn local(file: &str) -> &Path {
    Path::new(file.strip_prefix("file://").unwrap_or(file))
}

fn snapshots(h: &SqlHarness) -> usize {
    let d = iceberg(&["describe", &h.reader, TABLE]).expect("readers present");
    d["snapshots"].as_array().unwrap().len()
}

async fn expire(h: &SqlHarness) -> ExpireSnapshots {
    let catalog: Arc<dyn Catalog> = h.catalog().await;
    ExpireSnapshots::new(catalog, TABLE)
        .unwrap()
        .with_older_than(std::time::Duration::ZERO)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_keeps_rows_and_markers_and_a_replay_after_it_is_a_no_op() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    stream(&h, chk.path(), OutputMode::Append, 5, None).await.unwrap();
    assert_eq!(snapshots(&h), 6);

    // A dry run plans and changes nothing.
    let plan = expire(&h).await.with_retain_last(2).with_dry_run(true).await.unwrap();
    assert_eq!((plan.expired.len(), plan.retained), (4, 2));
    assert_eq!(plan.manifest_lists.len(), 4);
    assert!(plan.metadata_location.is_none());
    assert_eq!(snapshots(&h), 6);
    assert!(plan.manifest_lists.iter().all(|l| local(l).exists()));

    // Appends share their manifests with later snapshots: only the
    // expired snapshots' manifest lists go.
    let done = expire(&h).await.with_retain_last(2).await.unwrap();
    assert_eq!(done.expired, plan.expired);
    assert!(done.data_files.is_empty() && done.manifests.is_empty(), "{done:?}");
    assert!(done.manifest_lists.iter().all(|l| !local(l).exists()));
    assert!(done.failed.is_empty());
    assert_eq!(snapshots(&h), 2);
    assert_exactly_once(&event_ids(&h, TABLE), 0..600);

    // Batch 6 reaches the table but not the checkpoint; every snapshot but
    // the current one expires; the restart replays batch 6 as a no-op.
    let crash = CrashPoints::new().fail_at(CrashPoint::AfterSinkCommit, Some(BatchId(6)));
    assert!(stream(&h, chk.path(), OutputMode::Append, 6, Some(crash))
        .await
        .is_err());
    let done = expire(&h).await.await.unwrap();
    assert_eq!((done.expired.len(), done.retained), (2, 1));
    stream(&h, chk.path(), OutputMode::Append, 6, None).await.unwrap();
    assert_exactly_once(&event_ids(&h, TABLE), 0..700);
    assert_eq!(snapshots(&h), 1, "the replayed batch made no snapshot");
    let d = iceberg(&["describe", &h.reader, TABLE]).expect("readers present");
    assert_eq!(d["properties"]["weir.query.payments-bronze.batch-id"], "6");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_after_complete_mode_deletes_the_replaced_data_files() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    stream(&h, chk.path(), OutputMode::Complete, 2, None).await.unwrap();

    // Nothing is old enough yet.
    let young = expire(&h)
        .await
        .with_older_than(std::time::Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(young.expired.is_empty() && young.deleted_files() == 0);

    let done = expire(&h).await.await.unwrap();
    assert_eq!(done.expired.len(), 2);
    // Batches 0 and 1 were replaced by batch 2: their data files go.
    assert!(!done.data_files.is_empty() && done.data_bytes > 0, "{done:?}");
    assert!(done.data_files.iter().all(|f| !local(f).exists()));
    assert!(done.manifests.iter().all(|f| !local(f).exists()));
    // pyiceberg reads every file the table still lists.
    assert_exactly_once(&event_ids(&h, TABLE), 0..300);
    assert_eq!(snapshots(&h), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_beside_a_running_stream_loses_no_row() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    let sink = h.sink_on(TABLE).await;
    let query = read_stream(RateSource::rows_per_batch(50))
        .write_stream()
        .query_name("payments-bronze")
        .checkpoint_location(chk.path())
        .stop_after_batch(BatchId(39))
        .start(sink)
        .await
        .unwrap();
    // Expire over and over while batches land; each run either commits on
    // the newest version or plans again.
    let mut runs = 0;
    while query.is_active() {
        let report = expire(&h).await.with_retain_last(3).await.unwrap();
        assert!(report.failed.is_empty());
        runs += 1;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    query.await_termination().await.unwrap();
    assert!(runs >= 2, "only {runs} expiries ran beside the stream");
    assert_exactly_once(&event_ids(&h, TABLE), 0..2000);
    expire(&h).await.await.unwrap();
    assert_exactly_once(&event_ids(&h, TABLE), 0..2000);
}

/// Forty batches of 20 rows (ids 0..800) by the query `payments-bronze`.
async fn forty_batches(chk: &Path, sink: weir_iceberg::IcebergSink) {
    batches_to(chk, sink, 39).await;
}

/// The query `payments-bronze`, 20 rows a batch, through batch `last`.
async fn batches_to(chk: &Path, sink: weir_iceberg::IcebergSink, last: u64) {
    let q = read_stream(RateSource::rows_per_batch(20))
        .write_stream()
        .query_name("payments-bronze")
        .checkpoint_location(chk)
        .stop_after_batch(BatchId(last))
        .start(sink)
        .await
        .unwrap();
    q.await_termination().await.unwrap();
}

/// An expiry policy of the sink's own counts: every `every` commits, the
/// newest `keep` snapshots kept, of any age.
fn policy(every: u64, keep: usize) -> weir_iceberg::ExpiryPolicy {
    weir_iceberg::ExpiryPolicy {
        every_commits: every,
        retain_last: keep,
        older_than: None,
        table_properties_first: false,
    }
}

/// Asserts that every manifest a snapshot of the table lists exists.
fn assert_listed_manifests_exist(h: &SqlHarness) {
    let out = iceberg(&["manifests", &h.reader, TABLE]).expect("readers present");
    for snapshot in out["snapshots"].as_array().unwrap() {
        for m in snapshot["manifests"].as_array().unwrap() {
            assert!(
                local(m.as_str().unwrap()).exists(),
                "a snapshot lists {m}, which is gone"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_with_an_expiry_policy_keeps_its_history_bounded() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    let sink = h.sink_on(TABLE).await.with_snapshot_expiry(policy(10, 3));
    forty_batches(chk.path(), sink).await;
    assert_exactly_once(&event_ids(&h, TABLE), 0..800);
    // The query ran to its end, so its expiries have ended too: the last
    // began fewer than 10 commits before the end, and kept 3 snapshots.
    let left = snapshots(&h);
    assert!((3..=13).contains(&left), "{left} snapshots of 40 commits are left");
    assert_exactly_once(&event_ids(&h, TABLE), 0..800);
    let d = iceberg(&["describe", &h.reader, TABLE]).expect("readers present");
    assert_eq!(d["properties"]["weir.query.payments-bronze.batch-id"], "39");
    // The expiries were folded into the query's commits: each removed
    // snapshots in a commit that also added one, and the files only the
    // removed ones reached were deleted once it landed. One manifest list
    // is left for each snapshot.
    let parents: Vec<_> = d["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["parent"])
        .collect();
    assert!(
        parents.iter().all(|p| !p.is_null()),
        "the table's first snapshot expired"
    );
    let metadata = local(d["location"].as_str().unwrap()).join("metadata");
    let lists = std::fs::read_dir(&metadata)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("snap-"))
        .count();
    assert_eq!(
        lists, left,
        "a manifest list for each snapshot left, none of the expired ones"
    );
    // Every snapshot kept still reads: its manifests exist.
    assert_listed_manifests_exist(&h);
}

/// A table whose files may belong to other tables (`gc.enabled=false`, as
/// Spark's snapshot and migrate procedures leave it) keeps every snapshot
/// under a sink's expiry policy; the query goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_expiry_policy_leaves_a_table_without_gc_alone() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    let sink = h
        .sink_on(TABLE)
        .await
        .with_table_property("gc.enabled", "false")
        .with_snapshot_expiry(policy(10, 3));
    forty_batches(chk.path(), sink).await;
    assert_eq!(snapshots(&h), 40, "no snapshot expired");
    assert_exactly_once(&event_ids(&h, TABLE), 0..800);
}

/// A policy that puts the table first (the streaming default's way) keeps
/// what the table's `history.expire.min-snapshots-to-keep` says, not its
/// own count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_puts_the_table_first_keeps_what_the_table_says() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    let policy = weir_iceberg::ExpiryPolicy {
        every_commits: 10,
        retain_last: 3,
        ..weir_iceberg::ExpiryPolicy::STREAMING
    };
    let sink = h
        .sink_on(TABLE)
        .await
        .with_table_property("history.expire.min-snapshots-to-keep", "25")
        .with_snapshot_expiry(policy);
    forty_batches(chk.path(), sink).await;
    // Forty commits, expiries every ten: the last kept the table's 25.
    let left = snapshots(&h);
    assert!((25..=35).contains(&left), "{left} snapshots of 40 commits are left");
    assert_exactly_once(&event_ids(&h, TABLE), 0..800);
}

/// Branches, tags and retention settings as another engine (pyiceberg) sets
/// them: expiry keeps what Iceberg's rules keep, time travel to a ref reads
/// its rows, and weir's own commits keep the refs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_keeps_what_refs_and_their_retention_keep() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    stream(&h, chk.path(), OutputMode::Append, 9, None).await.unwrap();
    let describe = || iceberg(&["describe", &h.reader, TABLE]).expect("readers present");
    let ids_of = |d: &serde_json::Value| -> Vec<i64> {
        let snapshots = d["snapshots"].as_array().unwrap();
        snapshots.iter().map(|s| s["id"].as_i64().unwrap()).collect()
    };
    let manage = |args: &[&str]| {
        let all: Vec<&str> = ["manage", h.reader.as_str(), TABLE]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        iceberg(&all).expect("readers present");
    };
    let at = |id: i64| json_ids(&iceberg(&["ids-at", &h.reader, TABLE, &id.to_string()]).unwrap());
    let s = ids_of(&describe());
    assert_eq!(s.len(), 10, "a snapshot a batch");
    manage(&["tag", "v1", &s[1].to_string()]);
    manage(&["branch", "audit", &s[3].to_string(), "2", "-"]);
    manage(&["property", "history.expire.min-snapshots-to-keep", "three"]);
    let e = expire(&h).await.await.unwrap_err();
    assert!(e.to_string().contains("is not a whole number"), "{e}");
    assert_eq!(ids_of(&describe()), s, "nothing expired");
    manage(&["property", "history.expire.min-snapshots-to-keep", "3"]);

    // Main keeps its newest 3 (the table's setting), the branch its own 2,
    // the tag its head; the rest is older than the job's age (any).
    let report = expire(&h).await.await.unwrap();
    let mut expired = report.expired.clone();
    expired.sort_unstable();
    let mut want = vec![s[0], s[4], s[5], s[6]];
    want.sort_unstable();
    assert_eq!(expired, want, "{report:?}");
    assert_exactly_once(&at(s[1]), 0..200);
    assert_exactly_once(&at(s[2]), 0..300);
    assert_exactly_once(&at(s[3]), 0..400);
    assert_exactly_once(&event_ids(&h, TABLE), 0..1000);

    // weir's commits keep the refs, and main's own retention.
    stream(&h, chk.path(), OutputMode::Append, 13, None).await.unwrap();
    manage(&["main-retention", "2"]);
    stream(&h, chk.path(), OutputMode::Append, 14, None).await.unwrap();
    let d = describe();
    assert_eq!(d["refs"]["v1"]["snapshot"], s[1], "{}", d["refs"]);
    assert_eq!(d["refs"]["audit"]["snapshot"], s[3], "{}", d["refs"]);
    assert_eq!(d["refs"]["audit"]["min_keep"], 2, "{}", d["refs"]);
    assert_eq!(d["refs"]["main"]["min_keep"], 2, "{}", d["refs"]);
    let all = ids_of(&d);
    let new = &all[all.len() - 5..];
    // A branch whose own age is a day keeps its whole history; main keeps
    // its own 2 over the job's retain_last(1).
    manage(&["branch", "young", &new[1].to_string(), "-", "86400000"]);
    let report = expire(&h).await.with_retain_last(1).await.unwrap();
    assert_eq!(
        report.expired,
        vec![new[2]],
        "only main's snapshot between the branch and its 2: {report:?}"
    );
    for (snapshot, rows) in [(new[1], 1200), (s[9], 1000), (s[7], 800), (s[2], 300), (s[1], 200)] {
        assert_exactly_once(&at(snapshot), 0..rows);
    }
    assert_exactly_once(&at(new[3]), 0..1400);
    assert_exactly_once(&event_ids(&h, TABLE), 0..1500);
}

/// A tag another engine puts on an old snapshot while a query with an
/// expiry policy runs: the query's later expiries keep it and what it
/// lists, and time travel to it reads its rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_expiry_policy_keeps_a_tagged_snapshot() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    let run = |last| {
        let (h, chk) = (&h, chk.path());
        async move {
            let sink = h.sink_on(TABLE).await.with_snapshot_expiry(policy(5, 2));
            batches_to(chk, sink, last).await
        }
    };
    run(3).await;
    let d = iceberg(&["describe", &h.reader, TABLE]).expect("readers present");
    // The snapshot of batch 1 (rows 0..40), tagged as another engine would.
    let tagged = d["snapshots"][1]["id"].as_i64().unwrap().to_string();
    iceberg(&["manage", &h.reader, TABLE, "tag", "audit", &tagged]).expect("readers present");
    run(29).await;
    let d = iceberg(&["describe", &h.reader, TABLE]).expect("readers present");
    let kept: Vec<String> = d["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_i64().unwrap().to_string())
        .collect();
    assert!(kept.contains(&tagged), "the tagged snapshot expired");
    assert!(
        kept.len() < 15,
        "{} snapshots of 30 commits: nothing expired",
        kept.len()
    );
    assert_eq!(d["refs"]["audit"]["snapshot"].as_i64().unwrap().to_string(), tagged);
    assert_listed_manifests_exist(&h);
    let at_tag = iceberg(&["ids-at", &h.reader, TABLE, &tagged]).expect("readers present");
    assert_exactly_once(&json_ids(&at_tag), 0..40);
    assert_exactly_once(&event_ids(&h, TABLE), 0..600);
}
