//! Running one batch's rows through the writers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::sink::{BatchContext, CommitMessage, Sink};
use crate::source::BatchStream;

/// Record batches in flight per writer: enough to overlap reading and
/// writing, few enough to bound memory.
const CHANNEL_DEPTH: usize = 2;

/// What writing a batch produced.
#[derive(Debug, Default)]
pub(crate) struct Written {
    pub messages: Vec<CommitMessage>,
    pub input_rows: u64,
    pub output_rows: u64,
    pub partitions: usize,
    pub read_time: Duration,
    /// Rows the operators dropped as behind the watermark.
    pub late_rows: u64,
}

/// A failed write, with the messages of the writers that finished (for the
/// sink's abort).
pub(crate) struct WriteFailure {
    pub error: Error,
    pub messages: Vec<CommitMessage>,
}

struct Partition {
    tx: mpsc::Sender<RecordBatch>,
    task: JoinHandle<Result<CommitMessage>>,
}

/// Streams the rows through `transform` into one writer per partition
/// (round-robin), then finishes every writer.
pub(crate) async fn write_batch(
    mut rows: BatchStream,
    transform: &(dyn Fn(RecordBatch) -> Result<RecordBatch> + Sync),
    sink: &Arc<dyn Sink>,
    ctx: &BatchContext,
    parallelism: usize,
) -> std::result::Result<Written, WriteFailure> {
    let mut partitions: Vec<Partition> = Vec::new();
    let mut written = Written::default();
    let mut next = 0usize;
    let mut failure: Option<Error> = None;
    loop {
        let waited = Instant::now();
        let item = rows.next().await;
        written.read_time += waited.elapsed();
        let batch = match item {
            None => break,
            Some(Err(e)) => {
                failure = Some(e);
                break;
            }
            Some(Ok(batch)) => batch,
        };
        written.input_rows += batch.num_rows() as u64;
        let batch = match transform(batch) {
            Ok(b) => b,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        if batch.num_rows() == 0 {
            continue;
        }
        written.output_rows += batch.num_rows() as u64;
        let index = next % parallelism;
        next += 1;
        if index == partitions.len() {
            match sink.create_writer(ctx, index) {
                Ok(writer) => partitions.push(spawn_writer(writer)),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if partitions[index].tx.send(batch).await.is_err() {
            // The writer stopped early; its error comes out of the join.
            break;
        }
    }
    written.partitions = partitions.len();
    let mut messages = Vec::with_capacity(partitions.len());
    let mut tasks = Vec::with_capacity(partitions.len());
    for p in partitions {
        drop(p.tx);
        tasks.push(p.task);
    }
    for task in tasks {
        match task.await {
            Ok(Ok(m)) => messages.push(m),
            Ok(Err(e)) => {
                failure.get_or_insert(e);
            }
            Err(join) => {
                failure.get_or_insert(Error::sink(
                    "writer",
                    Some(ctx.batch_id),
                    false,
                    format!("a writer task panicked: {join}"),
                ));
            }
        }
    }
    match failure {
        Some(error) => Err(WriteFailure { error, messages }),
        None => {
            written.messages = messages;
            Ok(written)
        }
    }
}

fn spawn_writer(mut writer: Box<dyn crate::sink::DataWriter>) -> Partition {
    let (tx, mut rx) = mpsc::channel::<RecordBatch>(CHANNEL_DEPTH);
    let task = tokio::spawn(async move {
        while let Some(batch) = rx.recv().await {
            if let Err(e) = writer.write(batch).await {
                let _ = writer.abort().await;
                return Err(e);
            }
        }
        writer.commit().await
    });
    Partition { tx, task }
}
