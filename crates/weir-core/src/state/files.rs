//! State files: one Arrow IPC file each.

use std::io::{Cursor, Write};

use arrow_array::RecordBatch;
use arrow_ipc::reader::FileReader;
use arrow_ipc::writer::FileWriter;
use arrow_schema::{ArrowError, DataType};
use bytes::Bytes;

/// Writes an IPC file holding `batch` into `out`, as record batches of
/// about `chunk_bytes` each on average (at least one row, and one batch
/// when `batch` has no rows): Arrow's writer gathers each record batch into
/// a buffer of its own first, and small buffers are reused where one large
/// one would be new memory every time. A batch with a column whose slices
/// Arrow writes whole (views, run-end encoding) is written as one. An error of Arrow's own (not the writer's) is
/// of kind `InvalidData`.
pub(crate) fn write(batch: &RecordBatch, out: &mut dyn Write, chunk_bytes: usize) -> std::io::Result<()> {
    let ipc = |e: ArrowError| match e {
        ArrowError::IoError(_, source) => source,
        other => std::io::Error::new(std::io::ErrorKind::InvalidData, other),
    };
    let mut writer = FileWriter::try_new(out, &batch.schema()).map_err(ipc)?;
    let rows = batch.num_rows();
    let bytes = batch.get_array_memory_size().max(1);
    let per_chunk = if batch.schema().fields().iter().all(|f| slices_trimmed(f.data_type())) {
        ((chunk_bytes as u128 * rows as u128) / bytes as u128).clamp(1, rows.max(1) as u128) as usize
    } else {
        rows.max(1)
    };
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

/// Whether Arrow's IPC writer writes a slice of a `data_type` column
/// trimmed to the slice. View types write all their data buffers, and
/// run-end encoded, list-view and union columns their whole children.
fn slices_trimmed(data_type: &DataType) -> bool {
    match data_type {
        DataType::Utf8View
        | DataType::BinaryView
        | DataType::ListView(_)
        | DataType::LargeListView(_)
        | DataType::RunEndEncoded(..)
        | DataType::Union(..)
        | DataType::Dictionary(..) => false,
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) | DataType::Map(f, _) => {
            slices_trimmed(f.data_type())
        }
        DataType::Struct(fields) => fields.iter().all(|f| slices_trimmed(f.data_type())),
        _ => true,
    }
}

/// The batches of an IPC file.
pub(crate) fn decode(bytes: Bytes) -> Result<Vec<RecordBatch>, ArrowError> {
    FileReader::try_new(Cursor::new(bytes), None)?.collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array, StringViewArray};
    use arrow_schema::{Field, Schema};

    use super::*;

    fn batches_of(batch: &RecordBatch, chunk_bytes: usize) -> Vec<RecordBatch> {
        let mut out = Vec::new();
        write(batch, &mut out, chunk_bytes).unwrap();
        decode(Bytes::from(out)).unwrap()
    }

    /// Chunks keep every row in order; a view column, whose slices would
    /// each carry all its data, is written as one batch.
    #[test]
    fn a_file_holds_the_rows_in_chunks_unless_slices_carry_everything() {
        let ints: ArrayRef = Arc::new(Int64Array::from_iter_values(0..10_000));
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)])),
            vec![ints],
        )
        .unwrap();
        let chunks = batches_of(&batch, 8 << 10);
        assert!(chunks.len() > 5, "{} chunks", chunks.len());
        assert_eq!(
            arrow_select::concat::concat_batches(&batch.schema(), &chunks).unwrap(),
            batch
        );
        let empty = batch.slice(0, 0);
        assert_eq!(
            batches_of(&empty, 8 << 10).len(),
            1,
            "an empty batch keeps the file's schema"
        );
        let views: ArrayRef = Arc::new(StringViewArray::from_iter_values(
            (0..10_000).map(|i| format!("a long value, number {i}")),
        ));
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8View, false)])),
            vec![views],
        )
        .unwrap();
        assert_eq!(batches_of(&batch, 8 << 10), vec![batch]);
    }
}
