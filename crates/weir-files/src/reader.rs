//! Reading the output as the log has it, and finding files it does not
//! list.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use bytes::Bytes;
use futures::TryStreamExt;
use object_store::ObjectStoreExt;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::Serialize;

use crate::error::FileSinkError;
use crate::log::{FileEntry, MetadataLog};
use crate::store::Output;

/// An output directory read through its metadata log.
#[derive(Debug, Clone)]
pub struct FileLog {
    output: Output,
    log: MetadataLog,
}

/// A file under the output directory that no log entry lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Orphan {
    /// Relative to the output directory.
    pub path: String,
    pub size: u64,
    /// Its age, in seconds.
    pub age_secs: u64,
}

impl FileLog {
    /// The output at `location` (a local path or `s3://`), with object
    /// storage options for S3.
    pub fn open(location: &str, storage: &std::collections::HashMap<String, String>) -> Result<Self, FileSinkError> {
        let output = Output::open(location, storage, false)?;
        let log = MetadataLog::new(output.clone(), 10, None);
        Ok(FileLog { output, log })
    }

    /// The log.
    pub fn log(&self) -> &MetadataLog {
        &self.log
    }

    /// Every file the log lists.
    pub async fn files(&self) -> Result<Vec<FileEntry>, FileSinkError> {
        self.log.files().await
    }

    /// The rows of every listed file (and only those), each batch with the
    /// partition columns appended as strings.
    pub async fn read(&self) -> Result<Vec<RecordBatch>, FileSinkError> {
        let mut out = Vec::new();
        for file in self.files().await? {
            let path = self.output.path(&file.path)?;
            let bytes: Bytes = self
                .output
                .store
                .get(&path)
                .await
                .map_err(self.output.store_err(&file.path))?
                .bytes()
                .await
                .map_err(self.output.store_err(&file.path))?;
            let bad = |e: String| FileSinkError::Encode {
                location: self.output.shown.clone(),
                path: file.path.clone(),
                reason: format!("cannot read it: {e}"),
            };
            let batches: Vec<RecordBatch> = if file.path.ends_with(".json") {
                let (schema, _) = arrow_json::reader::infer_json_schema(std::io::Cursor::new(&bytes[..]), None)
                    .map_err(|e| bad(e.to_string()))?;
                arrow_json::ReaderBuilder::new(Arc::new(schema))
                    .build(std::io::Cursor::new(bytes))
                    .map_err(|e| bad(e.to_string()))?
                    .collect::<Result<_, _>>()
                    .map_err(|e| bad(e.to_string()))?
            } else {
                ParquetRecordBatchReaderBuilder::try_new(bytes)
                    .and_then(|b| b.build())
                    .map_err(|e| bad(e.to_string()))?
                    .collect::<Result<_, _>>()
                    .map_err(|e| bad(e.to_string()))?
            };
            for b in batches {
                out.push(with_partition(b, &file).map_err(|e| bad(e.to_string()))?);
            }
        }
        Ok(out)
    }

    /// Files weir wrote under the output directory that no entry lists and
    /// that are older than `older_than`: files of failed attempts, and of
    /// batches that left the log with its retention. Only weir's data file
    /// names (`part-<batch>-...`) of batches the log has reached count, so
    /// files of a batch being written are never taken, whatever their age;
    /// nor are files under `_` or `.` folders (checkpoints, staging) or
    /// anyone else's files. An output without a log has no orphans.
    pub async fn orphans(&self, older_than: Duration) -> Result<Vec<Orphan>, FileSinkError> {
        // Listing first, then the log: a batch committed in between is in
        // the log read after, so none of its files is taken.
        let all: Vec<object_store::ObjectMeta> = self
            .output
            .store
            .list(Some(&self.output.root))
            .try_collect()
            .await
            .map_err(self.output.store_err("(the listing)"))?;
        let Some(latest) = self.log.latest_header().await? else {
            return Ok(Vec::new());
        };
        let listed: HashSet<String> = self.files().await?.into_iter().map(|f| f.path).collect();
        let now = chrono::Utc::now();
        let mut orphans = Vec::new();
        for meta in all {
            let path = self.output.relative(&meta.location);
            let hidden = path.split('/').any(|part| part.starts_with(['_', '.']));
            let committed_batch = batch_of(&path).is_some_and(|b| b <= latest.batch_id);
            if hidden || !committed_batch || listed.contains(&path) {
                continue;
            }
            let age = (now - meta.last_modified).to_std().unwrap_or_default();
            if age >= older_than {
                orphans.push(Orphan {
                    path,
                    size: meta.size,
                    age_secs: age.as_secs(),
                });
            }
        }
        orphans.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(orphans)
    }

    /// Deletes [`orphans`](Self::orphans) older than `older_than` (at
    /// least a minute). Returns what was deleted.
    pub async fn remove_orphans(&self, older_than: Duration) -> Result<Vec<Orphan>, FileSinkError> {
        if older_than < Duration::from_secs(60) {
            return Err(FileSinkError::Unsupported {
                location: self.output.shown.clone(),
                reason:
                    "orphans younger than a minute may be files of a batch being written; use a longer grace period"
                        .into(),
            });
        }
        let orphans = self.orphans(older_than).await?;
        for o in &orphans {
            let path = self.output.path(&o.path)?;
            self.output
                .store
                .delete(&path)
                .await
                .map_err(self.output.store_err(&o.path))?;
        }
        Ok(orphans)
    }
}

/// The batch of a data file weir named `part-<batch>-...`.
fn batch_of(path: &str) -> Option<u64> {
    let name = path.rsplit('/').next()?;
    let rest = name.strip_prefix("part-")?;
    let digits: &str = rest.split('-').next()?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// `batch` with `file`'s partition values appended as string columns.
fn with_partition(batch: RecordBatch, file: &FileEntry) -> Result<RecordBatch, arrow_schema::ArrowError> {
    if file.partition.is_empty() {
        return Ok(batch);
    }
    let mut fields: Vec<Field> = batch.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    for (name, value) in &file.partition {
        fields.push(Field::new(name, DataType::Utf8, true));
        columns.push(Arc::new(StringArray::from(vec![value.clone(); batch.num_rows()])));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_read_from_weirs_file_names_only() {
        assert_eq!(batch_of("b=1/part-00012-abc-def-p000-000.zstd.parquet"), Some(12));
        assert_eq!(batch_of("part-00003-q-a-c000-p000-001.json"), Some(3));
        assert_eq!(batch_of("part-stray.zstd.parquet"), None);
        assert_eq!(batch_of("data/other.parquet"), None);
    }
}
