//! The state of a windowed aggregation in Append mode, as bins.
//!
//! Append emits a window once, when the watermark closes it, so nothing
//! needs a group's running value before then. Each batch's partial rows
//! (one per group it saw) are kept whole, one entry per window and batch:
//! the key is (window start, batch id), the value the rows as Arrow IPC.
//! When the watermark closes a window, its entries come out together and
//! only then are a group's partial rows merged. A batch touches the state
//! once per window it saw, not once per group, and the state's delta is
//! the batch's partial rows as they are. A window that gathers more than
//! [`MAX_BINS`] bins (long windows, frequent triggers) has them merged into
//! one, so a window holds at most that many batches' partial rows.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, LargeBinaryArray, RecordBatch, UInt32Array, UInt64Array};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};
use weir_core::state::{KeyedState, StateSchema};
use weir_core::BatchId;

use crate::window::WINDOW_START;

const BATCH: &str = "__batch";
const PARTIALS: &str = "__partials";
/// The metadata entry of the bins' value column that names the partial
/// rows' columns, so a checkpoint whose aggregation changed is refused
/// when it is restored, not when a window closes.
const PARTIAL_COLUMNS: &str = "weir.partial_columns";

/// The most bins a window keeps before they are merged into one.
pub(crate) const MAX_BINS: usize = 16;

/// The bins' state schema: (window start, batch id) to the IPC bytes of
/// partial rows of `partial` columns.
pub(crate) fn state_schema(partial: &Schema) -> StateSchema {
    let columns: Vec<String> = partial
        .fields()
        .iter()
        .map(|f| {
            format!(
                "{} {}{}",
                f.name(),
                f.data_type(),
                if f.is_nullable() { "" } else { " not null" }
            )
        })
        .collect();
    let metadata = [(PARTIAL_COLUMNS.to_string(), columns.join(", "))].into();
    StateSchema::new(
        Arc::new(Schema::new(vec![
            Field::new(WINDOW_START, DataType::Int64, false),
            Field::new(BATCH, DataType::UInt64, false),
        ])),
        // Large: the bins of a snapshot can pass 2 GiB together.
        Arc::new(Schema::new(vec![
            Field::new(PARTIALS, DataType::LargeBinary, false).with_metadata(metadata)
        ])),
    )
}

/// Puts batch `batch`'s partial rows `rows` (window start first, one row
/// per group) into `state`, one entry per window; returns the windows'
/// starts.
pub(crate) fn put(state: &mut KeyedState, rows: &RecordBatch, batch: BatchId) -> Result<Vec<i64>, ArrowError> {
    let starts = rows.column(0).as_primitive::<Int64Type>();
    let mut windows: BTreeMap<i64, Vec<u32>> = BTreeMap::new();
    for (i, start) in starts.values().iter().enumerate() {
        windows.entry(*start).or_default().push(i as u32);
    }
    // Each window's rows as Arrow IPC, one after the other in one buffer:
    // a binary column of the blobs, without copying them again.
    let mut bytes = Vec::with_capacity(rows.get_array_memory_size() + 512 * windows.len());
    let mut offsets = vec![0i64];
    for indices in windows.values() {
        let rows = arrow_select::take::take_record_batch(rows, &UInt32Array::from(indices.clone()))?;
        let mut writer = StreamWriter::try_new(&mut bytes, &rows.schema())?;
        writer.write(&rows)?;
        writer.finish()?;
        drop(writer);
        offsets.push(bytes.len() as i64);
    }
    let blobs = LargeBinaryArray::new(
        OffsetBuffer::new(ScalarBuffer::from(offsets)),
        Buffer::from_vec(bytes),
        None,
    );
    let keys = state.encode_keys(&[
        Arc::new(Int64Array::from_iter_values(windows.keys().copied())) as ArrayRef,
        Arc::new(UInt64Array::from_iter_values(windows.keys().map(|_| batch.0))),
    ])?;
    let values = state
        .encode_values(&[Arc::new(blobs) as ArrayRef])?
        .expect("the bins have a value column");
    for (k, v) in keys.iter().zip(values.iter()) {
        state.put(k.data(), v);
    }
    Ok(windows.into_keys().collect())
}

/// The partial rows of taken entries (sorted by key), window by window in
/// order: each window's batches, oldest first, as `schema`.
pub(crate) fn windows(taken: &RecordBatch, schema: &SchemaRef) -> Result<Vec<Vec<RecordBatch>>, ArrowError> {
    let starts = taken.column(0).as_primitive::<Int64Type>();
    let blobs = taken.column(2).as_binary::<i64>();
    let mut out: Vec<Vec<RecordBatch>> = Vec::new();
    let mut last = None;
    for (start, blob) in starts.values().iter().zip(blobs.iter()) {
        let blob = blob.ok_or_else(|| ArrowError::InvalidArgumentError("a bin without rows".into()))?;
        let batches = StreamReader::try_new(Cursor::new(blob), None)?.collect::<Result<Vec<_>, _>>()?;
        if last != Some(*start) {
            out.push(Vec::new());
            last = Some(*start);
        }
        let window = out.last_mut().expect("pushed above");
        for b in batches {
            if b.schema().fields() != schema.fields() {
                return Err(ArrowError::SchemaError(format!(
                    "a bin's rows are {}, the aggregation's partial rows are {schema}",
                    b.schema()
                )));
            }
            window.push(b.with_schema(schema.clone())?);
        }
    }
    Ok(out)
}

/// Of the windows starting at `starts`, those holding more than
/// [`MAX_BINS`] bins, each as the keys of its bins, sorted (oldest batch
/// first). Keys are matched by their encoded window start, not decoded.
pub(crate) fn crowded(state: &KeyedState, starts: &[i64]) -> Result<Vec<Vec<Box<[u8]>>>, ArrowError> {
    if state.len() <= MAX_BINS || starts.is_empty() {
        return Ok(Vec::new());
    }
    let prefixes = state.key_prefix(&[Arc::new(Int64Array::from(starts.to_vec())) as ArrayRef])?;
    let mut windows: Vec<Vec<Box<[u8]>>> = vec![Vec::new(); starts.len()];
    for (key, _) in state.iter() {
        if let Some(w) = (0..starts.len()).find(|&w| key.starts_with(prefixes.row(w).as_ref())) {
            windows[w].push(Box::from(key));
        }
    }
    Ok(windows
        .into_iter()
        .filter(|bins| bins.len() > MAX_BINS)
        .map(|mut bins| {
            bins.sort_unstable();
            bins
        })
        .collect())
}
