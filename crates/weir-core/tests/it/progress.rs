//! Progress events and transformations.

use std::sync::{Arc, Mutex};

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use weir_core::prelude::*;
use weir_test_support::{assert_exactly_once, event_ids};

#[tokio::test]
async fn each_batch_reports_its_progress() {
    let chk = tempfile::tempdir().unwrap();
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink_lines = lines.clone();
    let q = read_stream(RateSource::rows_per_batch(1000))
        .write_stream()
        .checkpoint_location(chk.path())
        .writer_parallelism(2)
        .stop_after_batch(BatchId(2))
        .on_progress(move |p| sink_lines.lock().unwrap().push(p.to_json()))
        .start(MemorySink::new("t"))
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let progress = q.recent_progress();
    assert_eq!(
        progress.iter().map(|p| p.batch_id).collect::<Vec<_>>(),
        vec![BatchId(0), BatchId(1), BatchId(2)]
    );
    let last = q.last_progress().unwrap();
    assert_eq!((last.input_rows, last.output_rows, last.partitions), (1000, 1000, 1));
    assert_eq!(last.sink.version, Some(3));
    assert!(!last.replayed);
    let d = last.durations_ms;
    assert!(
        d.total >= d.commit + d.record && d.plan >= 0.0 && d.read >= 0.0 && d.write >= 0.0,
        "{d:?}"
    );
    assert_eq!(last.sources[0].start_offset.as_ref().unwrap().0["next_event_id"], 2000);

    let lines = lines.lock().unwrap();
    assert_eq!(lines.len(), 3);
    let json: serde_json::Value = serde_json::from_str(&lines[2]).unwrap();
    assert_eq!(json["batch_id"], 2);
    assert_eq!(json["input_rows"], 1000);
    for phase in ["plan", "read", "write", "commit", "record", "total"] {
        assert!(json["durations_ms"][phase].is_number(), "{phase} in {json}");
    }
    assert_eq!(json["query_id"], q.id().to_string());
}

#[tokio::test]
async fn transformations_filter_and_derive_columns() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let q = read_stream(RateSource::rows_per_batch(100).with_total_rows(300))
        .map_batches(|b| {
            // Keep even event ids and add their double.
            let ids = b.column(0).as_primitive::<Int64Type>();
            let keep = arrow_array::BooleanArray::from_iter(ids.iter().map(|v| v.map(|v| v % 2 == 0)));
            let b = arrow_select::filter::filter_record_batch(&b, &keep)?;
            let ids = b.column(0).as_primitive::<Int64Type>();
            let doubled: Int64Array = ids.unary(|v| v * 2);
            let schema = Schema::new(vec![
                Field::new("event_id", DataType::Int64, false),
                Field::new("doubled", DataType::Int64, false),
            ]);
            Ok(RecordBatch::try_new(
                Arc::new(schema),
                vec![b.column(0).clone(), Arc::new(doubled)],
            )?)
        })
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::available_now())
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let ids = event_ids(&table.batches());
    assert_eq!(ids.len(), 150);
    assert!(ids.iter().all(|i| i % 2 == 0));
    let halves: Vec<i64> = ids.iter().map(|i| i / 2).collect();
    assert_exactly_once(&halves, 0..150);
    let last = q.last_progress().unwrap();
    assert_eq!((last.input_rows, last.output_rows), (100, 50));
}

#[tokio::test]
async fn a_transformation_must_keep_its_schema() {
    let chk = tempfile::tempdir().unwrap();
    let q = read_stream(RateSource::rows_per_batch(10))
        .map_batches(|b| if b.num_rows() == 0 { Ok(b) } else { Ok(b.project(&[0])?) })
        .write_stream()
        .checkpoint_location(chk.path())
        .start(MemorySink::new("t"))
        .await
        .unwrap();
    let err = q.await_termination().await.unwrap_err();
    assert!(matches!(err, Error::SchemaMismatch { .. }), "{err}");
    assert_eq!(q.exception(), Some(err.to_string()));
    assert!(!q.is_active());
    let again = q.await_termination().await.unwrap_err();
    assert!(
        matches!(&again, Error::QueryFailed { message, .. } if *message == err.to_string()),
        "{again}"
    );
}
