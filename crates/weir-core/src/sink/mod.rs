//! Sinks in two phases, after Spark's DataSource V2 streaming write.
//!
//! For each batch the driver asks the sink for one [`DataWriter`] per
//! partition of the batch's rows. Writers write (data files, staged rows)
//! and return a serialisable [`CommitMessage`] describing what they wrote;
//! writing never makes anything visible. The driver then calls
//! [`Sink::commit`] once with every message, and the sink makes it all
//! visible in one atomic step together with its marker for the query
//! (design section 1). If the batch fails before the commit, the driver
//! calls [`Sink::abort`] with the messages it has.

mod background;
mod commit;
mod console;
mod foreach;
mod foreach_batch;
mod memory;
pub(crate) mod mode;
pub mod prune;
mod staging;
mod table_writer;

use std::fmt;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use background::{log_compaction, Background, Close, CompactionPolicy, Periodic, Running};
pub use commit::{commit_batch, TableCommit, Tried};
pub use console::ConsoleSink;
pub use foreach::{ForeachSink, ForeachWriter, Row};
pub use foreach_batch::ForeachBatchSink;
pub use memory::MemorySink;
pub use mode::{ModeRefusal, OutputMode};
pub use table_writer::{TableWriter, WriteOutcome};

use crate::error::{Error, Result};
use crate::ids::{BatchId, QueryId, QueryName, RunId};
use crate::protocol::{CommitFacts, SinkIdentity, SinkMarker};

/// The query a sink serves, given to [`Sink::prepare`].
#[derive(Debug, Clone)]
pub struct QueryInfo {
    /// The query's id.
    pub query_id: QueryId,
    /// The query's name.
    pub query_name: QueryName,
    /// The output mode.
    pub output_mode: OutputMode,
    /// The schema of the rows the sink will receive.
    pub schema: SchemaRef,
    /// The columns that name a row's group, when the query aggregates and
    /// every such column reaches the sink (else empty). In Update mode each
    /// row replaces the row with the same values in them.
    pub key_columns: Vec<String>,
}

/// The batch being written, given to every writer and to the commit.
#[derive(Debug, Clone)]
pub struct BatchContext {
    /// The query's id.
    pub query_id: QueryId,
    /// The query's name.
    pub query_name: QueryName,
    /// This run of the query.
    pub run_id: RunId,
    /// The batch.
    pub batch_id: BatchId,
    /// Unique per attempt at the batch: put it in file names so that a
    /// replayed batch never overwrites a file of an earlier attempt.
    pub attempt_id: Uuid,
    /// The output mode.
    pub output_mode: OutputMode,
    /// The schema of the rows.
    pub schema: SchemaRef,
    /// The marker of another query id that this query took over, which
    /// [`crate::protocol::decide_commit`] accepts in place of its own.
    pub taken_over: Option<SinkMarker>,
}

impl BatchContext {
    /// The query ids this batch's commit can vouch for, for [`Sink::marker`].
    pub fn known_ids(&self) -> Vec<QueryId> {
        std::iter::once(self.query_id)
            .chain(self.taken_over.map(|m| m.query_id))
            .collect()
    }

    /// The facts for [`crate::protocol::decide_commit`].
    pub fn commit_facts(&self) -> CommitFacts<'_> {
        CommitFacts {
            query_name: &self.query_name,
            query_id: self.query_id,
            batch_id: self.batch_id,
            taken_over: self.taken_over,
        }
    }
}

/// What one partition writer wrote, in a form the sink defines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommitMessage {
    /// The partition that wrote it.
    pub partition_id: usize,
    /// The sink's description of what was written (files, sizes, stats).
    pub payload: serde_json::Value,
}

impl CommitMessage {
    /// Wraps a sink's own description.
    pub fn new<T: Serialize>(partition_id: usize, payload: &T) -> Result<Self> {
        let payload = serde_json::to_value(payload).map_err(|e| Error::sink("commit message", None, false, e))?;
        Ok(CommitMessage { partition_id, payload })
    }

    /// Reads back a sink's own description.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T> {
        T::deserialize(&self.payload).map_err(|e| Error::sink("commit message", None, false, e))
    }
}

/// What [`Sink::commit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    /// The batch is now visible; `version` is the sink's new version (table
    /// version, snapshot id) where it has one.
    Committed { version: Option<i64> },
    /// The sink already held this batch of this query from another attempt
    /// (another run): nothing was committed, and the messages' output will be
    /// discarded by [`Sink::abort`]. A sink must only say so when it knows
    /// this attempt's own output is not in the sink (a retried write of this
    /// attempt that landed is `Committed`).
    AlreadyCommitted(SinkMarker),
}

/// Writes one partition of one batch. Called on a worker task; each method
/// is called at most once in the order `write*`, then `commit` or `abort`.
#[async_trait]
pub trait DataWriter: Send {
    /// Writes rows. Nothing becomes visible.
    async fn write(&mut self, batch: RecordBatch) -> Result<()>;

    /// Finishes writing and describes what was written.
    async fn commit(self: Box<Self>) -> Result<CommitMessage>;

    /// Gives up: removes what was written, where it can.
    async fn abort(self: Box<Self>) -> Result<()>;
}

/// A sink that keeps markers but does not say how to read them (a bug of
/// the sink's, found when the query starts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the sink keeps markers (keeps_marker is true) but does not implement Sink::marker; nothing was written")]
pub struct MarkerNotImplemented;

/// A destination of a streaming query.
///
/// The driver calls [`Sink::identity`], [`Sink::check_output_mode`],
/// [`Sink::prepare`] and [`Sink::marker`] when the query starts; then for
/// each batch [`Sink::create_writer`] per partition, and exactly one of
/// [`Sink::commit`] (all writers succeeded) or [`Sink::abort`].
#[async_trait]
pub trait Sink: Send + Sync + fmt::Debug {
    /// What the sink is, recorded in the checkpoint (invariant I6).
    fn identity(&self) -> SinkIdentity;

    /// `Ok` if the sink supports `mode`, else why it does not. By default
    /// a sink only appends.
    fn check_output_mode(&self, mode: OutputMode) -> std::result::Result<(), ModeRefusal> {
        match mode {
            OutputMode::Append => Ok(()),
            OutputMode::Complete => Err(ModeRefusal::AppendOnly("this sink")),
            OutputMode::Update => Err(ModeRefusal::NoUpdate("this sink")),
        }
    }

    /// Whether the sink keeps a durable marker per query name. A sink that
    /// does not (console, foreach) cannot tell a replayed batch from a new
    /// one: it gets every batch at least once.
    fn keeps_marker(&self) -> bool {
        true
    }

    /// Called once when the query starts: create the destination if missing,
    /// check that it accepts `query.schema`.
    async fn prepare(&self, _query: &QueryInfo) -> Result<()> {
        Ok(())
    }

    /// The last batch committed under `name`, and by which query id.
    ///
    /// `known_ids` are the query ids the caller can vouch for (its own, and
    /// one whose output it took over). A sink that stores the owning query id
    /// with the marker ignores them. A sink that can only test ownership by
    /// key (Delta's `txn` actions) must return the exact owner when it is one
    /// of `known_ids`, and otherwise a marker with another id: the true owner
    /// where it can find it, else [`QueryId::unknown`].
    ///
    /// A sink that keeps no marker ([`Sink::keeps_marker`] is false) need
    /// not implement it: it has none. One that keeps markers must: the
    /// default refuses to start it, so a forgotten marker is never taken
    /// for an empty sink.
    async fn marker(&self, _name: &QueryName, _known_ids: &[QueryId]) -> Result<Option<SinkMarker>> {
        if self.keeps_marker() {
            return Err(Error::sink(self.identity().format, None, false, MarkerNotImplemented));
        }
        Ok(None)
    }

    /// A writer for one partition of a batch.
    fn create_writer(&self, batch: &BatchContext, partition_id: usize) -> Result<Box<dyn DataWriter>>;

    /// Makes the batch visible with the marker `(query name, query id, batch
    /// id)` in one atomic step, unless the marker read on the same snapshot
    /// says the batch is already there ([`crate::protocol::decide_commit`]).
    /// Called once per batch attempt; it must be committed or not when it
    /// returns, never half.
    async fn commit(&self, batch: &BatchContext, messages: Vec<CommitMessage>) -> Result<CommitOutcome>;

    /// Discards what the messages describe. Called when a batch attempt fails
    /// before commit, or its commit found the batch already committed.
    async fn abort(&self, _batch: &BatchContext, _messages: Vec<CommitMessage>) -> Result<()> {
        Ok(())
    }

    /// Called when a started query ends (its last batch run, stopped, or
    /// failed), before its end is reported: background work the sink
    /// started for the query (compaction, expiry) finishes or stops, as
    /// `how` says, so that none outlives the query. A `Close::Finish` is
    /// abandoned (its future dropped) and followed by a `Close::Cancel` when
    /// the query is stopped meanwhile. An error here is the query's only
    /// when the query itself ended without one.
    async fn close(&self, _how: Close) -> Result<()> {
        Ok(())
    }
}
