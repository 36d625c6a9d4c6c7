//! A deterministic rate source: row content is a function of its offset.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrow_array::{Decimal128Array, Int64Array, RecordBatch, TimestampMicrosecondArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use async_trait::async_trait;
use futures::StreamExt;
use serde_json::json;

use super::{integer_offset, BatchStream, Offset, ReadLimit, Source};
use crate::error::{Error, Result};
use crate::sync::Recover;

const KEY: &str = "next_event_id";
/// `ts` of event 0: 2026-01-01T00:00:00Z, in microseconds.
const BASE_TS_MICROS: i64 = 1_767_225_600_000_000;
const CHUNK_ROWS: u64 = 64 * 1024;

/// Generates rows `event_id` (int64, equal to the row's offset, unique),
/// `ts` (timestamp, 2026-01-01 plus `event_id` milliseconds), `account_id`
/// (`event_id % 1000`) and `amount` (decimal(18,2), `(event_id * 7919) %
/// 100000` cents). A replayed range gives the same rows, bit for bit.
///
/// With [`RateSource::rows_per_batch`] each batch takes that many rows
/// (the source never runs dry); with [`RateSource::rows_per_second`] rows
/// become available at that rate from the start of the run. Both together
/// cap each batch. [`RateSource::total_rows`] ends the source.
#[derive(Debug, Clone)]
pub struct RateSource {
    rows_per_batch: Option<u64>,
    rows_per_second: Option<u64>,
    total_rows: Option<u64>,
    clock: Arc<Mutex<RateClock>>,
}

#[derive(Debug, Default)]
struct RateClock {
    /// The offset and instant of the run's first plan.
    started: Option<(u64, Instant)>,
    /// Set by `prepare_for_available_now`.
    available_now: bool,
    /// The end fixed at the first plan after it.
    available_now_end: Option<u64>,
}

impl RateSource {
    /// A source that hands out `rows` rows per batch.
    pub fn rows_per_batch(rows: u64) -> Self {
        Self::new(Some(rows), None)
    }

    /// A source that makes `rows` rows available per second.
    pub fn rows_per_second(rows: u64) -> Self {
        Self::new(None, Some(rows))
    }

    fn new(rows_per_batch: Option<u64>, rows_per_second: Option<u64>) -> Self {
        RateSource {
            rows_per_batch,
            rows_per_second,
            total_rows: None,
            clock: Arc::default(),
        }
    }

    /// Also caps each batch at `rows` (with a per-second rate).
    pub fn with_rows_per_batch(mut self, rows: u64) -> Self {
        self.rows_per_batch = Some(rows);
        self
    }

    /// Also limits the rate to `rows` per second.
    pub fn with_rows_per_second(mut self, rows: u64) -> Self {
        self.rows_per_second = Some(rows);
        self
    }

    /// Ends the source after `rows` rows (event ids `0..rows`).
    pub fn with_total_rows(mut self, rows: u64) -> Self {
        self.total_rows = Some(rows);
        self
    }

    /// The schema of the generated rows.
    pub fn output_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("event_id", DataType::Int64, false),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                false,
            ),
            Field::new("account_id", DataType::Int64, false),
            Field::new("amount", DataType::Decimal128(18, 2), false),
        ]))
    }

    /// The rows with event ids `from..to`.
    pub fn generate(from: u64, to: u64) -> RecordBatch {
        let ids: Vec<i64> = (from as i64..to as i64).collect();
        let ts = ids.iter().map(|i| BASE_TS_MICROS + i * 1000);
        let accounts = ids.iter().map(|i| i % 1000);
        let amounts = ids.iter().map(|i| ((*i as i128) * 7919) % 100_000);
        RecordBatch::try_new(
            Self::output_schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(ids.iter().copied())),
                Arc::new(TimestampMicrosecondArray::from_iter_values(ts).with_timezone("UTC")),
                Arc::new(Int64Array::from_iter_values(accounts)),
                Arc::new(
                    Decimal128Array::from_iter_values(amounts)
                        .with_precision_and_scale(18, 2)
                        .expect("decimal(18,2) is valid"),
                ),
            ],
        )
        .expect("generated columns match the schema")
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RateClock> {
        self.clock.lock().recover()
    }

    fn available(&self, start: u64, clock: &mut RateClock) -> u64 {
        let rate_end = self.rows_per_second.map(|rps| {
            let (base, at) = *clock.started.get_or_insert((start, Instant::now()));
            base + (at.elapsed().as_secs_f64() * rps as f64) as u64
        });
        let batch_end = self.rows_per_batch.map(|n| start + n);
        let end = match (batch_end, rate_end) {
            (Some(b), Some(r)) => b.min(r),
            (b, r) => b.or(r).unwrap_or(start),
        };
        end.min(self.total_rows.unwrap_or(u64::MAX))
    }
}

#[async_trait]
impl Source for RateSource {
    fn name(&self) -> &str {
        "rate"
    }

    fn schema(&self) -> SchemaRef {
        Self::output_schema()
    }

    async fn latest_offset(&self, start: Option<&Offset>, _limit: ReadLimit) -> Result<Option<Offset>> {
        let start = integer_offset(self.name(), start, KEY)?;
        let mut clock = self.lock();
        let mut end = self.available(start, &mut clock).max(start);
        if clock.available_now {
            let cap = *clock.available_now_end.get_or_insert(self.total_rows.unwrap_or(end));
            end = end.min(cap).max(start);
        }
        Ok(Some(Offset(json!({ KEY: end }))))
    }

    async fn prepare_for_available_now(&self) -> Result<()> {
        // The end is fixed at the first plan after this call: what the rate
        // has produced by then, one batch of an unbounded rows-per-batch
        // source, or the total.
        self.lock().available_now = true;
        Ok(())
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> Result<BatchStream> {
        let from = integer_offset(self.name(), start, KEY)?;
        let to = integer_offset(self.name(), Some(end), KEY)?;
        if from > to {
            return Err(Error::Source {
                retryable: false,
                source_name: self.name().into(),
                source: format!("range ({from}, {to}] runs backwards").into(),
            });
        }
        let chunks = (from..to)
            .step_by(CHUNK_ROWS as usize)
            .map(move |lo| Ok(Self::generate(lo, (lo + CHUNK_ROWS).min(to))));
        Ok(futures::stream::iter(chunks).boxed())
    }
}

#[cfg(test)]
mod tests {
    use futures::TryStreamExt;

    use super::*;

    #[tokio::test]
    async fn rows_are_a_function_of_their_offset() {
        let source = RateSource::rows_per_batch(100_000);
        let end = source.latest_offset(None, ReadLimit::Default).await.unwrap().unwrap();
        assert_eq!(end, Offset(json!({ KEY: 100_000 })));
        let batches: Vec<RecordBatch> = source.read(None, &end).await.unwrap().try_collect().await.unwrap();
        assert_eq!(batches.len(), 2, "split in chunks");
        let again: Vec<RecordBatch> = source.read(None, &end).await.unwrap().try_collect().await.unwrap();
        assert_eq!(batches, again);
        let ids = batches[1].column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(ids.value(0), CHUNK_ROWS as i64);
        let amounts = batches[0].column(3).as_any().downcast_ref::<Decimal128Array>().unwrap();
        assert_eq!(amounts.value(3), 3 * 7919);
    }

    #[tokio::test]
    async fn total_rows_ends_the_source() {
        let source = RateSource::rows_per_batch(10).with_total_rows(15);
        let first = source.latest_offset(None, ReadLimit::Default).await.unwrap().unwrap();
        let second = source
            .latest_offset(Some(&first), ReadLimit::Default)
            .await
            .unwrap()
            .unwrap();
        let third = source
            .latest_offset(Some(&second), ReadLimit::Default)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((first.0[KEY].as_u64(), second.0[KEY].as_u64()), (Some(10), Some(15)));
        assert_eq!(third, second, "no new data after the total");
    }
}
