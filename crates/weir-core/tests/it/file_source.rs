//! The file source: formats, replay of the same files, bad files.

use std::path::Path;
use std::sync::Arc;

use arrow_array::RecordBatch;
use parquet::arrow::ArrowWriter;
use weir_core::crash::{CrashPoint, CrashPoints};
use weir_core::prelude::*;
use weir_test_support::{assert_exactly_once, event_ids};

use crate::common::{rows, schema};

fn write_json(dir: &Path, name: &str, ids: std::ops::Range<i64>) {
    let lines: String = ids
        .map(|i| format!("{{\"event_id\": {i}, \"name\": \"n{i}\"}}\n"))
        .collect();
    std::fs::write(dir.join(name), lines).unwrap();
}

fn write_csv(dir: &Path, name: &str, ids: std::ops::Range<i64>) {
    let mut text = String::from("event_id,name\n");
    for i in ids {
        text.push_str(&format!("{i},n{i}\n"));
    }
    std::fs::write(dir.join(name), text).unwrap();
}

fn write_parquet(dir: &Path, name: &str, ids: std::ops::Range<i64>) {
    let file = std::fs::File::create(dir.join(name)).unwrap();
    let mut w = ArrowWriter::try_new(file, schema(), None).unwrap();
    w.write(&rows(ids)).unwrap();
    w.close().unwrap();
}

fn files_query(input: &Path, chk: &Path, format: FileFormat) -> StreamWriter {
    read_stream(FileSource::new(input, format, schema()).with_max_files_per_trigger(2))
        .write_stream()
        .checkpoint_location(chk)
        .trigger(Trigger::available_now())
}

async fn run(writer: StreamWriter, table: &MemorySink) -> Result<()> {
    writer.start(table.clone()).await?.await_termination().await
}

#[tokio::test]
async fn every_format_is_read_once_across_runs() {
    for (format, write) in [
        (
            FileFormat::JsonLines,
            write_json as fn(&Path, &str, std::ops::Range<i64>),
        ),
        (FileFormat::Csv, write_csv),
        (FileFormat::Parquet, write_parquet),
    ] {
        let (input, chk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let table = MemorySink::new("t");
        for i in 0..5 {
            write(input.path(), &format!("part-{i}"), i * 10..i * 10 + 10);
        }
        std::fs::write(input.path().join(".part-9.tmp"), "half a file").unwrap();
        run(files_query(input.path(), chk.path(), format), &table)
            .await
            .unwrap();
        assert_eq!(
            table.committed_batches().len(),
            3,
            "{format:?}: five files, two per batch"
        );
        assert_exactly_once(&event_ids(&table.batches()), 0..50);

        write(input.path(), "part-5", 50..60);
        run(files_query(input.path(), chk.path(), format), &table)
            .await
            .unwrap();
        assert_exactly_once(&event_ids(&table.batches()), 0..60);
        for batch in table.batches() {
            for i in 0..batch.num_rows() {
                let row = Row::new(&batch, i);
                let id = row.get_i64("event_id").unwrap();
                assert_eq!(
                    row.get_str("name"),
                    Some(format!("n{id}").as_str()),
                    "{format:?}: row contents"
                );
            }
        }
    }
}

#[tokio::test]
async fn a_replayed_batch_reads_exactly_its_files() {
    let (input, chk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let table = MemorySink::new("t");
    write_json(input.path(), "a", 0..10);
    let crash = CrashPoints::new().fail_at(CrashPoint::AfterDataWritten, Some(BatchId(0)));
    let err = run(
        files_query(input.path(), chk.path(), FileFormat::JsonLines).crash_points(crash),
        &table,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::InjectedCrash { .. }));

    // New files arrive before the restart; batch 0 still reads only "a".
    write_json(input.path(), "b", 10..20);
    write_json(input.path(), "c", 20..30);
    let q = files_query(input.path(), chk.path(), FileFormat::JsonLines)
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let progress = q.recent_progress();
    assert_eq!(progress[0].batch_id, BatchId(0));
    assert!(progress[0].replayed);
    assert_eq!(progress[0].input_rows, 10, "the replay read only its own file");
    assert_exactly_once(&event_ids(&table.batches()), 0..30);
}

#[tokio::test]
async fn a_bad_file_fails_the_batch_and_names_the_file() {
    let (input, chk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let table = MemorySink::new("t");
    write_json(input.path(), "good", 0..10);
    std::fs::write(input.path().join("bad"), "{\"event_id\": \"not a number\"}\n").unwrap();
    let err = run(files_query(input.path(), chk.path(), FileFormat::JsonLines), &table)
        .await
        .unwrap_err();
    match &err {
        Error::SourceFile { path, reason } => {
            assert!(path.ends_with("bad"), "{err}");
            assert!(reason.contains("parse"), "{err}");
        }
        other => panic!("expected a SourceFile error, got {other}"),
    }
    assert_eq!(table.row_count(), 0, "nothing of the failed batch is committed");
    assert_eq!(table.staged_count(), 0, "the failed batch's writers were aborted");

    // A planned file must keep its size: a replay would read other rows.
    write_json(input.path(), "bad", 10..20);
    let err = run(files_query(input.path(), chk.path(), FileFormat::JsonLines), &table)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("bytes when its batch was planned"), "{err}");
    assert_eq!(table.row_count(), 0);

    // Restoring a readable file of the planned size lets the batch through.
    let fixed = "{\"event_id\":10,\"name\":\"n10\"}\n";
    assert_eq!(fixed.len(), 29, "the size of the bad file");
    std::fs::write(input.path().join("bad"), fixed).unwrap();
    run(files_query(input.path(), chk.path(), FileFormat::JsonLines), &table)
        .await
        .unwrap();
    assert_exactly_once(&event_ids(&table.batches()), 0..11);
}

#[tokio::test]
async fn parquet_columns_are_matched_by_name() {
    let (input, chk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let reordered = Arc::new(arrow_schema::Schema::new(vec![
        arrow_schema::Field::new("name", arrow_schema::DataType::Utf8, true),
        arrow_schema::Field::new("extra", arrow_schema::DataType::Int64, false),
        arrow_schema::Field::new("event_id", arrow_schema::DataType::Int64, false),
    ]));
    let batch = RecordBatch::try_new(
        reordered.clone(),
        vec![
            Arc::new(arrow_array::StringArray::from(vec!["x", "y"])),
            Arc::new(arrow_array::Int64Array::from(vec![7, 8])),
            Arc::new(arrow_array::Int64Array::from(vec![1, 2])),
        ],
    )
    .unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(input.path().join("p")).unwrap(), reordered, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let table = MemorySink::new("t");
    run(files_query(input.path(), chk.path(), FileFormat::Parquet), &table)
        .await
        .unwrap();
    assert_eq!(table.batches()[0].schema(), schema());
    assert_exactly_once(&event_ids(&table.batches()), 1..3);
}

#[tokio::test]
async fn a_file_log_entry_of_a_newer_format_is_refused_by_name() {
    let (input, chk) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let table = MemorySink::new("t");
    write_json(input.path(), "a", 0..10);
    run(files_query(input.path(), chk.path(), FileFormat::JsonLines), &table)
        .await
        .unwrap();
    let entry = chk.path().join("sources/files/0");
    let text = std::fs::read_to_string(&entry).unwrap();
    assert!(text.starts_with("{\"version\":1,"), "{text}");
    std::fs::write(&entry, text.replacen("\"version\":1", "\"version\":9", 1)).unwrap();
    let err = run(files_query(input.path(), chk.path(), FileFormat::JsonLines), &table)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnsupportedCheckpointVersion { path, found: 9, .. } if path == "sources/files/0"),
        "{err}"
    );
    assert_exactly_once(&event_ids(&table.batches()), 0..10);
}
