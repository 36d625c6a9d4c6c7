//! A Parquet data file being written, row group by row group: held in
//! memory and put whole, sent in parts as it grows, or written straight to
//! a table on a local disk. The sink's writers and compaction both write
//! their files through it.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use deltalake::ObjectStore;
use object_store::path::Path;
use object_store::{MultipartUpload, ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression as ParquetCompression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use serde::{Deserialize, Serialize};

use crate::error::DeltaSinkError;
use crate::options::Compression;
use crate::stats::FileStats;

/// One data file a writer wrote: what its `add` action needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct AddFile {
    /// Relative to the table root, as stored (not URL-encoded).
    pub path: String,
    pub size: i64,
    pub partition_values: BTreeMap<String, Option<String>>,
    pub modification_time: i64,
    pub stats: String,
    pub rows: i64,
}

/// A part upload's result, a failed task included.
async fn joined(part: tokio::task::JoinHandle<object_store::Result<()>>) -> object_store::Result<()> {
    part.await.unwrap_or_else(|e| {
        Err(object_store::Error::Generic {
            store: "upload",
            source: Box::new(e),
        })
    })
}

/// A row group is closed once its buffered rows reach this estimate, so a
/// writer's memory does not grow with its file.
const ROW_GROUP_BYTES: usize = 16 << 20;

/// The same for a file written straight to disk, which holds no part in
/// memory besides: larger row groups cost less to encode (each column
/// chunk builds its dictionary again) and read well.
const DISK_ROW_GROUP_BYTES: usize = 64 << 20;

/// Once closed row groups have left this many encoded bytes, they go up as
/// a part of a multipart upload (begun then); a file that never gets there
/// is put in one request.
const PART_BYTES: usize = 8 << 20;

/// Parts uploading while the writer goes on encoding; one more waits for
/// the oldest.
const PARTS_IN_FLIGHT: usize = 2;

/// Where a data file's encoded bytes go.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Destination {
    /// The table's object store: the bytes are held in memory and put in
    /// one request, or sent in parts.
    Store,
    /// This file on a local disk (the table's own file, as its store would
    /// name it), written as row groups close. Its writes block, so a file
    /// bound for disk is encoded only on a thread that may block (not a
    /// runtime worker).
    Disk(std::path::PathBuf),
}

/// The encoded bytes of a file being written.
enum Output {
    Memory(Vec<u8>),
    Disk(std::fs::File),
}

impl std::io::Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Output::Memory(v) => v.write(buf),
            Output::Disk(f) => f.write(buf),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Output::Memory(v) => v.write_all(buf),
            Output::Disk(f) => f.write_all(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Output::Memory(_) => Ok(()),
            Output::Disk(f) => f.flush(),
        }
    }
}

/// One data file being written.
///
/// Bound for the store, its encoded bytes stay in memory until the file is
/// closed and put in one request, or, for a large file, go up in parts of
/// a multipart upload as closed row groups pass [`PART_BYTES`]: a writer
/// holds about one row group and one part, whatever the file's size.
/// (Parts differ in size; every store weir targets accepts that.) Bound
/// for a local disk, closed row groups are written straight to the file.
pub(crate) struct OpenFile {
    path: String,
    values: Vec<Option<String>>,
    /// Until the file is closed.
    writer: Option<ArrowWriter<Output>>,
    /// Once the file is closed: its last bytes, or its file on disk.
    closed: Option<Output>,
    /// The local file written, if the file goes to disk.
    disk: Option<std::path::PathBuf>,
    stats: FileStats,
    upload: Option<Box<dyn MultipartUpload>>,
    /// Parts still uploading, oldest first.
    in_flight: std::collections::VecDeque<tokio::task::JoinHandle<object_store::Result<()>>>,
    /// Bytes already sent as parts.
    sent: u64,
    row_group_bytes: usize,
    part_bytes: usize,
}

/// How data files are encoded and described.
pub(crate) struct FileFormat<'a> {
    pub schema: &'a SchemaRef,
    pub compression: Compression,
    pub num_indexed_cols: usize,
    pub stats_columns: Option<&'a [String]>,
}

impl OpenFile {
    /// A file at `path` (relative to the table root) in the partition with
    /// `values`, bound for the table's store.
    pub(crate) fn create(
        table: &str,
        path: String,
        values: &[Option<String>],
        format: &FileFormat<'_>,
    ) -> Result<Self, DeltaSinkError> {
        Self::create_in(table, path, values, format, Destination::Store)
    }

    /// A file at `path` in the partition with `values`, bound for
    /// `destination`.
    pub(crate) fn create_in(
        table: &str,
        path: String,
        values: &[Option<String>],
        format: &FileFormat<'_>,
        destination: Destination,
    ) -> Result<Self, DeltaSinkError> {
        let compression = match format.compression {
            Compression::Zstd(level) => ParquetCompression::ZSTD(ZstdLevel::try_new(level).unwrap_or_default()),
            Compression::Snappy => ParquetCompression::SNAPPY,
        };
        let properties = WriterProperties::builder().set_compression(compression).build();
        let row_group_bytes = match destination {
            Destination::Store => ROW_GROUP_BYTES,
            Destination::Disk(_) => DISK_ROW_GROUP_BYTES,
        };
        let (sink, disk) = match destination {
            Destination::Store => (Output::Memory(Vec::new()), None),
            Destination::Disk(file) => {
                let created = file
                    .parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| std::fs::File::create_new(&file));
                let created = created.map_err(|source| DeltaSinkError::Disk {
                    table: table.to_string(),
                    path: path.clone(),
                    source,
                })?;
                (Output::Disk(created), Some(file))
            }
        };
        let writer = match ArrowWriter::try_new(sink, format.schema.clone(), Some(properties)) {
            Ok(writer) => writer,
            Err(source) => {
                if let Some(file) = &disk {
                    let _ = std::fs::remove_file(file);
                }
                return Err(DeltaSinkError::Parquet {
                    table: table.to_string(),
                    path: path.clone(),
                    source,
                });
            }
        };
        Ok(OpenFile {
            path,
            values: values.to_vec(),
            writer: Some(writer),
            closed: None,
            disk,
            stats: FileStats::new(format.schema, format.num_indexed_cols, format.stats_columns),
            upload: None,
            in_flight: std::collections::VecDeque::new(),
            sent: 0,
            row_group_bytes,
            part_bytes: PART_BYTES,
        })
    }

    fn parquet_err(&self, table: &str) -> impl FnOnce(parquet::errors::ParquetError) -> DeltaSinkError {
        let (table, path) = (table.to_string(), self.path.clone());
        move |source| DeltaSinkError::Parquet { table, path, source }
    }

    fn store_err(&self, table: &str) -> impl FnOnce(object_store::Error) -> DeltaSinkError {
        let (table, path) = (table.to_string(), self.path.clone());
        move |source| DeltaSinkError::Store { table, path, source }
    }

    /// Appends rows of the file's schema; closes the row group once it is
    /// large, and sends a part once enough bytes are encoded.
    pub(crate) async fn write(
        &mut self,
        table: &str,
        store: &Arc<dyn ObjectStore>,
        rows: &RecordBatch,
    ) -> Result<(), DeltaSinkError> {
        self.encode(table, rows)?;
        self.send_if_ready(table, store).await
    }

    /// Encodes rows of the file's schema, closing the row group once it is
    /// large; CPU work, for a thread that may block (not a runtime worker:
    /// a file on disk is written here). Bound for the store, the bytes stay
    /// in memory until [`send_if_ready`](Self::send_if_ready) or `finish`.
    pub(crate) fn encode(&mut self, table: &str, rows: &RecordBatch) -> Result<(), DeltaSinkError> {
        let Some(writer) = self.writer.as_mut() else {
            return Err(self.parquet_err(table)(closed()));
        };
        let written = writer.write(rows).and_then(|()| {
            if writer.in_progress_size() >= self.row_group_bytes {
                writer.flush()?;
            }
            Ok(())
        });
        written.map_err(|e| self.parquet_err(table)(e))?;
        self.stats.update(rows);
        Ok(())
    }

    /// Whether enough encoded bytes wait to go up as a part (never for a
    /// file on disk).
    pub(crate) fn part_ready(&self) -> bool {
        match self.writer.as_ref().map(|w| w.inner()) {
            Some(Output::Memory(bytes)) => bytes.len() >= self.part_bytes,
            _ => false,
        }
    }

    /// Sends the encoded bytes as a part once there are enough of them.
    pub(crate) async fn send_if_ready(
        &mut self,
        table: &str,
        store: &Arc<dyn ObjectStore>,
    ) -> Result<(), DeltaSinkError> {
        if self.part_ready() {
            self.send_part(table, store).await?;
        }
        Ok(())
    }

    /// Sends the encoded bytes so far as the next part. The Parquet writer
    /// counts offsets itself, so taking the bytes it has written does not
    /// disturb it.
    async fn send_part(&mut self, table: &str, store: &Arc<dyn ObjectStore>) -> Result<(), DeltaSinkError> {
        if self.upload.is_none() {
            let location = Path::parse(&self.path).map_err(|e| self.store_err(table)(e.into()))?;
            self.upload = Some(store.put_multipart(&location).await.map_err(self.store_err(table))?);
        }
        let Some(Output::Memory(buffer)) = self.writer.as_mut().map(|w| w.inner_mut()) else {
            return Ok(());
        };
        let bytes = std::mem::take(buffer);
        self.sent += bytes.len() as u64;
        let part = self
            .upload
            .as_mut()
            .expect("begun above")
            .put_part(PutPayload::from(bytes));
        // The part uploads while the writer encodes the next rows; at most
        // PARTS_IN_FLIGHT parts are held.
        self.in_flight.push_back(tokio::spawn(part));
        while self.in_flight.len() > PARTS_IN_FLIGHT {
            let oldest = self.in_flight.pop_front().expect("more than one");
            joined(oldest).await.map_err(self.store_err(table))?;
        }
        Ok(())
    }

    /// The encoded size so far, buffered row group included.
    pub(crate) fn size(&self) -> u64 {
        self.writer
            .as_ref()
            .map_or(0, |w| (w.bytes_written() + w.in_progress_size()) as u64)
    }

    /// Gives the file up: a multipart upload begun for it is aborted, a
    /// file on disk deleted.
    pub(crate) async fn abort(mut self) {
        if let Some(file) = self.disk.take() {
            drop(self.writer.take());
            drop(self.closed.take());
            if let Err(e) = std::fs::remove_file(&file) {
                tracing::warn!(path = %self.path, error = %e, "could not delete an abandoned data file");
            }
        }
        for part in self.in_flight.drain(..) {
            let _ = joined(part).await;
        }
        if let Some(upload) = self.upload.as_mut() {
            if let Err(e) = upload.abort().await {
                tracing::warn!(path = %self.path, error = %e, "could not abort the upload of an abandoned data file");
            }
        }
    }

    /// Writes the last row group and the footer: CPU work, and for a file
    /// on disk its last writes, so for a thread that may block.
    /// [`finish`](Self::finish) closes a file not closed yet.
    pub(crate) fn close(&mut self, table: &str) -> Result<(), DeltaSinkError> {
        if let Some(writer) = self.writer.take() {
            let sink = writer.into_inner().map_err(self.parquet_err(table))?;
            self.closed = Some(sink);
        }
        Ok(())
    }

    /// Closes the file and puts it in the store (a file on disk is already
    /// there). On an error nothing of the file is left.
    pub(crate) async fn finish(
        mut self,
        table: &str,
        store: &Arc<dyn ObjectStore>,
        partition_columns: &[String],
    ) -> Result<AddFile, DeltaSinkError> {
        if let Err(e) = self.close(table) {
            self.abort().await;
            return Err(e);
        }
        // Taken out, so dropping what is left deletes nothing.
        let disk = self.disk.take();
        let closed = self.closed.take();
        let upload = self.upload.take();
        let in_flight = std::mem::take(&mut self.in_flight);
        let (path, values, sent) = (
            std::mem::take(&mut self.path),
            std::mem::take(&mut self.values),
            self.sent,
        );
        let stats = &self.stats;
        let store_err = |source| DeltaSinkError::Store {
            table: table.to_string(),
            path: path.clone(),
            source,
        };
        let bytes = match closed {
            Some(Output::Memory(bytes)) => bytes,
            Some(Output::Disk(file)) => {
                let size = file.metadata().map(|m| m.len());
                drop(file);
                let size = match size {
                    Ok(size) => size,
                    Err(e) => {
                        if let Some(disk) = &disk {
                            let _ = std::fs::remove_file(disk);
                        }
                        return Err(DeltaSinkError::Disk {
                            table: table.to_string(),
                            path,
                            source: e,
                        });
                    }
                };
                return Ok(added(path, size as i64, partition_columns, values, stats));
            }
            None => unreachable!("closed above"),
        };
        let size = (sent + bytes.len() as u64) as i64;
        match upload {
            Some(mut upload) => {
                let sent = async {
                    for part in in_flight {
                        joined(part).await?;
                    }
                    upload.put_part(PutPayload::from(bytes)).await?;
                    upload.complete().await
                }
                .await;
                if let Err(e) = sent {
                    let _ = upload.abort().await;
                    return Err(store_err(e));
                }
            }
            None => {
                let location = Path::parse(&path).map_err(|e| store_err(e.into()))?;
                store.put(&location, PutPayload::from(bytes)).await.map_err(store_err)?;
            }
        }
        Ok(added(path, size, partition_columns, values, stats))
    }
}

impl Drop for OpenFile {
    /// A file on disk that was neither finished nor aborted (its writer
    /// panicked, or its job was dropped) is deleted. (A multipart upload
    /// cannot be aborted without a runtime; the store's lifecycle rules
    /// remove incomplete uploads.)
    fn drop(&mut self) {
        if let Some(file) = self.disk.take() {
            // Closed first: some systems do not delete an open file.
            drop(self.writer.take());
            drop(self.closed.take());
            let _ = std::fs::remove_file(file);
        }
    }
}

/// The error of a write to a file already closed (a bug of weir's).
fn closed() -> parquet::errors::ParquetError {
    parquet::errors::ParquetError::General("the data file is already closed".into())
}

/// What the `add` action of a written file needs.
fn added(
    path: String,
    size: i64,
    partition_columns: &[String],
    values: Vec<Option<String>>,
    stats: &FileStats,
) -> AddFile {
    AddFile {
        path,
        size,
        partition_values: partition_columns.iter().cloned().zip(values).collect(),
        modification_time: chrono::Utc::now().timestamp_millis(),
        stats: stats.to_json(),
        rows: stats.num_records(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, StringArray};
    use arrow_schema::{DataType, Field, Schema};
    use object_store::memory::InMemory;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::*;

    /// With small thresholds a file goes up in several parts, and the parts
    /// together are the whole file.
    #[tokio::test]
    async fn a_large_file_goes_up_in_parts_that_read_back_whole() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("text", DataType::Utf8, false),
        ]));
        let format = FileFormat {
            schema: &schema,
            compression: Compression::Snappy,
            num_indexed_cols: 32,
            stats_columns: None,
        };
        let mut file = OpenFile::create("t", "big.parquet".into(), &[], &format).unwrap();
        file.row_group_bytes = 64 << 10;
        file.part_bytes = 96 << 10;
        let mut parts = 0;
        for chunk in 0..20i64 {
            let ids: Vec<i64> = (chunk * 5000..(chunk + 1) * 5000).collect();
            let text: Vec<String> = ids
                .iter()
                .map(|i| format!("{:x}", (*i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)))
                .collect();
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from(ids)), Arc::new(StringArray::from(text))],
            )
            .unwrap();
            let sent = file.sent;
            file.write("t", &store, &batch).await.unwrap();
            parts += usize::from(file.sent > sent);
        }
        assert!(parts >= 3, "only {parts} parts were sent");
        let added = file.finish("t", &store, &[]).await.unwrap();
        let bytes = store
            .get(&Path::from("big.parquet"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(bytes.len() as i64, added.size);
        let rows: usize = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .unwrap()
            .build()
            .unwrap()
            .map(|b| b.unwrap().num_rows())
            .sum();
        assert_eq!((rows, added.rows), (100_000, 100_000));
    }

    /// A file bound for disk is written there as row groups close; one that
    /// is dropped unfinished (a panicking writer) is deleted, a finished one
    /// stays with the size on disk.
    #[tokio::test]
    async fn a_file_on_disk_is_kept_when_finished_and_deleted_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let format = FileFormat {
            schema: &schema,
            compression: Compression::Snappy,
            num_indexed_cols: 32,
            stats_columns: None,
        };
        let batch =
            RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from_iter_values(0..1000))]).unwrap();
        let open = |name: &str| {
            let on_disk = dir.path().join("p=1").join(name);
            let file = OpenFile::create_in(
                "t",
                format!("p=1/{name}"),
                &[],
                &format,
                Destination::Disk(on_disk.clone()),
            );
            (file.unwrap(), on_disk)
        };

        let (mut dropped, dropped_path) = open("dropped.parquet");
        dropped.encode("t", &batch).unwrap();
        assert!(dropped_path.exists());
        drop(dropped);
        assert!(!dropped_path.exists(), "an unfinished file is deleted");

        let (mut kept, kept_path) = open("kept.parquet");
        kept.encode("t", &batch).unwrap();
        assert!(!kept.part_ready(), "a file on disk sends no parts");
        let added = kept.finish("t", &store, &[]).await.unwrap();
        assert_eq!(std::fs::metadata(&kept_path).unwrap().len() as i64, added.size);
        let rows: usize = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(&kept_path).unwrap())
            .unwrap()
            .build()
            .unwrap()
            .map(|b| b.unwrap().num_rows())
            .sum();
        assert_eq!((rows, added.rows), (1000, 1000));
        assert!(
            futures::StreamExt::next(&mut store.list(None)).await.is_none(),
            "nothing went through the store"
        );
    }
}
