//! The metadata log: `_weir_metadata/N` lists every file batch N added, and
//! a file belongs to the output only once an entry lists it.
//!
//! An entry is text: `v1`, a header line (JSON: query name and id, batch id,
//! commit time), then one JSON line per file. Each batch claims its entry
//! `N` with a put-if-absent: that is the commit. Every `compact_interval`-th
//! batch then also gets `N.compact`, derived from the log, listing every
//! file of every batch up to N (less those past the retention), so a reader
//! reads one compact entry and the few after it, never thousands of small
//! ones. Entries a newer compact entry makes redundant are deleted once
//! they are older than [`CLEANUP_DELAY`], so a reader that listed the log a
//! moment ago still finds what it listed.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use weir_core::BatchId;

use crate::error::FileSinkError;
use crate::store::Output;

/// The log's directory under the output directory.
pub const LOG_DIR: &str = "_weir_metadata";

const VERSION: &str = "v1";

/// How long an entry made redundant by a compact entry stays (as Spark's
/// `fileSink.log.cleanupDelay`).
pub const CLEANUP_DELAY: Duration = Duration::from_secs(600);

/// How many times reading the log lists it again when an entry it listed
/// was cleaned up meanwhile.
const READ_ATTEMPTS: usize = 3;

/// A data file the log lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileEntry {
    /// Relative to the output directory (Hive-escaped directories).
    pub path: String,
    /// Bytes.
    pub size: u64,
    /// Rows.
    pub rows: u64,
    /// Partition values by column (`None`: null).
    #[serde(default)]
    pub partition: BTreeMap<String, Option<String>>,
    /// The batch that added it (filled when read).
    #[serde(default)]
    pub batch_id: u64,
    /// When that batch was committed, in ms since the epoch (filled when
    /// read).
    #[serde(default)]
    pub committed_at: i64,
}

/// The header of an entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EntryHeader {
    /// The query that committed the batch.
    pub query_name: String,
    pub query_id: String,
    /// The batch.
    pub batch_id: u64,
    /// When it was committed, in ms since the epoch.
    pub committed_at: i64,
    /// The attempt that wrote the entry.
    #[serde(default)]
    pub attempt_id: Option<String>,
    /// For a compact entry: the oldest batch whose files it still lists
    /// (older ones left the log with the retention).
    #[serde(default)]
    pub retained_from: Option<u64>,
}

/// One entry: its header and files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub header: EntryHeader,
    pub files: Vec<FileEntry>,
    /// Whether it is a compact entry (every file up to its batch).
    pub compact: bool,
}

/// The metadata log of an output directory.
#[derive(Debug, Clone)]
pub struct MetadataLog {
    output: Output,
    compact_interval: u64,
    retention: Option<Duration>,
}

/// Whether an entry was written or one was there already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    Written,
    Exists,
}

fn name(batch: u64, compact: bool) -> String {
    if compact {
        format!("{batch}.compact")
    } else {
        batch.to_string()
    }
}

/// `N` or `N.compact` as a batch id and whether it is compact.
fn parse_name(file: &str) -> Option<(u64, bool)> {
    match file.strip_suffix(".compact") {
        Some(n) => n.parse().ok().map(|n| (n, true)),
        None => file.parse().ok().map(|n| (n, false)),
    }
}

impl MetadataLog {
    pub(crate) fn new(output: Output, compact_interval: u64, retention: Option<Duration>) -> Self {
        MetadataLog {
            output,
            compact_interval: compact_interval.max(1),
            retention,
        }
    }

    /// Whether batch `batch` is written as a compact entry.
    fn compacts(&self, batch: u64) -> bool {
        (batch + 1).is_multiple_of(self.compact_interval)
    }

    fn entry_path(&self, batch: u64, compact: bool) -> Result<object_store::path::Path, FileSinkError> {
        self.output.path(&format!("{LOG_DIR}/{}", name(batch, compact)))
    }

    /// The entries in the log, by batch (a batch may have both a plain and
    /// a compact entry).
    pub async fn list(&self) -> Result<Vec<(u64, bool)>, FileSinkError> {
        Ok(self.list_dated().await?.into_iter().map(|(e, _)| e).collect())
    }

    /// The entries with their modification times.
    async fn list_dated(&self) -> Result<Vec<((u64, bool), chrono::DateTime<chrono::Utc>)>, FileSinkError> {
        let dir = self.output.path(LOG_DIR)?;
        let listed: Vec<object_store::ObjectMeta> = self
            .output
            .store
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(self.output.store_err(LOG_DIR))?;
        let mut entries: Vec<((u64, bool), chrono::DateTime<chrono::Utc>)> = listed
            .iter()
            .filter_map(|m| Some((m.location.filename().and_then(parse_name)?, m.last_modified)))
            .collect();
        entries.sort_unstable_by_key(|(e, _)| *e);
        Ok(entries)
    }

    /// Reads one entry, or `None` if it is not there.
    pub async fn read(&self, batch: u64, compact: bool) -> Result<Option<LogEntry>, FileSinkError> {
        let path = self.entry_path(batch, compact)?;
        let shown = format!("{LOG_DIR}/{}", name(batch, compact));
        let bytes = match self.output.store.get(&path).await {
            Ok(got) => got.bytes().await.map_err(self.output.store_err(&shown))?,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.output.store_err(&shown)(e)),
        };
        self.parse(&shown, &bytes, compact).map(Some)
    }

    fn parse(&self, shown: &str, bytes: &[u8], compact: bool) -> Result<LogEntry, FileSinkError> {
        let bad = |reason: String| FileSinkError::BadEntry {
            location: self.output.shown.clone(),
            path: shown.to_string(),
            reason,
        };
        let text = std::str::from_utf8(bytes).map_err(|e| bad(e.to_string()))?;
        let mut lines = text.lines();
        match lines.next() {
            Some(VERSION) => {}
            other => return Err(bad(format!("version {other:?}, expected {VERSION:?}"))),
        }
        let header: EntryHeader =
            serde_json::from_str(lines.next().unwrap_or_default()).map_err(|e| bad(format!("header: {e}")))?;
        let mut files = Vec::new();
        for line in lines.filter(|l| !l.is_empty()) {
            let mut file: FileEntry = serde_json::from_str(line).map_err(|e| bad(format!("file line: {e}")))?;
            if !compact {
                file.batch_id = header.batch_id;
                file.committed_at = header.committed_at;
            }
            files.push(file);
        }
        Ok(LogEntry { header, files, compact })
    }

    /// The latest entry (a compact one if the batch has both).
    pub async fn latest(&self) -> Result<Option<LogEntry>, FileSinkError> {
        let entries = self.list().await?;
        let Some(&(batch, _)) = entries.last() else {
            return Ok(None);
        };
        let compact = entries.contains(&(batch, true));
        self.read(batch, compact).await
    }

    /// Every file the log lists: the latest compact entry's and those of
    /// the entries after it, oldest first.
    pub async fn files(&self) -> Result<Vec<FileEntry>, FileSinkError> {
        self.files_through(u64::MAX).await
    }

    /// The files of batches up to `last`, listing the log again if an
    /// entry it listed was cleaned up meanwhile.
    async fn files_through(&self, last: u64) -> Result<Vec<FileEntry>, FileSinkError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let entries: Vec<(u64, bool)> = self.list().await?.into_iter().filter(|(b, _)| *b <= last).collect();
            match self.files_of(&entries).await {
                Err(FileSinkError::EntryVanished { .. }) if attempt < READ_ATTEMPTS => continue,
                other => return other,
            }
        }
    }

    async fn files_of(&self, entries: &[(u64, bool)]) -> Result<Vec<FileEntry>, FileSinkError> {
        let base = entries.iter().rev().find(|(_, compact)| *compact).map(|(b, _)| *b);
        let mut files = Vec::new();
        if let Some(b) = base {
            files = self.read(b, true).await?.ok_or_else(|| self.vanished(b, true))?.files;
        }
        for &(batch, compact) in entries {
            if compact || base.is_some_and(|b| batch <= b) {
                continue;
            }
            files.extend(
                self.read(batch, false)
                    .await?
                    .ok_or_else(|| self.vanished(batch, false))?
                    .files,
            );
        }
        Ok(files)
    }

    fn vanished(&self, batch: u64, compact: bool) -> FileSinkError {
        FileSinkError::EntryVanished {
            location: self.output.shown.clone(),
            path: format!("{LOG_DIR}/{}", name(batch, compact)),
        }
    }

    fn encode(header: &EntryHeader, files: &[FileEntry]) -> Result<Bytes, serde_json::Error> {
        let mut out = String::from(VERSION);
        out.push('\n');
        out.push_str(&serde_json::to_string(header)?);
        for f in files {
            out.push('\n');
            out.push_str(&serde_json::to_string(f)?);
        }
        out.push('\n');
        Ok(Bytes::from(out))
    }

    /// Claims batch `header.batch_id`'s entry, listing `files`, with a
    /// put-if-absent (the commit); then, if the batch is one, writes its
    /// compact entry from the log.
    pub(crate) async fn commit(&self, header: EntryHeader, files: Vec<FileEntry>) -> Result<Written, FileSinkError> {
        let batch = header.batch_id;
        let written = self.put(&header, &files, false).await?;
        if written == Written::Written && self.compacts(batch) {
            // The batch is committed; its compact entry only spares readers
            // the entries before it, so its failure is logged, not raised.
            if let Err(e) = self.compact_at(batch).await {
                tracing::warn!(output = %self.output.shown, batch, error = %e, "could not write the compact log entry; the next one covers it");
            }
        }
        Ok(written)
    }

    /// Writes `batch.compact` listing every file up to `batch`.
    async fn compact_at(&self, batch: u64) -> Result<(), FileSinkError> {
        let latest = self
            .read(batch, false)
            .await?
            .ok_or_else(|| self.vanished(batch, false))?;
        let all = self.files_through(batch).await?;
        self.compact_into(latest.header, all).await.map(|_| ())
    }

    /// Rewrites the log's latest batch as a compact entry (if it is not one
    /// already) and removes the entries it makes redundant.
    pub async fn compact_now(&self) -> Result<Option<BatchId>, FileSinkError> {
        let entries = self.list().await?;
        let Some(&(batch, _)) = entries.last() else {
            return Ok(None);
        };
        if !entries.contains(&(batch, true)) {
            self.compact_at(batch).await?;
        }
        Ok(Some(BatchId(batch)))
    }

    async fn compact_into(&self, mut header: EntryHeader, mut files: Vec<FileEntry>) -> Result<Written, FileSinkError> {
        let batch = header.batch_id;
        if let Some(retention) = self.retention {
            let cutoff =
                chrono::Utc::now().timestamp_millis() - i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
            let before = files.len();
            files.retain(|f| f.committed_at >= cutoff);
            if files.len() < before {
                tracing::info!(
                    output = %self.output.shown,
                    left = before - files.len(),
                    "files of batches past the retention leave the log"
                );
            }
        }
        header.retained_from = Some(files.iter().map(|f| f.batch_id).min().unwrap_or(batch));
        let written = self.put(&header, &files, true).await?;
        if written == Written::Written {
            self.clean_up(batch).await;
        }
        Ok(written)
    }

    async fn put(&self, header: &EntryHeader, files: &[FileEntry], compact: bool) -> Result<Written, FileSinkError> {
        let batch = header.batch_id;
        let shown = format!("{LOG_DIR}/{}", name(batch, compact));
        let bytes = Self::encode(header, files).map_err(|e| FileSinkError::Encode {
            location: self.output.shown.clone(),
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        let path = self.entry_path(batch, compact)?;
        match self
            .output
            .store
            .put_opts(&path, PutPayload::from(bytes), options)
            .await
        {
            Ok(_) => Ok(Written::Written),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Written::Exists),
            Err(e) => Err(self.output.store_err(&shown)(e)),
        }
    }

    /// After compact entry `batch`: removes the entries the previous
    /// compact entry covers (a reader that listed the log before sees that
    /// compact entry and what follows it, which stay), once they are older
    /// than [`CLEANUP_DELAY`]. Best effort.
    async fn clean_up(&self, batch: u64) {
        let Ok(entries) = self.list_dated().await else { return };
        let Some(previous) = entries
            .iter()
            .rev()
            .find(|((b, compact), _)| *compact && *b < batch)
            .map(|((b, _), _)| *b)
        else {
            return;
        };
        let cutoff = chrono::Utc::now() - chrono::Duration::from_std(CLEANUP_DELAY).unwrap_or_default();
        for ((b, compact), modified) in entries {
            let redundant = b < previous || (b == previous && !compact);
            if !redundant || modified > cutoff {
                continue;
            }
            let Ok(path) = self.entry_path(b, compact) else {
                continue;
            };
            if let Err(e) = self.output.store.delete(&path).await {
                tracing::warn!(entry = %path, error = %e, "could not remove an old log entry");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_names_parse() {
        assert_eq!(parse_name("12"), Some((12, false)));
        assert_eq!(parse_name("9.compact"), Some((9, true)));
        assert_eq!(parse_name("x"), None);
        assert_eq!(parse_name("9.compact.tmp"), None);
        assert_eq!(name(9, true), "9.compact");
    }
}
