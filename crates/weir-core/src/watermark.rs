//! Event-time watermarks, as Spark Structured Streaming keeps them.
//!
//! The watermark of batch N is the latest event time seen in batches before
//! N, less the query's delay, and never goes back. It is recorded in
//! `offsets/N` before the batch runs, so a replay uses the same value; the
//! latest event time seen is recorded with the operators' state. A row
//! whose event time is at or before the batch's watermark is late: the
//! engine drops it (and counts it) before the first stateful operator.
//! Before a later operator (whose input has the event-time column) it drops
//! the rows at or before the previous batch's watermark, as Spark does:
//! rows a stage moved back in time cannot reach a window emitted already,
//! and the windows an earlier aggregation closed in this batch pass. A
//! watermark of 0 means none yet: no row is late.

use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::TimestampMillisecondType;
use arrow_array::{BooleanArray, RecordBatch};
use arrow_schema::{DataType, Schema, TimeUnit};

use crate::error::{Error, Result};

/// A query's watermark: its event-time column and how late rows may come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watermark {
    /// The event-time column (a timestamp of any unit).
    pub column: String,
    /// How far behind the latest event time seen a row may still come.
    pub delay: Duration,
}

/// The watermark for the next batch: `current`, moved up to the latest
/// event time seen less `delay` (a pure function).
pub fn next_watermark(current_ms: i64, max_event_time_ms: Option<i64>, delay: Duration) -> i64 {
    let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
    match max_event_time_ms {
        Some(max) => current_ms.max(max.saturating_sub(delay_ms)),
        None => current_ms,
    }
}

impl Watermark {
    /// Checks that the column exists in `schema` and holds timestamps.
    pub(crate) fn check(&self, schema: &Schema) -> Result<()> {
        match schema.field_with_name(&self.column).map(|f| f.data_type()) {
            Ok(DataType::Timestamp(_, _)) => Ok(()),
            Ok(other) => Err(Error::InvalidOption {
                option: "with_watermark",
                reason: format!(
                    "the event-time column {:?} is {other}; a watermark needs a timestamp column (cast it first)",
                    self.column
                ),
            }),
            Err(_) => Err(Error::InvalidOption {
                option: "with_watermark",
                reason: format!(
                    "there is no column {:?} at the watermark; the columns are {:?}",
                    self.column,
                    schema.fields().iter().map(|f| f.name()).collect::<Vec<_>>()
                ),
            }),
        }
    }

    fn millis(&self, batch: &RecordBatch) -> Result<arrow_array::TimestampMillisecondArray> {
        let column = batch
            .column_by_name(&self.column)
            .ok_or_else(|| Error::SchemaMismatch {
                context: "the watermark's event-time column".into(),
                expected: self.column.clone(),
                found: batch.schema().to_string(),
            })?;
        let cast = arrow_cast::cast(column, &DataType::Timestamp(TimeUnit::Millisecond, None))
            .map_err(|e| Error::arrow(format!("reading event times from {:?}", self.column), e))?;
        Ok(cast.as_primitive::<TimestampMillisecondType>().clone())
    }

    /// The latest event time in `batches`, if any row has one.
    pub(crate) fn max_event_time(&self, batches: &[RecordBatch]) -> Result<Option<i64>> {
        let mut max = None;
        for batch in batches {
            let times = self.millis(batch)?;
            if let Some(m) = arrow_arith::aggregate::max(&times) {
                max = Some(max.map_or(m, |x: i64| x.max(m)));
            }
        }
        Ok(max)
    }

    /// `batch` without its rows at or before `watermark_ms`, and how many
    /// were dropped. Rows without an event time are kept.
    pub(crate) fn drop_late(&self, batch: RecordBatch, watermark_ms: i64) -> Result<(RecordBatch, u64)> {
        if watermark_ms == 0 || batch.num_rows() == 0 {
            return Ok((batch, 0));
        }
        let times = self.millis(&batch)?;
        let keep: BooleanArray = times.iter().map(|t| Some(t.is_none_or(|t| t > watermark_ms))).collect();
        let late = (keep.len() - keep.true_count()) as u64;
        if late == 0 {
            return Ok((batch, 0));
        }
        let kept = arrow_select::filter::filter_record_batch(&batch, &keep)
            .map_err(|e| Error::arrow("dropping late rows", e))?;
        Ok((kept, late))
    }
}

/// Where the next batch ends, given where the last ended (`start`), the
/// source's latest offset, and the watermark the next batch would use
/// against the last one's: at the latest offset when there are new rows;
/// at `start` again when there are none but the watermark moved (a batch
/// without data, so operators can close windows and forget state, as
/// Spark runs one); else no batch.
pub(crate) fn next_end<O: PartialEq + Clone>(
    start: Option<&O>,
    latest: Option<O>,
    watermark_ms: i64,
    last_watermark_ms: i64,
) -> Option<O> {
    match latest {
        Some(end) if Some(&end) != start => Some(end),
        _ if watermark_ms > last_watermark_ms => start.cloned(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::TimestampMicrosecondArray;
    use arrow_schema::Field;

    use super::*;

    #[test]
    fn the_watermark_only_moves_forward() {
        let d = Duration::from_secs(10);
        assert_eq!(next_watermark(0, None, d), 0);
        assert_eq!(next_watermark(0, Some(60_000), d), 50_000);
        assert_eq!(next_watermark(50_000, Some(55_000), d), 50_000);
        assert_eq!(next_watermark(50_000, Some(70_000), d), 60_000);
        assert_eq!(next_watermark(0, Some(i64::MIN), d), 0);
    }

    #[test]
    fn rows_at_or_before_the_watermark_are_late() {
        let schema = Arc::new(Schema::new(vec![Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            true,
        )]));
        let times = TimestampMicrosecondArray::from(vec![Some(9_000_000), Some(10_000_000), None, Some(10_001_000)])
            .with_timezone("UTC");
        let batch = RecordBatch::try_new(schema, vec![Arc::new(times)]).unwrap();
        let wm = Watermark {
            column: "ts".into(),
            delay: Duration::ZERO,
        };
        assert_eq!(wm.max_event_time(std::slice::from_ref(&batch)).unwrap(), Some(10_001));
        let (kept, late) = wm.drop_late(batch.clone(), 10_000).unwrap();
        assert_eq!((kept.num_rows(), late), (2, 2));
        // No watermark yet: nothing is late.
        assert_eq!(wm.drop_late(batch, 0).unwrap().1, 0);
    }

    #[test]
    fn a_batch_runs_for_new_rows_or_for_a_watermark_that_moved() {
        // New rows: up to the latest offset, whatever the watermark.
        assert_eq!(next_end(Some(&1), Some(5), 0, 0), Some(5));
        assert_eq!(next_end(None, Some(5), 0, 0), Some(5));
        // No new rows, the watermark moved: a batch without data.
        assert_eq!(next_end(Some(&5), Some(5), 10, 0), Some(5));
        assert_eq!(next_end(Some(&5), None, 10, 0), Some(5));
        // Nothing read yet: nothing to close either.
        assert_eq!(next_end::<i32>(None, None, 10, 0), None);
        // No new rows, the watermark stayed (or would go back): no batch.
        assert_eq!(next_end(Some(&5), Some(5), 10, 10), None);
        assert_eq!(next_end(Some(&5), Some(5), 9, 10), None);
    }
}
