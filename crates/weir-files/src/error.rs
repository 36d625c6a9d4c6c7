//! The error type of weir-files.

use weir_core::BatchId;

/// What can go wrong in the file sink and its log. Every variant names the
/// output directory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileSinkError {
    /// The location is not a path or URL weir can open.
    #[error("invalid output location {location:?}: {reason}")]
    Location { location: String, reason: String },

    /// The store failed to read, write, list or delete.
    #[error("output {location}: {path}: {source}")]
    Store {
        location: String,
        path: String,
        #[source]
        source: object_store::Error,
    },

    /// Rows could not be encoded.
    #[error("output {location}: cannot encode {path}: {reason}")]
    Encode {
        location: String,
        path: String,
        reason: String,
    },

    /// A log entry is not one weir can read.
    #[error("output {location}: metadata log entry {path} is unreadable: {reason}. The log was not written by this version of weir or was damaged; nothing was changed")]
    BadEntry {
        location: String,
        path: String,
        reason: String,
    },

    /// An entry the log listed was cleaned up before it was read, again and
    /// again.
    #[error("output {location}: log entry {path} was listed but removed before it could be read (a compaction cleaned it up); read the log again")]
    EntryVanished { location: String, path: String },

    /// The batch's entry exists, yet the log's latest entry does not show
    /// the batch.
    #[error("output {location}: the log entry of batch {batch_id} exists but the log's latest entry is older; the log was changed by hand or damaged. This attempt's files are orphans; nothing of it is listed")]
    LogConflict { location: String, batch_id: BatchId },

    /// The log belongs to another query name.
    #[error("output {location} holds the metadata log of query {owner:?} (up to batch {batch_id}), not of {name:?}; a log serves one query name, so take_over_output does not apply. Write to another output path, or run the query under the name {owner:?} if it is the same query")]
    OtherQuery {
        location: String,
        owner: String,
        name: String,
        batch_id: BatchId,
    },

    /// The stream's rows cannot be written as asked.
    #[error("output {location}: {reason}; nothing was written")]
    Unsupported { location: String, reason: String },
}

impl FileSinkError {
    /// Whether trying again may succeed: not for a missing object or a
    /// refused credential, nor for a local disk that is full or read-only.
    pub fn retryable(&self) -> bool {
        match self {
            FileSinkError::Store { source, .. } => {
                !matches!(
                    source,
                    object_store::Error::NotFound { .. }
                        | object_store::Error::PermissionDenied { .. }
                        | object_store::Error::Unauthenticated { .. }
                        | object_store::Error::InvalidPath { .. }
                        | object_store::Error::NotSupported { .. }
                ) && weir_core::permanent_io_kind(source).is_none()
            }
            _ => false,
        }
    }

    pub(crate) fn into_core(self, batch_id: Option<BatchId>) -> weir_core::Error {
        let retryable = self.retryable();
        weir_core::Error::sink("files", batch_id, retryable, self)
    }
}

impl From<FileSinkError> for weir_core::Error {
    fn from(e: FileSinkError) -> Self {
        e.into_core(None)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Error as IoError, ErrorKind};

    use super::*;

    #[test]
    fn a_full_local_disk_is_not_retryable() {
        let store = |kind| FileSinkError::Store {
            location: "/out".into(),
            path: "part-0.parquet".into(),
            source: object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(IoError::from(kind)),
            },
        };
        assert!(!store(ErrorKind::StorageFull).retryable());
        assert!(store(ErrorKind::ConnectionReset).retryable());
    }
}
