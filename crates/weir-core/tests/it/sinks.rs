//! The foreach, foreach_batch and console sinks, and output modes a sink
//! refuses.

use std::sync::{Arc, Mutex};

use weir_core::crash::{CrashPoint, CrashPoints};
use weir_core::prelude::*;
use weir_test_support::operators::CountByKey;
use weir_test_support::{assert_exactly_once, event_ids};

use crate::common::{rows, schema};

fn input(batches: i64) -> MemoryStream {
    let input = MemoryStream::new(schema());
    for i in 0..batches {
        input.add_batch(rows(i * 10..i * 10 + 10)).unwrap();
    }
    input
}

#[derive(Default, Clone)]
struct Log(Arc<Mutex<Vec<String>>>);

struct LoggingWriter(Log);

impl ForeachWriter for LoggingWriter {
    fn open(&mut self, partition_id: usize, batch_id: BatchId) -> std::result::Result<bool, BoxError> {
        self.0
             .0
            .lock()
            .unwrap()
            .push(format!("open {partition_id} {batch_id}"));
        Ok(true)
    }
    fn process(&mut self, row: Row<'_>) -> std::result::Result<(), BoxError> {
        let id = row.get_i64("event_id").ok_or("no event id")?;
        let json = row.to_json()?;
        assert_eq!(json["name"], format!("n{id}"));
        if id == 999 {
            return Err("poison row".into());
        }
        self.0
             .0
            .lock()
            .unwrap()
            .push(format!("row {id} {}", row.get_str("name").unwrap_or("")));
        Ok(())
    }
    fn close(&mut self, error: Option<&BoxError>) {
        self.0
             .0
            .lock()
            .unwrap()
            .push(format!("close {}", error.map(|e| e.to_string()).unwrap_or_default()));
    }
}

#[tokio::test]
async fn foreach_sees_every_row_between_open_and_close() {
    let chk = tempfile::tempdir().unwrap();
    let log = Log::default();
    let sink_log = log.clone();
    let q = read_stream(input(2))
        .write_stream()
        .checkpoint_location(chk.path())
        .writer_parallelism(1)
        .trigger(Trigger::once())
        .start(ForeachSink::new("log", move || LoggingWriter(sink_log.clone())))
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let log = log.0.lock().unwrap().clone();
    assert_eq!(log.first().map(String::as_str), Some("open 0 0"));
    assert_eq!(log.last().map(String::as_str), Some("close "));
    let rows: Vec<&String> = log.iter().filter(|l| l.starts_with("row ")).collect();
    assert_eq!(rows.len(), 20);
    assert_eq!(rows[19], "row 19 n19");
}

#[tokio::test]
async fn foreach_error_closes_with_it_and_fails_the_query() {
    let chk = tempfile::tempdir().unwrap();
    let input = MemoryStream::new(schema());
    input.add_batch(rows(995..1000)).unwrap();
    let log = Log::default();
    let sink_log = log.clone();
    let err = read_stream(input)
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::once())
        .start(ForeachSink::new("log", move || LoggingWriter(sink_log.clone())))
        .await
        .unwrap()
        .await_termination()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("poison row"), "{err}");
    let closes: Vec<String> = log
        .0
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("close"))
        .cloned()
        .collect();
    assert_eq!(
        closes,
        vec!["close poison row".to_string()],
        "closed once, with the error"
    );
    assert!(!chk.path().join("commits/0").exists());
}

#[tokio::test]
async fn foreach_batch_gets_the_same_batch_again_after_a_crash() {
    let chk = tempfile::tempdir().unwrap();
    type Calls = Arc<Mutex<Vec<(BatchId, Vec<i64>)>>>;
    let seen: Calls = Arc::default();
    let run = |crash: CrashPoints| {
        let seen = seen.clone();
        read_stream(input(3))
            .write_stream()
            .checkpoint_location(chk.path())
            .trigger(Trigger::once())
            .crash_points(crash)
            .foreach_batch(move |batches, batch_id| {
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().push((batch_id, event_ids(&batches)));
                    Ok(())
                }
            })
    };
    let crash = CrashPoints::new().fail_at(CrashPoint::AfterSinkCommit, None);
    assert!(run(crash).await.unwrap().await_termination().await.is_err());
    run(CrashPoints::new())
        .await
        .unwrap()
        .await_termination()
        .await
        .unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "called again for the replayed batch");
    assert_eq!(seen[0].0, seen[1].0, "with the same batch id");
    let (mut a, mut b) = (seen[0].1.clone(), seen[1].1.clone());
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b, "and the same rows");
    assert_exactly_once(&a, 0..30);
}

#[tokio::test]
async fn console_sink_prints_batches() {
    let chk = tempfile::tempdir().unwrap();
    let q = read_stream(input(1))
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::once())
        .start(ConsoleSink::new().with_max_rows(3))
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    let p = q.last_progress().unwrap();
    assert_eq!((p.batch_id, p.input_rows), (BatchId(0), 10));
    assert!(chk.path().join("commits/0").exists());
}

#[derive(Debug)]
struct AppendOnly(MemorySink);

#[async_trait::async_trait]
impl Sink for AppendOnly {
    fn identity(&self) -> weir_core::protocol::SinkIdentity {
        self.0.identity()
    }
    async fn marker(&self, name: &QueryName, ids: &[QueryId]) -> Result<Option<weir_core::protocol::SinkMarker>> {
        self.0.marker(name, ids).await
    }
    fn create_writer(
        &self,
        b: &weir_core::sink::BatchContext,
        p: usize,
    ) -> Result<Box<dyn weir_core::sink::DataWriter>> {
        self.0.create_writer(b, p)
    }
    async fn commit(
        &self,
        b: &weir_core::sink::BatchContext,
        m: Vec<weir_core::sink::CommitMessage>,
    ) -> Result<weir_core::sink::CommitOutcome> {
        self.0.commit(b, m).await
    }
}

#[tokio::test]
async fn an_unsupported_output_mode_is_refused_with_the_reason() {
    let chk = tempfile::tempdir().unwrap();
    // An aggregation in Update mode: changed groups replace their old rows.
    let err = read_stream(input(1))
        .with_operator(CountByKey::new("ids", "event_id"))
        .write_stream()
        .checkpoint_location(chk.path())
        .output_mode(OutputMode::Update)
        .start(AppendOnly(MemorySink::new("t")))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("output mode update is not supported"), "{err}");
    assert!(err.to_string().contains("cannot replace rows by key"), "{err}");
    assert!(!chk.path().join("metadata").exists(), "nothing was written");
}

/// A sink that keeps markers (the default) but forgot to say how to read
/// them.
#[derive(Debug)]
struct NoMarker(MemorySink);

#[async_trait::async_trait]
impl Sink for NoMarker {
    fn identity(&self) -> weir_core::protocol::SinkIdentity {
        self.0.identity()
    }
    fn create_writer(
        &self,
        b: &weir_core::sink::BatchContext,
        p: usize,
    ) -> Result<Box<dyn weir_core::sink::DataWriter>> {
        self.0.create_writer(b, p)
    }
    async fn commit(
        &self,
        b: &weir_core::sink::BatchContext,
        m: Vec<weir_core::sink::CommitMessage>,
    ) -> Result<weir_core::sink::CommitOutcome> {
        self.0.commit(b, m).await
    }
}

#[tokio::test]
async fn a_sink_that_keeps_markers_but_cannot_read_them_is_refused_before_writing() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let started = read_stream(input(2))
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::available_now())
        .start(NoMarker(table.clone()))
        .await;
    let err = match started {
        Ok(q) => q.await_termination().await.unwrap_err(),
        Err(e) => e,
    };
    assert!(err.to_string().contains("does not implement Sink::marker"), "{err}");
    assert!(!err.retryable());
    assert!(table.batches().is_empty(), "nothing was written");
}

/// A memory sink that records how each query's end closed it, and fails
/// its close, or never finishes its work, when told to.
#[derive(Debug)]
struct Closing {
    inner: MemorySink,
    closes: Arc<Mutex<Vec<weir_core::sink::Close>>>,
    fail: bool,
    endless: bool,
}

impl Closing {
    fn new(fail: bool) -> Self {
        Closing {
            inner: MemorySink::new("t"),
            closes: Arc::default(),
            fail,
            endless: false,
        }
    }
}

#[async_trait::async_trait]
impl Sink for Closing {
    fn identity(&self) -> weir_core::protocol::SinkIdentity {
        self.inner.identity()
    }
    async fn marker(&self, name: &QueryName, ids: &[QueryId]) -> Result<Option<weir_core::protocol::SinkMarker>> {
        self.inner.marker(name, ids).await
    }
    fn create_writer(
        &self,
        b: &weir_core::sink::BatchContext,
        p: usize,
    ) -> Result<Box<dyn weir_core::sink::DataWriter>> {
        self.inner.create_writer(b, p)
    }
    async fn commit(
        &self,
        b: &weir_core::sink::BatchContext,
        m: Vec<weir_core::sink::CommitMessage>,
    ) -> Result<weir_core::sink::CommitOutcome> {
        self.inner.commit(b, m).await
    }
    async fn close(&self, how: weir_core::sink::Close) -> Result<()> {
        self.closes.lock().unwrap().push(how);
        if self.endless && how == weir_core::sink::Close::Finish {
            std::future::pending::<()>().await;
        }
        if self.fail {
            // A store that did not answer: trying again may succeed.
            return Err(weir_core::Error::sink("t", None, true, "the close failed"));
        }
        Ok(())
    }
}

#[tokio::test]
async fn the_sink_is_closed_once_as_the_query_ended() {
    use weir_core::sink::Close;
    // Ran to its last batch: background work finishes.
    let chk = tempfile::tempdir().unwrap();
    let sink = Arc::new(Closing::new(false));
    let closes = sink.closes.clone();
    let q = read_stream(input(3))
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::available_now())
        .start_arc(sink.clone())
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    assert_eq!(*closes.lock().unwrap(), [Close::Finish]);
    assert_exactly_once(&event_ids(&sink.inner.batches()), 0..30);

    // Stopped: background work stops.
    let chk = tempfile::tempdir().unwrap();
    let sink = Closing::new(false);
    let closes = sink.closes.clone();
    let q = read_stream(input(1))
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::processing_time(std::time::Duration::from_millis(10)))
        .start(sink)
        .await
        .unwrap();
    q.stop_and_wait().await.unwrap();
    assert_eq!(*closes.lock().unwrap(), [Close::Cancel]);

    // Failed: the same, and the query's own error is kept.
    let chk = tempfile::tempdir().unwrap();
    let sink = Closing::new(true);
    let closes = sink.closes.clone();
    let q = read_stream(input(2))
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::once())
        .crash_points(CrashPoints::new().fail_at(CrashPoint::AfterSinkCommit, None))
        .start(sink)
        .await
        .unwrap();
    let err = q.await_termination().await.unwrap_err();
    assert!(!err.to_string().contains("the close failed"), "{err}");
    assert_eq!(*closes.lock().unwrap(), [Close::Cancel]);

    // A failed close of a query that ended well is the query's error.
    let chk = tempfile::tempdir().unwrap();
    let q = read_stream(input(1))
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::once())
        .start(Closing::new(true))
        .await
        .unwrap();
    let err = q.await_termination().await.unwrap_err();
    assert!(err.to_string().contains("the close failed"), "{err}");
    assert!(err.retryable());
    // Asked again, the query names the same failure and keeps its judgement.
    let again = q.await_termination().await.unwrap_err();
    assert!(
        matches!(&again, Error::QueryFailed { message, retryable: true, .. } if *message == err.to_string()),
        "{again:?}"
    );

    // Ran to its end, but its work never finishes: a stop cancels it.
    let chk = tempfile::tempdir().unwrap();
    let sink = Closing {
        endless: true,
        ..Closing::new(false)
    };
    let closes = sink.closes.clone();
    let q = read_stream(input(2))
        .write_stream()
        .checkpoint_location(chk.path())
        .trigger(Trigger::once())
        .start(sink)
        .await
        .unwrap();
    // Bounded, so that a regression fails instead of hanging the run.
    let stopped = tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while closes.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        q.stop_and_wait().await
    });
    stopped.await.expect("a stop cancels a finishing close").unwrap();
    assert_eq!(*closes.lock().unwrap(), [Close::Finish, Close::Cancel]);
}

#[tokio::test]
async fn update_mode_without_an_aggregation_appends() {
    let chk = tempfile::tempdir().unwrap();
    let table = MemorySink::new("t");
    let q = read_stream(input(2))
        .write_stream()
        .checkpoint_location(chk.path())
        .output_mode(OutputMode::Update)
        .trigger(Trigger::available_now())
        .start(AppendOnly(table.clone()))
        .await
        .unwrap();
    q.await_termination().await.unwrap();
    assert_exactly_once(&event_ids(&table.batches()), 0..20);
}
