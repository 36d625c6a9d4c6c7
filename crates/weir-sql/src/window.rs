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
        let times = cast(times, &DataType::Timestamp(TimeUnit::Millisecond, None))?;
        let times = times.as_primitive::<TimestampMillisecondType>();
        let mut rows = Vec::with_capacity(batch.num_rows());
        let mut starts = Vec::with_capacity(batch.num_rows());
        for (i, t) in times.iter().enumerate() {
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
        let mut fields = vec![Arc::new(Field::new(WINDOW_START, DataType::Int64, false))];
        fields.extend(batch.schema().fields().iter().cloned());
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
    }
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
}
