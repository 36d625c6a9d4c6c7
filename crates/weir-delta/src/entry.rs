//! The content of a batch's Delta log entry: commit info, `txn` markers and
//! `add` actions.

use bytes::Bytes;
use deltalake::kernel::{Action, Add, CommitInfo, Transaction};
use deltalake::protocol::{DeltaOperation, OutputMode as DeltaOutputMode};
use serde_json::{json, Value};
use weir_core::sink::{BatchContext, OutputMode};

use crate::open_file::AddFile;

/// The operation Spark's Delta sink records for a micro-batch.
pub(crate) fn streaming_update(ctx: &BatchContext) -> DeltaOperation {
    DeltaOperation::StreamingUpdate {
        output_mode: match ctx.output_mode {
            OutputMode::Append => DeltaOutputMode::Append,
            OutputMode::Complete => DeltaOutputMode::Complete,
            OutputMode::Update => DeltaOutputMode::Update,
        },
        query_id: ctx.query_id.to_string(),
        epoch_id: ctx.batch_id.0 as i64,
    }
}

/// weir's fields in the commit info: who committed which batch, and the
/// attempt id by which a writer recognises its own landed commit.
pub(crate) fn commit_metadata(ctx: &BatchContext) -> Vec<(String, Value)> {
    vec![
        ("weir.queryName".to_string(), json!(ctx.query_name.as_str())),
        ("weir.queryId".to_string(), json!(ctx.query_id.to_string())),
        ("weir.batchId".to_string(), json!(ctx.batch_id.0)),
        ("weir.runId".to_string(), json!(ctx.run_id.to_string())),
        ("weir.attemptId".to_string(), json!(ctx.attempt_id.to_string())),
    ]
}

/// The `add` action of a written file; `data_change` is false for a
/// rewrite of rows already in the table.
pub(crate) fn add(file: &AddFile, data_change: bool) -> Action {
    Action::Add(Add {
        path: file.path.clone(),
        partition_values: file.partition_values.clone().into_iter().collect(),
        size: file.size,
        modification_time: file.modification_time,
        data_change,
        stats: Some(file.stats.clone()),
        ..Default::default()
    })
}

/// The log entry of an append: commit info first (as the protocol asks),
/// the query's `txn` markers, then one `add` per file. `read_version` is
/// the version the entry is built on.
pub(crate) fn append(
    ctx: &BatchContext,
    transactions: &[Transaction],
    files: &[AddFile],
    read_version: u64,
) -> Result<Bytes, serde_json::Error> {
    let mut info: CommitInfo = streaming_update(ctx).get_commit_info();
    info.timestamp = Some(chrono::Utc::now().timestamp_millis());
    info.read_version = Some(read_version);
    info.is_blind_append = Some(true);
    info.engine_info = Some(format!("weir-delta/{}", env!("CARGO_PKG_VERSION")));
    info.info = commit_metadata(ctx).into_iter().collect();
    info.info.insert(
        "clientVersion".to_string(),
        json!(format!("weir-delta.{}", env!("CARGO_PKG_VERSION"))),
    );
    let actions = std::iter::once(Action::CommitInfo(info))
        .chain(transactions.iter().cloned().map(Action::Txn))
        .chain(files.iter().map(|f| add(f, true)));
    encode(actions)
}

/// A log entry: one JSON action per line.
pub(crate) fn encode<A: serde::Serialize>(actions: impl Iterator<Item = A>) -> Result<Bytes, serde_json::Error> {
    let mut entry = Vec::with_capacity(4096);
    for (i, action) in actions.enumerate() {
        if i > 0 {
            entry.push(b'\n');
        }
        serde_json::to_writer(&mut entry, &action)?;
    }
    Ok(Bytes::from(entry))
}

/// The actions of a log entry, each as JSON.
pub(crate) fn actions(entry: &[u8]) -> impl Iterator<Item = Value> + '_ {
    entry
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .filter_map(|l| serde_json::from_slice(l).ok())
}
