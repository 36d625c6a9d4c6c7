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
//!
//! The writer never holds a compact entry as parsed files: it reads the
//! previous one a chunk at a time, copies its lines, and adds the few
//! plain entries after it, into a
//! [`CompactEntry`](crate::compact_entry::CompactEntry) that holds the new text
//! in small blocks, or stages a large entry in parts and copies it into
//! place if absent; and a marker is read from an entry's header alone.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};
use weir_core::BatchId;

use crate::error::FileSinkError;
use crate::store::Output;

mod compaction;

/// The log's directory under the output directory.
pub const LOG_DIR: &str = "_weir_metadata";

const VERSION: &str = "v1";

/// How long an entry made redundant by a compact entry stays (as Spark's
/// `fileSink.log.cleanupDelay`).
pub const CLEANUP_DELAY: Duration = Duration::from_secs(600);

/// A compact entry is staged when the previous one has at least this many
/// bytes.
const STAGE_BYTES: u64 = 1 << 20;

/// How many times reading the log lists it again when an entry it listed
/// was cleaned up meanwhile.
const READ_ATTEMPTS: usize = 3;

/// The two fields of a compact entry's file line that compaction needs.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Stamp {
    #[serde(default)]
    batch_id: u64,
    #[serde(default)]
    committed_at: i64,
}

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
    /// Whether large compact entries are staged: until the store says it
    /// cannot copy if absent.
    staging: Arc<AtomicBool>,
    /// The size of a compact entry from which the next one is staged.
    stage_bytes: u64,
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

/// The batch of the latest compact entry among `entries` (sorted).
fn latest_compact(entries: &[(u64, bool)]) -> Option<u64> {
    entries.iter().rev().find(|(_, compact)| *compact).map(|(b, _)| *b)
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
            staging: Arc::new(AtomicBool::new(true)),
            stage_bytes: STAGE_BYTES,
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

    /// Every object in the log's directory.
    async fn list_all(&self) -> Result<Vec<object_store::ObjectMeta>, FileSinkError> {
        let dir = self.output.path(LOG_DIR)?;
        self.output
            .store
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(self.output.store_err(LOG_DIR))
    }

    /// The entries with their modification times.
    async fn list_dated(&self) -> Result<Vec<((u64, bool), chrono::DateTime<chrono::Utc>)>, FileSinkError> {
        Ok(Self::dated(&self.list_all().await?))
    }

    fn dated(listed: &[object_store::ObjectMeta]) -> Vec<((u64, bool), chrono::DateTime<chrono::Utc>)> {
        let mut entries: Vec<((u64, bool), chrono::DateTime<chrono::Utc>)> = listed
            .iter()
            .filter_map(|m| Some((m.location.filename().and_then(parse_name)?, m.last_modified)))
            .collect();
        entries.sort_unstable_by_key(|(e, _)| *e);
        entries
    }

    /// Reads one entry, or `None` if it is not there.
    pub async fn read(&self, batch: u64, compact: bool) -> Result<Option<LogEntry>, FileSinkError> {
        let (mut header, mut files) = (None::<EntryHeader>, Vec::new());
        let found = self
            .each_line(batch, compact, |n, line| {
                if n < 2 {
                    if let Some(h) = self.head_line(batch, compact, n, line)? {
                        header = Some(h);
                    }
                    return Ok(true);
                }
                if line.is_empty() {
                    return Ok(true);
                }
                let mut file: FileEntry = serde_json::from_slice(line)
                    .map_err(|e| self.bad_entry(batch, compact, format!("file line: {e}")))?;
                if let (false, Some(h)) = (compact, &header) {
                    file.batch_id = h.batch_id;
                    file.committed_at = h.committed_at;
                }
                files.push(file);
                Ok(true)
            })
            .await?;
        match header {
            Some(header) => Ok(Some(LogEntry { header, files, compact })),
            None if found => Err(self.bad_entry(batch, compact, "no header".into())),
            None => Ok(None),
        }
    }

    /// The header of one entry, read without the files after it, or `None`
    /// if the entry is not there.
    pub async fn read_header(&self, batch: u64, compact: bool) -> Result<Option<EntryHeader>, FileSinkError> {
        let mut header = None;
        let found = self
            .each_line(batch, compact, |n, line| {
                header = self.head_line(batch, compact, n, line)?;
                Ok(header.is_none())
            })
            .await?;
        match header {
            Some(h) => Ok(Some(h)),
            None if found => Err(self.bad_entry(batch, compact, "no header".into())),
            None => Ok(None),
        }
    }

    /// Line `n` of an entry's first two: the version (checked) or the
    /// header.
    fn head_line(
        &self,
        batch: u64,
        compact: bool,
        n: usize,
        line: &[u8],
    ) -> Result<Option<EntryHeader>, FileSinkError> {
        if n == 0 {
            if line != VERSION.as_bytes() {
                let shown = String::from_utf8_lossy(line).into_owned();
                return Err(self.bad_entry(batch, compact, format!("version {shown:?}, expected {VERSION:?}")));
            }
            return Ok(None);
        }
        serde_json::from_slice(line)
            .map(Some)
            .map_err(|e| self.bad_entry(batch, compact, format!("header: {e}")))
    }

    /// Calls `f` with each line of an entry and its number, a chunk of the
    /// object at a time, until `f` returns `false`. `false` if the entry is
    /// not there.
    async fn each_line(
        &self,
        batch: u64,
        compact: bool,
        mut f: impl FnMut(usize, &[u8]) -> Result<bool, FileSinkError>,
    ) -> Result<bool, FileSinkError> {
        let path = self.entry_path(batch, compact)?;
        let shown = format!("{LOG_DIR}/{}", name(batch, compact));
        let mut chunks = match self.output.store.get(&path).await {
            Ok(got) => got.into_stream(),
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(self.output.store_err(&shown)(e)),
        };
        let mut pending: Vec<u8> = Vec::new();
        let mut n = 0;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(self.output.store_err(&shown))?;
            let mut rest: &[u8] = &chunk;
            while let Some(end) = rest.iter().position(|b| *b == b'\n') {
                let line: &[u8] = if pending.is_empty() {
                    &rest[..end]
                } else {
                    pending.extend_from_slice(&rest[..end]);
                    &pending
                };
                if !f(n, line)? {
                    return Ok(true);
                }
                n += 1;
                pending.clear();
                rest = &rest[end + 1..];
            }
            pending.extend_from_slice(rest);
        }
        if !pending.is_empty() {
            f(n, &pending)?;
        }
        Ok(true)
    }

    fn bad_entry(&self, batch: u64, compact: bool, reason: String) -> FileSinkError {
        FileSinkError::BadEntry {
            location: self.output.shown.clone(),
            path: format!("{LOG_DIR}/{}", name(batch, compact)),
            reason,
        }
    }

    /// Runs `read` on the log's entries of batches up to `last`, listing the
    /// log again when an entry it listed was cleaned up meanwhile (a newer
    /// compact entry made it redundant).
    async fn listed_through<'a, T, Fut>(
        &'a self,
        last: u64,
        read: impl Fn(Vec<(u64, bool)>) -> Fut,
    ) -> Result<T, FileSinkError>
    where
        Fut: std::future::Future<Output = Result<T, FileSinkError>> + 'a,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let entries: Vec<(u64, bool)> = self.list().await?.into_iter().filter(|(b, _)| *b <= last).collect();
            match read(entries).await {
                Err(FileSinkError::EntryVanished { .. }) if attempt < READ_ATTEMPTS => continue,
                other => return other,
            }
        }
    }

    /// The latest entry (a compact one if the batch has both).
    pub async fn latest(&self) -> Result<Option<LogEntry>, FileSinkError> {
        self.listed_through(u64::MAX, |entries| async move {
            let Some(&(batch, _)) = entries.last() else {
                return Ok(None);
            };
            let compact = entries.contains(&(batch, true));
            let entry = self.read(batch, compact).await?;
            entry.ok_or_else(|| self.vanished(batch, compact)).map(Some)
        })
        .await
    }

    /// The header of the latest entry: the batch the log has reached and
    /// the query that wrote it. Read from the batch's plain entry while it
    /// is there, so a compact entry is not read whole.
    pub async fn latest_header(&self) -> Result<Option<EntryHeader>, FileSinkError> {
        self.listed_through(u64::MAX, |entries| async move {
            let Some(&(batch, _)) = entries.last() else {
                return Ok(None);
            };
            let compact = !entries.contains(&(batch, false));
            let header = self.read_header(batch, compact).await?;
            header.ok_or_else(|| self.vanished(batch, compact)).map(Some)
        })
        .await
    }

    /// Every file the log lists: the latest compact entry's and those of
    /// the entries after it, oldest first.
    pub async fn files(&self) -> Result<Vec<FileEntry>, FileSinkError> {
        self.listed_through(u64::MAX, |entries| async move { self.files_of(&entries).await })
            .await
    }

    async fn files_of(&self, entries: &[(u64, bool)]) -> Result<Vec<FileEntry>, FileSinkError> {
        let base = latest_compact(entries);
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

    pub(crate) fn encode(header: &EntryHeader, files: &[FileEntry]) -> Result<Bytes, serde_json::Error> {
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
        let bytes = Self::encode(&header, &files).map_err(|e| self.encode_err(batch, false, e))?;
        let written = self.put(batch, false, PutPayload::from(bytes)).await?;
        if written == Written::Written && self.compacts(batch) {
            // The batch is committed; its compact entry only spares readers
            // the entries before it, so its failure is logged, not raised.
            if let Err(e) = self.compact_at(batch).await {
                tracing::warn!(output = %self.output.shown, batch, error = %e, "could not write the compact log entry; the next one covers it");
            }
        }
        Ok(written)
    }

    fn encode_err(&self, batch: u64, compact: bool, e: serde_json::Error) -> FileSinkError {
        FileSinkError::Encode {
            location: self.output.shown.clone(),
            path: format!("{LOG_DIR}/{}", name(batch, compact)),
            reason: e.to_string(),
        }
    }

    /// Puts an entry if it is not there yet.
    async fn put(&self, batch: u64, compact: bool, payload: PutPayload) -> Result<Written, FileSinkError> {
        let shown = format!("{LOG_DIR}/{}", name(batch, compact));
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        let path = self.entry_path(batch, compact)?;
        match self.output.store.put_opts(&path, payload, options).await {
            Ok(_) => Ok(Written::Written),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Written::Exists),
            Err(e) => Err(self.output.store_err(&shown)(e)),
        }
    }
}

#[cfg(test)]
mod tests;
