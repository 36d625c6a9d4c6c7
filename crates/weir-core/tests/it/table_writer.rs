//! Idempotent table writes by (application id, version).

use arrow_array::RecordBatch;
use weir_core::prelude::*;
use weir_core::protocol::Refusal;
use weir_core::sink::{ConsoleSink, TableWriter, WriteOutcome};
use weir_test_support::event_ids;

use crate::common::{rows, schema};

/// One version's rows: event ids `from..to`.
fn ids(from: i64, to: i64) -> Vec<RecordBatch> {
    vec![rows(from..to)]
}

/// The event ids the table holds, sorted.
fn held(sink: &MemorySink) -> Vec<i64> {
    let mut all = event_ids(&sink.batches());
    all.sort_unstable();
    all
}

#[tokio::test]
async fn a_version_lands_once_and_an_older_version_is_refused_or_skipped() {
    let table = MemorySink::new("t");
    let writer = TableWriter::new(table.clone(), "fanout").unwrap();
    assert_eq!(writer.last_version().await.unwrap(), None);
    assert!(matches!(
        writer.write(ids(0, 3), BatchId(0)).await.unwrap(),
        WriteOutcome::Written { .. }
    ));
    // The same version again, and an older one, write nothing.
    assert_eq!(
        writer.write(ids(0, 3), BatchId(0)).await.unwrap(),
        WriteOutcome::Skipped { committed: BatchId(0) }
    );
    assert!(matches!(
        writer.write(ids(3, 5), BatchId(5)).await.unwrap(),
        WriteOutcome::Written { .. }
    ));
    // An older version means the versions went back: refused, nothing
    // written, unless the writer skips older versions.
    let err = writer.write(ids(100, 101), BatchId(2)).await.unwrap_err();
    assert!(
        matches!(
            err.refusal(),
            Some(Refusal::VersionBehind {
                version: BatchId(2),
                committed: BatchId(5),
                ..
            })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("skip_older_versions"), "{err}");
    let skipping = TableWriter::new(table.clone(), "fanout").unwrap().skip_older_versions();
    assert_eq!(
        skipping.write(ids(100, 101), BatchId(2)).await.unwrap(),
        WriteOutcome::Skipped { committed: BatchId(5) }
    );
    // A second writer under the same id (another process) knows the versions.
    let again = TableWriter::new(table.clone(), "fanout").unwrap();
    assert_eq!(again.last_version().await.unwrap(), Some(BatchId(5)));
    assert_eq!(
        again.write(ids(3, 5), BatchId(5)).await.unwrap(),
        WriteOutcome::Skipped { committed: BatchId(5) }
    );
    assert_eq!(held(&table), vec![0, 1, 2, 3, 4]);
    // Another application id has versions of its own.
    let other = TableWriter::new(table.clone(), "fanout-2").unwrap();
    assert!(matches!(
        other.write(ids(7, 8), BatchId(0)).await.unwrap(),
        WriteOutcome::Written { .. }
    ));
    assert_eq!(held(&table), vec![0, 1, 2, 3, 4, 7]);
    // An append of no rows writes and records nothing.
    assert_eq!(other.write(Vec::new(), BatchId(1)).await.unwrap(), WriteOutcome::Empty);
    assert_eq!(other.last_version().await.unwrap(), Some(BatchId(0)));
    assert_eq!(held(&table), vec![0, 1, 2, 3, 4, 7]);
}

#[tokio::test]
async fn an_overwrite_replaces_the_rows_and_one_of_no_rows_empties_the_table() {
    let table = MemorySink::new("t");
    let schema = schema();
    let writer = TableWriter::new(table.clone(), "latest").unwrap().overwrite();
    // No rows and no schema: refused, nothing written.
    let err = writer.write(Vec::new(), BatchId(0)).await.unwrap_err();
    assert!(err.to_string().contains("with_schema"), "{err}");
    writer.write(ids(0, 3), BatchId(0)).await.unwrap();
    writer.write(ids(10, 12), BatchId(1)).await.unwrap();
    assert_eq!(held(&table), vec![10, 11]);
    // A writer started again knows the schema it was given.
    let again = TableWriter::new(table.clone(), "latest")
        .unwrap()
        .overwrite()
        .with_schema(schema);
    assert!(matches!(
        again.write(Vec::new(), BatchId(2)).await.unwrap(),
        WriteOutcome::Written { .. }
    ));
    assert_eq!(held(&table), Vec::<i64>::new());
    assert_eq!(again.last_version().await.unwrap(), Some(BatchId(2)));
}

#[tokio::test]
async fn what_cannot_be_written_once_is_refused_before_anything_is_written() {
    let err = TableWriter::new(ConsoleSink::new(), "fanout").unwrap_err();
    assert!(err.to_string().contains("keeps no marker"), "{err}");
    let err = TableWriter::new(MemorySink::new("t"), "not a name!").unwrap_err();
    assert!(err.to_string().contains("not a name!"), "{err}");
    let table = MemorySink::new("t");
    let writer = TableWriter::new(table.clone(), "fanout").unwrap();
    assert_eq!(writer.write(Vec::new(), BatchId(0)).await.unwrap(), WriteOutcome::Empty);
    assert!(table.batches().is_empty());
}

/// A streaming query and a writer cannot share a name: the writer's
/// version would be taken for the query's batch.
#[tokio::test]
async fn a_name_a_streaming_query_writes_under_is_refused() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let input = MemoryStream::new(schema());
    input.add_batch(rows(0..2)).unwrap();
    let q = read_stream(input.clone())
        .write_stream()
        .query_name("payments")
        .checkpoint_location(chk.path())
        .trigger(Trigger::available_now())
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let writer = TableWriter::new(table.clone(), "payments").unwrap();
    let err = writer.write(ids(5, 6), BatchId(3)).await.unwrap_err();
    assert!(err.to_string().contains("payments"), "{err}");
    assert_eq!(held(&table), vec![0, 1]);
}
