//! State files: one Arrow IPC file each.

use std::io::{Cursor, Write};

use arrow_array::RecordBatch;
use arrow_ipc::reader::FileReader;
use arrow_ipc::writer::FileWriter;
use arrow_schema::ArrowError;
use bytes::Bytes;

/// Writes an IPC file holding `batch` into `out`; an error of Arrow's own
/// (not the writer's) is of kind `InvalidData`.
pub(crate) fn write(batch: &RecordBatch, out: &mut dyn Write) -> std::io::Result<()> {
    let ipc = |e: ArrowError| match e {
        ArrowError::IoError(_, source) => source,
        other => std::io::Error::new(std::io::ErrorKind::InvalidData, other),
    };
    let mut writer = FileWriter::try_new(out, &batch.schema()).map_err(ipc)?;
    writer.write(batch).map_err(ipc)?;
    writer.finish().map_err(ipc)
}

/// The batches of an IPC file.
pub(crate) fn decode(bytes: Bytes) -> Result<Vec<RecordBatch>, ArrowError> {
    FileReader::try_new(Cursor::new(bytes), None)?.collect()
}
