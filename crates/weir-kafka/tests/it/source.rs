//! The Kafka source on a real broker: exact replay, limits, where a query
//! starts, partitions that come and go, lost records, transactions.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::producer::{BaseRecord, Producer};
use serde_json::json;
use weir_core::crash::{CrashPoint, CrashPoints};
use weir_core::prelude::*;
use weir_core::sink::MemorySink;
use weir_kafka::{IsolationLevel, KafkaSource, PartitionOffsets, StartingOffsets};
use weir_test_support::assert_exactly_once;

use crate::broker::{self, ids, records};

/// What one run of a query did.
struct Run {
    result: weir_core::Result<()>,
    progress: Vec<QueryProgress>,
}

async fn run_with(source: KafkaSource, chk: &Path, sink: &MemorySink, crash: Option<CrashPoints>) -> Run {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = seen.clone();
    let mut writer = read_stream(source)
        .write_stream()
        .checkpoint_location(chk)
        .trigger(Trigger::available_now())
        .on_progress(move |p| keep.lock().unwrap().push(p.clone()));
    if let Some(crash) = crash {
        writer = writer.crash_points(crash);
    }
    let result = match writer.start(sink.clone()).await {
        Ok(q) => q.await_termination().await,
        Err(e) => Err(e),
    };
    let progress = seen.lock().unwrap().clone();
    Run { result, progress }
}

async fn run(source: KafkaSource, chk: &Path, sink: &MemorySink) -> Run {
    run_with(source, chk, sink, None).await
}

fn end_of(p: &QueryProgress) -> PartitionOffsets {
    PartitionOffsets::from_json(&p.sources[0].end_offset.0).expect("kafka offsets")
}

#[tokio::test]
async fn a_crash_at_every_point_replays_the_logged_range_exactly() {
    let Some(kafka) = broker::bootstrap() else { return };
    let topic = broker::topic(&kafka, "replay", 4);
    let producer = broker::producer(&kafka, &[]);
    for p in 0..4 {
        broker::produce(&producer, &topic, p, (p as i64 * 100)..(p as i64 * 100 + 100));
    }
    let chk = tempfile::tempdir().unwrap();
    let sink = MemorySink::new("t");
    let source = || {
        KafkaSource::subscribe(&kafka, [topic.as_str()])
            .starting_offsets(StartingOffsets::Earliest)
            .max_offsets_per_trigger(60)
    };
    let points = [
        CrashPoint::AfterOffsetsWritten,
        CrashPoint::AfterDataWritten,
        CrashPoint::AfterSinkCommit,
        CrashPoint::AfterCommitLog,
    ];
    let mut planned = Vec::new();
    for (i, point) in points.into_iter().enumerate() {
        let crash = CrashPoints::new().fail_at(point, Some(BatchId(i as u64)));
        let r = run_with(source(), chk.path(), &sink, Some(crash)).await;
        let err = r.result.expect_err("the armed crash point fires");
        assert!(err.to_string().contains("injected crash"), "{err}");
        planned.extend(r.progress);
    }
    let r = run(source(), chk.path(), &sink).await;
    r.result.unwrap();
    planned.extend(r.progress);

    let got = records(&sink.batches());
    assert_exactly_once(&got.iter().map(|r| r.0).collect::<Vec<_>>(), 0..400);
    // Every record sits at the offset it was produced at (id = 100 p + offset).
    for (id, partition, offset) in &got {
        assert_eq!(*id, *partition as i64 * 100 + offset);
    }
    // Each batch read exactly its logged range: 60 offsets, then the rest.
    let committed = sink.committed_batches();
    assert_eq!(committed.len(), 7, "400 offsets at 60 a batch: {committed:?}");
    let last = planned.last().unwrap();
    assert_eq!(
        end_of(last),
        PartitionOffsets::from_json(&json!({&topic: {"0": 100, "1": 100, "2": 100, "3": 100}})).unwrap()
    );
    for p in &planned {
        let m = p.sources[0].metrics.as_ref().expect("the source reports what it read");
        assert_eq!(m["records"].as_u64().unwrap(), p.input_rows, "{m}");
        assert!(p.input_rows <= 60);
    }
}

#[tokio::test]
async fn a_limit_is_shared_by_lag_across_skewed_partitions() {
    let Some(kafka) = broker::bootstrap() else { return };
    let topic = broker::topic(&kafka, "skew", 3);
    let producer = broker::producer(&kafka, &[]);
    broker::produce(&producer, &topic, 0, 0..900);
    broker::produce(&producer, &topic, 1, 900..990);
    broker::produce(&producer, &topic, 2, 990..1000);
    let chk = tempfile::tempdir().unwrap();
    let sink = MemorySink::new("t");
    let source = KafkaSource::subscribe(&kafka, [topic.as_str()])
        .starting_offsets(StartingOffsets::Earliest)
        .max_offsets_per_trigger(100);
    let r = run(source, chk.path(), &sink).await;
    r.result.unwrap();
    assert_exactly_once(&ids(&sink.batches()), 0..1000);
    assert_eq!(r.progress.len(), 10);
    assert_eq!(
        end_of(&r.progress[0]).to_json(),
        json!({&topic: {"0": 90, "1": 9, "2": 1}})
    );
    for p in &r.progress {
        assert_eq!(p.input_rows, 100);
        let lags: Vec<i64> = p.sources[0].metrics.as_ref().unwrap()["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|part| part["lag"].as_i64().unwrap())
            .collect();
        assert!(lags.iter().all(|l| *l >= 0), "{lags:?}");
    }
}

#[tokio::test]
async fn latest_is_fixed_on_the_first_start_and_kept_in_the_checkpoint() {
    let Some(kafka) = broker::bootstrap() else { return };
    let topic = broker::topic(&kafka, "latest", 2);
    broker::send(&kafka, &topic, 0, 0..10);
    let chk = tempfile::tempdir().unwrap();
    let sink = MemorySink::new("t");
    let source = || KafkaSource::subscribe(&kafka, [topic.as_str()]);
    let first = run(source(), chk.path(), &sink).await;
    first.result.unwrap();
    assert!(first.progress.is_empty(), "nothing after the start yet");
    broker::send(&kafka, &topic, 0, 10..20);
    broker::send(&kafka, &topic, 1, 20..25);
    let second = run(source(), chk.path(), &sink).await;
    second.result.unwrap();
    assert_exactly_once(&ids(&sink.batches()), 10..25);
}

#[tokio::test]
async fn specific_offsets_start_each_partition_where_they_say() {
    let Some(kafka) = broker::bootstrap() else { return };
    let topic = broker::topic(&kafka, "specific", 3);
    broker::send(&kafka, &topic, 0, 0..10);
    broker::send(&kafka, &topic, 1, 10..20);
    broker::send(&kafka, &topic, 2, 20..30);
    let given = PartitionOffsets::from_json(&json!({&topic: {"0": 5, "1": -2, "2": -1}})).unwrap();
    let chk = tempfile::tempdir().unwrap();
    let sink = MemorySink::new("t");
    let source =
        || KafkaSource::subscribe(&kafka, [topic.as_str()]).starting_offsets(StartingOffsets::Specific(given.clone()));
    run(source(), chk.path(), &sink).await.result.unwrap();
    broker::send(&kafka, &topic, 2, 30..32);
    run(source(), chk.path(), &sink).await.result.unwrap();
    let mut want: Vec<i64> = (5..20).chain(30..32).collect();
    let mut got = ids(&sink.batches());
    got.sort();
    want.sort();
    assert_eq!(got, want);

    // Offsets that leave a partition out, or name one that does not exist.
    let partial = PartitionOffsets::from_json(&json!({&topic: {"0": 0}})).unwrap();
    let err = run(
        KafkaSource::subscribe(&kafka, [topic.as_str()]).starting_offsets(StartingOffsets::Specific(partial)),
        tempfile::tempdir().unwrap().path(),
        &MemorySink::new("u"),
    )
    .await
    .result
    .unwrap_err();
    assert!(err.to_string().contains(&format!("missing {topic}-1")), "{err}");
    let unknown = PartitionOffsets::from_json(&json!({&topic: {"0": 0, "1": 0, "2": 0, "7": 0}})).unwrap();
    let err = run(
        KafkaSource::subscribe(&kafka, [topic.as_str()]).starting_offsets(StartingOffsets::Specific(unknown)),
        tempfile::tempdir().unwrap().path(),
        &MemorySink::new("v"),
    )
    .await
    .result
    .unwrap_err();
    assert!(
        err.to_string().contains(&format!("{topic}-7, which does not exist")),
        "{err}"
    );
}

#[tokio::test]
async fn a_starting_timestamp_begins_at_the_first_record_at_or_after_it() {
    let Some(kafka) = broker::bootstrap() else { return };
    let topic = broker::topic(&kafka, "time", 1);
    let producer = broker::producer(&kafka, &[]);
    let base = 1_700_000_000_000i64;
    for id in 0..10i64 {
        let value = format!("{{\"id\":{id}}}");
        producer
            .send(
                BaseRecord::<(), _>::to(&topic)
                    .partition(0)
                    .payload(&value)
                    .timestamp(base + id * 1000),
            )
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    let chk = tempfile::tempdir().unwrap();
    let sink = MemorySink::new("t");
    let source =
        KafkaSource::subscribe(&kafka, [topic.as_str()]).starting_offsets(StartingOffsets::Timestamp(base + 5500));
    run(source, chk.path(), &sink).await.result.unwrap();
    assert_exactly_once(&ids(&sink.batches()), 6..10);
}

#[tokio::test]
async fn a_partition_added_while_the_query_runs_is_read_from_its_beginning() {
    let Some(kafka) = broker::bootstrap() else { return };
    let topic = broker::topic(&kafka, "grow", 2);
    broker::send(&kafka, &topic, 0, 0..10);
    broker::send(&kafka, &topic, 1, 10..20);
    let chk = tempfile::tempdir().unwrap();
    let sink = MemorySink::new("t");
    let source = || KafkaSource::subscribe(&kafka, [topic.as_str()]).starting_offsets(StartingOffsets::Earliest);
    run(source(), chk.path(), &sink).await.result.unwrap();
    broker::add_partitions(&kafka, &topic, 3).await;
    broker::send(&kafka, &topic, 2, 20..30);
    broker::send(&kafka, &topic, 0, 30..35);
    let r = run(source(), chk.path(), &sink).await;
    r.result.unwrap();
    assert_exactly_once(&ids(&sink.batches()), 0..35);
    assert_eq!(end_of(r.progress.last().unwrap()).get(&topic, 2), Some(10));
}

#[tokio::test]
async fn a_deleted_topic_stops_the_query_unless_loss_is_accepted() {
    let Some(kafka) = broker::bootstrap() else { return };
    let keep = broker::topic(&kafka, "keep", 1);
    let doomed = broker::topic(&kafka, "doomed", 2);
    broker::send(&kafka, &keep, 0, 0..5);
    broker::send(&kafka, &doomed, 1, 5..10);
    let chk = tempfile::tempdir().unwrap();
    let sink = MemorySink::new("t");
    let source =
        || KafkaSource::subscribe(&kafka, [keep.as_str(), doomed.as_str()]).starting_offsets(StartingOffsets::Earliest);
    run(source(), chk.path(), &sink).await.result.unwrap();
    broker::delete_topic(&kafka, &doomed).await;
    broker::send(&kafka, &keep, 0, 10..15);
    // Deletion takes a moment to show in the metadata.
    let mut err = None;
    for _ in 0..50 {
        match run(source(), chk.path(), &sink).await.result {
            Err(e) => {
                err = Some(e);
                break;
            }
            Ok(()) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let err = err.expect("the query stops on the deleted topic");
    let msg = err.to_string();
    assert!(
        msg.contains(&doomed) && msg.contains("fail_on_data_loss(false)"),
        "{msg}"
    );
    assert!(!err.retryable());
    run(source().fail_on_data_loss(false), chk.path(), &sink)
        .await
        .result
        .unwrap();
    assert_exactly_once(&ids(&sink.batches()), 0..15);
}

#[tokio::test]
async fn records_removed_before_they_were_read_stop_the_query_or_are_reported_skipped() {
    let Some(kafka) = broker::bootstrap() else { return };
    let topic = broker::topic(&kafka, "retention", 1);
    broker::send(&kafka, &topic, 0, 0..100);
    let chk = tempfile::tempdir().unwrap();
    let sink = MemorySink::new("t");
    let source = || {
        KafkaSource::subscribe(&kafka, [topic.as_str()])
            .starting_offsets(StartingOffsets::Earliest)
            .max_offsets_per_trigger(20)
    };
    // Batch 0 reads 0..20 and batch 1 is planned (20..40), then retention
    // removes everything before 50.
    let crash = CrashPoints::new().fail_at(CrashPoint::AfterOffsetsWritten, Some(BatchId(1)));
    assert!(run_with(source(), chk.path(), &sink, Some(crash)).await.result.is_err());
    broker::delete_records_before(&kafka, &topic, 0, 50).await;

    let err = run(source(), chk.path(), &sink).await.result.unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("data loss in {topic}-0: offsets 20..40")),
        "{msg}"
    );
    assert!(!err.retryable());
    assert_exactly_once(&ids(&sink.batches()), 0..20);

    let r = run(source().fail_on_data_loss(false), chk.path(), &sink).await;
    r.result.unwrap();
    let mut got = ids(&sink.batches());
    got.sort();
    assert_eq!(got, (0..20).chain(50..100).collect::<Vec<_>>());
    // The replayed batch 1 and batch 2 report what they skipped: 20..50.
    let lost: Vec<(i64, i64)> = r
        .progress
        .iter()
        .flat_map(|p| {
            p.sources[0].metrics.as_ref().unwrap()["lost"]
                .as_array()
                .unwrap()
                .clone()
        })
        .map(|l| (l["from"].as_i64().unwrap(), l["until"].as_i64().unwrap()))
        .collect();
    assert_eq!(lost, vec![(20, 40), (40, 50)]);
}

#[tokio::test]
async fn aborted_transactions_never_land_and_a_batch_ends_past_the_markers() {
    let Some(kafka) = broker::bootstrap() else { return };
    let topic = broker::topic(&kafka, "txn", 2);
    let txn_id = format!("weir-test-{}", uuid::Uuid::new_v4().simple());
    let producer = broker::producer(&kafka, &[("transactional.id", txn_id.as_str())]);
    producer.init_transactions(Duration::from_secs(30)).unwrap();
    let txn = |ids: std::ops::Range<i64>, commit: bool| {
        producer.begin_transaction().unwrap();
        for p in 0..2 {
            broker::produce(&producer, &topic, p, ids.clone().filter(|i| i % 2 == p as i64));
        }
        if commit {
            producer.commit_transaction(Duration::from_secs(30)).unwrap();
        } else {
            producer.abort_transaction(Duration::from_secs(30)).unwrap();
        }
    };
    txn(0..50, true);
    txn(1000..1050, false);
    txn(50..100, true);
    txn(2000..2010, false);

    let chk = tempfile::tempdir().unwrap();
    let sink = MemorySink::new("t");
    let source = KafkaSource::subscribe(&kafka, [topic.as_str()]).starting_offsets(StartingOffsets::Earliest);
    let r = run(source, chk.path(), &sink).await;
    r.result.unwrap();
    assert_exactly_once(&ids(&sink.batches()), 0..100);
    // Each partition: 25 + 25 + 25 + 5 records and 4 markers.
    let end = end_of(r.progress.last().unwrap());
    assert_eq!(end.to_json(), json!({&topic: {"0": 84, "1": 84}}));

    let all = MemorySink::new("u");
    let source = KafkaSource::subscribe(&kafka, [topic.as_str()])
        .starting_offsets(StartingOffsets::Earliest)
        .isolation_level(IsolationLevel::ReadUncommitted);
    run(source, tempfile::tempdir().unwrap().path(), &all)
        .await
        .result
        .unwrap();
    assert_eq!(ids(&all.batches()).len(), 160);
}

#[tokio::test]
async fn json_values_become_typed_columns_and_a_bad_one_names_its_offset() {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::Array;
    use arrow_schema::{DataType, Field, Schema};
    use weir_kafka::{OnBadRecord, ValueColumns};

    let Some(kafka) = broker::bootstrap() else { return };
    let topic = broker::topic(&kafka, "json", 2);
    broker::send(&kafka, &topic, 0, 0..10);
    broker::send(&kafka, &topic, 1, 10..20);
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let source = |on_bad: OnBadRecord| {
        KafkaSource::subscribe(&kafka, [topic.as_str()])
            .starting_offsets(StartingOffsets::Earliest)
            .value_columns(
                ValueColumns::json(schema.clone())
                    .keep_columns(["partition", "offset"])
                    .on_bad_record(on_bad),
            )
            .unwrap()
    };
    let chk = tempfile::tempdir().unwrap();
    let sink = MemorySink::new("t");
    run(source(OnBadRecord::Fail), chk.path(), &sink).await.result.unwrap();
    let ids: Vec<i64> = sink
        .batches()
        .iter()
        .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
        .collect();
    assert_exactly_once(&ids, 0..20);

    let producer = broker::producer(&kafka, &[]);
    producer
        .send(
            BaseRecord::<(), _>::to(&topic)
                .partition(1)
                .payload("{\"id\": \"twenty\"}"),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(Duration::from_secs(30)).unwrap();
    broker::send(&kafka, &topic, 1, 21..22);
    let err = run(source(OnBadRecord::Fail), chk.path(), &sink)
        .await
        .result
        .unwrap_err();
    assert!(
        err.to_string().contains(&format!("{topic}-1 offset 10 does not parse")),
        "{err}"
    );
    assert_eq!(sink.row_count(), 20, "nothing of the failed batch landed");

    run(
        source(OnBadRecord::DeadLetterColumn("corrupt".into())),
        chk.path(),
        &sink,
    )
    .await
    .result
    .unwrap();
    let last = sink.batches().last().unwrap().clone();
    let corrupt = last.column_by_name("corrupt").unwrap().as_binary::<i32>();
    assert_eq!(last.num_rows(), 2);
    assert_eq!(corrupt.value(0), b"{\"id\": \"twenty\"}");
    assert!(corrupt.is_null(1));
}

#[tokio::test]
async fn a_pattern_picks_up_topics_created_later_and_offsets_reach_the_group() {
    use rdkafka::consumer::{BaseConsumer, Consumer};

    let Some(kafka) = broker::bootstrap() else { return };
    let prefix = format!("pat{}", uuid::Uuid::new_v4().simple());
    let first = broker::topic(&kafka, &format!("{prefix}-a"), 1);
    broker::send(&kafka, &first, 0, 0..10);
    let group = format!("weir-test-{prefix}");
    let source = || {
        KafkaSource::subscribe_pattern(&kafka, &format!("{prefix}-.*"))
            .unwrap()
            .starting_offsets(StartingOffsets::Earliest)
            .commit_offsets_to_group(&group)
    };
    let chk = tempfile::tempdir().unwrap();
    let sink = MemorySink::new("t");
    run(source(), chk.path(), &sink).await.result.unwrap();
    let second = broker::topic(&kafka, &format!("{prefix}-b"), 2);
    broker::send(&kafka, &second, 1, 10..20);
    let other = broker::topic(&kafka, &format!("x{prefix}-c"), 1);
    broker::send(&kafka, &other, 0, 100..110);
    run(source(), chk.path(), &sink).await.result.unwrap();
    assert_exactly_once(&ids(&sink.batches()), 0..20);

    // The group holds the end of the last batch, for lag monitors.
    let reader: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &kafka)
        .set("group.id", &group)
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition(&first, 0);
    tpl.add_partition(&second, 1);
    let committed = reader.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    let at = |t: &str, p: i32| committed.find_partition(t, p).unwrap().offset();
    assert_eq!(at(&first, 0), rdkafka::Offset::Offset(10));
    assert_eq!(at(&second, 1), rdkafka::Offset::Offset(10));
}

#[tokio::test]
async fn avro_values_in_confluents_wire_format_become_typed_columns() {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    use arrow_array::Array;
    use weir_kafka::{AvroFraming, OnBadRecord, ValueColumns};

    let Some(kafka) = broker::bootstrap() else { return };
    let topic = broker::topic(&kafka, "avro", 1);
    let schema = r#"{"type": "record", "name": "Payment", "fields": [{"name": "event_id", "type": "long"}]}"#;
    let avro = apache_avro::Schema::parse_str(schema).unwrap();
    let producer = broker::producer(&kafka, &[]);
    for id in 0..20i64 {
        let mut record = apache_avro::types::Record::new(&avro).unwrap();
        record.put("event_id", id);
        let datum = apache_avro::to_avro_datum(&avro, record).unwrap();
        let framed = [&[0u8][..], &42u32.to_be_bytes(), &datum].concat();
        producer
            .send(BaseRecord::<(), _>::to(&topic).partition(0).payload(&framed))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    producer
        .send(BaseRecord::<(), _>::to(&topic).partition(0).payload("not avro"))
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(Duration::from_secs(30)).unwrap();
    let values = ValueColumns::avro(schema, AvroFraming::Confluent { schema_id: 42 })
        .unwrap()
        .keep_columns(["offset"])
        .on_bad_record(OnBadRecord::DeadLetterColumn("corrupt".into()));
    let source = KafkaSource::subscribe(&kafka, [topic.as_str()])
        .starting_offsets(StartingOffsets::Earliest)
        .value_columns(values)
        .unwrap();
    let sink = MemorySink::new("t");
    run(source, tempfile::tempdir().unwrap().path(), &sink)
        .await
        .result
        .unwrap();
    let batches = sink.batches();
    let ids: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            let c = b.column(0).as_primitive::<Int64Type>();
            (0..c.len())
                .filter(|i| c.is_valid(*i))
                .map(|i| c.value(i))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_exactly_once(&ids, 0..20);
    let corrupt: Vec<&[u8]> = batches
        .iter()
        .flat_map(|b| {
            let c = b.column_by_name("corrupt").unwrap().as_binary::<i32>();
            (0..c.len())
                .filter(|i| c.is_valid(*i))
                .map(|i| c.value(i))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(corrupt, vec![&b"not avro"[..]]);
}
