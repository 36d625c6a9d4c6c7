//! Following a table's log entry by entry: the latest version read and a
//! digest of its entry, so a log replaced under the reader (the table
//! deleted and created again) is noticed rather than read on. The sink's
//! marker cache and compaction's commits both follow the log with it.

use bytes::Bytes;
use deltalake::logstore::LogStore;
use deltalake::DeltaTableError;

/// A position in a table's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogCursor {
    version: u64,
    /// The digest of entry `version`, once read or written (a cursor placed
    /// at a loaded table's version takes the entry it first reads).
    digest: Option<u64>,
}

fn digest(bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

impl LogCursor {
    /// At `version`, whose entry is not read yet.
    pub(crate) fn at(version: u64) -> Self {
        LogCursor { version, digest: None }
    }

    /// The latest version read.
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// Whether entry `version` is still the one read (or, if none was read
    /// yet, exists: it is taken as the one).
    pub(crate) async fn still_there(&mut self, log_store: &dyn LogStore) -> Result<bool, DeltaTableError> {
        match log_store.read_commit_entry(self.version).await? {
            None => Ok(false),
            Some(bytes) if self.digest.is_some_and(|d| d != digest(&bytes)) => Ok(false),
            Some(bytes) => {
                self.digest = Some(digest(&bytes));
                Ok(true)
            }
        }
    }

    /// The next entry, if it exists yet; the cursor moves onto it.
    pub(crate) async fn next(&mut self, log_store: &dyn LogStore) -> Result<Option<Bytes>, DeltaTableError> {
        let Some(bytes) = log_store.read_commit_entry(self.version + 1).await? else {
            return Ok(None);
        };
        self.wrote(&bytes);
        Ok(Some(bytes))
    }

    /// Moves onto `entry`, the next version, which this process wrote.
    pub(crate) fn wrote(&mut self, entry: &[u8]) {
        self.version += 1;
        self.digest = Some(digest(entry));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_moves_one_entry_at_a_time_and_remembers_it() {
        let mut cursor = LogCursor::at(4);
        assert_eq!(cursor.version(), 4);
        cursor.wrote(b"{\"add\":{}}");
        assert_eq!(cursor.version(), 5);
        let mut same = LogCursor::at(4);
        same.wrote(b"{\"add\":{}}");
        assert_eq!(cursor, same);
        let mut other = LogCursor::at(4);
        other.wrote(b"{\"remove\":{}}");
        assert_ne!(cursor, other, "another entry at the same version is told apart");
    }
}
