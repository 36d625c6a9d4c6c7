//! Idempotent table writes for `foreach_batch`: each (application id,
//! version) lands once, its marker in the same commit as its rows.
//!
//! What Delta's `txnAppId` / `txnVersion` writer options give Spark users,
//! for any sink that keeps markers: a Delta or Iceberg table, by path or by
//! name. The application id plays the part of a query name and the version
//! that of a batch id, so the table's commit path is the streaming sink's
//! own: a write whose version the table already holds for that id writes
//! nothing, one older than the table's newest is refused (unless the writer
//! skips older versions), and a write that lands records the version in
//! the same atomic commit. One `foreach_batch` function can then write its
//! batch to several tables, each exactly once, without idempotency logic of
//! its own: a replayed batch calls it with the same batch id, and each
//! table that already has it skips it.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use tokio::sync::Mutex;
use uuid::Uuid;

use super::{BatchContext, Close, CommitOutcome, OutputMode, QueryInfo, Sink};
use crate::error::{Error, Result};
use crate::ids::{BatchId, QueryId, QueryName, RunId};
use crate::protocol::{decide_commit, CommitDecision, CommitFacts, Refusal, SinkMarker};

/// What [`TableWriter::write`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The rows are in the table with the marker of their version;
    /// `table_version` is the table's new version (Delta version, Iceberg
    /// snapshot id) where it has one.
    Written {
        /// The table's version after the commit.
        table_version: Option<i64>,
    },
    /// The table already held this version of the application id (or a
    /// later one, with [`TableWriter::skip_older_versions`]): nothing was
    /// written.
    Skipped {
        /// The newest version the table holds for the application id.
        committed: BatchId,
    },
    /// An append or a merge of no rows: nothing to write, and nothing was
    /// recorded (the next version with rows records itself).
    Empty,
}

/// Writes rows into a table at most once per (application id, version):
/// see the module docs. Clones share the table; writes through one writer
/// run one at a time. Each writer needs a sink of its own: a sink keeps the
/// mode and key it was prepared for, so a sink shared with a query or with
/// another writer would be prepared for theirs.
///
/// ```no_run
/// # async fn demo(silver: weir_core::sink::MemorySink) -> weir_core::Result<()> {
/// use weir_core::sink::TableWriter;
/// let silver = TableWriter::new(silver, "payments-fanout-silver")?;
/// # let rows = Vec::new();
/// // In a foreach_batch function, with the batch's rows and id:
/// silver.write(rows, weir_core::BatchId(7)).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct TableWriter {
    sink: Arc<dyn Sink>,
    app_id: QueryName,
    owner: QueryId,
    run_id: RunId,
    mode: OutputMode,
    keys: Vec<String>,
    /// The rows' schema, if given.
    schema: Option<SchemaRef>,
    /// Whether a version older than the table's is skipped, not refused.
    skip_older: bool,
    /// The schema the table was prepared for, held while a write runs.
    prepared: Arc<Mutex<Option<SchemaRef>>>,
}

impl std::fmt::Debug for TableWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableWriter")
            .field("sink", &self.sink.identity())
            .field("app_id", &self.app_id)
            .field("mode", &self.mode)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

/// The writer's stable query id: made from its application id, so every
/// process writing under one id is the same owner of its marker, as Delta's
/// `txnAppId` is.
fn owner_of(app_id: &QueryName) -> QueryId {
    // FNV-1a, 128 bits: stable across builds and platforms.
    let mut hash: u128 = 0x6c62272e07bb014262b821756295c58d;
    for byte in b"weir table writer\0".iter().chain(app_id.as_str().as_bytes()) {
        hash ^= u128::from(*byte);
        hash = hash.wrapping_mul(0x0000000001000000000000000000013B);
    }
    QueryId(Uuid::from_u128(hash))
}

impl TableWriter {
    /// Appends to `sink`'s table under `app_id` (letters, digits, `.`, `_`
    /// and `-`). Refuses a sink that keeps no marker.
    pub fn new(sink: impl Sink + 'static, app_id: impl Into<String>) -> Result<Self> {
        Self::from_arc(Arc::new(sink), app_id)
    }

    /// [`TableWriter::new`] with a sink behind an `Arc` (one no query or
    /// other writer uses).
    pub fn from_arc(sink: Arc<dyn Sink>, app_id: impl Into<String>) -> Result<Self> {
        let app_id = QueryName::new(app_id)?;
        if !sink.keeps_marker() {
            return Err(Error::InvalidOption {
                option: "sink",
                reason: format!(
                    "{} keeps no marker, so a write under {app_id} could not be told from a repeated one; write to a sink that keeps one (a Delta or Iceberg table, files, exactly-once Kafka)",
                    sink.identity()
                ),
            });
        }
        Ok(TableWriter {
            owner: owner_of(&app_id),
            sink,
            app_id,
            run_id: RunId::new(),
            mode: OutputMode::Append,
            keys: Vec::new(),
            schema: None,
            skip_older: false,
            prepared: Arc::new(Mutex::new(None)),
        })
    }

    /// The schema of the rows, for an [`TableWriter::overwrite`] whose
    /// first write after a start may have no rows (an empty result empties
    /// the table).
    pub fn with_schema(mut self, schema: SchemaRef) -> Self {
        self.schema = Some(schema);
        self
    }

    /// Skips a version older than the newest the table holds for the
    /// application id, with a warning, as Delta's `txnVersion` does. By
    /// default such a write is refused ([`Refusal::VersionBehind`]): the
    /// versions going back means the id was reused or its query restarted
    /// on a new checkpoint, and skipping would drop the rows silently.
    pub fn skip_older_versions(mut self) -> Self {
        self.skip_older = true;
        self
    }

    /// Each version replaces the table's content with its rows.
    pub fn overwrite(mut self) -> Self {
        self.mode = OutputMode::Complete;
        self.keys.clear();
        self
    }

    /// Each version's rows replace the table's rows with the same values in
    /// `keys` and add the others (a merge by key). Two rows of one key in a
    /// version are refused.
    pub fn merge_on<I, S>(mut self, keys: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.mode = OutputMode::Update;
        self.keys = keys.into_iter().map(Into::into).collect();
        self
    }

    /// The application id.
    pub fn app_id(&self) -> &QueryName {
        &self.app_id
    }

    /// The newest version the table holds for the application id.
    pub async fn last_version(&self) -> Result<Option<BatchId>> {
        Ok(self.marker().await?.map(|m| m.batch_id))
    }

    async fn marker(&self) -> Result<Option<SinkMarker>> {
        self.sink.marker(&self.app_id, &[self.owner]).await
    }

    /// Writes `rows` as `version` of the application id, unless the table
    /// holds that version (skipped) or a later one (refused, see
    /// [`TableWriter::skip_older_versions`]). An append or merge of no rows
    /// writes nothing and reads no marker ([`WriteOutcome::Empty`], whatever
    /// the version); an overwrite of no rows
    /// empties the table, and needs the rows' schema from an earlier write
    /// or [`TableWriter::with_schema`].
    pub async fn write(&self, rows: Vec<RecordBatch>, version: BatchId) -> Result<WriteOutcome> {
        let rows: Vec<RecordBatch> = rows.into_iter().filter(|b| b.num_rows() > 0).collect();
        if rows.is_empty() && self.mode != OutputMode::Complete {
            return Ok(WriteOutcome::Empty);
        }
        let mut prepared = self.prepared.lock().await;
        let outcome = self.write_prepared(&mut prepared, rows, version).await;
        if outcome.is_err() {
            // A table replaced or changed meanwhile is prepared again.
            *prepared = None;
        }
        outcome
    }

    async fn write_prepared(
        &self,
        prepared: &mut Option<SchemaRef>,
        rows: Vec<RecordBatch>,
        version: BatchId,
    ) -> Result<WriteOutcome> {
        let schema = match rows.first() {
            Some(b) => b.schema(),
            None => prepared.clone().or_else(|| self.schema.clone()).ok_or_else(|| Error::InvalidOption {
                option: "schema",
                reason: format!(
                    "an overwrite under {} of no rows empties the table, but the rows' schema is unknown; give it with TableWriter::with_schema. Nothing was written",
                    self.app_id
                ),
            })?,
        };
        if prepared.as_ref() != Some(&schema) {
            self.prepare(&schema).await?;
            *prepared = Some(schema.clone());
        }
        let facts = CommitFacts {
            query_name: &self.app_id,
            query_id: self.owner,
            batch_id: version,
            taken_over: None,
        };
        if let CommitDecision::AlreadyCommitted(m) = decide_commit(self.marker().await?, facts)? {
            return self.skipped(m.batch_id, version);
        }
        let ctx = BatchContext {
            query_id: self.owner,
            query_name: self.app_id.clone(),
            run_id: self.run_id,
            batch_id: version,
            attempt_id: Uuid::new_v4(),
            output_mode: self.mode,
            schema,
            taken_over: None,
        };
        let mut writer = self.sink.create_writer(&ctx, 0)?;
        for batch in rows {
            if let Err(e) = writer.write(batch).await {
                // What the writer wrote is not in the table; its error is
                // the write's.
                if let Err(cleanup) = writer.abort().await {
                    tracing::warn!(app_id = %self.app_id, %version, error = %cleanup, "could not remove an unfinished write's files");
                }
                return Err(e);
            }
        }
        let message = writer.commit().await?;
        // An error here may leave the outcome unknown: the next write of
        // this version reads the marker and tells.
        match self.sink.commit(&ctx, vec![message.clone()]).await? {
            CommitOutcome::Committed { version } => Ok(WriteOutcome::Written { table_version: version }),
            CommitOutcome::AlreadyCommitted(m) => {
                if let Err(cleanup) = self.sink.abort(&ctx, vec![message]).await {
                    tracing::warn!(app_id = %self.app_id, %version, error = %cleanup, "could not remove a skipped write's files");
                }
                self.skipped(m.batch_id, version)
            }
        }
    }

    /// A skip of a version the table holds; a refusal when it holds a later
    /// one (the id was reused, or its versions went back), unless older
    /// versions are skipped.
    fn skipped(&self, committed: BatchId, version: BatchId) -> Result<WriteOutcome> {
        if committed > version {
            if !self.skip_older {
                return Err(Error::Refused(Box::new(Refusal::VersionBehind {
                    app_id: self.app_id.clone(),
                    sink: self.sink.identity(),
                    version,
                    committed,
                })));
            }
            tracing::warn!(
                app_id = %self.app_id,
                %version,
                %committed,
                "the table holds a later version of this application id, so this one is skipped; if the versions started again (a new checkpoint), use a new application id"
            );
        }
        Ok(WriteOutcome::Skipped { committed })
    }

    async fn prepare(&self, schema: &SchemaRef) -> Result<()> {
        if let Err(reason) = self.sink.check_output_mode(self.mode) {
            return Err(Error::UnsupportedOutputMode {
                mode: self.mode,
                sink: self.sink.identity().to_string(),
                reason,
            });
        }
        self.sink
            .prepare(&QueryInfo {
                query_id: self.owner,
                query_name: self.app_id.clone(),
                output_mode: self.mode,
                schema: schema.clone(),
                key_columns: self.keys.clone(),
            })
            .await
    }

    /// Lets background work the table's sink started (log compaction,
    /// expiry) finish. Call it when the writer is no longer needed.
    pub async fn close(&self) -> Result<()> {
        self.sink.close(Close::Finish).await
    }
}
