//! The Kafka sink on a real broker: at least once, duplicates only from the
//! replayed batch; exactly once for read_committed consumers through a crash
//! at every point; a second run of a query fences the first.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use rdkafka::producer::Producer as _;
use weir_core::crash::{CrashPoint, CrashPoints};
use weir_core::prelude::*;
use weir_kafka::{Guarantee, KafkaSink};
use weir_test_support::assert_exactly_once;
use weir_test_support::kafka::Record;

use crate::broker;

/// Rate rows as `key` `k<id>` and `value` `{"id": <id>}`.
fn as_records(batch: RecordBatch) -> Result<RecordBatch, BoxError> {
    let ids = batch.column(0).as_primitive::<Int64Type>();
    let keys: StringArray = ids.values().iter().map(|i| Some(format!("k{i}"))).collect();
    let values: StringArray = ids.values().iter().map(|i| Some(format!("{{\"id\":{i}}}"))).collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("key", DataType::Utf8, true),
        Field::new("value", DataType::Utf8, true),
    ]));
    Ok(RecordBatch::try_new(schema, vec![Arc::new(keys), Arc::new(values)]).unwrap())
}

/// A query name of its own: the transactional id derives from it, and the
/// tests run at once.
fn query_name() -> String {
    format!("alerts-{}", uuid::Uuid::new_v4().simple())
}

async fn run(sink: KafkaSink, name: &str, chk: &Path, crash: Option<CrashPoints>) -> weir_core::Result<()> {
    let source = RateSource::rows_per_batch(100).with_total_rows(1000);
    let mut writer = read_stream(source)
        .map_batches(as_records)
        .write_stream()
        .query_name(name)
        .checkpoint_location(chk)
        .trigger(Trigger::available_now());
    if let Some(crash) = crash {
        writer = writer.crash_points(crash);
    }
    writer.start(sink).await?.await_termination().await
}

fn ids(records: &[Record]) -> Vec<i64> {
    records
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_str(&r.value).unwrap();
            let id = v["id"].as_i64().unwrap();
            assert_eq!(r.key.as_deref(), Some(format!("k{id}").as_str()));
            id
        })
        .collect()
}

fn counts(ids: &[i64]) -> BTreeMap<i64, usize> {
    let mut c = BTreeMap::new();
    for id in ids {
        *c.entry(*id).or_default() += 1;
    }
    c
}

#[tokio::test]
async fn at_least_once_repeats_only_the_batch_running_at_a_crash() {
    let Some(kafka) = broker::bootstrap() else { return };
    let topic = broker::topic(&kafka, "alo", 2);
    let chk = tempfile::tempdir().unwrap();
    let sink = || KafkaSink::new(&kafka).topic(&topic);
    let name = query_name();
    let crash = CrashPoints::new().fail_at(CrashPoint::AfterDataWritten, Some(BatchId(3)));
    assert!(run(sink(), &name, chk.path(), Some(crash)).await.is_err());
    run(sink(), &name, chk.path(), None).await.unwrap();
    let got = ids(&broker::read_all(&kafka, &topic, "read_committed"));
    let twice: Vec<i64> = counts(&got)
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(id, _)| id)
        .collect();
    // Batch 3 (ids 300..400) was written, not recorded, and written again.
    assert_eq!(twice, (300..400).collect::<Vec<_>>());
    assert_eq!(got.len(), 1100);
    let mut once = got.clone();
    once.sort();
    once.dedup();
    assert_exactly_once(&once, 0..1000);
}

#[tokio::test]
async fn exactly_once_holds_for_read_committed_consumers_through_a_crash_at_every_point() {
    let Some(kafka) = broker::bootstrap() else { return };
    let topic = broker::topic(&kafka, "eos", 3);
    let markers = format!("markers-{}", uuid::Uuid::new_v4().simple());
    let chk = tempfile::tempdir().unwrap();
    let sink = || {
        KafkaSink::new(&kafka).topic(&topic).guarantee(Guarantee::ExactlyOnce {
            marker_topic: markers.clone(),
        })
    };
    let points = [
        CrashPoint::AfterOffsetsWritten,
        CrashPoint::AfterDataWritten,
        CrashPoint::AfterSinkCommit,
        CrashPoint::AfterCommitLog,
    ];
    let name = query_name();
    for (i, point) in points.into_iter().enumerate() {
        let crash = CrashPoints::new().fail_at(point, Some(BatchId(2 * i as u64 + 1)));
        let err = run(sink(), &name, chk.path(), Some(crash)).await.unwrap_err();
        assert!(err.to_string().contains("injected crash"), "{err}");
    }
    run(sink(), &name, chk.path(), None).await.unwrap();
    assert_exactly_once(&ids(&broker::read_all(&kafka, &topic, "read_committed")), 0..1000);
    // The crash after the data was written left an aborted transaction:
    // a read_uncommitted consumer sees its records twice.
    let all = ids(&broker::read_all(&kafka, &topic, "read_uncommitted"));
    let twice: Vec<i64> = counts(&all)
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(id, _)| id)
        .collect();
    assert_eq!(twice, (300..400).collect::<Vec<_>>());
    // One marker per committed batch, in their transactions.
    let marks = broker::read_all(&kafka, &markers, "read_committed");
    assert_eq!(marks.len(), 10, "{marks:?}");
    assert!(marks.iter().all(|m| m.key.as_deref() == Some(name.as_str())));
}

/// Queries share the marker topic. Another query's transaction, opened
/// (as its commit began) before this query's later markers, hides them
/// from read_committed readers until it ends: a restart waits for it
/// rather than miss the marker of a batch the sink committed and the
/// checkpoint did not record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marker_behind_another_querys_open_transaction_is_waited_for() {
    let Some(kafka) = broker::bootstrap() else { return };
    let topic = broker::topic(&kafka, "shared", 2);
    let markers = broker::topic(&kafka, "markers", 1);
    let chk = tempfile::tempdir().unwrap();
    let sink = || {
        KafkaSink::new(&kafka).topic(&topic).guarantee(Guarantee::ExactlyOnce {
            marker_topic: markers.clone(),
        })
    };
    let other = Arc::new(broker::producer(
        &kafka,
        &[("transactional.id", &format!("other-{}", uuid::Uuid::new_v4().simple()))],
    ));
    other.init_transactions(Duration::from_secs(30)).unwrap();

    // After this query's batch 2, the other query's marker goes out in a
    // transaction it keeps open; this query commits batch 5 in the sink
    // and stops before recording it.
    let name = query_name();
    let (opener, marker_topic) = (other.clone(), markers.clone());
    let q = read_stream(RateSource::rows_per_batch(100).with_total_rows(1000))
        .map_batches(as_records)
        .write_stream()
        .query_name(&name)
        .checkpoint_location(chk.path())
        .trigger(Trigger::available_now())
        .crash_points(CrashPoints::new().fail_at(CrashPoint::AfterSinkCommit, Some(BatchId(5))))
        .on_progress(move |p| {
            if p.batch_id == BatchId(2) {
                opener.begin_transaction().unwrap();
                let record = rdkafka::producer::BaseRecord::to(&marker_topic)
                    .partition(0)
                    .key("other-query")
                    .payload("{}");
                weir_test_support::kafka::send(&opener, record);
                weir_test_support::kafka::flush(&opener);
            }
        })
        .start(sink())
        .await
        .unwrap();
    let err = q.await_termination().await.unwrap_err();
    assert!(err.to_string().contains("injected crash"), "{err}");

    // It starts again while the other transaction is still open; that one
    // ends two seconds later.
    let ended = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        other.commit_transaction(Duration::from_secs(30)).unwrap();
    });
    run(sink(), &name, chk.path(), None).await.unwrap();
    ended.join().unwrap();
    assert_exactly_once(&ids(&broker::read_all(&kafka, &topic, "read_committed")), 0..1000);
    let marks = broker::read_all(&kafka, &markers, "read_committed");
    assert_eq!(
        marks.iter().filter(|m| m.key.as_deref() == Some(name.as_str())).count(),
        10
    );
}

#[tokio::test]
async fn a_second_run_of_the_query_fences_the_first() {
    let Some(kafka) = broker::bootstrap() else { return };
    let topic = broker::topic(&kafka, "fence", 1);
    let markers = format!("markers-{}", uuid::Uuid::new_v4().simple());
    let sink = || {
        KafkaSink::new(&kafka).topic(&topic).guarantee(Guarantee::ExactlyOnce {
            marker_topic: markers.clone(),
        })
    };
    let name = query_name();
    let start = |chk: &Path, every: Duration| {
        read_stream(RateSource::rows_per_batch(10))
            .map_batches(as_records)
            .write_stream()
            .query_name(&name)
            .checkpoint_location(chk)
            .trigger(Trigger::processing_time(every))
            .start(sink())
    };
    let chk = tempfile::tempdir().unwrap();
    // The first run commits batch 0, then waits three seconds.
    let first = start(chk.path(), Duration::from_secs(3)).await.unwrap();
    for _ in 0..100 {
        if first.last_progress().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(first.is_active() && first.last_progress().is_some());
    // A copy of its checkpoint: the same query id, another lease.
    let copy = tempfile::tempdir().unwrap();
    weir_test_support::copy_dir(chk.path(), copy.path());
    let second = start(copy.path(), Duration::from_millis(50)).await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(30), first.await_termination())
        .await
        .expect("the first run stops")
        .unwrap_err();
    assert!(err.to_string().contains("fenced"), "{err}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(second.is_active(), "{:?}", second.exception());
    second.stop_and_wait().await.unwrap();
    // The first committed batch 0 before it was fenced, the second batches
    // 1 to its last: read_committed, each of their ids once.
    let last = second.last_progress().expect("the second run committed").batch_id.0 as i64;
    let got = ids(&broker::read_all(&kafka, &topic, "read_committed"));
    assert_exactly_once(&got, 0..(last + 1) * 10);
}

/// Invariants I4 and I4b against the marker topic: an old copy of the
/// checkpoint (the sink holds batches it never planned) and a new
/// checkpoint under the same query name are both refused, and neither adds
/// a row.
#[tokio::test]
async fn an_old_copy_and_a_new_checkpoint_of_the_query_are_refused_by_its_marker() {
    let Some(kafka) = broker::bootstrap() else { return };
    let topic = broker::topic(&kafka, "guards", 1);
    let markers = format!("markers-{}", uuid::Uuid::new_v4().simple());
    let name = query_name();
    let sink = || {
        KafkaSink::new(&kafka).topic(&topic).guarantee(Guarantee::ExactlyOnce {
            marker_topic: markers.clone(),
        })
    };
    let run = |chk: std::path::PathBuf, last: Option<BatchId>| {
        let mut writer = read_stream(RateSource::rows_per_batch(100).with_total_rows(300))
            .map_batches(as_records)
            .write_stream()
            .query_name(&name)
            .checkpoint_location(chk)
            .trigger(Trigger::available_now());
        if let Some(last) = last {
            writer = writer.stop_after_batch(last);
        }
        let sink = sink();
        async move { writer.start(sink).await?.await_termination().await }
    };
    let chk = tempfile::tempdir().unwrap();
    run(chk.path().into(), Some(BatchId(0))).await.unwrap();
    let old = tempfile::tempdir().unwrap();
    weir_test_support::copy_dir(chk.path(), old.path());
    run(chk.path().into(), None).await.unwrap();
    assert_exactly_once(&ids(&broker::read_all(&kafka, &topic, "read_committed")), 0..300);

    let err = run(old.path().into(), None).await.unwrap_err().to_string();
    assert!(err.contains("holds batch 2") && err.contains("old copy"), "{err}");
    let fresh = tempfile::tempdir().unwrap();
    let err = run(fresh.path().into(), None).await.unwrap_err().to_string();
    assert!(err.contains("already has output"), "{err}");
    assert_exactly_once(&ids(&broker::read_all(&kafka, &topic, "read_uncommitted")), 0..300);
}

#[tokio::test]
async fn rows_without_a_value_or_a_topic_are_refused_before_anything_is_sent() {
    let Some(kafka) = broker::bootstrap() else { return };
    let chk = tempfile::tempdir().unwrap();
    let err = read_stream(RateSource::rows_per_batch(10))
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::once())
        .start(KafkaSink::new(&kafka).topic("t"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("there is no column value"), "{err}");
    let err = read_stream(RateSource::rows_per_batch(10))
        .map_batches(as_records)
        .write_stream()
        .checkpoint_location(tempfile::tempdir().unwrap().path())
        .trigger(Trigger::once())
        .start(KafkaSink::new(&kafka))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no topic"), "{err}");
}

#[tokio::test]
async fn topic_partition_and_headers_columns_route_each_record() {
    use arrow_array::builder::{BinaryBuilder, ListBuilder, StringBuilder, StructBuilder};
    use arrow_array::Int32Array;
    use arrow_schema::Fields;

    let Some(kafka) = broker::bootstrap() else { return };
    let (a, b) = (broker::topic(&kafka, "route-a", 2), broker::topic(&kafka, "route-b", 2));
    let header_fields = Fields::from(vec![
        Field::new("key", DataType::Utf8, false),
        Field::new("value", DataType::Binary, true),
    ]);
    let mut headers = ListBuilder::new(StructBuilder::from_fields(header_fields.clone(), 0));
    for i in 0..4 {
        let entry = headers.values();
        entry.field_builder::<StringBuilder>(0).unwrap().append_value("trace");
        entry
            .field_builder::<BinaryBuilder>(1)
            .unwrap()
            .append_value(format!("t{i}"));
        entry.append(true);
        headers.append(true);
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("value", DataType::Utf8, false),
        Field::new("topic", DataType::Utf8, false),
        Field::new("partition", DataType::Int32, true),
        Field::new(
            "headers",
            DataType::List(Arc::new(Field::new("item", DataType::Struct(header_fields), true))),
            true,
        ),
    ]));
    let rows = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from(vec!["v0", "v1", "v2", "v3"])),
            Arc::new(StringArray::from(vec![a.as_str(), a.as_str(), b.as_str(), b.as_str()])),
            Arc::new(Int32Array::from(vec![Some(1), Some(0), Some(1), None])),
            Arc::new(headers.finish()),
        ],
    )
    .unwrap();
    let chk = tempfile::tempdir().unwrap();
    let input = weir_core::source::MemoryStream::new(rows.schema());
    input.add_batch(rows).unwrap();
    read_stream(input)
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::once())
        .start(KafkaSink::new(&kafka))
        .await
        .unwrap()
        .await_termination()
        .await
        .unwrap();

    // Read back by a plain consumer: each value in its topic and partition,
    // with its header.
    let mut seen: Vec<Record> = [&a, &b]
        .into_iter()
        .flat_map(|topic| broker::read_all(&kafka, topic, "read_committed"))
        .collect();
    seen.sort_by(|x, y| x.value.cmp(&y.value));
    let record = |topic: &str, partition: i32, i: u8| Record {
        topic: topic.to_string(),
        partition,
        key: None,
        value: format!("v{i}"),
        headers: vec![("trace".to_string(), Some(format!("t{i}").into_bytes()))],
    };
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(seen[0], record(&a, 1, 0));
    assert_eq!(seen[1], record(&a, 0, 1));
    assert_eq!(seen[2], record(&b, 1, 2));
    // No partition given: the partitioner chose one.
    assert_eq!(seen[3], record(&b, seen[3].partition, 3));
}
