//! Compaction's rewrite phase: a group's small files read one at a time
//! and written into the default spec's files of the target size.

use super::*;

/// What every rewrite of a job shares.
pub(super) struct Job {
    pub(super) table: String,
    pub(super) file_io: FileIO,
    pub(super) layout: Arc<Layout>,
    /// Field ids identity partitions are made of.
    pub(super) identity_sources: Vec<i32>,
    pub(super) locations: DefaultLocationGenerator,
    pub(super) prefix: String,
}

impl Job {
    /// Reads a group's files one at a time into the sink's writer (field
    /// ids, metrics), as one file; `None` (and nothing left) once `halted`
    /// is set.
    pub(super) async fn rewrite(
        &self,
        index: usize,
        group: Vec<DataFile>,
        halted: &AtomicBool,
    ) -> Result<Option<Rewritten>, IcebergSinkError> {
        let ctx = WriterContext {
            table: self.table.clone(),
            file_io: self.file_io.clone(),
            layout: self.layout.clone(),
            locations: self.locations.clone(),
            file_prefix: format!("{}-{index:04}", self.prefix),
        };
        let mut out: Box<dyn DataWriter> = Box::new(IcebergWriter::new(ctx, index));
        let written = async {
            for file in &group {
                let path = file.file_path();
                let stopped = |reason: String| IcebergSinkError::CompactionStopped {
                    table: self.table.clone(),
                    reason: format!("data file {path}: {reason}"),
                };
                let read_err = |source| IcebergSinkError::Iceberg {
                    table: self.table.clone(),
                    context: format!("read data file {path}"),
                    source: Box::new(source),
                };
                let bytes = self
                    .file_io
                    .new_input(path)
                    .map_err(read_err)?
                    .read()
                    .await
                    .map_err(read_err)?;
                let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
                    .and_then(|b| b.with_batch_size(READ_BATCH_ROWS).build())
                    .map_err(|e| stopped(e.to_string()))?;
                for batch in reader {
                    if halted.load(Ordering::Relaxed) {
                        return Ok(false);
                    }
                    let batch = batch.map_err(|e| stopped(e.to_string()))?;
                    let rows = self.conform(&batch).map_err(stopped)?;
                    out.write(rows).await.map_err(|e| stopped(e.to_string()))?;
                }
            }
            Ok::<_, IcebergSinkError>(true)
        };
        // A panic (a malformed input can make the decoder panic) still
        // deletes what the writer wrote before it goes on.
        let written = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(written)).await;
        match written {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => {
                let _ = out.abort().await;
                return Ok(None);
            }
            Ok(Err(e)) => {
                let _ = out.abort().await;
                return Err(e);
            }
            Err(panic) => {
                let _ = out.abort().await;
                std::panic::resume_unwind(panic);
            }
        }
        let message = out.commit().await.map_err(|e| IcebergSinkError::CompactionStopped {
            table: self.table.clone(),
            reason: format!("closing a compacted file failed: {e}"),
        })?;
        let layout = &self.layout;
        let partition_type =
            layout
                .spec
                .partition_type(&layout.schema)
                .map_err(|source| IcebergSinkError::Iceberg {
                    table: self.table.clone(),
                    context: "derive the partition type".into(),
                    source: Box::new(source),
                })?;
        let outputs = writer::decode(&[message], &layout.spec, &partition_type, &layout.schema).map_err(|e| {
            IcebergSinkError::CompactionStopped {
                table: self.table.clone(),
                reason: format!("describing a compacted file failed: {e}"),
            }
        })?;
        let rows_in: u64 = group.iter().map(|f| f.record_count()).sum();
        let rows_out: u64 = outputs.iter().map(|f| f.record_count()).sum();
        if rows_in != rows_out {
            writer::delete_files(&self.file_io, &outputs).await;
            return Err(IcebergSinkError::CompactionStopped {
                table: self.table.clone(),
                reason: format!("group {index} read {rows_in} rows by its files' metadata but wrote {rows_out}"),
            });
        }
        Ok(Some(Rewritten {
            index,
            inputs: group,
            outputs,
        }))
    }

    /// A data file's rows as the table's current columns (see [`conform`]).
    pub(super) fn conform(&self, batch: &RecordBatch) -> Result<RecordBatch, String> {
        conform(&self.layout.arrow_schema, &self.identity_sources, batch)
    }
}
