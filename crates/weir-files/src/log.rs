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
//! plain entries after it, into a [`CompactEntry`] that holds the new text
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

use crate::compact_entry::{self, Built, CompactEntry};
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
            stage_bytes: compact_entry::STAGE_BYTES,
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

    /// Writes `batch.compact` listing every file up to `batch`.
    async fn compact_at(&self, batch: u64) -> Result<(), FileSinkError> {
        let header = self
            .read_header(batch, false)
            .await?
            .ok_or_else(|| self.vanished(batch, false))?;
        let written = self
            .listed_through(batch, |entries| {
                let header = header.clone();
                async move {
                    let base = latest_compact(&entries);
                    let mut entry = self.compact_entry(header, base).await?;
                    if let Err(e) = self.compact_lines(&entries, base, &mut entry).await {
                        entry.abort().await;
                        return Err(e);
                    }
                    self.put_compact(batch, entry).await
                }
            })
            .await?;
        if written == Written::Written {
            self.clean_up(batch).await;
        }
        Ok(())
    }

    /// A new compact entry: staged when the compact entry `base` it is
    /// built from is large (and the store has not refused staging before).
    async fn compact_entry(&self, header: EntryHeader, base: Option<u64>) -> Result<CompactEntry, FileSinkError> {
        let Some(base) = base.filter(|_| self.staging.load(Ordering::Relaxed)) else {
            return Ok(CompactEntry::in_memory(header));
        };
        let shown = format!("{LOG_DIR}/{}", name(base, true));
        let size = match self.output.store.head(&self.entry_path(base, true)?).await {
            Ok(meta) => meta.size,
            Err(object_store::Error::NotFound { .. }) => return Err(self.vanished(base, true)),
            Err(e) => return Err(self.output.store_err(&shown)(e)),
        };
        if size < self.stage_bytes {
            return Ok(CompactEntry::in_memory(header));
        }
        let staging = compact_entry::staging_name(header.batch_id);
        let path = self.output.path(&format!("{LOG_DIR}/{staging}"))?;
        let upload = self
            .output
            .store
            .put_multipart(&path)
            .await
            .map_err(self.output.store_err(&format!("{LOG_DIR}/{staging}")))?;
        Ok(CompactEntry::staged(header, path, compact_entry::upload(upload)))
    }

    /// Adds to `entry` the file lines of a compact entry covering
    /// `entries`: the lines of their latest compact entry `base` as they
    /// are, then the files of the plain entries after it with their batch
    /// and commit time, less the files past the retention.
    async fn compact_lines(
        &self,
        entries: &[(u64, bool)],
        base: Option<u64>,
        entry: &mut CompactEntry,
    ) -> Result<(), FileSinkError> {
        let batch = entry.batch();
        let cutoff = self.retention.map(|retention| {
            chrono::Utc::now().timestamp_millis() - i64::try_from(retention.as_millis()).unwrap_or(i64::MAX)
        });
        let kept = |committed_at: i64| cutoff.is_none_or(|c| committed_at >= c);
        if let Some(b) = base {
            let found = self
                .each_line(b, true, |n, line| {
                    if n < 2 || line.is_empty() {
                        // The version and header are checked by the header
                        // read of every commit; the new entry has its own.
                        return Ok(true);
                    }
                    let stamp: Stamp =
                        serde_json::from_slice(line).map_err(|e| self.bad_entry(b, true, format!("file line: {e}")))?;
                    if kept(stamp.committed_at) {
                        entry
                            .keep(stamp.batch_id, line)
                            .map_err(|e| self.encode_err(batch, true, e))?;
                    } else {
                        entry.dropped += 1;
                    }
                    Ok(true)
                })
                .await?;
            if !found {
                return Err(self.vanished(b, true));
            }
        }
        for &(plain, compact) in entries {
            if compact || base.is_some_and(|b| plain <= b) {
                continue;
            }
            let read = self
                .read(plain, false)
                .await?
                .ok_or_else(|| self.vanished(plain, false))?;
            for file in read.files {
                if !kept(file.committed_at) {
                    entry.dropped += 1;
                    continue;
                }
                let line = serde_json::to_vec(&file).map_err(|e| self.encode_err(plain, false, e))?;
                entry.keep(plain, &line).map_err(|e| self.encode_err(batch, true, e))?;
            }
        }
        if entry.dropped > 0 {
            tracing::info!(
                output = %self.output.shown,
                left = entry.dropped,
                "files of batches past the retention leave the log"
            );
        }
        Ok(())
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

    /// Puts compact entry `batch` if it is not there yet: the text as it
    /// is, or the staging object completed and copied into place. A store
    /// that cannot copy if absent gets the staged text in one put, and no
    /// staging from then on.
    async fn put_compact(&self, batch: u64, entry: CompactEntry) -> Result<Written, FileSinkError> {
        let built = entry.build().map_err(|e| self.encode_err(batch, true, e))?;
        let (staging, upload) = match built {
            Built::InMemory(payload) => return self.put(batch, true, payload).await,
            Built::Staged(path, upload) => (path, upload),
        };
        let shown_staging = format!("{LOG_DIR}/{}", staging.filename().unwrap_or_default());
        upload.finish().await.map_err(self.output.store_err(&shown_staging))?;
        let target = self.entry_path(batch, true)?;
        let written = match self.output.store.copy_if_not_exists(&staging, &target).await {
            Ok(()) => Ok(Written::Written),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Written::Exists),
            Err(object_store::Error::NotSupported { .. } | object_store::Error::NotImplemented { .. }) => {
                tracing::debug!(output = %self.output.shown, "the store cannot copy if absent: compact entries are put whole");
                self.staging.store(false, Ordering::Relaxed);
                let staged = async { self.output.store.get(&staging).await?.bytes().await };
                match staged.await {
                    Ok(bytes) => self.put(batch, true, PutPayload::from(bytes)).await,
                    Err(e) => Err(self.output.store_err(&shown_staging)(e)),
                }
            }
            Err(e) => Err(self.output.store_err(&format!("{LOG_DIR}/{}", name(batch, true)))(e)),
        };
        if let Err(e) = self.output.store.delete(&staging).await {
            tracing::warn!(staging = %shown_staging, error = %e, "could not remove a staged compact entry; the next clean-up does");
        }
        written
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

    /// After compact entry `batch`: removes the entries the previous
    /// compact entry covers (a reader that listed the log before sees that
    /// compact entry and what follows it, which stay), once they are older
    /// than [`CLEANUP_DELAY`]. Best effort.
    async fn clean_up(&self, batch: u64) {
        let Ok(listed) = self.list_all().await else { return };
        let cutoff = chrono::Utc::now() - chrono::Duration::from_std(CLEANUP_DELAY).unwrap_or_default();
        // Staging objects of compactions that did not finish.
        let stale = listed
            .iter()
            .filter(|m| m.location.filename().is_some_and(compact_entry::is_staging) && m.last_modified < cutoff);
        let mut old: Vec<object_store::path::Path> = stale.map(|m| m.location.clone()).collect();
        let entries = Self::dated(&listed);
        let previous = entries
            .iter()
            .rev()
            .find(|((b, compact), _)| *compact && *b < batch)
            .map(|((b, _), _)| *b);
        for ((b, compact), modified) in entries {
            let redundant = previous.is_some_and(|p| b < p || (b == p && !compact));
            if redundant && modified < cutoff {
                old.extend(self.entry_path(b, compact).ok());
            }
        }
        for path in old {
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

    const FILES_PER_BATCH: u64 = 40;

    fn header(batch: u64, committed_at: i64) -> EntryHeader {
        EntryHeader {
            query_name: "q".into(),
            query_id: "00000000-0000-0000-0000-000000000001".into(),
            batch_id: batch,
            committed_at,
            attempt_id: Some(format!("attempt-{batch}")),
            retained_from: None,
        }
    }

    /// Batch `batch`'s files, with paths long enough that a compact entry
    /// spans many of the local store's read chunks, lines split across them.
    fn files(batch: u64) -> Vec<FileEntry> {
        (0..FILES_PER_BATCH)
            .map(|i| FileEntry {
                path: format!(
                    "zone=z{i}/part-{batch:05}-{}-p{i:03}.zstd.parquet",
                    "x".repeat(i as usize)
                ),
                size: 1000 + i,
                rows: batch * 100 + i,
                partition: BTreeMap::from([("zone".to_string(), Some(format!("z{i}")))]),
                batch_id: 0,
                committed_at: 0,
            })
            .collect()
    }

    async fn commit_batches(log: &MetadataLog, batches: std::ops::Range<u64>, committed_at: i64) {
        for b in batches {
            assert_eq!(
                log.commit(header(b, committed_at), files(b)).await.unwrap(),
                Written::Written
            );
        }
    }

    fn rows_of(files: &[FileEntry]) -> Vec<(u64, u64)> {
        files.iter().map(|f| (f.batch_id, f.rows)).collect()
    }

    fn expected(batches: std::ops::Range<u64>) -> Vec<(u64, u64)> {
        batches
            .flat_map(|b| (0..FILES_PER_BATCH).map(move |i| (b, b * 100 + i)))
            .collect()
    }

    #[tokio::test]
    async fn compact_entries_built_a_chunk_at_a_time_list_every_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let output = Output::open(dir.path().to_str().unwrap(), &Default::default(), true).unwrap();
        let log = MetadataLog::new(output, 7, None);
        let now = chrono::Utc::now().timestamp_millis();
        commit_batches(&log, 0..30, now).await;

        // Compact entries at 6, 13, 20 and 27, each built from the one
        // before; the last is far larger than one read chunk.
        let compact = log.read(27, true).await.unwrap().unwrap();
        assert_eq!(rows_of(&compact.files), expected(0..28));
        assert!(compact.files.iter().all(|f| f.committed_at == now));
        assert_eq!(
            compact.files[41],
            FileEntry {
                batch_id: 1,
                committed_at: now,
                ..files(1)[1].clone()
            }
        );
        assert_eq!(compact.header.retained_from, Some(0));
        assert_eq!(compact.header.attempt_id.as_deref(), Some("attempt-27"));
        let size = tokio::fs::metadata(dir.path().join(LOG_DIR).join("27.compact"))
            .await
            .unwrap()
            .len();
        assert!(size > 64 * 1024, "{size} bytes");
        assert_eq!(rows_of(&log.files().await.unwrap()), expected(0..30));

        // The marker comes from a header alone, from the plain entry or,
        // once only the compact entry is left, from that.
        assert_eq!(log.latest_header().await.unwrap().unwrap().batch_id, 29);
        assert_eq!(log.compact_now().await.unwrap(), Some(BatchId(29)));
        tokio::fs::remove_file(dir.path().join(LOG_DIR).join("29"))
            .await
            .unwrap();
        let latest = log.latest_header().await.unwrap().unwrap();
        assert_eq!((latest.batch_id, latest.retained_from), (29, Some(0)));
        assert_eq!(rows_of(&log.files().await.unwrap()), expected(0..30));
    }

    #[tokio::test]
    async fn files_past_the_retention_leave_the_next_compact_entry() {
        let dir = tempfile::tempdir().unwrap();
        let output = Output::open(dir.path().to_str().unwrap(), &Default::default(), true).unwrap();
        let log = MetadataLog::new(output, 5, Some(Duration::from_secs(600)));
        let now = chrono::Utc::now().timestamp_millis();
        // Batches 0..12 committed an hour ago: the compact entries at 4 and
        // 9 drop what is already past the retention.
        commit_batches(&log, 0..12, now - 3_600_000).await;
        assert!(log.read(9, true).await.unwrap().unwrap().files.is_empty());
        commit_batches(&log, 12..20, now).await;
        // 14.compact drops batches 10 and 11 (copied from 9.compact's
        // successors); 19.compact copies 14.compact's lines.
        for compact in [14, 19] {
            let entry = log.read(compact, true).await.unwrap().unwrap();
            assert_eq!(rows_of(&entry.files), expected(12..compact + 1));
            assert_eq!(entry.header.retained_from, Some(12));
        }
        assert_eq!(rows_of(&log.files().await.unwrap()), expected(12..20));
    }

    #[tokio::test]
    async fn a_compact_entry_with_a_broken_line_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let output = Output::open(dir.path().to_str().unwrap(), &Default::default(), true).unwrap();
        let log = MetadataLog::new(output, 3, None);
        commit_batches(&log, 0..3, 1).await;
        let path = dir.path().join(LOG_DIR).join("2.compact");
        let mut text = tokio::fs::read_to_string(&path).await.unwrap();
        text.push_str("{not json\n");
        tokio::fs::remove_file(dir.path().join(LOG_DIR).join("2"))
            .await
            .unwrap();
        tokio::fs::write(&path, text).await.unwrap();
        commit_batches(&log, 3..5, 1).await;
        let err = log.compact_now().await.unwrap_err();
        assert!(
            matches!(&err, FileSinkError::BadEntry { path, .. } if path == "_weir_metadata/2.compact"),
            "{err}"
        );
    }

    /// Every file of `dir`'s log directory that is not an entry.
    fn strays(dir: &std::path::Path) -> Vec<String> {
        std::fs::read_dir(dir.join(LOG_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|f| parse_name(f).is_none())
            .collect()
    }

    #[tokio::test]
    async fn large_compact_entries_are_staged_and_copied_into_place() {
        let dir = tempfile::tempdir().unwrap();
        let output = Output::open(dir.path().to_str().unwrap(), &Default::default(), true).unwrap();
        let mut log = MetadataLog::new(output, 7, None);
        log.stage_bytes = 16 << 10;
        let now = chrono::Utc::now().timestamp_millis();
        // 6.compact (7 batches of files) is over 16 KiB, so 13.compact,
        // 20.compact and 27.compact are staged.
        commit_batches(&log, 0..28, now).await;
        let staged_from = tokio::fs::metadata(dir.path().join(LOG_DIR).join("6.compact"))
            .await
            .unwrap()
            .len();
        assert!(staged_from > 16 << 10, "{staged_from} bytes");
        let compact = log.read(27, true).await.unwrap().unwrap();
        assert_eq!(rows_of(&compact.files), expected(0..28));
        assert_eq!(compact.header.retained_from, Some(0));
        assert_eq!(compact.header.batch_id, 27);
        assert!(log.staging.load(Ordering::Relaxed), "a local store copies if absent");
        assert_eq!(strays(dir.path()), Vec::<String>::new());

        // A second compaction of batch 27 finds the entry there.
        let entries = log.list().await.unwrap();
        let header = log.read_header(27, false).await.unwrap().unwrap();
        let base = latest_compact(&entries);
        let mut again = log.compact_entry(header, base).await.unwrap();
        assert!(again.is_staged());
        log.compact_lines(&entries, base, &mut again).await.unwrap();
        assert_eq!(log.put_compact(27, again).await.unwrap(), Written::Exists);
        assert_eq!(strays(dir.path()), Vec::<String>::new());
        assert_eq!(rows_of(&log.files().await.unwrap()), expected(0..28));
    }

    #[tokio::test]
    async fn a_store_that_cannot_copy_if_absent_gets_a_large_entry_whole() {
        // S3 copies if absent only when configured to: the staged entry is
        // read back and put with put-if-absent.
        let Some(endpoint) = weir_test_support::service("WEIR_TEST_S3_ENDPOINT") else {
            return;
        };
        let bucket = std::env::var("WEIR_TEST_S3_BUCKET").unwrap_or_else(|_| "weir".into());
        let location = format!("s3://{bucket}/files-log/{}", uuid::Uuid::new_v4());
        let options = [
            ("aws_endpoint".to_string(), endpoint),
            ("aws_allow_http".to_string(), "true".to_string()),
        ]
        .into();
        let output = Output::open(&location, &options, true).unwrap();
        let mut log = MetadataLog::new(output.clone(), 7, None);
        log.stage_bytes = 16 << 10;
        let now = chrono::Utc::now().timestamp_millis();
        commit_batches(&log, 0..21, now).await;
        assert!(!log.staging.load(Ordering::Relaxed), "S3 refused the copy");
        // 13.compact was staged, then put whole; 20.compact was not staged.
        for batch in [13, 20] {
            let compact = log.read(batch, true).await.unwrap().unwrap();
            assert_eq!(rows_of(&compact.files), expected(0..batch + 1));
            assert_eq!(compact.header.retained_from, Some(0));
        }
        let listed: Vec<object_store::ObjectMeta> = output
            .store
            .list(Some(&output.path(LOG_DIR).unwrap()))
            .try_collect()
            .await
            .unwrap();
        let strays: Vec<_> = listed
            .iter()
            .filter_map(|m| m.location.filename())
            .filter(|f| parse_name(f).is_none())
            .collect();
        assert_eq!(strays, Vec::<&str>::new());
    }

    #[tokio::test]
    async fn the_clean_up_removes_staging_objects_left_past_the_delay_and_no_entry() {
        let dir = tempfile::tempdir().unwrap();
        let output = Output::open(dir.path().to_str().unwrap(), &Default::default(), true).unwrap();
        let log = MetadataLog::new(output, 3, None);
        let now = chrono::Utc::now().timestamp_millis();
        commit_batches(&log, 0..3, now).await;
        let logs = dir.path().join(LOG_DIR);
        let stale = logs.join("2.compact.0123.tmp");
        let fresh = logs.join("5.compact.4567.tmp");
        for path in [&stale, &fresh] {
            std::fs::write(path, "v1\n").unwrap();
        }
        let long_ago = std::time::SystemTime::now() - CLEANUP_DELAY * 2;
        std::fs::File::options()
            .write(true)
            .open(&stale)
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        log.clean_up(2).await;
        assert_eq!(strays(dir.path()), vec!["5.compact.4567.tmp".to_string()]);
        assert_eq!(rows_of(&log.files().await.unwrap()), expected(0..3));
    }
}
