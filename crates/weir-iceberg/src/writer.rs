//! Partition writers: Parquet data files with Iceberg field ids, under the
//! table's `data/` directory, invisible until the batch's snapshot lists them.

use std::sync::Arc;

use arrow_array::RecordBatch;
use async_trait::async_trait;
use iceberg::arrow::RecordBatchPartitionSplitter;
use iceberg::io::FileIO;
use iceberg::spec::{
    deserialize_data_file_from_json, serialize_data_file_to_json, DataFile, DataFileFormat, FormatVersion,
    PartitionSpec, Schema, StructType,
};
use iceberg::writer::base_writer::data_file_writer::{DataFileWriter as IcebergDataFileWriter, DataFileWriterBuilder};
use iceberg::writer::file_writer::location_generator::{DefaultFileNameGenerator, DefaultLocationGenerator};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::partitioning::fanout_writer::FanoutWriter;
use iceberg::writer::partitioning::PartitioningWriter;
use iceberg::writer::{IcebergWriter as _, IcebergWriterBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use weir_core::sink::{CommitMessage, DataWriter};

use crate::error::IcebergSinkError;
use crate::table::Layout;

type Builder = DataFileWriterBuilder<ParquetWriterBuilder, DefaultLocationGenerator, DefaultFileNameGenerator>;
type Unpartitioned = IcebergDataFileWriter<ParquetWriterBuilder, DefaultLocationGenerator, DefaultFileNameGenerator>;

/// What every writer of a batch shares. (`Debug` leaves out the file IO,
/// whose settings may hold secrets.)
#[derive(Clone)]
pub(crate) struct WriterContext {
    pub table: String,
    pub file_io: FileIO,
    pub layout: Arc<Layout>,
    pub locations: DefaultLocationGenerator,
    /// `part-<batch>-<query id>-<attempt>-p<partition>`: unique per attempt,
    /// so a replay never overwrites a file of an earlier attempt.
    pub file_prefix: String,
}

impl std::fmt::Debug for WriterContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterContext")
            .field("table", &self.table)
            .field("file_prefix", &self.file_prefix)
            .finish_non_exhaustive()
    }
}

enum Inner {
    Unpartitioned(Box<Unpartitioned>),
    Partitioned(Box<(FanoutWriter<Builder>, RecordBatchPartitionSplitter)>),
}

/// Writes one partition of one batch, rolling files at the target size.
pub(crate) struct IcebergWriter {
    ctx: WriterContext,
    partition_id: usize,
    inner: Option<Inner>,
}

impl IcebergWriter {
    pub(crate) fn new(ctx: WriterContext, partition_id: usize) -> Self {
        IcebergWriter {
            ctx,
            partition_id,
            inner: None,
        }
    }

    fn err(&self, context: &str) -> impl Fn(iceberg::Error) -> IcebergSinkError + '_ {
        let context = context.to_string();
        move |source| IcebergSinkError::Iceberg {
            table: self.ctx.table.clone(),
            context: context.clone(),
            source: Box::new(source),
        }
    }
}

/// Opens the writers of a partition. (A free function: the writers are not
/// `Sync`, so no `&IcebergWriter` may live across an await.)
async fn open(ctx: &WriterContext) -> Result<Inner, IcebergSinkError> {
    let err = |context: &'static str| {
        move |source| IcebergSinkError::Iceberg {
            table: ctx.table.clone(),
            context: context.into(),
            source: Box::new(source),
        }
    };
    let layout = &ctx.layout;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .build();
    let parquet = ParquetWriterBuilder::new(props, layout.schema.clone());
    let rolling = RollingFileWriterBuilder::new(
        parquet,
        layout.target_file_size as usize,
        ctx.file_io.clone(),
        ctx.locations.clone(),
        DefaultFileNameGenerator::new(ctx.file_prefix.clone(), None, DataFileFormat::Parquet),
    );
    let builder = DataFileWriterBuilder::new(rolling);
    if layout.spec.is_unpartitioned() {
        let writer = builder.build(None).await.map_err(err("open a data file"))?;
        return Ok(Inner::Unpartitioned(Box::new(writer)));
    }
    let splitter =
        RecordBatchPartitionSplitter::try_new_with_computed_values(layout.schema.clone(), layout.spec.clone())
            .map_err(err("prepare partitioning"))?;
    Ok(Inner::Partitioned(Box::new((FanoutWriter::new(builder), splitter))))
}

#[async_trait]
impl DataWriter for IcebergWriter {
    async fn write(&mut self, batch: RecordBatch) -> weir_core::Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let rows = self
            .ctx
            .layout
            .project(&batch)
            .map_err(|e| IcebergSinkError::SchemaMismatch {
                table: self.ctx.table.clone(),
                differences: e.to_string(),
            })?;
        if self.inner.is_none() {
            self.inner = Some(open(&self.ctx).await?);
        }
        let table = self.ctx.table.clone();
        let err = |source| IcebergSinkError::Iceberg {
            table: table.clone(),
            context: "write a data file".into(),
            source: Box::new(source),
        };
        match self.inner.as_mut().expect("opened above") {
            Inner::Unpartitioned(w) => w.write(rows).await.map_err(err)?,
            Inner::Partitioned(parts) => {
                let (w, splitter) = &mut **parts;
                for (key, part) in splitter.split(&rows).map_err(err)? {
                    w.write(key, part).await.map_err(err)?;
                }
            }
        }
        Ok(())
    }

    async fn commit(mut self: Box<Self>) -> weir_core::Result<CommitMessage> {
        let files = match self.inner.take() {
            None => Vec::new(),
            Some(Inner::Unpartitioned(mut w)) => w.close().await.map_err(self.err("close a data file"))?,
            Some(Inner::Partitioned(parts)) => parts.0.close().await.map_err(self.err("close a data file"))?,
        };
        let layout = &self.ctx.layout;
        let partition_type = layout
            .spec
            .partition_type(&layout.schema)
            .map_err(self.err("derive the partition type"))?;
        let encoded = files
            .into_iter()
            .map(|f| serialize_data_file_to_json(f, &partition_type, FormatVersion::V2))
            .collect::<Result<Vec<String>, _>>()
            .map_err(self.err("describe the data files"))?;
        CommitMessage::new(self.partition_id, &encoded)
    }

    async fn abort(mut self: Box<Self>) -> weir_core::Result<()> {
        // Close what is open to learn the files' names, then remove them.
        let files = match self.inner.take() {
            None => Vec::new(),
            Some(Inner::Unpartitioned(mut w)) => w.close().await.unwrap_or_default(),
            Some(Inner::Partitioned(parts)) => parts.0.close().await.unwrap_or_default(),
        };
        delete_files(&self.ctx.file_io, &files).await;
        Ok(())
    }
}

/// The data files of a batch's commit messages.
pub(crate) fn decode(
    messages: &[CommitMessage],
    spec: &PartitionSpec,
    partition_type: &StructType,
    schema: &Schema,
) -> weir_core::Result<Vec<DataFile>> {
    let mut files = Vec::new();
    for m in messages {
        for json in m.decode::<Vec<String>>()? {
            let file = deserialize_data_file_from_json(&json, spec.spec_id(), partition_type, schema)
                .map_err(|e| weir_core::Error::sink("iceberg", None, false, e))?;
            files.push(file);
        }
    }
    Ok(files)
}

/// Removes data files no commit will list.
pub(crate) async fn delete_files(file_io: &FileIO, files: &[DataFile]) {
    for f in files {
        if let Err(e) = file_io.delete(f.file_path()).await {
            tracing::warn!(path = f.file_path(), error = %e, "could not delete a data file of an aborted batch; it is an orphan");
        }
    }
}
