//! State files: one Arrow IPC file each.

use std::io::Cursor;

use arrow_array::RecordBatch;
use arrow_ipc::reader::FileReader;
use arrow_ipc::writer::FileWriter;
use arrow_schema::ArrowError;
use bytes::Bytes;

/// The bytes of an IPC file holding `batch`.
pub(crate) fn encode(batch: &RecordBatch) -> Result<Bytes, ArrowError> {
    let mut buf = Vec::with_capacity(batch.get_array_memory_size() + 1024);
    let mut writer = FileWriter::try_new(&mut buf, &batch.schema())?;
    writer.write(batch)?;
    writer.finish()?;
    drop(writer);
    Ok(Bytes::from(buf))
}

/// The batches of an IPC file.
pub(crate) fn decode(bytes: Bytes) -> Result<Vec<RecordBatch>, ArrowError> {
    FileReader::try_new(Cursor::new(bytes), None)?.collect()
}
