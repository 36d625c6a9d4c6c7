//! Partition writers: Parquet data files straight into the table directory,
//! invisible until the batch's commit adds them.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{new_null_array, RecordBatch};
use async_trait::async_trait;
use deltalake::ObjectStore;
use object_store::path::Path;
use object_store::ObjectStoreExt;
use weir_core::sink::{CommitMessage, DataWriter};
use weir_core::BatchId;

use crate::error::DeltaSinkError;
use crate::open_file::{AddFile, FileFormat, OpenFile};
use crate::options::Compression;
use crate::table::Layout;
use weir_core::partition;

/// What every writer of a batch shares.
#[derive(Debug, Clone)]
pub(crate) struct WriterContext {
    pub table: String,
    pub store: Arc<dyn ObjectStore>,
    pub layout: Arc<Layout>,
    pub compression: Compression,
    /// `weir-<query id>-<batch>-<attempt>-p<partition>`: unique per attempt,
    /// so a replay never overwrites a file of an earlier attempt.
    pub file_prefix: String,
    pub batch_id: BatchId,
}

/// Writes one partition of one batch, rolling files at the target size.
pub(crate) struct DeltaWriter {
    ctx: WriterContext,
    partition_id: usize,
    open: HashMap<Vec<Option<String>>, OpenFile>,
    files: usize,
    written: Vec<AddFile>,
}

impl DeltaWriter {
    pub(crate) fn new(ctx: WriterContext, partition_id: usize) -> Self {
        DeltaWriter {
            ctx,
            partition_id,
            open: HashMap::new(),
            files: 0,
            written: Vec::new(),
        }
    }

    /// The rows of `part` as a data file's columns.
    fn file_batch(&self, part: &RecordBatch) -> Result<RecordBatch, DeltaSinkError> {
        let layout = &self.ctx.layout;
        let columns = layout
            .file_sources
            .iter()
            .zip(layout.file_schema.fields())
            .map(|(source, field)| match source {
                Some(i) => part.column(*i).clone(),
                None => new_null_array(field.data_type(), part.num_rows()),
            })
            .collect();
        RecordBatch::try_new(layout.file_schema.clone(), columns).map_err(|e| DeltaSinkError::Parquet {
            table: self.ctx.table.clone(),
            path: String::new(),
            source: e.into(),
        })
    }

    fn open_file(&mut self, values: &[Option<String>]) -> Result<OpenFile, DeltaSinkError> {
        let name = format!(
            "{}-{:03}.{}.parquet",
            self.ctx.file_prefix,
            self.files,
            self.ctx.compression.extension()
        );
        self.files += 1;
        let dir = partition::directory(&self.ctx.layout.partition_columns, values);
        let path = if dir.is_empty() { name } else { format!("{dir}/{name}") };
        let layout = &self.ctx.layout;
        let format = FileFormat {
            schema: &layout.file_schema,
            compression: self.ctx.compression,
            num_indexed_cols: layout.num_indexed_cols,
            stats_columns: layout.stats_columns.as_deref(),
        };
        OpenFile::create(&self.ctx.table, path, values, &format)
    }

    async fn finish(&mut self, file: OpenFile) -> Result<(), DeltaSinkError> {
        let added = file
            .finish(&self.ctx.table, &self.ctx.store, &self.ctx.layout.partition_columns)
            .await?;
        self.written.push(added);
        Ok(())
    }
}

#[async_trait]
impl DataWriter for DeltaWriter {
    async fn write(&mut self, batch: RecordBatch) -> weir_core::Result<()> {
        let batch_id = Some(self.ctx.batch_id);
        let parts = partition::split(&batch, &self.ctx.layout.partition_indices).map_err(|e| {
            DeltaSinkError::Parquet {
                table: self.ctx.table.clone(),
                path: String::new(),
                source: e.into(),
            }
            .into_core(batch_id)
        })?;
        for (values, part) in parts {
            let rows = self.file_batch(&part).map_err(|e| e.into_core(batch_id))?;
            let mut file = match self.open.remove(&values) {
                Some(f) => f,
                None => self.open_file(&values).map_err(|e| e.into_core(batch_id))?,
            };
            file.write(&self.ctx.table, &self.ctx.store, &rows)
                .await
                .map_err(|e| e.into_core(batch_id))?;
            if file.size() >= self.ctx.layout.target_file_size {
                self.finish(file).await.map_err(|e| e.into_core(batch_id))?;
            } else {
                self.open.insert(values, file);
            }
        }
        Ok(())
    }

    async fn commit(mut self: Box<Self>) -> weir_core::Result<CommitMessage> {
        let open: Vec<OpenFile> = self.open.drain().map(|(_, f)| f).collect();
        for file in open {
            self.finish(file)
                .await
                .map_err(|e| e.into_core(Some(self.ctx.batch_id)))?;
        }
        CommitMessage::new(self.partition_id, &self.written)
    }

    async fn abort(mut self: Box<Self>) -> weir_core::Result<()> {
        for (_, file) in self.open.drain() {
            file.abort().await;
        }
        delete_files(&self.ctx.store, &self.written).await;
        Ok(())
    }
}

/// Deletes files of an attempt that will never be committed (best effort:
/// a file left behind is an orphan for vacuum, never a visible row).
pub(crate) async fn delete_files(store: &Arc<dyn ObjectStore>, files: &[AddFile]) {
    for file in files {
        if let Ok(path) = Path::parse(&file.path) {
            if let Err(e) = store.delete(&path).await {
                if !matches!(e, object_store::Error::NotFound { .. }) {
                    tracing::warn!(path = %file.path, error = %e, "could not delete a data file of an aborted attempt");
                }
            }
        }
    }
}
