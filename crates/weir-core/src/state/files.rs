//! State files: one Arrow IPC file each.

use std::io::{Cursor, Write};

use arrow_array::RecordBatch;
use arrow_ipc::reader::FileReader;
use arrow_ipc::writer::FileWriter;
use arrow_schema::ArrowError;
use bytes::Bytes;

/// Writes an IPC file holding `batch` into `out`, as record batches of
/// about `chunk_bytes` each (at least one row, and one batch when `batch`
/// has no rows): Arrow's writer gathers each record batch into a buffer of
/// its own first, and small buffers are reused where one large one would
/// be new memory every time. An error of Arrow's own (not the writer's) is
/// of kind `InvalidData`.
pub(crate) fn write(batch: &RecordBatch, out: &mut dyn Write, chunk_bytes: usize) -> std::io::Result<()> {
    let ipc = |e: ArrowError| match e {
        ArrowError::IoError(_, source) => source,
        other => std::io::Error::new(std::io::ErrorKind::InvalidData, other),
    };
    let mut writer = FileWriter::try_new(out, &batch.schema()).map_err(ipc)?;
    let rows = batch.num_rows();
    let bytes = batch.get_array_memory_size().max(1);
    let per_chunk = ((chunk_bytes as u128 * rows as u128) / bytes as u128).clamp(1, rows.max(1) as u128) as usize;
    if rows == 0 {
        writer.write(batch).map_err(ipc)?;
    }
    for start in (0..rows).step_by(per_chunk) {
        writer
            .write(&batch.slice(start, per_chunk.min(rows - start)))
            .map_err(ipc)?;
    }
    writer.finish().map_err(ipc)
}

/// The batches of an IPC file.
pub(crate) fn decode(bytes: Bytes) -> Result<Vec<RecordBatch>, ArrowError> {
    FileReader::try_new(Cursor::new(bytes), None)?.collect()
}
