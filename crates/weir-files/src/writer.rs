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

/// The schema JSON lines are written with: a time zone the JSON encoder
/// cannot read (it reads offsets, and names only when built with time zone
/// data) but that names UTC becomes the offset `+00:00` (the same
/// instants). `Err` names a column whose time zone it can read in no way,
/// nested columns included.
pub(crate) fn json_schema(schema: &Schema) -> Result<Schema, String> {
    fn readable(tz: &str) -> bool {
        tz.parse::<arrow_array::timezone::Tz>().is_ok()
    }
    fn check_nested(field: &Field) -> Result<(), String> {
        let mut stack = vec![field.data_type().clone()];
        while let Some(t) = stack.pop() {
            match t {
                DataType::Timestamp(_, Some(tz)) if !readable(&tz) => {
                    return Err(format!(
                    "column {:?} holds a time zone {tz:?} the JSON encoder cannot read; cast it to an offset (+00:00)",
                    field.name()
                ))
                }
                DataType::Struct(fields) => stack.extend(fields.iter().map(|f| f.data_type().clone())),
                DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) | DataType::Map(f, _) => {
                    stack.push(f.data_type().clone())
                }
                _ => {}
            }
        }
        Ok(())
    }
    let fields = schema
        .fields()
        .iter()
        .map(|f| match f.data_type() {
            DataType::Timestamp(unit, Some(tz))
                if !readable(tz) && matches!(tz.as_ref(), "UTC" | "Etc/UTC" | "Z" | "GMT") =>
            {
                Ok(f.as_ref()
                    .clone()
                    .with_data_type(DataType::Timestamp(*unit, Some("+00:00".into()))))
            }
            _ => check_nested(f).map(|()| f.as_ref().clone()),
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
        let shown = self.ctx.output.shown.clone();
        let encode = |e: arrow_schema::ArrowError| {
            FileSinkError::Encode {
                location: shown.clone(),
                path: String::new(),
                reason: e.to_string(),
            }
            .into_core(batch_id)
        };
        let parts = partition::split(&batch, &layout.partition_indices).map_err(encode)?;
        for (values, part) in parts {
            let rows = part.project(&layout.file_columns).map_err(encode)?;
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
            let rows = RecordBatch::try_new(layout.file_schema.clone(), columns).map_err(encode)?;
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

/// The writers of one batch attempt when the sink coalesces: `N` shared
/// slots, each one [`FileWriter`], so a batch writes at most `N` files per
/// partition (more only past the target size), whatever the query's
/// parallelism. The last of the batch's writers to finish closes them all.
pub(crate) struct Coalesced {
    slots: Vec<tokio::sync::Mutex<Option<FileWriter>>>,
    /// Writers handed out and not yet finished.
    open_handles: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for Coalesced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalesced")
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl Coalesced {
    pub(crate) fn new(ctx: &WriterContext, slots: usize) -> Self {
        Coalesced {
            slots: (0..slots.max(1))
                .map(|i| {
                    let mut ctx = ctx.clone();
                    ctx.file_prefix = format!("{}-c{i:03}", ctx.file_prefix);
                    tokio::sync::Mutex::new(Some(FileWriter::new(ctx, i)))
                })
                .collect(),
            open_handles: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// A writer of partition `partition_id` that writes into its slot.
    pub(crate) fn handle(self: &Arc<Self>, partition_id: usize) -> CoalescingWriter {
        self.open_handles.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        CoalescingWriter {
            shared: self.clone(),
            slot: partition_id % self.slots.len(),
            partition_id,
        }
    }

    /// Marks a handle finished; `true` for the last one.
    fn finish_handle(&self) -> bool {
        self.open_handles.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1
    }
}

/// One partition's writer of a coalesced batch.
pub(crate) struct CoalescingWriter {
    shared: Arc<Coalesced>,
    slot: usize,
    partition_id: usize,
}

#[async_trait]
impl DataWriter for CoalescingWriter {
    async fn write(&mut self, batch: RecordBatch) -> weir_core::Result<()> {
        let mut slot = self.shared.slots[self.slot].lock().await;
        match slot.as_mut() {
            Some(w) => w.write(batch).await,
            None => Err(weir_core::Error::sink(
                "files",
                None,
                false,
                "a coalesced writer was used after its batch closed",
            )),
        }
    }

    async fn commit(self: Box<Self>) -> weir_core::Result<CommitMessage> {
        let mut files: Vec<FileEntry> = Vec::new();
        if self.shared.finish_handle() {
            for slot in &self.shared.slots {
                if let Some(w) = slot.lock().await.take() {
                    let message = Box::new(w).commit().await?;
                    files.extend(message.decode::<Vec<FileEntry>>()?);
                }
            }
        }
        CommitMessage::new(self.partition_id, &files)
    }

    async fn abort(self: Box<Self>) -> weir_core::Result<()> {
        if self.shared.finish_handle() {
            for slot in &self.shared.slots {
                if let Some(w) = slot.lock().await.take() {
                    Box::new(w).abort().await?;
                }
            }
        }
        Ok(())
    }
}
