//! # weir-delta: the Delta Lake sink of weir
//!
//! [`DeltaSink`] writes each micro-batch of a weir streaming query into a
//! Delta table exactly once.
//!
//! ## Guarantees
//!
//! - **One atomic commit per batch.** Writers put Parquet files (named with
//!   the query id, batch id and a per-attempt uuid) straight into the table
//!   directory, where no reader sees them; the batch's single Delta commit
//!   adds them together with `txn {appId: <query name>, version: <batch id>}`
//!   and `txn {appId: <query name>@<query id>, ...}`, and a commit info
//!   `STREAMING UPDATE` naming the query. A reader sees all of a batch or
//!   none of it.
//! - **Exactly once.** An append commits by writing log entry V+1 with a
//!   put-if-absent, V being the latest version. The sink knows V by reading
//!   only the entries after the one it last read (one read each, until the
//!   first that does not exist; the log is listed again only when that
//!   knowledge is older than 15 minutes or half the log retention), and
//!   checks the query's `txn` marker on exactly those entries. A writer that
//!   takes V+1 first is read, and the batch retried on top of it; a
//!   concurrent run of the same query that committed the batch is found
//!   that way, and the batch is in the table once. Complete mode, a commit
//!   that adds columns, and log stores without conditional put commit
//!   through deltalake's transaction, whose conflict checker fences a
//!   concurrent run by the same `txn` app id.
//! - **Other writers** (other queries, compaction, other engines) are
//!   followed, not failed. A metadata or protocol change read in their
//!   entries reloads the table: a new nullable column is taken in stride,
//!   a new partitioning fails the batch before anything of it is committed.
//! - **Guards.** The marker carries the query name, so a deleted and
//!   recreated checkpoint, an old copy of one, or a restored table is caught
//!   by weir-core's start-up guards; the table's metadata id is part of the
//!   sink's identity.
//! - **Empty batches** commit only the `txn`, so a restart resumes after them.
//! - **Log health.** A log checkpoint every `delta.checkpointInterval`
//!   commits (default 100), then expired-log cleanup; with commits that
//!   never list the log, commit time does not grow with the table's history.
//!   The sink writes the checkpoint in the background: no batch waits for
//!   it, one is written at a time (a newer one due while it runs follows
//!   it, an older waiting one is skipped), a query's finish waits for it,
//!   and a stop cuts it short at its next row group. A checkpoint cut short
//!   is never visible; a checkpoint of a fixed version is the same whatever
//!   commits after it, so writing it beside commits is safe.
//!   The checkpoint is written in row groups of at most 1 MiB through a
//!   5 MiB upload buffer, and read back a row group at a time, so its
//!   memory is bounded but for the replay's set of live file paths.
//! - **A local log listed while another writer commits** (a background
//!   compaction, a second query) is listed again if it skipped a commit,
//!   rather than refused as broken.
//! - **Files are never deleted after a commit attempt whose outcome is
//!   unknown**; only files of attempts known not to have committed are.
//!   Each commit info carries its attempt id, so a race lost to this
//!   attempt's own retried write is recognised as a commit.
//! - **A log checkpoint that fails after the commit landed is logged, not
//!   reported as a failed commit**; expired-log cleanup runs after each log
//!   checkpoint only, so commits do not list the whole log.
//! - **Refused up front**: a protocol deltalake cannot write without its
//!   SQL engine (CHECK constraints, generated and identity columns, row
//!   tracking, in-commit timestamps), invariants, column mapping,
//!   `delta.setTransactionRetentionDuration`
//!   (it would expire the marker), Complete mode on an append-only table,
//!   unsigned and nanosecond columns; a table replaced while the query runs
//!   stops it.
//!
//! ## Maintenance
//!
//! - [`Compact`] rewrites small files into files of the target size, one
//!   partition's group at a time, in commits of `remove`s and `add`s with
//!   `dataChange=false` (so streaming readers skip them). Its commits are
//!   log entries of its own, written with a put-if-absent and rebased over
//!   whatever other writers committed meanwhile: appends never fail it, a
//!   group whose input another writer removed is dropped, and nothing is
//!   committed on a view that is no longer true. Each `remove` names its
//!   file exactly as the log's `add` did. Rewrites run on threads of the
//!   job's own; memory is bounded by the rewrites at once, not the table.
//! - [`Vacuum`] deletes files no version within the retention needs, never
//!   a file the plan cannot tell apart from a live or recently removed one
//!   (tables with deletion vectors are refused);
//!   [`checkpoint_log`] writes a log checkpoint on demand.
//!
//! Output modes: Append; Complete (one commit removes every current file
//! and adds the batch's); Update (one commit removes the files holding the
//! batch's groups, by the aggregation's key, and adds them rewritten
//! without those rows beside the batch's: copy-on-write, no deletion
//! vectors, each group once). Schema: the stream must match the table (names and
//! types); with `merge_schema`, new nullable columns are added in the commit
//! of the first batch that has them. Column mapping is not supported.
//!
//! ## Example
//!
//! A stream of payments into a Delta table in a directory, exactly once
//! (tables by name, through a catalog, are the `weir` crate's `to_table`):
//!
//! ```no_run
//! use std::time::Duration;
//! use weir_core::prelude::*;
//! use weir_delta::DeltaSink;
//!
//! # async fn run() -> Result<(), BoxError> {
//! let sink = DeltaSink::try_new("lake/bronze/payments")? // a directory, or s3://bucket/prefix
//!     .with_target_file_size(128 << 20);
//! let query = read_stream(RateSource::rows_per_second(1_000))
//!     .write_stream()
//!     .query_name("payments-bronze") // the table's `txn` app id
//!     .checkpoint_location("chk/payments-bronze")
//!     .trigger(Trigger::processing_time(Duration::from_secs(10)))
//!     .start(sink)
//!     .await?;
//! query.await_termination().await?;
//! # Ok(())
//! # }
//! ```

mod compact;
mod data_file;
mod describe;
mod engine;
mod entry;
mod error;
mod log_checkpoint;
mod log_cursor;
mod maintenance;
mod marker;
mod open_file;
mod options;
mod protocol;
mod read;
mod sink;
mod stats;
mod table;
mod writer;

pub use compact::Compact;
pub use describe::{describe, history, DeltaCommit, DeltaQueryMarker, DeltaTableSummary};
pub use error::{DeltaSinkError, LogCheckpointError};
pub use maintenance::{checkpoint_log, LogReport, Vacuum, VacuumReport, DEFAULT_VACUUM_RETENTION};
pub use options::{Compression, DeltaSinkOptions};
pub use read::{latest_version, read_rows, table_schema, TableRows};
pub use sink::DeltaSink;
pub use weir_core::maintenance::{CompactGroup, CompactOptions, CompactProgress, CompactReport};
