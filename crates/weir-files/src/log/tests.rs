//! The metadata log's tests: entries, compact entries in blocks or staged,
//! clean-up and readers racing it.

use super::*;

#[test]
fn entry_names_parse() {
    assert_eq!(parse_name("12"), Some((12, false)));
    assert_eq!(parse_name("9.compact"), Some((9, true)));
    assert_eq!(parse_name("x"), None);
    assert_eq!(parse_name("9.compact.tmp"), None);
    assert_eq!(name(9, true), "9.compact");
}

const FILES_PER_BATCH: u64 = 40;

fn header(batch: u64, committed_at: i64) -> EntryHeader {
    EntryHeader {
        query_name: "q".into(),
        query_id: "00000000-0000-0000-0000-000000000001".into(),
        batch_id: batch,
        committed_at,
        attempt_id: Some(format!("attempt-{batch}")),
        retained_from: None,
    }
}

/// Batch `batch`'s files, with paths long enough that a compact entry
/// spans many of the local store's read chunks, lines split across them.
fn files(batch: u64) -> Vec<FileEntry> {
    (0..FILES_PER_BATCH)
        .map(|i| FileEntry {
            path: format!(
                "zone=z{i}/part-{batch:05}-{}-p{i:03}.zstd.parquet",
                "x".repeat(i as usize)
            ),
            size: 1000 + i,
            rows: batch * 100 + i,
            partition: BTreeMap::from([("zone".to_string(), Some(format!("z{i}")))]),
            batch_id: 0,
            committed_at: 0,
        })
        .collect()
}

async fn commit_batches(log: &MetadataLog, batches: std::ops::Range<u64>, committed_at: i64) {
    for b in batches {
        assert_eq!(
            log.commit(header(b, committed_at), files(b)).await.unwrap(),
            Written::Written
        );
    }
}

fn rows_of(files: &[FileEntry]) -> Vec<(u64, u64)> {
    files.iter().map(|f| (f.batch_id, f.rows)).collect()
}

fn expected(batches: std::ops::Range<u64>) -> Vec<(u64, u64)> {
    batches
        .flat_map(|b| (0..FILES_PER_BATCH).map(move |i| (b, b * 100 + i)))
        .collect()
}

#[tokio::test]
async fn compact_entries_built_a_chunk_at_a_time_list_every_file_once() {
    let dir = tempfile::tempdir().unwrap();
    let output = Output::open(dir.path().to_str().unwrap(), &Default::default(), true).unwrap();
    let log = MetadataLog::new(output, 7, None);
    let now = chrono::Utc::now().timestamp_millis();
    commit_batches(&log, 0..30, now).await;

    // Compact entries at 6, 13, 20 and 27, each built from the one
    // before; the last is far larger than one read chunk.
    let compact = log.read(27, true).await.unwrap().unwrap();
    assert_eq!(rows_of(&compact.files), expected(0..28));
    assert!(compact.files.iter().all(|f| f.committed_at == now));
    assert_eq!(
        compact.files[41],
        FileEntry {
            batch_id: 1,
            committed_at: now,
            ..files(1)[1].clone()
        }
    );
    assert_eq!(compact.header.retained_from, Some(0));
    assert_eq!(compact.header.attempt_id.as_deref(), Some("attempt-27"));
    let size = tokio::fs::metadata(dir.path().join(LOG_DIR).join("27.compact"))
        .await
        .unwrap()
        .len();
    assert!(size > 64 * 1024, "{size} bytes");
    assert_eq!(rows_of(&log.files().await.unwrap()), expected(0..30));

    // The marker comes from a header alone, from the plain entry or,
    // once only the compact entry is left, from that.
    assert_eq!(log.latest_header().await.unwrap().unwrap().batch_id, 29);
    assert_eq!(log.compact_now().await.unwrap(), Some(BatchId(29)));
    tokio::fs::remove_file(dir.path().join(LOG_DIR).join("29"))
        .await
        .unwrap();
    let latest = log.latest_header().await.unwrap().unwrap();
    assert_eq!((latest.batch_id, latest.retained_from), (29, Some(0)));
    assert_eq!(rows_of(&log.files().await.unwrap()), expected(0..30));
}

#[tokio::test]
async fn files_past_the_retention_leave_the_next_compact_entry() {
    let dir = tempfile::tempdir().unwrap();
    let output = Output::open(dir.path().to_str().unwrap(), &Default::default(), true).unwrap();
    let log = MetadataLog::new(output, 5, Some(Duration::from_secs(600)));
    let now = chrono::Utc::now().timestamp_millis();
    // Batches 0..12 committed an hour ago: the compact entries at 4 and
    // 9 drop what is already past the retention.
    commit_batches(&log, 0..12, now - 3_600_000).await;
    assert!(log.read(9, true).await.unwrap().unwrap().files.is_empty());
    commit_batches(&log, 12..20, now).await;
    // 14.compact drops batches 10 and 11 (copied from 9.compact's
    // successors); 19.compact copies 14.compact's lines.
    for compact in [14, 19] {
        let entry = log.read(compact, true).await.unwrap().unwrap();
        assert_eq!(rows_of(&entry.files), expected(12..compact + 1));
        assert_eq!(entry.header.retained_from, Some(12));
    }
    assert_eq!(rows_of(&log.files().await.unwrap()), expected(12..20));
}

#[tokio::test]
async fn a_compact_entry_with_a_broken_line_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let output = Output::open(dir.path().to_str().unwrap(), &Default::default(), true).unwrap();
    let log = MetadataLog::new(output, 3, None);
    commit_batches(&log, 0..3, 1).await;
    let path = dir.path().join(LOG_DIR).join("2.compact");
    let mut text = tokio::fs::read_to_string(&path).await.unwrap();
    text.push_str("{not json\n");
    tokio::fs::remove_file(dir.path().join(LOG_DIR).join("2"))
        .await
        .unwrap();
    tokio::fs::write(&path, text).await.unwrap();
    commit_batches(&log, 3..5, 1).await;
    let err = log.compact_now().await.unwrap_err();
    assert!(
        matches!(&err, FileSinkError::BadEntry { path, .. } if path == "_weir_metadata/2.compact"),
        "{err}"
    );
}

/// Every file of `dir`'s log directory that is not an entry.
fn strays(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir.join(LOG_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| parse_name(f).is_none())
        .collect()
}

#[tokio::test]
async fn large_compact_entries_are_staged_and_copied_into_place() {
    let dir = tempfile::tempdir().unwrap();
    let output = Output::open(dir.path().to_str().unwrap(), &Default::default(), true).unwrap();
    let mut log = MetadataLog::new(output, 7, None);
    log.stage_bytes = 16 << 10;
    let now = chrono::Utc::now().timestamp_millis();
    // 6.compact (7 batches of files) is over 16 KiB, so 13.compact,
    // 20.compact and 27.compact are staged.
    commit_batches(&log, 0..28, now).await;
    let staged_from = tokio::fs::metadata(dir.path().join(LOG_DIR).join("6.compact"))
        .await
        .unwrap()
        .len();
    assert!(staged_from > 16 << 10, "{staged_from} bytes");
    let compact = log.read(27, true).await.unwrap().unwrap();
    assert_eq!(rows_of(&compact.files), expected(0..28));
    assert_eq!(compact.header.retained_from, Some(0));
    assert_eq!(compact.header.batch_id, 27);
    assert!(log.staging.load(Ordering::Relaxed), "a local store copies if absent");
    assert_eq!(strays(dir.path()), Vec::<String>::new());

    // A second compaction of batch 27 finds the entry there.
    let entries = log.list().await.unwrap();
    let header = log.read_header(27, false).await.unwrap().unwrap();
    let base = latest_compact(&entries);
    let mut again = log.compact_entry(header, base).await.unwrap();
    assert!(again.is_staged());
    log.compact_lines(&entries, base, &mut again).await.unwrap();
    assert_eq!(log.put_compact(27, again).await.unwrap(), Written::Exists);
    assert_eq!(strays(dir.path()), Vec::<String>::new());
    assert_eq!(rows_of(&log.files().await.unwrap()), expected(0..28));
}

#[tokio::test]
async fn a_store_that_cannot_copy_if_absent_gets_a_large_entry_whole() {
    // S3 copies if absent only when configured to: the staged entry is
    // read back and put with put-if-absent.
    let Some(endpoint) = weir_test_support::service("WEIR_TEST_S3_ENDPOINT") else {
        return;
    };
    let bucket = std::env::var("WEIR_TEST_S3_BUCKET").unwrap_or_else(|_| "weir".into());
    let location = format!("s3://{bucket}/files-log/{}", uuid::Uuid::new_v4());
    let options = [
        ("aws_endpoint".to_string(), endpoint),
        ("aws_allow_http".to_string(), "true".to_string()),
    ]
    .into();
    let output = Output::open(&location, &options, true).unwrap();
    let mut log = MetadataLog::new(output.clone(), 7, None);
    log.stage_bytes = 16 << 10;
    let now = chrono::Utc::now().timestamp_millis();
    commit_batches(&log, 0..21, now).await;
    assert!(!log.staging.load(Ordering::Relaxed), "S3 refused the copy");
    // 13.compact was staged, then put whole; 20.compact was not staged.
    for batch in [13, 20] {
        let compact = log.read(batch, true).await.unwrap().unwrap();
        assert_eq!(rows_of(&compact.files), expected(0..batch + 1));
        assert_eq!(compact.header.retained_from, Some(0));
    }
    let listed: Vec<object_store::ObjectMeta> = output
        .store
        .list(Some(&output.path(LOG_DIR).unwrap()))
        .try_collect()
        .await
        .unwrap();
    let strays: Vec<_> = listed
        .iter()
        .filter_map(|m| m.location.filename())
        .filter(|f| parse_name(f).is_none())
        .collect();
    assert_eq!(strays, Vec::<&str>::new());
}

#[tokio::test]
async fn the_clean_up_removes_staging_objects_left_past_the_delay_and_no_entry() {
    let dir = tempfile::tempdir().unwrap();
    let output = Output::open(dir.path().to_str().unwrap(), &Default::default(), true).unwrap();
    let log = MetadataLog::new(output, 3, None);
    let now = chrono::Utc::now().timestamp_millis();
    commit_batches(&log, 0..3, now).await;
    let logs = dir.path().join(LOG_DIR);
    let stale = logs.join("2.compact.0123.tmp");
    let fresh = logs.join("5.compact.4567.tmp");
    for path in [&stale, &fresh] {
        std::fs::write(path, "v1\n").unwrap();
    }
    let long_ago = std::time::SystemTime::now() - CLEANUP_DELAY * 2;
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(long_ago)
        .unwrap();
    log.clean_up(2).await;
    assert_eq!(strays(dir.path()), vec!["5.compact.4567.tmp".to_string()]);
    assert_eq!(rows_of(&log.files().await.unwrap()), expected(0..3));
}
