//! A compact entry of the metadata log as it is built: its header, then its
//! file lines as compaction reads them. The text is held in small blocks,
//! never in one buffer the size of the entry; an entry the previous one
//! shows to be large is written as it is built, in parts, to a staging
//! object beside the log, and then copied to `N.compact` only if that is
//! absent. Either way a compaction's memory stays bounded, however many
//! files the log lists.

use object_store::path::Path;
use object_store::{PutPayload, PutPayloadMut, WriteMultipart};

use crate::log::{EntryHeader, MetadataLog};

/// The size of a staged entry's parts (S3's smallest but for the last).
const PART_BYTES: usize = 5 << 20;

/// The bytes held before they go to the staging object.
const HELD_BYTES: usize = 64 << 10;

/// The name of a staging object: `N.compact.<unique>.tmp`, which no reader
/// of the log takes for an entry.
pub(crate) fn staging_name(batch: u64) -> String {
    format!("{batch}.compact.{}.tmp", uuid::Uuid::new_v4().simple())
}

/// Whether a file of the log's directory is a staging object.
pub(crate) fn is_staging(file: &str) -> bool {
    file.ends_with(".tmp")
}

/// A compact entry being built.
pub(crate) struct CompactEntry {
    header: EntryHeader,
    /// The text not yet sent to the staging object (all of it when the
    /// entry is not staged), the header first.
    text: PutPayloadMut,
    /// The batch of the oldest file kept; the header, which names it, is
    /// written with the first line.
    oldest: Option<u64>,
    /// Files left out by the retention.
    pub dropped: usize,
    staged: Option<(Path, WriteMultipart)>,
}

/// A compact entry built: its text, or its staging object to complete and
/// copy.
pub(crate) enum Built {
    InMemory(PutPayload),
    Staged(Path, WriteMultipart),
}

impl CompactEntry {
    /// An entry held in memory until it is put.
    pub(crate) fn in_memory(header: EntryHeader) -> Self {
        CompactEntry {
            header,
            text: PutPayloadMut::new(),
            oldest: None,
            dropped: 0,
            staged: None,
        }
    }

    /// An entry written in parts to the staging object `path` as it grows.
    pub(crate) fn staged(header: EntryHeader, path: Path, upload: WriteMultipart) -> Self {
        CompactEntry {
            staged: Some((path, upload)),
            ..Self::in_memory(header)
        }
    }

    /// The batch the entry is of.
    pub(crate) fn batch(&self) -> u64 {
        self.header.batch_id
    }

    /// Whether the entry goes to a staging object.
    #[cfg(test)]
    pub(crate) fn is_staged(&self) -> bool {
        self.staged.is_some()
    }

    /// Adds the file line `line` of batch `batch`.
    pub(crate) fn keep(&mut self, batch: u64, line: &[u8]) -> Result<(), serde_json::Error> {
        if self.oldest.is_none() {
            self.oldest = Some(batch);
            self.head()?;
        }
        self.text.extend_from_slice(line);
        self.text.extend_from_slice(b"\n");
        if let Some((_, upload)) = &mut self.staged {
            if self.text.content_length() >= HELD_BYTES {
                send(upload, std::mem::take(&mut self.text));
            }
        }
        Ok(())
    }

    /// Writes the header, with the oldest batch the entry lists (its own
    /// when it lists none).
    fn head(&mut self) -> Result<(), serde_json::Error> {
        self.header.retained_from = Some(self.oldest.unwrap_or(self.header.batch_id));
        let head = MetadataLog::encode(&self.header, &[])?;
        self.text.extend_from_slice(&head);
        Ok(())
    }

    /// The entry, complete.
    pub(crate) fn build(mut self) -> Result<Built, serde_json::Error> {
        if self.oldest.is_none() {
            self.head()?;
        }
        Ok(match self.staged {
            None => Built::InMemory(self.text.freeze()),
            Some((path, mut upload)) => {
                send(&mut upload, self.text);
                Built::Staged(path, upload)
            }
        })
    }

    /// Gives up the staging object, if any, as far as the store allows.
    pub(crate) async fn abort(self) {
        if let Some((path, upload)) = self.staged {
            if let Err(e) = upload.abort().await {
                tracing::debug!(staging = %path, error = %e, "could not abort a staged compact entry");
            }
        }
    }
}

/// Hands `payload`'s blocks to `upload`, which sends them in parts of
/// [`PART_BYTES`].
fn send(upload: &mut WriteMultipart, payload: PutPayloadMut) {
    for block in payload.freeze() {
        upload.put(block);
    }
}

/// A new upload of a staged entry, in parts of [`PART_BYTES`].
pub(crate) fn upload(upload: Box<dyn object_store::MultipartUpload>) -> WriteMultipart {
    WriteMultipart::new_with_chunk_size(upload, PART_BYTES)
}
