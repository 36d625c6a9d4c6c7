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
use arrow_array::{ArrayRef, Int64Array, RecordBatch, UInt32Array, UInt64Array};
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

/// The most runs of a window's rows a bin holds as record batches of its
/// own; more are gathered into one.
const MAX_RUNS: usize = 8;

/// The partial rows of one window, from its bins.
pub(crate) struct WindowRows {
    /// How many bins (batches) held them.
    pub bins: usize,
    /// The rows, bin by bin, oldest first.
    pub rows: Vec<RecordBatch>,
}

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
    let starts = rows.column(0).as_primitive::<Int64Type>().values();
    // Each window's runs of rows (offset, length). DataFusion emits groups
    // as it first met them, and event times mostly rise, so a window's
    // rows are usually a few runs, written as slices without a copy.
    let mut windows: BTreeMap<i64, Vec<(usize, usize)>> = BTreeMap::new();
    let mut at = 0;
    while at < starts.len() {
        let start = starts[at];
        let len = starts[at..]
            .iter()
            .position(|s| *s != start)
            .unwrap_or(starts.len() - at);
        windows.entry(start).or_default().push((at, len));
        at += len;
    }
    let keys = state.encode_keys(&[
        Arc::new(Int64Array::from_iter_values(windows.keys().copied())) as ArrayRef,
        Arc::new(UInt64Array::from_iter_values(windows.keys().map(|_| batch.0))),
    ])?;
    let row_bytes = rows.get_array_memory_size() / rows.num_rows().max(1);
    for (runs, key) in windows.values().zip(keys.iter()) {
        let window_rows: usize = runs.iter().map(|(_, len)| len).sum();
        // Each window's rows as Arrow IPC, the state's value as it is.
        let mut blob = Vec::with_capacity(window_rows * row_bytes + 1024);
        let mut writer = StreamWriter::try_new(&mut blob, &rows.schema())?;
        // A few runs are written as slices; rows in no order (many short
        // runs) are gathered first.
        if runs.len() <= MAX_RUNS {
            for &(offset, len) in runs {
                writer.write(&rows.slice(offset, len))?;
            }
        } else {
            let indices = runs
                .iter()
                .flat_map(|&(offset, len)| offset as u32..(offset + len) as u32);
            writer.write(&arrow_select::take::take_record_batch(
                rows,
                &UInt32Array::from_iter_values(indices),
            )?)?;
        }
        writer.finish()?;
        drop(writer);
        state.put_owned(key.data(), blob.into_boxed_slice());
    }
    Ok(windows.into_keys().collect())
}

/// The partial rows of taken entries (sorted by key), window by window in
/// order: each window's batches, oldest first, as `schema`.
pub(crate) fn windows(taken: &RecordBatch, schema: &SchemaRef) -> Result<Vec<WindowRows>, ArrowError> {
    let starts = taken.column(0).as_primitive::<Int64Type>();
    let blobs = taken.column(2).as_binary::<i64>();
    let mut out: Vec<WindowRows> = Vec::new();
    let mut last = None;
    for (start, blob) in starts.values().iter().zip(blobs.iter()) {
        let blob = blob.ok_or_else(|| ArrowError::InvalidArgumentError("a bin without rows".into()))?;
        let batches = StreamReader::try_new(Cursor::new(blob), None)?.collect::<Result<Vec<_>, _>>()?;
        if last != Some(*start) {
            out.push(WindowRows {
                bins: 0,
                rows: Vec::new(),
            });
            last = Some(*start);
        }
        let window = out.last_mut().expect("pushed above");
        window.bins += 1;
        for b in batches {
            if b.schema().fields() != schema.fields() {
                return Err(ArrowError::SchemaError(format!(
                    "a bin's rows are {}, the aggregation's partial rows are {schema}",
                    b.schema()
                )));
            }
            window.rows.push(b.with_schema(schema.clone())?);
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

#[cfg(test)]
mod tests {
    use arrow_array::StringArray;

    use super::*;

    fn partial_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new(WINDOW_START, DataType::Int64, false),
            Field::new("key", DataType::Utf8, false),
            Field::new("total", DataType::Int64, true),
        ]))
    }

    /// Partial rows of these (window start, key) pairs, each with the
    /// total `start + key length`.
    fn partial_rows(groups: &[(i64, &str)]) -> RecordBatch {
        RecordBatch::try_new(
            partial_schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(groups.iter().map(|g| g.0))),
                Arc::new(StringArray::from_iter_values(groups.iter().map(|g| g.1))),
                Arc::new(Int64Array::from_iter_values(
                    groups.iter().map(|g| g.0 + g.1.len() as i64),
                )),
            ],
        )
        .unwrap()
    }

    /// Each window's (key, total) rows, as the bins give them back.
    fn read_back(state: &mut KeyedState) -> BTreeMap<i64, Vec<(String, i64)>> {
        let taken = state.take_before(&[0xff; 64]).unwrap();
        let mut out: BTreeMap<i64, Vec<(String, i64)>> = BTreeMap::new();
        for window in windows(&taken, &partial_schema()).unwrap() {
            assert_eq!(window.bins, 1, "each window has the one bin of batch 7");
            for b in window.rows {
                let starts = b.column(0).as_primitive::<Int64Type>();
                let (keys, totals) = (b.column(1).as_string::<i32>(), b.column(2).as_primitive::<Int64Type>());
                for r in 0..b.num_rows() {
                    out.entry(starts.value(r))
                        .or_default()
                        .push((keys.value(r).to_string(), totals.value(r)));
                }
            }
        }
        out
    }

    #[test]
    fn each_window_keeps_its_rows_whether_they_come_in_runs_or_in_no_order() {
        // Two parts' outputs, each in window order (a few runs), and rows
        // in no order (a run each).
        let in_runs: Vec<(i64, &str)> = vec![
            (0, "a"),
            (0, "bb"),
            (60, "a"),
            (120, "ccc"),
            (0, "d"),
            (60, "bb"),
            (60, "e"),
            (120, "a"),
        ];
        let no_order: Vec<(i64, &str)> = (0..40)
            .map(|i| ((i % 3) * 60, ["a", "bb", "ccc", "d"][i as usize % 4]))
            .collect();
        for groups in [in_runs, no_order] {
            let mut state = KeyedState::new(state_schema(&partial_schema())).unwrap();
            let starts = put(&mut state, &partial_rows(&groups), BatchId(7)).unwrap();
            let mut expected: BTreeMap<i64, Vec<(String, i64)>> = BTreeMap::new();
            for (start, key) in &groups {
                expected
                    .entry(*start)
                    .or_default()
                    .push((key.to_string(), start + key.len() as i64));
            }
            assert_eq!(starts, expected.keys().copied().collect::<Vec<_>>());
            assert_eq!(state.len(), expected.len(), "one bin per window");
            // A window's rows in input order.
            assert_eq!(read_back(&mut state), expected);
        }
    }
}
