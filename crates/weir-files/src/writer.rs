//! Partition writers: files with unique names under `col=value/`
//! directories, invisible until the batch's log entry lists them.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use object_store::{ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use weir_core::partition::{self, PartitionKey};
use weir_core::sink::{CommitMessage, DataWriter};
use weir_core::BatchId;

use crate::error::FileSinkError;
use crate::log::FileEntry;
use crate::store::Output;

/// The format of the files written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FileFormat {
    /// Parquet (zstd).
    #[default]
    Parquet,
    /// JSON, one object per line.
    JsonLines,
}

impl FileFormat {
    fn extension(self) -> &'static str {
        match self {
            FileFormat::Parquet => "zstd.parquet",
            FileFormat::JsonLines => "json",
        }
    }
}

/// The schema JSON lines are written with: a time zone named UTC becomes
/// the offset `+00:00` (the same instants; the JSON encoder reads offsets
/// only). `Err` names a column whose time zone is another name.
pub(crate) fn json_schema(schema: &Schema) -> Result<Schema, String> {
    let fields = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Timestamp(unit, Some(tz)) if tz.starts_with(['+', '-']) => Ok(f.as_ref().clone()),
            DataType::Timestamp(unit, Some(tz)) if matches!(tz.as_ref(), "UTC" | "Etc/UTC" | "Z" | "GMT") => Ok(f
                .as_ref()
                .clone()
                .with_data_type(DataType::Timestamp(*unit, Some("+00:00".into())))),
            DataType::Timestamp(_, Some(tz)) => Err(format!(
                "column {:?} has time zone {tz:?}; JSON lines are written with offset time zones (+00:00), so cast it",
                f.name()
            )),
            _ => Ok(f.as_ref().clone()),
        })
        .collect::<Result<Vec<Field>, String>>()?;
    Ok(Schema::new(fields))
}

/// How a batch's rows become files, fixed when the query starts.
#[derive(Debug)]
pub(crate) struct Layout {
    pub format: FileFormat,
    pub partition_columns: Vec<String>,
    /// Their indices in the stream's batches.
    pub partition_indices: Vec<usize>,
    /// The stream's columns without the partition columns (which live in
    /// the directory names, as Spark and Hive write them).
    pub file_schema: SchemaRef,
    pub file_columns: Vec<usize>,
    pub target_file_size: u64,
}

/// What every writer of a batch shares.
#[derive(Debug, Clone)]
pub(crate) struct WriterContext {
    pub output: Output,
    pub layout: Arc<Layout>,
    /// `part-<batch>-<query id>-<attempt>-p<partition>`.
    pub file_prefix: String,
    pub batch_id: BatchId,
}

enum Encoder {
    Parquet(Box<ArrowWriter<Vec<u8>>>),
    Json(arrow_json::LineDelimitedWriter<Vec<u8>>),
}

struct OpenFile {
    path: String,
    values: PartitionKey,
    encoder: Encoder,
    rows: u64,
}

/// Writes one partition of one batch, rolling files at the target size.
pub(crate) struct FileWriter {
    ctx: WriterContext,
    partition_id: usize,
    open: HashMap<PartitionKey, OpenFile>,
    files: usize,
    written: Vec<FileEntry>,
}

impl FileWriter {
    pub(crate) fn new(ctx: WriterContext, partition_id: usize) -> Self {
        FileWriter {
            ctx,
            partition_id,
            open: HashMap::new(),
            files: 0,
            written: Vec::new(),
        }
    }

    fn encode_err(&self, path: &str) -> impl Fn(String) -> FileSinkError + '_ {
        let path = path.to_string();
        move |reason| FileSinkError::Encode {
            location: self.ctx.output.shown.clone(),
            path: path.clone(),
            reason,
        }
    }

    fn open_file(&mut self, values: &PartitionKey) -> Result<OpenFile, FileSinkError> {
        let layout = &self.ctx.layout;
        let name = format!(
            "{}-{:03}.{}",
            self.ctx.file_prefix,
            self.files,
            layout.format.extension()
        );
        self.files += 1;
        let dir = partition::directory(&layout.partition_columns, values);
        let path = if dir.is_empty() { name } else { format!("{dir}/{name}") };
        let encoder = match layout.format {
            FileFormat::Parquet => {
                let props = WriterProperties::builder()
                    .set_compression(Compression::ZSTD(ZstdLevel::default()))
                    .build();
                let w = ArrowWriter::try_new(Vec::new(), layout.file_schema.clone(), Some(props))
                    .map_err(|e| self.encode_err(&path)(e.to_string()))?;
                Encoder::Parquet(Box::new(w))
            }
            FileFormat::JsonLines => Encoder::Json(arrow_json::LineDelimitedWriter::new(Vec::new())),
        };
        Ok(OpenFile {
            path,
            values: values.clone(),
            encoder,
            rows: 0,
        })
    }

    fn write_rows(&self, file: &mut OpenFile, rows: &RecordBatch) -> Result<u64, FileSinkError> {
        let err = self.encode_err(&file.path);
        file.rows += rows.num_rows() as u64;
        match &mut file.encoder {
            Encoder::Parquet(w) => {
                w.write(rows).map_err(|e| err(e.to_string()))?;
                Ok((w.bytes_written() + w.in_progress_size()) as u64)
            }
            Encoder::Json(w) => {
                w.write(rows).map_err(|e| err(e.to_string()))?;
                Ok(w.get_ref().len() as u64)
            }
        }
    }

    async fn finish(&mut self, file: OpenFile) -> Result<(), FileSinkError> {
        let OpenFile {
            path,
            values,
            encoder,
            rows,
        } = file;
        let bytes = {
            let err = self.encode_err(&path);
            match encoder {
                Encoder::Parquet(w) => w.into_inner().map_err(|e| err(e.to_string()))?,
                Encoder::Json(mut w) => {
                    w.finish().map_err(|e| err(e.to_string()))?;
                    w.into_inner()
                }
            }
        };
        let size = bytes.len() as u64;
        let output = &self.ctx.output;
        output
            .store
            .put(&output.path(&path)?, PutPayload::from(bytes))
            .await
            .map_err(output.store_err(&path))?;
        let partition = self.ctx.layout.partition_columns.iter().cloned().zip(values).collect();
        self.written.push(FileEntry {
            path,
            size,
            rows,
            partition,
            batch_id: 0,
            committed_at: 0,
        });
        Ok(())
    }
}

#[async_trait]
impl DataWriter for FileWriter {
    async fn write(&mut self, batch: RecordBatch) -> weir_core::Result<()> {
        let batch_id = Some(self.ctx.batch_id);
        let layout = self.ctx.layout.clone();
        let parts = partition::split(&batch, &layout.partition_indices).map_err(|e| {
            FileSinkError::Encode {
                location: self.ctx.output.shown.clone(),
                path: String::new(),
                reason: e.to_string(),
            }
            .into_core(batch_id)
        })?;
        for (values, part) in parts {
            let rows = part.project(&layout.file_columns).map_err(|e| {
                FileSinkError::Encode {
                    location: self.ctx.output.shown.clone(),
                    path: String::new(),
                    reason: e.to_string(),
                }
                .into_core(batch_id)
            })?;
            let columns = rows
                .columns()
                .iter()
                .zip(layout.file_schema.fields())
                .map(|(c, f)| {
                    if c.data_type() == f.data_type() {
                        c.clone()
                    } else {
                        // Only a time zone's name differs (see `json_schema`).
                        let data = c.to_data().into_builder().data_type(f.data_type().clone());
                        arrow_array::make_array(data.build().expect("the same layout"))
                    }
                })
                .collect();
            let rows = RecordBatch::try_new(layout.file_schema.clone(), columns).map_err(|e| {
                FileSinkError::Encode {
                    location: self.ctx.output.shown.clone(),
                    path: String::new(),
                    reason: e.to_string(),
                }
                .into_core(batch_id)
            })?;
            let mut file = match self.open.remove(&values) {
                Some(f) => f,
                None => self.open_file(&values).map_err(|e| e.into_core(batch_id))?,
            };
            let size = self.write_rows(&mut file, &rows).map_err(|e| e.into_core(batch_id))?;
            if size >= layout.target_file_size {
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

    async fn abort(self: Box<Self>) -> weir_core::Result<()> {
        delete_files(&self.ctx.output, &self.written).await;
        Ok(())
    }
}

/// Deletes files of an attempt that no log entry will list (best effort: a
/// file left behind is an orphan, never a visible row).
pub(crate) async fn delete_files(output: &Output, files: &[FileEntry]) {
    for f in files {
        let Ok(path) = output.path(&f.path) else { continue };
        if let Err(e) = output.store.delete(&path).await {
            if !matches!(e, object_store::Error::NotFound { .. }) {
                tracing::warn!(path = %f.path, error = %e, "could not delete a file of an aborted attempt; it is an orphan");
            }
        }
    }
}
