//! The log's compaction: every `compact_interval`-th batch's compact entry,
//! built from the previous one and the entries after it, and the clean-up
//! of entries it makes redundant.

use super::*;
use crate::compact_entry::{self, Built, CompactEntry};

impl MetadataLog {
    /// Writes `batch.compact` listing every file up to `batch`.
    pub(super) async fn compact_at(&self, batch: u64) -> Result<(), FileSinkError> {
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
    pub(super) async fn compact_entry(
        &self,
        header: EntryHeader,
        base: Option<u64>,
    ) -> Result<CompactEntry, FileSinkError> {
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
    pub(super) async fn compact_lines(
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
    pub(super) async fn put_compact(&self, batch: u64, entry: CompactEntry) -> Result<Written, FileSinkError> {
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

    /// After compact entry `batch`: removes the entries the previous
    /// compact entry covers (a reader that listed the log before sees that
    /// compact entry and what follows it, which stay), once they are older
    /// than [`CLEANUP_DELAY`]. Best effort.
    pub(super) async fn clean_up(&self, batch: u64) {
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
