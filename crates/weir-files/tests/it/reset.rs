//! Reset protection: a deleted checkpoint with the output kept is refused
//! with both query ids; taking the log over continues after its last batch.

use std::path::Path;

use weir_core::prelude::*;
use weir_core::source::RateSource;
use weir_files::{FileLog, FileSink};

use crate::conformance::log_ids;

fn query(chk: &Path, name: &str) -> StreamWriter {
    read_stream(RateSource::rows_per_batch(100))
        .write_stream()
        .query_name(name)
        .checkpoint_location(chk)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_checkpoint_on_an_old_log_is_refused_then_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let sink = || FileSink::try_new(out.to_str().unwrap()).unwrap();
    let first = query(&dir.path().join("chk"), "files")
        .stop_after_batch(BatchId(2))
        .start(sink())
        .await
        .unwrap();
    first.await_termination().await.unwrap();
    let old_id = first.id();

    // The checkpoint is lost; the same query starts again on a new one.
    std::fs::remove_dir_all(dir.path().join("chk")).unwrap();
    let e = query(&dir.path().join("chk"), "files")
        .stop_after_batch(BatchId(5))
        .start(sink())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains(&old_id.to_string()), "{e}");
    assert_eq!(e.matches("query id").count(), 2, "both ids are named: {e}");
    assert!(e.contains("take_over_output") && e.contains("new output"), "{e}");
    assert_eq!(log_ids(&out).await.len(), 300, "nothing was written");

    let taken = query(&dir.path().join("chk"), "files")
        .take_over_output(true)
        .stop_after_batch(BatchId(5))
        .start(sink())
        .await
        .unwrap();
    taken.await_termination().await.unwrap();
    let log = FileLog::open(out.to_str().unwrap(), &Default::default()).unwrap();
    let latest = log.log().latest().await.unwrap().unwrap();
    assert_eq!(latest.header.batch_id, 5, "the batch ids continued after 2");
    assert_eq!(latest.header.query_id, taken.id().to_string());
    // The new checkpoint read its source from the start: its three batches
    // hold ids 0..300 again, as the take-over documents.
    let mut ids = log_ids(&out).await;
    ids.sort_unstable();
    let expected: Vec<i64> = (0..300).flat_map(|i| [i, i]).collect();
    assert_eq!(ids, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_of_another_query_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let sink = || FileSink::try_new(out.to_str().unwrap()).unwrap();
    query(&dir.path().join("a"), "first")
        .stop_after_batch(BatchId(0))
        .start(sink())
        .await
        .unwrap()
        .await_termination()
        .await
        .unwrap();
    let e = query(&dir.path().join("b"), "second")
        .stop_after_batch(BatchId(0))
        .start(sink())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"first\"") && e.contains("another output path"), "{e}");
    assert_eq!(log_ids(&out).await.len(), 100);
}
