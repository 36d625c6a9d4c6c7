//! Event-time windows: which windows each row falls in.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMillisecondType;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, UInt32Array};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use datafusion::arrow::compute::cast;

/// The column of window starts (milliseconds since the Unix epoch) that
/// rows get before they are aggregated.
pub(crate) const WINDOW_START: &str = "window_start";
/// The column of window ends in the output.
pub(crate) const WINDOW_END: &str = "window_end";

/// Tumbling (`slide == size`) or sliding windows over an event-time column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The event-time column.
    pub column: String,
    /// How long a window is.
    pub size: Duration,
    /// How far apart windows start (the size, for tumbling windows).
    pub slide: Duration,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

impl Window {
    /// Why the window cannot be used, if it cannot.
    pub(crate) fn invalid(&self) -> Option<String> {
        if self.size.as_millis() == 0 || self.slide.as_millis() == 0 {
            return Some("a window's size and slide are at least one millisecond".into());
        }
        if !self.size.subsec_nanos().is_multiple_of(1_000_000) || !self.slide.subsec_nanos().is_multiple_of(1_000_000) {
            return Some("a window's size and slide are whole milliseconds".into());
        }
        if self.slide > self.size {
            return Some(format!(
                "a window slides by {:?}, more than its size {:?}: rows between windows would be lost",
                self.slide, self.size
            ));
        }
        None
    }

    pub(crate) fn size_ms(&self) -> i64 {
        millis(self.size)
    }

    fn slide_ms(&self) -> i64 {
        millis(self.slide)
    }

    /// The starts of the windows holding event time `t`, latest first.
    pub(crate) fn starts(&self, t: i64) -> impl Iterator<Item = i64> {
        let (size, slide) = (self.size_ms(), self.slide_ms());
        let last = t - t.rem_euclid(slide);
        (0..)
            .map(move |k: i64| last - k * slide)
            .take_while(move |s| *s > t - size)
    }

    /// `batch` with a row per (row, window it falls in) and the window's
    /// start in a first column; rows without an event time fall in none.
    pub(crate) fn assign(&self, batch: &RecordBatch) -> Result<RecordBatch, arrow_schema::ArrowError> {
        let times = batch
            .column_by_name(&self.column)
            .ok_or_else(|| arrow_schema::ArrowError::SchemaError(format!("no column {:?}", self.column)))?;
        let times = event_millis(times)?;
        let mut fields = vec![Arc::new(Field::new(WINDOW_START, DataType::Int64, false))];
        fields.extend(batch.schema().fields().iter().cloned());
        let schema = Arc::new(Schema::new(fields));
        if self.slide == self.size && times.iter().all(Option::is_some) {
            // Tumbling windows: each row is in one window, so the rows stay
            // as they are (no copy) beside their windows' starts.
            let size = self.size_ms();
            let starts = Int64Array::from_iter_values(times.iter().flatten().map(|t| t - t.rem_euclid(size)));
            let mut columns: Vec<ArrayRef> = vec![Arc::new(starts)];
            columns.extend(batch.columns().iter().cloned());
            return RecordBatch::try_new(schema, columns);
        }
        let mut rows = Vec::with_capacity(batch.num_rows());
        let mut starts = Vec::with_capacity(batch.num_rows());
        for (i, t) in times.into_iter().enumerate() {
            if let Some(t) = t {
                for s in self.starts(t) {
                    rows.push(i as u32);
                    starts.push(s);
                }
            }
        }
        let rows = UInt32Array::from(rows);
        let mut columns: Vec<ArrayRef> = vec![Arc::new(Int64Array::from(starts))];
        for c in batch.columns() {
            columns.push(arrow_select::take::take(c, &rows, None)?);
        }
        RecordBatch::try_new(schema, columns)
    }
}

/// Event times in milliseconds, rounded down (so -1 µs is in the window
/// before 0, not the one after).
pub(crate) fn event_millis(times: &ArrayRef) -> Result<Vec<Option<i64>>, arrow_schema::ArrowError> {
    let per_ms: i64 = match times.data_type() {
        DataType::Timestamp(TimeUnit::Second, _) => {
            let ms = cast(times, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
            return Ok(ms.as_primitive::<TimestampMillisecondType>().iter().collect());
        }
        DataType::Timestamp(TimeUnit::Millisecond, _) => 1,
        DataType::Timestamp(TimeUnit::Microsecond, _) => 1000,
        DataType::Timestamp(TimeUnit::Nanosecond, _) => 1_000_000,
        other => {
            return Err(arrow_schema::ArrowError::SchemaError(format!(
                "a window needs a timestamp column, not {other}"
            )))
        }
    };
    let raw = cast(times, &DataType::Int64)?;
    Ok(raw
        .as_primitive::<arrow_array::types::Int64Type>()
        .iter()
        .map(|t| t.map(|t| t.div_euclid(per_ms)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(size: u64, slide: u64) -> Window {
        Window {
            column: "ts".into(),
            size: Duration::from_millis(size),
            slide: Duration::from_millis(slide),
        }
    }

    #[test]
    fn a_time_falls_in_every_window_that_holds_it() {
        assert_eq!(w(60, 60).starts(61).collect::<Vec<_>>(), [60]);
        assert_eq!(w(60, 60).starts(60).collect::<Vec<_>>(), [60]);
        assert_eq!(w(60, 60).starts(59).collect::<Vec<_>>(), [0]);
        assert_eq!(w(60, 60).starts(-1).collect::<Vec<_>>(), [-60]);
        assert_eq!(w(60, 20).starts(61).collect::<Vec<_>>(), [60, 40, 20]);
        assert_eq!(w(60, 20).starts(60).collect::<Vec<_>>(), [60, 40, 20]);
        assert_eq!(w(50, 20).starts(45).collect::<Vec<_>>(), [40, 20, 0]);
    }

    /// Tumbling windows keep the rows as they are; sliding windows repeat
    /// a row per window; a row without a time is in none.
    #[test]
    fn rows_get_the_starts_of_their_windows() {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            true,
        )]));
        let batch = |times: Vec<Option<i64>>| {
            RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(arrow_array::TimestampMillisecondArray::from(times)) as ArrayRef],
            )
            .unwrap()
        };
        let starts = |b: &RecordBatch| {
            b.column(0)
                .as_primitive::<arrow_array::types::Int64Type>()
                .values()
                .to_vec()
        };
        let whole = batch(vec![Some(61), Some(-1), Some(60)]);
        let tumbling = w(60, 60).assign(&whole).unwrap();
        assert_eq!(starts(&tumbling), [60, -60, 60]);
        assert!(
            Arc::ptr_eq(tumbling.column(1), whole.column(0)),
            "the rows are not copied"
        );
        let with_null = w(60, 60).assign(&batch(vec![Some(61), None])).unwrap();
        assert_eq!(starts(&with_null), [60]);
        let sliding = w(60, 30).assign(&whole).unwrap();
        assert_eq!(starts(&sliding), [60, 30, -30, -60, 60, 30]);
    }
}
