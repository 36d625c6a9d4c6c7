//! Compaction: small files become few in one `replace` snapshot, the rows
//! stay the same for pyiceberg and DuckDB and for every snapshot, and a
//! stream appending meanwhile never fails.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_core::prelude::*;
use weir_core::source::RateSource;
use weir_iceberg::{Catalog, Compact, CompactProgress, ExpireSnapshots, RewriteManifests};
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::{iceberg, iceberg_ids, json_ids, python};

use crate::conformance::{sqlite_harness, SqlHarness};

pub(crate) const TABLE: &str = "bronze.payments";

pub(crate) async fn stream(h: &SqlHarness, chk: &Path, last: u64, partition: Option<&str>) {
    let mut sink = h.sink_on(TABLE).await;
    if let Some(p) = partition {
        sink = sink.with_partition_by([p]);
    }
    read_stream(RateSource::rows_per_batch(60))
        .write_stream()
        .query_name("payments-bronze")
        .checkpoint_location(chk)
        .stop_after_batch(BatchId(last))
        .start(sink)
        .await
        .unwrap()
        .await_termination()
        .await
        .unwrap();
}

async fn compact(h: &SqlHarness) -> Compact {
    let catalog: Arc<dyn Catalog> = h.catalog().await;
    Compact::new(catalog, TABLE).unwrap()
}

pub(crate) fn describe(h: &SqlHarness) -> serde_json::Value {
    iceberg(&["describe", &h.reader, TABLE]).expect("readers present")
}

fn files(h: &SqlHarness) -> usize {
    describe(h)["files"].as_u64().unwrap() as usize
}

/// The ids by pyiceberg, checked against DuckDB's.
pub(crate) fn ids(h: &SqlHarness) -> Vec<i64> {
    let (a, _) = iceberg_ids("pyiceberg", &h.reader, TABLE).unwrap();
    let (mut b, _) = iceberg_ids("duckdb", &h.reader, TABLE).unwrap();
    let mut sorted = a.clone();
    sorted.sort_unstable();
    b.sort_unstable();
    assert_eq!(sorted, b, "pyiceberg and DuckDB disagree");
    a
}

/// The table's `replace` snapshots (compactions).
pub(crate) fn replaces(h: &SqlHarness) -> usize {
    describe(h)["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["operation"] == "replace")
        .count()
}

pub(crate) fn outputs_on_disk(h: &SqlHarness) -> usize {
    walk(&h.warehouse)
        .iter()
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("weir-compact-"))
        .count()
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_files_become_one_replace_snapshot_and_old_snapshots_read_the_same() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    stream(&h, chk.path(), 9, None).await;
    assert_eq!(files(&h), 10);
    let before = describe(&h)["snapshots"].as_array().unwrap().last().unwrap()["id"].clone();

    let plan = compact(&h).await.with_dry_run(true).await.unwrap();
    assert_eq!(plan.groups.len(), 1, "{plan:?}");
    assert_eq!(plan.groups[0].files.len(), 10);
    assert!(plan.commits.is_empty());
    assert_eq!(files(&h), 10, "a dry run changes nothing");

    let done = compact(&h).await.await.unwrap();
    assert_eq!(done.commits.len(), 1);
    assert_eq!((done.files_removed, done.files_added, done.rows), (10, 1, 600));
    assert_eq!(files(&h), 1);
    let d = describe(&h);
    let last = d["snapshots"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["operation"], "replace", "{last}");
    assert_eq!(last["summary"]["total-data-files"], "1", "{last}");
    assert_eq!(last["summary"]["total-records"], "600", "{last}");
    assert_eq!(
        d["properties"]["weir.query.payments-bronze.batch-id"], "9",
        "the marker is kept"
    );
    assert_exactly_once(&ids(&h), 0..600);
    let old = iceberg(&["ids-at", &h.reader, TABLE, &before.to_string()]).unwrap();
    assert_exactly_once(&json_ids(&old), 0..600);

    let again = compact(&h).await.await.unwrap();
    assert!(again.groups.is_empty() && again.commits.is_empty(), "{again:?}");

    // The stream goes on exactly once; expiry then deletes the replaced files.
    stream(&h, chk.path(), 11, None).await;
    assert_exactly_once(&ids(&h), 0..720);
    let catalog: Arc<dyn Catalog> = h.catalog().await;
    let expired = ExpireSnapshots::new(catalog, TABLE)
        .unwrap()
        .with_older_than(Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(expired.data_files.len(), 10, "{expired:?}");
    assert_exactly_once(&ids(&h), 0..720);
}

/// After partition evolution (by pyiceberg), small files of the old spec
/// are rewritten into the new one, and every row stays once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_of_an_older_partition_spec_are_rewritten_into_the_current_one() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    stream(&h, chk.path(), 5, None).await;
    iceberg(&[
        "manage",
        &h.reader,
        TABLE,
        "partition",
        "account_id",
        "bucket[4]",
        "account_bucket",
    ])
    .expect("readers present");
    stream(&h, chk.path(), 11, None).await;
    let d = describe(&h);
    let spec = d["default_spec"].as_i64().unwrap();
    assert_eq!(d["file_specs"], serde_json::json!([0, spec]), "{d}");
    let before = d["snapshots"].as_array().unwrap().last().unwrap()["id"].clone();
    assert_exactly_once(&ids(&h), 0..720);

    let done = compact(&h).await.with_min_input_files(2).await.unwrap();
    assert_eq!(done.commits.len(), 1, "{done:?}");
    let old: Vec<_> = done.groups.iter().filter(|g| g.partition.is_empty()).collect();
    assert_eq!(old.len(), 1, "the old spec's files are one group: {done:?}");
    assert_eq!(old[0].files.len(), 6);
    let d = describe(&h);
    assert_eq!(
        d["file_specs"],
        serde_json::json!([spec]),
        "every live file has the current spec: {d}"
    );
    assert!(d["files"].as_u64().unwrap() <= 8, "{d}");
    assert_exactly_once(&ids(&h), 0..720);
    let old = iceberg(&["ids-at", &h.reader, TABLE, &before.to_string()]).unwrap();
    assert_exactly_once(&json_ids(&old), 0..720);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_are_compacted_apart_with_a_filter_and_partial_progress() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    stream(&h, chk.path(), 5, Some("bucket(4, account_id)")).await;
    assert_eq!(files(&h), 24);

    let one = compact(&h)
        .await
        .with_partition("account_id_bucket", Some("1".into()))
        .await
        .unwrap();
    assert_eq!(one.groups.len(), 1, "{one:?}");
    assert_eq!(one.groups[0].partition["account_id_bucket"].as_deref(), Some("1"));
    assert_eq!(files(&h), 19);

    let rest = compact(&h).await.with_groups_per_commit(1).await.unwrap();
    assert_eq!((rest.groups.len(), rest.commits.len()), (3, 3), "{rest:?}");
    assert_eq!(files(&h), 4, "one file per bucket");
    assert_exactly_once(&ids(&h), 0..360);

    let e = compact(&h).await.with_partition("zone", None).await.unwrap_err();
    assert!(e.to_string().contains("not partition fields"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_stopped_before_its_swap_changes_nothing_and_a_rerun_finishes() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    stream(&h, chk.path(), 5, None).await;
    let before = describe(&h)["metadata_location"].clone();

    // The job dies right after rewriting, before its swap.
    let job = compact(&h).await.with_progress(|p| {
        if matches!(p, CompactProgress::Rewritten { .. }) {
            panic!("killed after the rewrite");
        }
    });
    let died = tokio::spawn(async move { job.await }).await;
    assert!(died.unwrap_err().is_panic());
    assert_eq!(describe(&h)["metadata_location"], before);
    assert_eq!(files(&h), 6);
    assert_exactly_once(&ids(&h), 0..360);
    assert_eq!(outputs_on_disk(&h), 1, "the uncommitted output is an orphan");

    let done = compact(&h).await.await.unwrap();
    assert_eq!(done.commits.len(), 1);
    assert_eq!(files(&h), 1);
    assert_exactly_once(&ids(&h), 0..360);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_input_another_writer_rewrote_is_dropped() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    stream(&h, chk.path(), 3, None).await;
    let reader = h.reader.clone();
    let deleted = Arc::new(AtomicBool::new(false));
    let flag = deleted.clone();
    let report = compact(&h)
        .await
        .with_progress(move |p| {
            if matches!(p, CompactProgress::Rewritten { .. }) && !flag.swap(true, Ordering::SeqCst) {
                // pyiceberg rewrites the file holding ids below 30 while the
                // group waits for its swap.
                iceberg(&["delete", &reader, TABLE, "event_id < 30"]).unwrap();
            }
        })
        .await
        .unwrap();
    assert!(deleted.load(Ordering::SeqCst));
    assert_eq!((report.groups_dropped, report.commits.len()), (1, 0), "{report:?}");
    assert_exactly_once(&ids(&h), 30..240);
    assert_eq!(outputs_on_disk(&h), 0, "a dropped group's outputs are deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_between_rewrite_and_swap_is_kept() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    stream(&h, chk.path(), 3, None).await;
    let reader = h.reader.clone();
    let report = compact(&h)
        .await
        .with_progress(move |p| {
            if matches!(p, CompactProgress::Rewritten { .. }) {
                // pyiceberg appends while the group waits for its swap.
                iceberg(&["append", &reader, TABLE, "1000000", "50"]).unwrap();
            }
        })
        .await
        .unwrap();
    assert_eq!((report.concurrent_commits, report.commits.len()), (1, 1), "{report:?}");
    let (ours, theirs): (Vec<i64>, Vec<i64>) = ids(&h).into_iter().partition(|id| *id < 1_000_000);
    assert_exactly_once(&ours, 0..240);
    assert_exactly_once(&theirs, 1_000_000..1_000_050);
    assert_eq!(files(&h), 2, "the compacted file and the appended one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_runs_again_and_again_beside_a_stream_that_never_fails() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    stream(&h, chk.path(), 0, None).await;
    let last = 60;
    let q = read_stream(RateSource::rows_per_batch(60))
        .write_stream()
        .query_name("payments-bronze")
        .checkpoint_location(chk.path())
        .trigger(Trigger::processing_time(Duration::from_millis(40)))
        .stop_after_batch(BatchId(last))
        .start(h.sink_on(TABLE).await)
        .await
        .unwrap();
    let (mut runs, mut committed) = (0, 0);
    while q.is_active() || runs < 3 {
        let r = compact(&h).await.await.expect("compaction beside a stream commits");
        runs += 1;
        committed += r.commits.len();
        if runs % 5 == 0 {
            let (ids, _) = iceberg_ids("pyiceberg", &h.reader, TABLE).unwrap();
            let n = ids.len() as i64;
            assert_exactly_once(&ids, 0..n);
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    q.await_termination().await.expect("the stream never fails");
    assert!(committed >= 1, "compactions committed {committed} times in {runs} runs");
    let total = (last as i64 + 1) * 60;
    assert_exactly_once(&ids(&h), 0..total);
    compact(&h).await.await.unwrap();
    assert_eq!(files(&h), 1);
    assert_exactly_once(&ids(&h), 0..total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_manifests_are_merged_into_one_without_changing_a_row() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    let run = |last: u64| {
        let chk = chk.path().to_path_buf();
        let h = &h;
        async move {
            let sink = h
                .sink_on(TABLE)
                .await
                .with_table_property("commit.manifest-merge.enabled", "false");
            read_stream(RateSource::rows_per_batch(60))
                .write_stream()
                .query_name("payments-bronze")
                .checkpoint_location(chk)
                .stop_after_batch(BatchId(last))
                .start(sink)
                .await
                .unwrap()
                .await_termination()
                .await
                .unwrap();
        }
    };
    run(5).await;
    assert_eq!(describe(&h)["manifests"], 6);
    let catalog: Arc<dyn Catalog> = h.catalog().await;
    let plan = RewriteManifests::new(catalog.clone(), TABLE)
        .unwrap()
        .with_dry_run(true)
        .await
        .unwrap();
    assert_eq!((plan.small_manifests, plan.snapshot_id), (6, None), "{plan:?}");
    assert_eq!(describe(&h)["manifests"], 6);

    let done = RewriteManifests::new(catalog.clone(), TABLE).unwrap().await.unwrap();
    assert_eq!((done.manifests_before, done.manifests_after), (6, 1), "{done:?}");
    let d = describe(&h);
    assert_eq!(d["manifests"], 1);
    assert_eq!(d["files"], 6, "no file was added or removed");
    let last = d["snapshots"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["operation"], "replace", "{last}");
    assert_eq!(last["summary"]["total-records"], "360", "{last}");
    assert_exactly_once(&ids(&h), 0..360);

    let again = RewriteManifests::new(catalog, TABLE).unwrap().await.unwrap();
    assert_eq!(again.snapshot_id, None, "one manifest is left alone");
    run(7).await;
    assert_exactly_once(&ids(&h), 0..480);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sinks_compaction_policy_compacts_in_the_background() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let chk = tempfile::tempdir().unwrap();
    let sink = h
        .sink_on(TABLE)
        .await
        .with_compaction(weir_core::sink::CompactionPolicy::every(10, 5));
    read_stream(RateSource::rows_per_batch(50))
        .write_stream()
        .query_name("payments-bronze")
        .checkpoint_location(chk.path())
        .trigger(Trigger::processing_time(Duration::from_millis(20)))
        .stop_after_batch(BatchId(39))
        .start(sink)
        .await
        .unwrap()
        .await_termination()
        .await
        .unwrap();
    // The query ran to its end, so its background compactions have ended
    // too: the one due at commit 10, and a second due 10 commits after it
    // began (at once, or when it ended).
    assert!(replaces(&h) >= 2, "{}", describe(&h));
    assert!(files(&h) < 40, "{} files", files(&h));
    assert_exactly_once(&ids(&h), 0..2000);
}
