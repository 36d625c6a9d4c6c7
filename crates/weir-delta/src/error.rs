//! The error type of weir-delta.

use deltalake::kernel::transaction::TransactionError;
use deltalake::DeltaTableError;
use weir_core::BatchId;

/// What can go wrong in the Delta sink. Every variant names the table.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeltaSinkError {
    /// The location is not a path or URL weir can open.
    #[error("invalid Delta table location {location:?}: {reason}")]
    Location { location: String, reason: String },

    /// deltalake failed to read or commit the table.
    #[error("Delta table {table}: {source}")]
    Delta {
        table: String,
        #[source]
        source: DeltaTableError,
    },

    /// A data file could not be written, read or deleted.
    #[error("Delta table {table}: data file {path}: {source}")]
    Store {
        table: String,
        path: String,
        #[source]
        source: object_store::Error,
    },

    /// A data file written straight to the table's local directory could
    /// not be created or read back.
    #[error("Delta table {table}: data file {path} on the local disk: {source}")]
    Disk {
        table: String,
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// A log checkpoint could not be written; the log stays whole without it.
    #[error("Delta table {table}: the log checkpoint of version {version} was not written: {source}. Every commit stands; the log is only slower to read until a checkpoint is written")]
    LogCheckpoint {
        table: String,
        version: u64,
        #[source]
        source: Box<LogCheckpointError>,
    },

    /// Rows could not be encoded as Parquet.
    #[error("Delta table {table}: cannot encode Parquet for {path}: {source}")]
    Parquet {
        table: String,
        path: String,
        #[source]
        source: parquet::errors::ParquetError,
    },

    /// A data file the sink reads back cannot be read as Parquet rows.
    #[error("Delta table {table}: cannot read data file {path}: {source}. Nothing of the batch was committed")]
    Unreadable {
        table: String,
        path: String,
        #[source]
        source: parquet::errors::ParquetError,
    },

    /// Update mode: the batch holds two rows of one group, so the table
    /// would hold both.
    #[error("Delta table {table}: the batch has {rows} rows but {groups} groups by the key columns {columns:?}; in Update mode each group's row replaces the table's, so a step after the aggregation must not change the key columns' values. Nothing of the batch was committed")]
    DuplicateGroup {
        table: String,
        columns: Vec<String>,
        rows: usize,
        groups: usize,
    },

    /// The stream's rows do not fit the table's schema.
    #[error("Delta table {table}: the stream's schema does not match the table's: {differences}. Nothing was written; set merge_schema to add new nullable columns, or write to another table")]
    SchemaMismatch { table: String, differences: String },

    /// A partition column cannot be used.
    #[error("Delta table {table}: partition column {column:?}: {reason}")]
    Partition {
        table: String,
        column: String,
        reason: String,
    },

    /// The table uses a feature this sink does not write.
    #[error("Delta table {table} uses {feature}, which weir's Delta sink does not write; nothing was written")]
    Unsupported { table: String, feature: String },

    /// Other writers kept winning the commit race.
    #[error("Delta table {table}: batch {batch_id} lost {attempts} commit races in a row to other writers; nothing of it was committed and a restart retries it")]
    TooManyConflicts {
        table: String,
        batch_id: BatchId,
        attempts: usize,
    },

    /// A maintenance job kept losing the commit race to other writers.
    #[error("Delta table {table}: {operation} lost {attempts} commit races in a row to other writers; nothing more of it was committed, run it again")]
    Busy {
        table: String,
        operation: String,
        attempts: usize,
    },

    /// Two live files' paths are spelled apart in the log but decode to one
    /// path, so a removal of one cannot be told from a removal of the other.
    #[error("Delta table {table}: two live files, {first} and {second}, have the same path decoded; a commit that removes files (compaction, Complete or Update mode) cannot tell their removals apart, and nothing was changed")]
    SamePathDecoded {
        table: String,
        first: String,
        second: String,
    },

    /// A compaction stopped before committing some of its groups.
    #[error("Delta table {table}: compaction stopped: {reason}. Groups it committed before stay and rows are never changed by it; run it again")]
    CompactionStopped { table: String, reason: String },

    /// The table was replaced (a new metadata id) while the query ran.
    #[error("Delta table {table} was replaced while the query ran (metadata id {expected} is now {found}); nothing of the batch was committed. Restart the query: its start-up guards decide whether the new table may be written")]
    TableReplaced {
        table: String,
        expected: String,
        found: String,
    },

    /// Another writer changed the table, while the query ran, in a way the
    /// batch's written files do not fit.
    #[error("Delta table {table}: another writer changed it while the query ran: {change}. Nothing of the batch was committed; a restart writes it again with the table's new layout")]
    TableChanged { table: String, change: String },

    /// Other writers kept changing the table's metadata while the sink
    /// reloaded it.
    #[error("Delta table {table}: other writers changed its metadata {reloads} times in a row while weir reloaded it; nothing of the batch was committed and a restart retries it")]
    Unsettled { table: String, reloads: usize },

    /// Update mode on rows that do not say which group they replace.
    #[error("Delta table {table}: Update mode replaces each group's row by the group's key (an aggregation's window start and grouping columns), and the rows reaching the sink have none: the query does not aggregate, or a step after the aggregation dropped or renamed a key column. Keep those columns, or use Append or Complete. Nothing was written")]
    NoUpdateKey { table: String },

    /// The sink was used before the driver prepared it.
    #[error("Delta table {table}: the sink was used before prepare; start it through a streaming query")]
    NotPrepared { table: String },
}

impl DeltaSinkError {
    /// Whether trying again may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            DeltaSinkError::TooManyConflicts { .. }
            | DeltaSinkError::Unsettled { .. }
            | DeltaSinkError::Busy { .. } => true,
            DeltaSinkError::Store { source, .. } => transient(source),
            DeltaSinkError::Disk { source, .. } => weir_core::permanent_io_kind(source).is_none(),
            DeltaSinkError::LogCheckpoint { source, .. } => source.retryable(),
            DeltaSinkError::Delta { source, .. } => match source {
                DeltaTableError::ObjectStore { source } => transient(source),
                DeltaTableError::Io { source } => weir_core::permanent_io_kind(source).is_none(),
                DeltaTableError::VersionAlreadyExists(_) => true,
                DeltaTableError::KernelError(e) => kernel_transient(e),
                DeltaTableError::Transaction { source } => matches!(
                    source,
                    TransactionError::MaxCommitAttempts(_)
                        | TransactionError::VersionAlreadyExists(_)
                        | TransactionError::CommitConflict(_)
                        | TransactionError::ObjectStore { .. }
                ),
                _ => false,
            },
            _ => false,
        }
    }

    pub(crate) fn into_core(self, batch_id: Option<BatchId>) -> weir_core::Error {
        let retryable = self.retryable();
        weir_core::Error::sink("delta", batch_id, retryable, self)
    }
}

/// Whether an object store error may pass on a retry.
pub(crate) use weir_core::store_error_may_pass as transient;

/// Whether a kernel error is a store's transient failure (the log read
/// while a table loads goes through the kernel), however it is wrapped.
pub(crate) fn kernel_transient(e: &buoyant_kernel::Error) -> bool {
    use buoyant_kernel::Error as Kernel;
    let store = |e: &(dyn std::error::Error + 'static)| e.downcast_ref::<object_store::Error>().is_some_and(transient);
    match e {
        Kernel::Backtraced { source, .. } => kernel_transient(source),
        Kernel::ObjectStore(e) => transient(e),
        Kernel::IOError(e) => weir_core::permanent_io_kind(e).is_none(),
        Kernel::GenericError { source } => store(source.as_ref()),
        Kernel::Parquet(parquet::errors::ParquetError::External(e)) => store(e.as_ref()),
        _ => false,
    }
}

impl From<DeltaSinkError> for weir_core::Error {
    fn from(e: DeltaSinkError) -> Self {
        e.into_core(None)
    }
}

/// Why a log checkpoint was not written. The commits it would summarise
/// stand either way: a log without its checkpoint is whole, only slower to
/// read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogCheckpointError {
    /// The table's location could not be resolved.
    #[error("locating the log: {0}")]
    Delta(#[from] deltalake::DeltaTableError),
    /// The kernel could not read the log or reconcile its actions.
    #[error("reading the log: {0}")]
    Kernel(#[from] buoyant_kernel::Error),
    /// The actions could not be encoded as Parquet.
    #[error("encoding the checkpoint: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    /// The checkpoint file could not be written or read back.
    #[error("storing the checkpoint: {0}")]
    Store(#[from] object_store::Error),
    /// The writer stopped before it finished: cancelled as the runtime
    /// shut down, or a panic.
    #[error("the checkpoint writer stopped: {0}")]
    Stopped(#[from] tokio::task::JoinError),
    /// The query stopped while the checkpoint was being written; nothing
    /// of it is visible, and a later one does the work.
    #[error("the query stopped before the checkpoint was finished; none was written")]
    Cancelled,
    /// The kernel's replay gave no actions to write.
    #[error("the log replay gave no actions")]
    Empty,
}

impl LogCheckpointError {
    /// Whether writing it again may succeed: a store's transient failure,
    /// however deep it is wrapped, or a cancelled writer.
    pub fn retryable(&self) -> bool {
        match self {
            LogCheckpointError::Store(e) => transient(e),
            LogCheckpointError::Delta(deltalake::DeltaTableError::ObjectStore { source }) => transient(source),
            LogCheckpointError::Kernel(e) => kernel_transient(e),
            LogCheckpointError::Parquet(parquet::errors::ParquetError::External(e)) => {
                e.downcast_ref::<object_store::Error>().is_some_and(transient)
            }
            LogCheckpointError::Stopped(e) => e.is_cancelled(),
            LogCheckpointError::Cancelled => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Error as IoError, ErrorKind};

    use super::*;

    fn local(kind: ErrorKind) -> object_store::Error {
        object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(IoError::from(kind)),
        }
    }

    #[test]
    fn a_full_disk_is_not_retryable_and_a_timeout_is() {
        assert!(!transient(&local(ErrorKind::StorageFull)));
        assert!(!transient(&local(ErrorKind::ReadOnlyFilesystem)));
        assert!(transient(&local(ErrorKind::TimedOut)));
        let disk = |kind| DeltaSinkError::Disk {
            table: "t".into(),
            path: "part-0.parquet".into(),
            source: IoError::from(kind),
        };
        assert!(!disk(ErrorKind::StorageFull).retryable());
        assert!(disk(ErrorKind::Interrupted).retryable());
        let delta_io = DeltaSinkError::Delta {
            table: "t".into(),
            source: DeltaTableError::Io {
                source: IoError::from(ErrorKind::StorageFull),
            },
        };
        assert!(!delta_io.retryable());
    }

    /// A table load reads the log through the kernel: a store's timeout
    /// there is worth a retry, however the kernel wraps it; a missing file
    /// or a bad log is not.
    #[test]
    fn a_store_timeout_inside_a_kernel_error_is_retryable() {
        let kernel = |e: buoyant_kernel::Error| DeltaSinkError::Delta {
            table: "t".into(),
            source: DeltaTableError::KernelError(e),
        };
        let timeout = || local(ErrorKind::TimedOut);
        assert!(kernel(buoyant_kernel::Error::ObjectStore(timeout())).retryable());
        assert!(kernel(buoyant_kernel::Error::GenericError {
            source: Box::new(timeout())
        })
        .retryable());
        assert!(kernel(buoyant_kernel::Error::ObjectStore(timeout()).with_backtrace()).retryable());
        assert!(!kernel(buoyant_kernel::Error::ObjectStore(local(ErrorKind::StorageFull))).retryable());
        assert!(!kernel(buoyant_kernel::Error::generic("a malformed entry")).retryable());
    }
}
