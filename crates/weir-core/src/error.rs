//! The error type of weir-core.

use std::path::PathBuf;

use arrow_schema::ArrowError;

use crate::checkpoint::lease_loss::LeaseLoss;
use crate::crash::point::CrashPoint;
use crate::ids::{BatchId, InvalidQueryName, QueryId, QueryName};
use crate::operator::query_rule::QueryRule;
use crate::protocol::Refusal;
use crate::sink::mode::{ModeRefusal, OutputMode};

/// A boxed error from a source, a sink or a user function.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The result type of weir-core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine. Each variant names the
/// checkpoint, batch, file or sink involved; [`Error::retryable`] says whether
/// trying again can help.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading or writing a checkpoint file failed. The query stops where
    /// it was; the checkpoint's protocol makes that safe at every step.
    #[error("checkpoint {location}: cannot access {path}: {source} (nothing is lost or repeated: a restart resumes from what the checkpoint holds)")]
    CheckpointIo {
        location: String,
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// Reading or writing a checkpoint file on object storage failed, once
    /// the store's own retries were spent. As for a local file, stopping
    /// there is safe.
    #[error("checkpoint {location}: cannot access {path}: {source} (nothing is lost or repeated: a restart resumes from what the checkpoint holds)")]
    CheckpointStore {
        location: String,
        path: String,
        #[source]
        source: object_store::Error,
    },

    /// This run lost the checkpoint's lease (invariant I5): it writes
    /// nothing more to the checkpoint.
    #[error("checkpoint {location}: this run's lease (epoch {epoch}) {loss}, so {path} was not written. Batches recorded before stand, and a restart replays the rest exactly once")]
    LeaseLost {
        location: String,
        path: String,
        epoch: u64,
        loss: LeaseLoss,
    },

    /// A checkpoint file exists but cannot be understood.
    #[error("checkpoint {location}: {path} is corrupt: {reason}. Nothing was written; inspect or restore the checkpoint before restarting")]
    CorruptCheckpoint {
        location: String,
        path: String,
        reason: String,
    },

    /// A checkpoint file was written by a newer weir.
    #[error("checkpoint {location}: {path} has format version {found}, this weir reads up to {supported}; upgrade weir to run this query")]
    UnsupportedCheckpointVersion {
        location: String,
        path: String,
        found: u32,
        supported: u32,
    },

    /// Another running query holds the checkpoint's lease (invariant I5).
    #[error("checkpoint {location} is in use by another running query ({owner}); stop it first, or give this query its own checkpoint")]
    CheckpointInUse { location: String, owner: String },

    /// The checkpoint was created for another query name.
    #[error("checkpoint {location} belongs to query {recorded:?}, not {requested:?}; use the recorded name or a new checkpoint")]
    QueryNameChanged {
        location: String,
        recorded: QueryName,
        requested: QueryName,
    },

    /// Another run of the same query id worked on the same batch at the same
    /// time: this run stopped, the other one keeps the batch.
    #[error("query {query_id}, batch {batch_id}: {detail}. Run one copy of a query at a time")]
    ConcurrentRun {
        query_id: QueryId,
        batch_id: BatchId,
        detail: String,
    },

    /// A start-up or commit guard refused to go on (invariants I4, I4b, I6).
    #[error(transparent)]
    Refused(Box<Refusal>),

    /// A source failed. `retryable` says whether reading again can help
    /// (a broker that did not answer in time) or not (data that is gone).
    #[error("source {source_name}: {source}")]
    Source {
        source_name: String,
        retryable: bool,
        #[source]
        source: BoxError,
    },

    /// A file of the file source cannot be read or parsed.
    #[error("source file {}: {reason}. The batch was not committed; restore the file as it was when the batch was planned (a replay reads exactly the planned files) and restart", path.display())]
    SourceFile { path: PathBuf, reason: String },

    /// The query's transformation failed on a batch.
    #[error("transformation failed in batch {batch_id}: {source}")]
    Transform {
        batch_id: BatchId,
        #[source]
        source: BoxError,
    },

    /// Rows do not have the schema the query or sink expects.
    #[error("schema mismatch in {context}: expected {expected}, found {found}")]
    SchemaMismatch {
        context: String,
        expected: String,
        found: String,
    },

    /// An Arrow operation failed.
    #[error("{context}: {source}")]
    Arrow {
        context: String,
        #[source]
        source: ArrowError,
    },

    /// A sink failed. The batch was not recorded as committed; a restart
    /// replays it and the sink's marker keeps it exactly once.
    #[error("sink {sink}{}: {source}. The batch is not recorded as committed; restarting the query replays it, and the sink's marker keeps it exactly once", batch_id.map(|b| format!(", batch {b}")).unwrap_or_default())]
    Sink {
        sink: String,
        batch_id: Option<BatchId>,
        retryable: bool,
        #[source]
        source: BoxError,
    },

    /// The sink cannot run the query in this output mode.
    #[error("output mode {mode} is not supported by sink {sink}: {reason}")]
    UnsupportedOutputMode {
        mode: OutputMode,
        sink: String,
        reason: ModeRefusal,
    },

    /// The query breaks a rule of stateful queries (in this output mode).
    #[error("this query cannot run in {mode} mode: {rule}")]
    UnsupportedQuery { mode: OutputMode, rule: QueryRule },

    /// The checkpoint holds state the query's operators cannot take over.
    #[error("checkpoint {location}: {reason}. Nothing was written; start the query on a new checkpoint, or restore the query as it was")]
    StateChanged { location: String, reason: String },

    /// An option of the query is missing or invalid.
    #[error("invalid option {option}: {reason}")]
    InvalidOption { option: &'static str, reason: String },

    /// A query name is not valid.
    #[error(transparent)]
    InvalidQueryName(#[from] InvalidQueryName),

    /// The query ended with an error that an earlier call already returned
    /// (the error went to that caller): its message and its judgement.
    #[error("query {query_name} failed: {message}")]
    QueryFailed {
        query_name: QueryName,
        message: String,
        retryable: bool,
    },

    /// The query's task panicked or was cancelled. What it committed
    /// stands; a restart resumes from the checkpoint.
    #[error("query {query_name} ended abnormally: {source}. Batches it committed stand; restarting the query resumes from its checkpoint")]
    QueryAborted {
        query_name: QueryName,
        #[source]
        source: tokio::task::JoinError,
    },

    /// A crash point armed by a test fired.
    #[error("injected crash at {point} in batch {batch_id}")]
    InjectedCrash { point: CrashPoint, batch_id: BatchId },
}

impl From<Refusal> for Error {
    fn from(refusal: Refusal) -> Self {
        Error::Refused(Box::new(refusal))
    }
}

impl Error {
    /// The guard's refusal, if this is one.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            Error::Refused(r) => Some(r),
            _ => None,
        }
    }

    /// Whether trying the same operation again may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            Error::CheckpointIo { source, .. } => permanent_io_kind(source).is_none(),
            Error::CheckpointStore { source, .. } => {
                matches!(
                    source,
                    object_store::Error::Generic { .. } | object_store::Error::JoinError { .. }
                )
            }
            Error::LeaseLost { loss, .. } => loss.retryable(),
            Error::Sink { retryable, .. } | Error::Source { retryable, .. } | Error::QueryFailed { retryable, .. } => {
                *retryable
            }
            Error::Transform { source, .. } => source.downcast_ref::<Transient>().is_some(),
            _ => false,
        }
    }

    /// Wraps a sink's own error.
    pub fn sink(
        sink: impl Into<String>,
        batch_id: Option<BatchId>,
        retryable: bool,
        source: impl Into<BoxError>,
    ) -> Self {
        Error::Sink {
            sink: sink.into(),
            batch_id,
            retryable,
            source: source.into(),
        }
    }

    /// Wraps a source's own error.
    pub fn source(source_name: impl Into<String>, retryable: bool, source: impl Into<BoxError>) -> Self {
        Error::Source {
            source_name: source_name.into(),
            retryable,
            source: source.into(),
        }
    }

    pub(crate) fn arrow(context: impl Into<String>, source: ArrowError) -> Self {
        Error::Arrow {
            context: context.into(),
            source,
        }
    }
}

/// Whether an object store's error may pass on a retry (a timeout, a reset
/// connection, a server's 5xx): not a missing object, a malformed path, a
/// call or a condition the store refuses, a refused credential, nor a local
/// store's disk that is full or read-only ([`permanent_io_kind`]). The table
/// stores of every format judge their failures with this.
pub fn store_error_may_pass(e: &object_store::Error) -> bool {
    use object_store::Error as E;
    !matches!(
        e,
        E::NotFound { .. }
            | E::InvalidPath { .. }
            | E::NotSupported { .. }
            | E::AlreadyExists { .. }
            | E::Precondition { .. }
            | E::NotModified { .. }
            | E::NotImplemented { .. }
            | E::PermissionDenied { .. }
            | E::Unauthenticated { .. }
            | E::UnknownConfigurationKey { .. }
    ) && permanent_io_kind(e).is_none()
}

/// The kind of the first I/O error in `error`'s chain of causes (the error
/// itself included) that trying again cannot mend: a full disk or quota, a
/// read-only or missing file system, a refused permission, a missing file,
/// malformed input. `None` when the chain holds no such error, so a timeout,
/// a reset connection or an error of another kind stays retryable.
///
/// Every crate judges an I/O failure it wraps (a local spool file, a local
/// object store's `Generic` error) with this, so a full disk is reported as
/// not retryable wherever it happens.
pub fn permanent_io_kind(error: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    use std::io::ErrorKind as K;
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            let kind = io.kind();
            let permanent = matches!(
                kind,
                K::NotFound
                    | K::PermissionDenied
                    | K::InvalidInput
                    | K::InvalidData
                    | K::Unsupported
                    | K::StorageFull
                    | K::QuotaExceeded
                    | K::ReadOnlyFilesystem
                    | K::FileTooLarge
                    | K::NotADirectory
                    | K::IsADirectory
                    | K::DirectoryNotEmpty
                    | K::InvalidFilename
                    | K::TooManyLinks
                    | K::CrossesDevices
                    | K::OutOfMemory
            );
            if permanent {
                return Some(kind);
            }
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use std::io::{Error as IoError, ErrorKind};

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("writing a file")]
    struct Wrapper(#[source] IoError);

    #[test]
    fn a_full_disk_is_permanent_and_a_timeout_is_not() {
        let full = IoError::from(ErrorKind::StorageFull);
        assert_eq!(permanent_io_kind(&full), Some(ErrorKind::StorageFull));
        assert_eq!(
            permanent_io_kind(&Wrapper(IoError::from(ErrorKind::ReadOnlyFilesystem))),
            Some(ErrorKind::ReadOnlyFilesystem)
        );
        assert_eq!(permanent_io_kind(&Wrapper(IoError::from(ErrorKind::TimedOut))), None);
        // An error of another kind wrapping a permanent one is judged by it.
        let wrapped = IoError::other(Wrapper(IoError::from(ErrorKind::PermissionDenied)));
        assert_eq!(permanent_io_kind(&wrapped), Some(ErrorKind::PermissionDenied));
        let other = arrow_schema::ArrowError::ComputeError("no I/O here".into());
        assert_eq!(permanent_io_kind(&other), None);
    }

    #[test]
    fn a_store_error_may_pass_unless_a_retry_cannot_mend_it() {
        let generic = |source: BoxError| object_store::Error::Generic { store: "s", source };
        assert!(store_error_may_pass(&generic("connection reset".into())));
        assert!(store_error_may_pass(&generic(Box::new(IoError::from(
            ErrorKind::TimedOut
        )))));
        assert!(!store_error_may_pass(&generic(Box::new(IoError::from(
            ErrorKind::StorageFull
        )))));
        let path = "p".to_string();
        assert!(!store_error_may_pass(&object_store::Error::NotFound {
            path: path.clone(),
            source: "gone".into()
        }));
        assert!(!store_error_may_pass(&object_store::Error::Precondition {
            path,
            source: "etag".into()
        }));
    }

    #[test]
    fn a_checkpoint_on_a_full_disk_is_not_retryable() {
        let io = |kind| Error::CheckpointIo {
            location: "/chk".into(),
            path: "offsets/3".into(),
            source: IoError::from(kind),
        };
        assert!(!io(ErrorKind::StorageFull).retryable());
        assert!(!io(ErrorKind::PermissionDenied).retryable());
        assert!(io(ErrorKind::Interrupted).retryable());
        assert!(io(ErrorKind::TimedOut).retryable());
        let message = io(ErrorKind::StorageFull).to_string();
        assert!(
            message.contains("offsets/3") && message.contains("a restart resumes"),
            "the message names the file and what is safe: {message}"
        );
    }
}

/// A transformation's error that trying again may mend (a table it reads
/// did not answer): [`Error::retryable`] is true for a transformation that
/// fails with one. Make it with [`transient`].
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct Transient(BoxError);

/// Marks a transformation's error as one that trying again may mend.
pub fn transient(error: impl Into<BoxError>) -> BoxError {
    Box::new(Transient(error.into()))
}
