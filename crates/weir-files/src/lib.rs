//! # weir-files: the file sink of weir
//!
//! [`FileSink`] writes each micro-batch of a weir streaming query as files
//! (Parquet or JSON lines) into a directory, exactly once, the way Spark's
//! file sink does, with the guards Spark lacks.
//!
//! ## Guarantees
//!
//! - **A file belongs to the output only once the log lists it.** A batch's
//!   writers put files with unique names (query id, batch id, attempt id)
//!   under `col=value/` directories; then the driver's commit writes
//!   `_weir_metadata/N`, listing every file of batch N with its size, rows
//!   and partition values, in one put-if-absent. A reader that follows the
//!   log ([`FileLog`]) sees all of a batch or none of it; a plain directory
//!   listing may also show files of failed attempts.
//! - **Exactly once.** Each entry records the query name and id. A replayed
//!   batch finds its entry and is skipped; two runs of one batch race for
//!   the entry and one wins; a write that reported an error is recognised
//!   by its attempt id.
//! - **Reset protection.** A log serves one query name. A checkpoint that
//!   was deleted or replaced, with the output kept, starts with another
//!   query id: the engine's guard refuses it with both ids and the safe
//!   choices (a new output path, or `take_over_output`, which continues
//!   after the log's last batch). A log of another query name is refused.
//! - **A bounded log.** Every `log_compact_interval` batches (default 10)
//!   the batch's entry is `N.compact`, listing every file so far, and the
//!   entries it makes redundant go. With `log_retention`, files of batches
//!   older than it leave the log at the next compaction: log-aware readers
//!   no longer see them, and they become orphans. A compaction holds the
//!   new entry in small blocks; a large one (the previous over 1 MiB) is
//!   written in parts to a staging object and copied into place if absent
//!   (put whole where the store cannot copy if absent, as S3 unless
//!   configured to), so the sink's memory does not follow the log's size.
//! - **Orphans** (files no entry lists) are listed and removed only past a
//!   grace period ([`FileLog::orphans`], [`FileLog::remove_orphans`]).
//!
//! Output mode: Append.
//!
//! ## Example
//!
//! Payments as Parquet files under `out/payments`, then read back through
//! the log, which lists only the files of committed batches:
//!
//! ```no_run
//! use weir_core::prelude::*;
//! use weir_files::{FileLog, FileSink};
//!
//! # async fn run() -> Result<(), BoxError> {
//! let sink = FileSink::try_new("out/payments")?; // a directory, or s3://bucket/prefix
//! let query = read_stream(RateSource::rows_per_batch(1_000))
//!     .write_stream()
//!     .query_name("payments-files")
//!     .checkpoint_location("chk/payments-files")
//!     .trigger(Trigger::Once)
//!     .start(sink)
//!     .await?;
//! query.await_termination().await?;
//! let batches = FileLog::open("out/payments", &Default::default())?.read().await?;
//! # Ok(())
//! # }
//! ```

mod compact_entry;
mod error;
mod log;
mod reader;
mod sink;
mod store;
mod writer;

pub use error::FileSinkError;
pub use log::{EntryHeader, FileEntry, LogEntry, MetadataLog, LOG_DIR};
pub use reader::{FileLog, Orphan};
pub use sink::{FileSink, FileSinkOptions};
pub use writer::FileFormat;
