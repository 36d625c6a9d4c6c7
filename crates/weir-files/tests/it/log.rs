//! The log: compaction keeps it short, retention drops old files from it,
//! DuckDB reads exactly the files it lists, orphans are told apart.

use std::path::Path;
use std::time::Duration;

use weir_core::prelude::*;
use weir_core::source::RateSource;
use weir_files::{FileFormat, FileLog, FileSink, LOG_DIR};
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::{json_ids, read};

use crate::conformance::log_ids;

async fn stream(sink: FileSink, chk: &Path, last: u64) {
    read_stream(RateSource::rows_per_batch(100))
        .write_stream()
        .query_name("files")
        .checkpoint_location(chk)
        .stop_after_batch(BatchId(last))
        .start(sink)
        .await
        .unwrap()
        .await_termination()
        .await
        .unwrap();
}

fn entries(out: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(out.join(LOG_DIR))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_keeps_the_log_short_and_complete() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let sink = || {
        FileSink::try_new(out.to_str().unwrap())
            .unwrap()
            .with_log_compact_interval(5)
    };
    stream(sink(), &dir.path().join("chk"), 23).await;
    let names = entries(&out);
    // With an interval of 5, every 5th batch also has a compact entry;
    // entries a newer compact one makes redundant stay for the cleanup
    // delay (ten minutes), so a reader that just listed them finds them.
    for compact in ["4.compact", "9.compact", "14.compact", "19.compact"] {
        assert!(names.iter().any(|n| n == compact), "{names:?}");
    }
    assert_eq!(
        names.iter().filter(|n| !n.ends_with(".compact")).count(),
        24,
        "{names:?}"
    );
    assert_exactly_once(&log_ids(&out).await, 0..2400);

    let log = FileLog::open(out.to_str().unwrap(), &Default::default()).unwrap();
    assert_eq!(log.log().compact_now().await.unwrap(), Some(BatchId(23)));
    assert!(entries(&out).contains(&"23.compact".to_string()));
    assert_exactly_once(&log_ids(&out).await, 0..2400);
    // The query goes on after a compaction made by hand.
    stream(sink(), &dir.path().join("chk"), 26).await;
    assert_exactly_once(&log_ids(&out).await, 0..2700);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_past_the_retention_leave_the_log_and_become_orphans() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let sink = || {
        FileSink::try_new(out.to_str().unwrap())
            .unwrap()
            .with_log_compact_interval(10)
            .with_log_retention(Duration::from_secs(2))
    };
    stream(sink(), &dir.path().join("chk"), 4).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stream(sink(), &dir.path().join("chk"), 9).await;
    // Batch 9 compacted the log without batches 0..=4, older than 2 s.
    assert_exactly_once(&log_ids(&out).await, 500..1000);
    let log = FileLog::open(out.to_str().unwrap(), &Default::default()).unwrap();
    let orphans = log.orphans(Duration::ZERO).await.unwrap();
    assert_eq!(orphans.len(), 5, "{orphans:?}");
    assert!(orphans.iter().all(|o| o.path.starts_with("part-0000")), "{orphans:?}");
    let e = log.remove_orphans(Duration::from_secs(1)).await.unwrap_err();
    assert!(e.to_string().contains("younger than a minute"), "{e}");
    assert!(log.remove_orphans(Duration::from_secs(3600)).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duckdb_reads_exactly_the_files_the_log_lists() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let sink = FileSink::try_new(out.to_str().unwrap())
        .unwrap()
        .with_partition_by(["account_id"]);
    // A partitioned batch of 3 accounts a batch.
    read_stream(RateSource::rows_per_batch(3))
        .write_stream()
        .query_name("files")
        .checkpoint_location(dir.path().join("chk"))
        .stop_after_batch(BatchId(9))
        .start(sink)
        .await
        .unwrap()
        .await_termination()
        .await
        .unwrap();
    // A stray file, as a failed attempt leaves: on disk, not in the log.
    std::fs::write(out.join("account_id=0/part-stray.zstd.parquet"), b"not parquet").ok();
    let log = FileLog::open(out.to_str().unwrap(), &Default::default()).unwrap();
    let files: Vec<String> = log
        .files()
        .await
        .unwrap()
        .iter()
        .map(|f| out.join(&f.path).to_str().unwrap().to_string())
        .collect();
    assert_eq!(files.len(), 30);
    let mut ours = log_ids(&out).await;
    ours.sort_unstable();
    assert_exactly_once(&ours, 0..30);
    let orphans = log.orphans(Duration::ZERO).await.unwrap();
    assert_eq!(
        orphans.len(),
        0,
        "a stray named like no weir file is no orphan: {orphans:?}"
    );
    let mut args = vec!["ids-files"];
    args.extend(files.iter().map(String::as_str));
    let duck = read(&args).expect("the readers are installed");
    let mut duck_ids = json_ids(&duck);
    duck_ids.sort_unstable();
    assert_eq!(duck_ids, ours);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_are_written_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let sink = FileSink::try_new(out.to_str().unwrap())
        .unwrap()
        .with_format(FileFormat::JsonLines);
    stream(sink, &dir.path().join("chk"), 2).await;
    let log = FileLog::open(out.to_str().unwrap(), &Default::default()).unwrap();
    assert!(log.files().await.unwrap().iter().all(|f| f.path.ends_with(".json")));
    assert_exactly_once(&log_ids(&out).await, 0..300);
}

/// The rate source with `bucket` (`b0` to `b2`, from the event id).
fn bucketed(rows: u64) -> ReadStream {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    read_stream(RateSource::rows_per_batch(rows)).map_batches(|b| {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let buckets: arrow_array::StringArray = ids.iter().map(|v| v.map(|v| format!("b{}", v % 3))).collect();
        let mut fields: Vec<arrow_schema::Field> = b.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(arrow_schema::Field::new("bucket", arrow_schema::DataType::Utf8, true));
        let mut columns = b.columns().to_vec();
        columns.push(std::sync::Arc::new(buckets));
        Ok(arrow_array::RecordBatch::try_new(
            std::sync::Arc::new(arrow_schema::Schema::new(fields)),
            columns,
        )?)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_coalesced_to_one_file_per_partition() {
    for (coalesce, files_per_batch) in [(None, 12), (Some(1), 3)] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let mut sink = FileSink::try_new(out.to_str().unwrap())
            .unwrap()
            .with_partition_by(["bucket"]);
        if let Some(n) = coalesce {
            sink = sink.with_max_files_per_partition(n);
        }
        // 300,000 rows come as 5 chunks, spread over 4 writers.
        bucketed(300_000)
            .write_stream()
            .query_name("files")
            .checkpoint_location(dir.path().join("chk"))
            .writer_parallelism(4)
            .stop_after_batch(BatchId(1))
            .start(sink)
            .await
            .unwrap()
            .await_termination()
            .await
            .unwrap();
        let log = FileLog::open(out.to_str().unwrap(), &Default::default()).unwrap();
        let files = log.files().await.unwrap();
        assert_eq!(files.len(), 2 * files_per_batch, "coalesce {coalesce:?}: {files:?}");
        assert_exactly_once(&log_ids(&out).await, 0..600_000);
        let on_disk = log.orphans(Duration::ZERO).await.unwrap();
        assert!(on_disk.is_empty(), "{on_disk:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_removal_takes_failed_attempts_files_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    stream(
        FileSink::try_new(out.to_str().unwrap()).unwrap(),
        &dir.path().join("chk"),
        3,
    )
    .await;
    let old = |name: &str| {
        let path = out.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"x").unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(std::time::SystemTime::now() - Duration::from_secs(7200))
            .unwrap();
        path
    };
    let failed = old("part-00002-q-a-p000-000.zstd.parquet"); // batch 2 is committed
    let in_flight = old("part-00004-q-a-p000-000.zstd.parquet"); // batch 4 is not
    let hidden = old("_checkpoint/part-00001-q-a-p000-000.zstd.parquet");
    let theirs = old("notes.txt");
    let log = FileLog::open(out.to_str().unwrap(), &Default::default()).unwrap();
    let removed = log.remove_orphans(Duration::from_secs(3600)).await.unwrap();
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert!(!failed.exists());
    assert!(in_flight.exists() && hidden.exists() && theirs.exists());
    assert_exactly_once(&log_ids(&out).await, 0..400);
}
