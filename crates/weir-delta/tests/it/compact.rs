//! Compaction: small files become few, the rows stay the same for every
//! reader and every version, and a stream appending meanwhile never fails.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_core::prelude::*;
use weir_core::source::RateSource;
use weir_delta::{Compact, CompactProgress, DeltaSink, Vacuum};
use weir_test_support::readers::{alter, event_ids_with, json_ids, python, read};
use weir_test_support::{assert_exactly_once, with_payload};

use crate::readers::{log_actions, log_entries, rewrite_log};
use crate::table::{bucketed, with_string_column};

pub(crate) async fn stream(table: &Path, chk: &Path, last: u64) {
    let q = read_stream(RateSource::rows_per_batch(100))
        .write_stream()
        .checkpoint_location(chk)
        .stop_after_batch(BatchId(last))
        .start(DeltaSink::try_new(table.to_str().unwrap()).unwrap())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
}

fn described(table: &Path) -> serde_json::Value {
    read(&["describe", table.to_str().unwrap()]).expect("readers present")
}

fn live_files(table: &Path) -> usize {
    described(table)["files"].as_array().unwrap().len()
}

pub(crate) fn ids_by_both_readers(table: &Path) -> Vec<i64> {
    let t = table.to_str().unwrap();
    let (a, _) = event_ids_with("deltalake", t).unwrap();
    let (mut b, _) = event_ids_with("duckdb", t).unwrap();
    let mut a2 = a.clone();
    a2.sort_unstable();
    b.sort_unstable();
    assert_eq!(a2, b, "Python deltalake and DuckDB disagree");
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_files_become_one_and_every_version_reads_the_same_rows() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    stream(&table, &dir.path().join("chk"), 11).await;
    assert_eq!(live_files(&table), 12);
    let before = described(&table)["version"].as_i64().unwrap();

    let plan = Compact::new(table.to_str().unwrap())
        .unwrap()
        .with_dry_run(true)
        .await
        .unwrap();
    assert_eq!(plan.groups.len(), 1, "{plan:?}");
    assert_eq!(plan.groups[0].files.len(), 12);
    assert!(plan.commits.is_empty());
    assert_eq!(
        described(&table)["version"].as_i64().unwrap(),
        before,
        "a dry run commits nothing"
    );

    let done = Compact::new(table.to_str().unwrap()).unwrap().await.unwrap();
    assert_eq!(done.commits, vec![before + 1]);
    assert_eq!((done.files_removed, done.files_added, done.rows), (12, 1, 1200));
    assert_eq!(done.files_after(), 1);
    assert_eq!(live_files(&table), 1);
    let d = described(&table);
    assert_eq!(d["last_commit"]["operation"], "OPTIMIZE", "{d}");
    assert_eq!(d["files"][0]["num_records"], 1200, "the new file has statistics");
    assert_exactly_once(&ids_by_both_readers(&table), 0..1200);
    // Time travel to the version before compaction reads the same rows.
    let old = read(&["ids-at", table.to_str().unwrap(), &before.to_string()]).unwrap();
    assert_exactly_once(&json_ids(&old), 0..1200);

    let again = Compact::new(table.to_str().unwrap()).unwrap().await.unwrap();
    assert!(again.groups.is_empty() && again.commits.is_empty(), "{again:?}");

    // The stream goes on after compaction, exactly once.
    stream(&table, &dir.path().join("chk"), 14).await;
    assert_exactly_once(&ids_by_both_readers(&table), 0..1500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_are_compacted_apart_with_a_filter_and_partial_progress() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    partitioned(&table, &dir.path().join("chk"), bucketed(60), "bucket").await;
    assert_eq!(live_files(&table), 18);

    let only_b1 = Compact::new(table.to_str().unwrap())
        .unwrap()
        .with_partition("bucket", Some("b1".into()))
        .await
        .unwrap();
    assert_eq!(only_b1.groups.len(), 1);
    assert_eq!(only_b1.groups[0].partition["bucket"].as_deref(), Some("b1"));
    assert_eq!(live_files(&table), 13);

    // A commit every 0 groups would commit nothing: it is taken as 1.
    let every_0 = weir_delta::CompactOptions {
        groups_per_commit: Some(0),
        ..Default::default()
    };
    let rest = Compact::new(table.to_str().unwrap())
        .unwrap()
        .with_options(every_0)
        .await
        .unwrap();
    assert_eq!(rest.groups.len(), 2);
    assert_eq!(rest.commits.len(), 2, "one commit per group: {rest:?}");
    let d = described(&table);
    let mut buckets: Vec<&str> = d["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["partition_values"]["bucket"].as_str().unwrap())
        .collect();
    buckets.sort_unstable();
    assert_eq!(buckets, ["b0", "b1", "b2"], "one file per partition");
    assert_exactly_once(&ids_by_both_readers(&table), 0..360);

    let e = Compact::new(table.to_str().unwrap())
        .unwrap()
        .with_partition("zone", None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("not a partition column"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_stopped_before_its_commit_changes_nothing_and_a_rerun_finishes() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    stream(&table, &dir.path().join("chk"), 7).await;
    let before = described(&table)["version"].as_i64().unwrap();

    // The job dies right after rewriting, before its commit, as a killed
    // process would.
    let job = Compact::new(table.to_str().unwrap()).unwrap().with_progress(|p| {
        if matches!(p, CompactProgress::Rewritten { .. }) {
            panic!("killed after the rewrite");
        }
    });
    let died = tokio::spawn(async move { job.await }).await;
    assert!(died.unwrap_err().is_panic());

    assert_eq!(described(&table)["version"].as_i64().unwrap(), before);
    assert_eq!(live_files(&table), 8);
    assert_exactly_once(&ids_by_both_readers(&table), 0..800);
    let on_disk = std::fs::read_dir(&table)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("weir-compact-"))
        .count();
    assert_eq!(on_disk, 1, "the uncommitted output is an orphan");

    let done = Compact::new(table.to_str().unwrap()).unwrap().await.unwrap();
    assert_eq!(done.commits, vec![before + 1]);
    assert_eq!(live_files(&table), 1);
    assert_exactly_once(&ids_by_both_readers(&table), 0..800);

    // Vacuum takes the orphan and the compacted inputs, never the live file.
    let vacuumed = Vacuum::new(table.to_str().unwrap())
        .unwrap()
        .with_retention(Duration::ZERO)
        .with_force(true)
        .await
        .unwrap();
    assert_eq!(vacuumed.files.len(), 9, "{vacuumed:?}");
    assert_exactly_once(&ids_by_both_readers(&table), 0..800);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_input_another_writer_removed_is_dropped() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    stream(&table, &dir.path().join("chk"), 3).await;
    let t = table.to_str().unwrap().to_string();
    let deleted = Arc::new(AtomicBool::new(false));
    let flag = deleted.clone();
    let report = Compact::new(&t)
        .unwrap()
        .with_progress(move |p| {
            if matches!(p, CompactProgress::Rewritten { .. }) && !flag.swap(true, Ordering::SeqCst) {
                // Another engine rewrites the files holding ids below 50
                // while the group waits for its commit.
                alter(&["delete", &t, "event_id < 50"]).unwrap();
            }
        })
        .await
        .unwrap();
    assert!(deleted.load(Ordering::SeqCst));
    assert_eq!(report.groups_dropped, 1, "{report:?}");
    assert!(report.commits.is_empty());
    assert_exactly_once(&ids_by_both_readers(&table), 50..400);
    let left = std::fs::read_dir(&table)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("weir-compact-"))
        .count();
    assert_eq!(left, 0, "a dropped group's outputs are deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_between_rewrite_and_commit_is_rebased_over() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    stream(&table, &dir.path().join("chk"), 3).await;
    let t = table.to_str().unwrap().to_string();
    let report = Compact::new(&t)
        .unwrap()
        .with_progress(move |p| {
            if matches!(p, CompactProgress::Rewritten { .. }) {
                // Another engine appends while the group waits for its commit.
                alter(&["append-copy", &t]).unwrap();
            }
        })
        .await
        .unwrap();
    assert_eq!((report.concurrent_commits, report.commits.len()), (1, 1), "{report:?}");
    let ids = ids_by_both_readers(&table);
    let (ours, copies): (Vec<i64>, Vec<i64>) = ids.into_iter().partition(|id| *id < 1_000_000);
    assert_exactly_once(&ours, 0..400);
    assert_exactly_once(&copies, 1_000_000..1_000_400);
    assert_eq!(live_files(&table), 2, "the compacted file and the appended one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_read_by_an_earlier_commit_drops_a_later_group() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    stream(&table, &dir.path().join("chk"), 7).await;
    let t = table.to_str().unwrap().to_string();
    // A target that packs the eight files into two groups of four.
    let all = Compact::new(&t).unwrap().with_dry_run(true).await.unwrap();
    let target = all.groups[0].bytes / 8 * 9 / 2;
    let plan = Compact::new(&t)
        .unwrap()
        .with_target_file_size(target)
        .with_dry_run(true)
        .await
        .unwrap();
    assert_eq!(
        plan.groups.iter().map(|g| g.files.len()).collect::<Vec<_>>(),
        [4, 4],
        "{plan:?}"
    );
    let deleted = Arc::new(AtomicBool::new(false));
    let flag = deleted.clone();
    let path = t.clone();
    let report = Compact::new(&t)
        .unwrap()
        .with_target_file_size(target)
        .with_groups_per_commit(1)
        .with_max_concurrent_rewrites(1)
        .with_progress(move |p| {
            if matches!(p, CompactProgress::Rewritten { .. }) && !flag.swap(true, Ordering::SeqCst) {
                // Before the first group commits, another engine deletes the
                // rows of the last file, an input of the second group.
                alter(&["delete", &path, "event_id >= 700"]).unwrap();
            }
        })
        .await
        .unwrap();
    assert!(deleted.load(Ordering::SeqCst));
    assert_eq!((report.commits.len(), report.groups_dropped), (1, 1), "{report:?}");
    assert_exactly_once(&ids_by_both_readers(&table), 0..700);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_runs_again_and_again_beside_a_stream_that_never_fails() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    stream(&table, &dir.path().join("chk"), 0).await;
    let last = 60;
    let q = read_stream(RateSource::rows_per_batch(50))
        .write_stream()
        .checkpoint_location(dir.path().join("chk"))
        .trigger(Trigger::processing_time(Duration::from_millis(20)))
        .stop_after_batch(BatchId(last))
        .start(DeltaSink::try_new(table.to_str().unwrap()).unwrap())
        .await
        .unwrap();
    let mut runs = 0;
    let mut committed = 0;
    while q.is_active() || runs < 3 {
        let r = Compact::new(table.to_str().unwrap())
            .unwrap()
            .await
            .expect("compaction beside a stream commits");
        runs += 1;
        committed += r.commits.len();
        if runs % 5 == 0 {
            // A reader sees whole batches, exactly once, between compactions.
            let (ids, _) = event_ids_with("deltalake", table.to_str().unwrap()).unwrap();
            let n = ids.len() as i64;
            assert_exactly_once(&ids, 0..n);
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    q.await_termination().await.expect("the stream never fails");
    assert!(committed >= 1, "compactions committed {committed} times in {runs} runs");
    let total = 100 + last as i64 * 50;
    assert_exactly_once(&ids_by_both_readers(&table), 0..total);
    Compact::new(table.to_str().unwrap()).unwrap().await.unwrap();
    assert_eq!(live_files(&table), 1);
    assert_exactly_once(&ids_by_both_readers(&table), 0..total);
}

/// The raw `path` strings of the log's `add` and `remove` actions.
fn raw_log_paths(table: &Path) -> (Vec<String>, Vec<String>) {
    let actions = log_actions(table);
    let paths = |kind: &str| -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| a[kind]["path"].as_str().map(str::to_string))
            .collect()
    };
    (paths("add"), paths("remove"))
}

/// Six batches of `rows` partitioned by `column`.
async fn partitioned(table: &Path, chk: &Path, rows: ReadStream, column: &str) {
    let q = rows
        .write_stream()
        .checkpoint_location(chk)
        .stop_after_batch(BatchId(5))
        .start(
            DeltaSink::try_new(table.to_str().unwrap())
                .unwrap()
                .with_partition_by([column]),
        )
        .await
        .unwrap();
    q.await_termination().await.unwrap();
}

/// Checks that the table compacts into one file per partition, that each
/// `remove` names its file exactly as its `add` did, and that both readers
/// see every row once.
async fn compacts_with_removes_as_written(table: &Path, partitions: usize, rows: u64) {
    let before = live_files(table);
    let done = Compact::new(table.to_str().unwrap()).unwrap().await.unwrap();
    assert_eq!((done.files_removed, done.files_added), (before, partitions), "{done:?}");
    assert_eq!(live_files(table), partitions);
    let (adds, removes) = raw_log_paths(table);
    assert_eq!(removes.len(), before);
    for removed in &removes {
        assert!(adds.contains(removed), "the remove {removed} matches no add");
    }
    assert_exactly_once(&ids_by_both_readers(table), 0..rows as i64);
}

/// Partition values with `:` and spaces live in Hive-escaped folders
/// (`10%3A00%20h`, in the log `10%253A00%2520h`). Other engines put spaces
/// in folders as they are (`day 1`) and write them into the log in
/// different ways (`day%201` as Spark does, `day 1` as weir did before it
/// escaped spaces): each is compacted, its `remove` written exactly as its
/// `add` was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaped_partition_folders_and_spaces_are_compacted() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let hours = with_string_column(10, "hour", |v| format!("10:{:02} h", v % 2));
    partitioned(&table, &dir.path().join("chk"), hours, "hour").await;
    assert!(table.join("hour=10%3A00%20h").is_dir());
    compacts_with_removes_as_written(&table, 2, 60).await;
    let (_, removes) = raw_log_paths(&table);
    assert!(removes.iter().all(|r| r.starts_with("hour=10%253A0")), "{removes:?}");

    for (n, (log_space, spelled)) in [("%20", "day=day%20"), (" ", "day=day ")].into_iter().enumerate() {
        let spaced = dir.path().join(format!("s{n}"));
        let days = with_string_column(10, "day", |v| format!("day {}", v % 2));
        partitioned(&spaced, &dir.path().join(format!("chk-s{n}")), days, "day").await;
        spaces_as_other_engines_write_them(&spaced, log_space);
        assert_exactly_once(&ids_by_both_readers(&spaced), 0..60);
        compacts_with_removes_as_written(&spaced, 2, 60).await;
        let (_, removes) = raw_log_paths(&spaced);
        assert!(removes.iter().all(|r| r.starts_with(spelled)), "{removes:?}");
    }
}

/// Respells a table weir wrote, whose folders escape spaces (`day=day%200`),
/// as other engines write one: folders with the space as it is (`day=day
/// 0`), named in the log with `log_space` for the space.
fn spaces_as_other_engines_write_them(table: &Path, log_space: &str) {
    for entry in std::fs::read_dir(table).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.contains("%20") {
            std::fs::rename(table.join(&name), table.join(name.replace("%20", " "))).unwrap();
        }
    }
    rewrite_log(table, |text| text.replace("%2520", log_space));
}

/// Two live files whose paths differ in the log (`day 0`, `day%200`) but
/// name one file once decoded: a compaction cannot write a `remove` that
/// tells them apart, so it refuses, naming both, and commits nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_files_that_decode_to_one_path_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let days = with_string_column(10, "day", |v| format!("day {}", v % 2));
    partitioned(&table, &dir.path().join("chk"), days, "day").await;
    spaces_as_other_engines_write_them(&table, " ");
    let entries = log_entries(&table);
    let last = entries.last().unwrap();
    let version: u64 = last.file_stem().unwrap().to_str().unwrap().parse().unwrap();
    // An engine adds the same file again, its path spelled with `%20`.
    let add = log_actions(&table)
        .into_iter()
        .find(|a| a["add"]["path"].as_str().is_some_and(|p| p.starts_with("day=day ")))
        .unwrap();
    let raw = add["add"]["path"].as_str().unwrap().to_string();
    let mut again = add.clone();
    again["add"]["path"] = serde_json::Value::String(raw.replace("day=day ", "day=day%20"));
    std::fs::write(
        table.join(format!("_delta_log/{:020}.json", version + 1)),
        format!("{again}\n"),
    )
    .unwrap();
    let before = log_entries(&table);

    let err = Compact::new(table.to_str().unwrap()).unwrap().await.unwrap_err();
    match &err {
        weir_delta::DeltaSinkError::SamePathDecoded { first, second, .. } => {
            let mut named = [first.clone(), second.clone()];
            named.sort();
            let mut expected = [raw.clone(), raw.replace("day=day ", "day=day%20")];
            expected.sort();
            assert_eq!(named, expected);
        }
        other => panic!("expected a refusal naming both paths, got {other:?}"),
    }
    assert!(!err.retryable(), "{err}");
    assert_eq!(log_entries(&table), before, "nothing was committed");
}

/// Rewrites run on blocking threads and drive their reads and writes on
/// the caller's runtime: a current-thread runtime (as `#[tokio::test]`
/// makes) works too.
#[tokio::test]
async fn compaction_runs_on_a_current_thread_runtime() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    stream(&table, &dir.path().join("chk"), 5).await;
    let done = Compact::new(table.to_str().unwrap()).unwrap().await.unwrap();
    assert_eq!(
        (done.files_removed, done.files_added, done.rows),
        (6, 1, 600),
        "{done:?}"
    );
    assert_eq!(live_files(&table), 1);
    assert_exactly_once(&ids_by_both_readers(&table), 0..600);
}

/// The `weir-compact-` files under the table, in any partition.
fn compaction_outputs(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if e.file_type().unwrap().is_dir() {
            found.extend(compaction_outputs(&e.path()));
        } else if name.starts_with("weir-compact-") {
            found.push(name);
        }
    }
    found
}

/// A damaged input file stops the job with an error that names it; the
/// rewrites of other groups stop too, and nothing the job wrote is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_input_stops_the_job_and_leaves_nothing_behind() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    partitioned(&table, &dir.path().join("chk"), bucketed(60), "bucket").await;
    let before = described(&table)["version"].as_i64().unwrap();
    // The last file of bucket b2 loses its footer.
    let b2 = table.join("bucket=b2");
    let mut files: Vec<_> = std::fs::read_dir(&b2).unwrap().flatten().map(|e| e.path()).collect();
    files.sort();
    let damaged = files.last().unwrap().clone();
    let bytes = std::fs::read(&damaged).unwrap();
    std::fs::write(&damaged, &bytes[..bytes.len() / 2]).unwrap();

    let e = Compact::new(table.to_str().unwrap())
        .unwrap()
        .with_max_concurrent_rewrites(3)
        .await
        .unwrap_err();
    let name = damaged.file_name().unwrap().to_string_lossy().to_string();
    assert!(e.to_string().contains(&name), "the error names the file: {e}");
    assert_eq!(described(&table)["version"].as_i64().unwrap(), before);
    assert_eq!(compaction_outputs(&table), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_larger_than_a_part_goes_up_in_parts_and_reads_whole() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let q = with_payload(100_000)
        .write_stream()
        .checkpoint_location(dir.path().join("chk"))
        .stop_after_batch(BatchId(4))
        .start(DeltaSink::try_new(table.to_str().unwrap()).unwrap())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let done = Compact::new(table.to_str().unwrap()).unwrap().await.unwrap();
    assert_eq!(
        (done.files_removed, done.files_added),
        (done.files_before, 1),
        "{done:?}"
    );
    assert!(done.bytes_added > 16 << 20, "the file is past one part: {done:?}");
    assert_eq!(live_files(&table), 1);
    assert_exactly_once(&ids_by_both_readers(&table), 0..500_000);
}

/// The operations of the table's log entries, oldest first.
/// The table's compaction entries.
pub(crate) fn optimizes(table: &Path) -> usize {
    operations(table).iter().filter(|o| *o == "OPTIMIZE").count()
}

fn operations(table: &Path) -> Vec<String> {
    log_entries(table)
        .iter()
        .filter_map(|p| {
            let text = std::fs::read_to_string(p).ok()?;
            let info: serde_json::Value = serde_json::from_str(text.lines().next()?).ok()?;
            info["commitInfo"]["operation"].as_str().map(str::to_string)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sinks_compaction_policy_compacts_in_the_background() {
    if python().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("t");
    let sink = DeltaSink::try_new(table.to_str().unwrap())
        .unwrap()
        .with_compaction(weir_core::sink::CompactionPolicy::every(10, 5));
    let q = read_stream(RateSource::rows_per_batch(50))
        .write_stream()
        .checkpoint_location(dir.path().join("chk"))
        .trigger(Trigger::processing_time(Duration::from_millis(20)))
        .stop_after_batch(BatchId(39))
        .start(sink)
        .await
        .unwrap();
    // The query ran to its end, so its background compactions have ended
    // too. The one due at commit 10 ran; a second became due 10 commits
    // after it began (at once, or when it ended).
    q.await_termination().await.unwrap();
    let optimized = optimizes(&table);
    assert!(optimized >= 2, "{:?}", operations(&table));
    assert!(live_files(&table) < 40, "{} files", live_files(&table));
    assert_exactly_once(&ids_by_both_readers(&table), 0..2000);
}
