//! Checkpoint formats (pinned by golden files), versions, retention and
//! the query name.

use std::path::Path;

use chrono::TimeZone;
use weir_core::checkpoint::{Checkpoint, CheckpointMetadata, CommitEntry, OffsetEntry, SourceOffset, FORMAT_VERSION};
use weir_core::prelude::*;
use weir_core::protocol::{SinkIdentity, SinkMarker};
use weir_core::source::Offset;
use weir_core::QueryId;

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/golden");

fn query_id() -> QueryId {
    QueryId(uuid::Uuid::parse_str("6f1c2a4e-8d3b-4c5a-9e7f-0a1b2c3d4e5f").unwrap())
}

fn metadata() -> CheckpointMetadata {
    CheckpointMetadata {
        version: FORMAT_VERSION,
        query_id: query_id(),
        query_name: QueryName::new("payments-bronze").unwrap(),
        created_at: chrono::Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).unwrap(),
        sink: SinkIdentity {
            format: "delta".into(),
            location: "s3://lake/bronze/payments".into(),
            table_id: Some("d9a1".into()),
        },
        taken_over: Some(SinkMarker {
            query_id: QueryId(uuid::Uuid::nil()),
            batch_id: BatchId(41),
        }),
        sink_since: Some(BatchId(42)),
        sources: vec!["rate".into()],
    }
}

fn offsets() -> OffsetEntry {
    OffsetEntry {
        version: FORMAT_VERSION,
        batch_id: BatchId(42),
        timestamp_ms: 1_795_953_600_000,
        watermark_ms: 0,
        sources: vec![SourceOffset {
            source: "rate".into(),
            offset: Offset(serde_json::json!({"next_event_id": 4300})),
        }],
    }
}

fn commit() -> CommitEntry {
    CommitEntry {
        version: FORMAT_VERSION,
        batch_id: BatchId(42),
        committed_at_ms: 1_795_953_600_250,
        sink_version: Some(17),
    }
}

fn assert_golden(written: &Path, golden: &str) {
    let want = std::fs::read_to_string(Path::new(GOLDEN).join(golden)).unwrap();
    let got = std::fs::read_to_string(written).unwrap();
    assert_eq!(
        got,
        want.trim_end(),
        "{golden} changed: a persisted format needs a new version"
    );
}

#[tokio::test]
async fn persisted_formats_match_their_golden_files() {
    let dir = tempfile::tempdir().unwrap();
    let chk = Checkpoint::open_local(dir.path()).unwrap();
    chk.create_metadata(&metadata()).await.unwrap();
    assert!(chk.offsets().add(BatchId(42), &offsets()).await.unwrap());
    assert!(chk.commits().add(BatchId(42), &commit()).await.unwrap());
    assert_golden(&dir.path().join("metadata"), "metadata-v1.json");
    assert_golden(&dir.path().join("offsets/42"), "offsets-v1.json");
    assert_golden(&dir.path().join("commits/42"), "commits-v1.json");

    // And the golden files read back to the same values.
    let golden = tempfile::tempdir().unwrap();
    std::fs::copy(
        Path::new(GOLDEN).join("metadata-v1.json"),
        golden.path().join("metadata"),
    )
    .unwrap();
    std::fs::create_dir(golden.path().join("offsets")).unwrap();
    std::fs::copy(
        Path::new(GOLDEN).join("offsets-v1.json"),
        golden.path().join("offsets/42"),
    )
    .unwrap();
    let chk = Checkpoint::open_local(golden.path()).unwrap();
    assert_eq!(chk.metadata().await.unwrap(), Some(metadata()));
    assert_eq!(chk.offsets().get(BatchId(42)).await.unwrap(), Some(offsets()));
}

#[tokio::test]
async fn a_newer_format_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("metadata"), r#"{"version": 7, "query_id": "x"}"#).unwrap();
    let err = read_stream(RateSource::rows_per_batch(1))
        .write_stream()
        .checkpoint_location(dir.path())
        .start(MemorySink::new("t"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnsupportedCheckpointVersion {
                found: 7,
                supported: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("upgrade weir"));
}

#[tokio::test]
async fn a_corrupt_log_entry_is_refused_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let run = || {
        read_stream(RateSource::rows_per_batch(5))
            .write_stream()
            .checkpoint_location(dir.path())
            .stop_after_batch(BatchId(1))
            .start(table.clone())
    };
    run().await.unwrap().await_termination().await.unwrap();
    std::fs::write(dir.path().join("offsets/1"), "{\"version\": 1, \"batch_").unwrap();
    std::fs::remove_file(dir.path().join("commits/1")).unwrap();
    let err = run().await.unwrap_err();
    assert!(
        matches!(&err, Error::CorruptCheckpoint { path, .. } if path == "offsets/1"),
        "{err}"
    );
}

#[tokio::test]
async fn logs_keep_only_the_retained_batches() {
    let dir = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let q = read_stream(RateSource::rows_per_batch(5))
        .write_stream()
        .checkpoint_location(dir.path())
        .retain_batches(3)
        .stop_after_batch(BatchId(9))
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let chk = Checkpoint::open_local(dir.path()).unwrap();
    assert_eq!(
        chk.offsets().batch_ids().await.unwrap(),
        vec![BatchId(7), BatchId(8), BatchId(9)]
    );
    assert_eq!(
        chk.commits().batch_ids().await.unwrap(),
        vec![BatchId(7), BatchId(8), BatchId(9)]
    );
    let status = chk.status().await.unwrap();
    assert_eq!(
        (status.last_planned, status.last_committed),
        (Some(BatchId(9)), Some(BatchId(9)))
    );
    assert_eq!(
        status.latest_offsets.unwrap().offset_of("rate"),
        Some(&Offset(serde_json::json!({"next_event_id": 50})))
    );
    assert_eq!(status.metadata.unwrap().query_id, q.id());
}

#[tokio::test]
async fn the_query_name_is_kept_with_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap().keep();
    let chk_dir = dir.join("payments-bronze");
    let table = MemorySink::new("t");
    let q = read_stream(RateSource::rows_per_batch(5))
        .write_stream()
        .checkpoint_location(&chk_dir)
        .trigger(Trigger::once())
        .start(table.clone())
        .await
        .unwrap();
    assert_eq!(
        q.name().as_str(),
        "payments-bronze",
        "named after the checkpoint directory"
    );
    q.await_termination().await.unwrap();
    let err = read_stream(RateSource::rows_per_batch(5))
        .write_stream()
        .checkpoint_location(&chk_dir)
        .query_name("other")
        .start(table.clone())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::QueryNameChanged { .. }), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}
