//! Stateful queries: output-mode rules, state kept exactly once in the
//! checkpoint, watermarks recorded in the offset log, late rows, and
//! batches run without data when the watermark moves.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Int64Array, RecordBatch, TimestampMillisecondArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use weir_core::checkpoint::Checkpoint;
use weir_core::crash::{CrashPoint, CrashPoints};
use weir_core::operator::QueryRule;
use weir_core::prelude::*;
use weir_core::state::StateStore;
use weir_test_support::operators::CountByKey;

use crate::common::{rows, schema};

/// `event_id % 4` as the column `k`.
fn with_key(batch: RecordBatch) -> std::result::Result<RecordBatch, BoxError> {
    let ids = batch.column(0).as_primitive::<Int64Type>();
    let k = Int64Array::from_iter_values(ids.values().iter().map(|i| i % 4));
    let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
    Ok(RecordBatch::try_new(schema, vec![Arc::new(k)])?)
}

fn counts(batches: &[RecordBatch]) -> BTreeMap<i64, i64> {
    let mut out = BTreeMap::new();
    for b in batches {
        let k = b.column(0).as_primitive::<Int64Type>();
        let c = b.column(1).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            assert!(out.insert(k.value(i), c.value(i)).is_none(), "key {} twice", k.value(i));
        }
    }
    out
}

/// The counts of `event_id % 4` over ids `0..n`.
fn expected(n: i64) -> BTreeMap<i64, i64> {
    let mut m = BTreeMap::new();
    for i in 0..n {
        *m.entry(i % 4).or_default() += 1;
    }
    m
}

fn input(chunks: i64) -> MemoryStream {
    let input = MemoryStream::new(schema());
    for i in 0..chunks {
        input.add_batch(rows(i * 10..i * 10 + 10)).unwrap();
    }
    input
}

fn counting(input: &MemoryStream, chk: &std::path::Path, mode: OutputMode) -> StreamWriter {
    counting_stream(read_stream(input.clone()), chk, mode)
}

fn counting_stream(stream: ReadStream, chk: &std::path::Path, mode: OutputMode) -> StreamWriter {
    stream
        .map_batches(with_key)
        .with_operator(CountByKey::new("counts", "k"))
        .write_stream()
        .query_name("counts")
        .checkpoint_location(chk)
        .output_mode(mode)
        .trigger(Trigger::available_now())
}

#[tokio::test]
async fn complete_mode_emits_the_whole_result_every_batch() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let source = input(1);
    for n in 1..=3 {
        let q = counting(&source, chk.path(), OutputMode::Complete)
            .start(table.clone())
            .await
            .unwrap();
        q.await_termination().await.unwrap();
        assert_eq!(counts(&table.batches()), expected(n * 10), "after {n} batches");
        let state = &q.last_progress().unwrap().state;
        assert_eq!((state[0].operator.as_str(), state[0].rows), ("counts", 4));
        source.add_batch(rows(n * 10..n * 10 + 10)).unwrap();
    }
}

#[tokio::test]
async fn update_mode_emits_the_groups_a_batch_changed() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let source = MemoryStream::new(schema());
    source.add_batch(rows(0..8)).unwrap();
    let q = counting(&source, chk.path(), OutputMode::Update)
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    // Ids 9 and 13: keys 1 only.
    source.add_batch(rows(9..10)).unwrap();
    source.add_batch(rows(13..14)).unwrap();
    let q = counting(&source, chk.path(), OutputMode::Update)
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let batches = table.batches();
    let last = counts(&batches[batches.len() - 1..]);
    assert_eq!(
        last,
        BTreeMap::from([(1, 4)]),
        "only the changed group, with its new count"
    );
}

#[tokio::test]
async fn a_crash_at_any_point_gives_the_output_of_a_straight_run() {
    for point in CrashPoint::ALL {
        // The first batch, one after it, the tenth state version (a
        // snapshot) and the batch that sweeps old state files.
        for crash_batch in [0u64, 2, 9, 10] {
            let chk = tempfile::tempdir().unwrap();
            let table = MemorySink::new("t");
            // Twelve batches of ten rows.
            let source = || read_stream(RateSource::rows_per_batch(10).with_total_rows(120));
            let armed = counting_stream(source(), chk.path(), OutputMode::Complete)
                .crash_points(CrashPoints::new().fail_at(point, Some(BatchId(crash_batch))));
            let q = armed.start(table.clone()).await.unwrap();
            match q.await_termination().await {
                Err(Error::InjectedCrash { point: p, batch_id }) => {
                    assert_eq!((p, batch_id), (point, BatchId(crash_batch)))
                }
                other => panic!("expected a crash at {point}: {other:?}"),
            }
            let q = counting_stream(source(), chk.path(), OutputMode::Complete)
                .start(table.clone())
                .await
                .unwrap();
            q.await_termination().await.unwrap();
            assert_eq!(
                counts(&table.batches()),
                expected(120),
                "crash at {point} in batch {crash_batch}"
            );
            assert_eq!(q.last_progress().unwrap().batch_id, BatchId(11));
            let state = StateStore::new(Checkpoint::open_local(chk.path()).unwrap().store().clone(), 10);
            let last = state.manifest(BatchId(11)).await.unwrap().unwrap();
            // Ten deltas make a snapshot due, made beside the next batches
            // and named once made: the chain is a snapshot after batch 9 or
            // 10 (the one a restart made) and the deltas after it, or, while
            // it was being made, deltas alone.
            let files = &last.operator("counts").unwrap().files;
            let deltas = |from: u64| (from..=11).map(|b| format!("{b}.delta")).collect::<Vec<_>>();
            let shapes = [
                [vec!["9.snapshot".to_string()], deltas(10)].concat(),
                [vec!["10.snapshot".to_string()], deltas(11)].concat(),
                deltas(0),
            ];
            assert!(
                shapes.contains(files),
                "crash at {point} in batch {crash_batch}: {files:?}"
            );
        }
    }
}

#[tokio::test]
async fn modes_that_break_the_rules_are_refused_before_anything_is_written() {
    let chk = tempfile::tempdir().unwrap();
    let err = read_stream(input(1))
        .write_stream()
        .checkpoint_location(chk.path())
        .output_mode(OutputMode::Complete)
        .start(MemorySink::new("t"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::UnsupportedQuery {
                rule: QueryRule::CompleteWithoutAggregation,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("Use Append"), "{err}");
    let err = counting(&input(1), chk.path(), OutputMode::Append)
        .start(MemorySink::new("t"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("needs a watermark"), "{err}");
    assert!(!chk.path().join("metadata").exists(), "nothing was written");
}

#[tokio::test]
async fn an_operator_cannot_change_under_a_checkpoint() {
    let chk = tempfile::tempdir().unwrap();
    let source = input(1);
    let table = MemorySink::new("t");
    let q = counting(&source, chk.path(), OutputMode::Complete)
        .start(table.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let spy = Arc::new(PrepareSpy(table.clone(), std::sync::atomic::AtomicBool::new(false)));
    let renamed = read_stream(source.clone())
        .map_batches(with_key)
        .with_operator(CountByKey::new("totals", "k"))
        .write_stream()
        .query_name("counts")
        .checkpoint_location(chk.path())
        .output_mode(OutputMode::Complete)
        .start_arc(spy.clone())
        .await
        .unwrap_err();
    assert!(
        renamed.to_string().contains("cannot change under one checkpoint"),
        "{renamed}"
    );
    // Refused before the sink was prepared (which may create a table).
    assert!(
        !spy.1.load(std::sync::atomic::Ordering::SeqCst),
        "the sink was prepared"
    );
}

/// The memory sink, recording whether it was prepared.
#[derive(Debug)]
struct PrepareSpy(MemorySink, std::sync::atomic::AtomicBool);

#[async_trait::async_trait]
impl Sink for PrepareSpy {
    fn identity(&self) -> weir_core::protocol::SinkIdentity {
        self.0.identity()
    }
    fn check_output_mode(&self, mode: OutputMode) -> std::result::Result<(), weir_core::sink::ModeRefusal> {
        self.0.check_output_mode(mode)
    }
    async fn prepare(&self, query: &weir_core::sink::QueryInfo) -> weir_core::Result<()> {
        self.1.store(true, std::sync::atomic::Ordering::SeqCst);
        self.0.prepare(query).await
    }
    async fn marker(
        &self,
        name: &QueryName,
        ids: &[QueryId],
    ) -> weir_core::Result<Option<weir_core::protocol::SinkMarker>> {
        self.0.marker(name, ids).await
    }
    fn create_writer(
        &self,
        b: &weir_core::sink::BatchContext,
        p: usize,
    ) -> weir_core::Result<Box<dyn weir_core::sink::DataWriter>> {
        self.0.create_writer(b, p)
    }
    async fn commit(
        &self,
        b: &weir_core::sink::BatchContext,
        m: Vec<weir_core::sink::CommitMessage>,
    ) -> weir_core::Result<weir_core::sink::CommitOutcome> {
        self.0.commit(b, m).await
    }
}

fn event_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("ts", DataType::Timestamp(TimeUnit::Millisecond, None), false),
    ]))
}

/// Rows of key 1 at the given event times (seconds).
fn events(seconds: &[i64]) -> RecordBatch {
    RecordBatch::try_new(
        event_schema(),
        vec![
            Arc::new(Int64Array::from(vec![1; seconds.len()])),
            Arc::new(TimestampMillisecondArray::from_iter_values(
                seconds.iter().map(|s| s * 1000),
            )),
        ],
    )
    .unwrap()
}

fn watermarked(input: &MemoryStream, chk: &std::path::Path) -> StreamWriter {
    read_stream(input.clone())
        .with_watermark("ts", Duration::from_secs(10))
        .with_operator(CountByKey::new("counts", "k"))
        .write_stream()
        .query_name("late")
        .checkpoint_location(chk)
        .output_mode(OutputMode::Update)
        .trigger(Trigger::available_now())
}

#[tokio::test]
async fn the_watermark_is_recorded_and_late_rows_are_dropped_and_counted() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let source = MemoryStream::new(event_schema());
    source.add_batch(events(&[100, 60])).unwrap();
    let q = watermarked(&source, chk.path()).start(table.clone()).await.unwrap();
    q.await_termination().await.unwrap();
    let progress = q.recent_progress();
    // Batch 0 with the rows, then batch 1 without data: the watermark moved
    // to 100 - 10 seconds.
    assert_eq!(progress.len(), 2, "{progress:?}");
    assert_eq!((progress[1].batch_id, progress[1].input_rows), (BatchId(1), 0));
    assert_eq!(progress[1].watermark.unwrap().timestamp_millis(), 90_000);
    let checkpoint = Checkpoint::open_local(chk.path()).unwrap();
    assert_eq!(
        checkpoint
            .offsets()
            .get(BatchId(0))
            .await
            .unwrap()
            .unwrap()
            .watermark_ms,
        0
    );
    assert_eq!(
        checkpoint
            .offsets()
            .get(BatchId(1))
            .await
            .unwrap()
            .unwrap()
            .watermark_ms,
        90_000
    );

    // 80 and 90 are late (at or before 90); 95 and 120 count.
    source.add_batch(events(&[80, 95, 90, 120])).unwrap();
    let q = watermarked(&source, chk.path()).start(table.clone()).await.unwrap();
    q.await_termination().await.unwrap();
    let p = &q.recent_progress()[0];
    assert_eq!((p.batch_id, p.input_rows, p.late_rows), (BatchId(2), 4, 2));
    let batches = table.batches();
    assert_eq!(counts(&batches[batches.len() - 1..]), BTreeMap::from([(1, 4)]));
    let state = StateStore::new(checkpoint.store().clone(), 10);
    let manifest = state.manifest(BatchId(2)).await.unwrap().unwrap();
    assert_eq!(manifest.max_event_time_ms, Some(120_000));
}

#[tokio::test]
async fn a_replayed_batch_uses_its_recorded_watermark() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let source = MemoryStream::new(event_schema());
    source.add_batch(events(&[100])).unwrap();
    let q = watermarked(&source, chk.path()).start(table.clone()).await.unwrap();
    q.await_termination().await.unwrap();
    source.add_batch(events(&[85, 200])).unwrap();
    // Batch 2 is planned with watermark 90 and dies before the sink commits.
    let q = watermarked(&source, chk.path())
        .crash_points(CrashPoints::new().fail_at(CrashPoint::AfterStateWritten, Some(BatchId(2))))
        .start(table.clone())
        .await
        .unwrap();
    assert!(matches!(q.await_termination().await, Err(Error::InjectedCrash { .. })));
    let q = watermarked(&source, chk.path()).start(table.clone()).await.unwrap();
    q.await_termination().await.unwrap();
    let p = &q.recent_progress()[0];
    assert!(p.replayed);
    assert_eq!((p.batch_id, p.late_rows), (BatchId(2), 1));
    assert_eq!(p.watermark.unwrap().timestamp_millis(), 90_000);
    let batches = table.batches();
    // Key 1: 100 and 200; 85 was late. Then a batch without data for the
    // watermark's move to 190.
    assert_eq!(counts(&batches[batches.len() - 1..]), BTreeMap::from([(1, 2)]));
    assert_eq!(
        q.last_progress().unwrap().watermark.unwrap().timestamp_millis(),
        190_000
    );
}

/// [`CountByKey`] failing on every batch, with a transient error or not.
#[derive(Debug)]
struct FailingCount {
    inner: CountByKey,
    transient: bool,
}

#[async_trait::async_trait]
impl weir_core::operator::StatefulOperator for FailingCount {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn kind(&self) -> weir_core::operator::OperatorKind {
        self.inner.kind()
    }

    fn output_schema(&self, input: &SchemaRef) -> std::result::Result<SchemaRef, BoxError> {
        self.inner.output_schema(input)
    }

    fn key_columns(&self, input: &SchemaRef) -> Option<Vec<String>> {
        self.inner.key_columns(input)
    }

    fn state_schema(
        &self,
        input: &SchemaRef,
        ctx: &weir_core::operator::StateContext,
    ) -> std::result::Result<weir_core::state::StateSchema, BoxError> {
        self.inner.state_schema(input, ctx)
    }

    async fn process(
        &self,
        _state: &mut weir_core::state::KeyedState,
        _input: Vec<RecordBatch>,
        _ctx: &weir_core::operator::OperatorContext,
    ) -> std::result::Result<Vec<RecordBatch>, BoxError> {
        let error = std::io::Error::other("the lookup service did not answer");
        Err(if self.transient {
            weir_core::transient(error)
        } else {
            Box::new(error)
        })
    }
}

#[tokio::test]
async fn an_operators_error_is_retryable_exactly_when_the_operator_says_so() {
    for transient in [true, false] {
        let chk = tempfile::tempdir().unwrap();
        let table = MemorySink::new("t");
        let q = read_stream(input(1).clone())
            .map_batches(with_key)
            .with_operator(FailingCount {
                inner: CountByKey::new("counts", "k"),
                transient,
            })
            .write_stream()
            .query_name("failing")
            .checkpoint_location(chk.path())
            .output_mode(OutputMode::Update)
            .trigger(Trigger::available_now())
            .start(table.clone())
            .await
            .unwrap();
        let error = q.await_termination().await.unwrap_err();
        assert_eq!(error.retryable(), transient, "{error}");
        assert!(error.to_string().contains("operator \"counts\""), "{error}");
        assert!(table.batches().is_empty(), "nothing was committed");
    }
}
