//! What the two payments examples share: their tables and what makes a
//! payment high-value or an alert.

use arrow_array::cast::AsArray;
use arrow_array::types::Decimal128Type;
use arrow_array::{BooleanArray, RecordBatch};
use weir_core::BoxError;

/// Every payment.
pub const BRONZE: &str = "lake.bronze.payments";
/// The high-value payments.
pub const RISK: &str = "lake.risk.high_value";
/// Cents from which a payment is high-value.
pub const HIGH_VALUE: i128 = 90_000;
/// Cents from which a payment raises an alert.
pub const ALERT: i128 = 99_000;

/// The payments of `batch` whose amount is at least `cents`.
pub fn at_least(batch: RecordBatch, cents: i128) -> Result<RecordBatch, BoxError> {
    let amounts = batch
        .column_by_name("amount")
        .ok_or("no amount column")?
        .as_primitive::<Decimal128Type>();
    let keep: BooleanArray = amounts.iter().map(|a| Some(a.is_some_and(|a| a >= cents))).collect();
    Ok(arrow_select::filter::filter_record_batch(&batch, &keep)?)
}
