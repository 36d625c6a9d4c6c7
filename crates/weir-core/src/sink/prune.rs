//! Which data files may hold a row of some groups, by their key columns'
//! bounds: the pruning step of a table sink's Update mode, shared by the
//! formats (Delta's file statistics, Iceberg's column bounds).

use arrow_arith::boolean::{and, is_null, or_kleene};
use arrow_array::{Array, ArrayRef, BooleanArray, Scalar};
use arrow_ord::cmp::{gt_eq, lt_eq};

/// Whether a file whose key columns lie within `bounds` may hold one of
/// the groups `keys`: some group must lie within the file's lower and upper
/// bound on every key column that has them.
///
/// `keys` holds one array per key column (row `i` of each is group `i`);
/// `bounds` one (lower, upper) pair per key column, each a one-element
/// array or `None` where the file has none (a null bound counts as none). A
/// bound is compared in its own
/// type, into which the key is cast (milliseconds into microseconds, exact);
/// a key that does not cast rules nothing out on that column. So do a null
/// key and a float column (bounds leave NaN out, and NaN compares as no
/// bound). The answer errs only towards reading a file.
pub fn may_hold(keys: &[ArrayRef], bounds: &[(Option<ArrayRef>, Option<ArrayRef>)]) -> bool {
    let mut within: Option<BooleanArray> = None;
    for (column, (lower, upper)) in keys.iter().zip(bounds) {
        if column.data_type().is_floating() {
            continue;
        }
        for (bound, is_lower) in [(lower, true), (upper, false)] {
            // A null bound is no bound.
            let Some(bound) = bound.as_ref().filter(|b| b.len() == 1 && b.is_valid(0)) else {
                continue;
            };
            let Ok(column) = arrow_cast::cast(column, bound.data_type()) else {
                continue;
            };
            let scalar = Scalar::new(bound.clone());
            let compared = if is_lower {
                gt_eq(&column, &scalar)
            } else {
                lt_eq(&column, &scalar)
            };
            // A null key compares as unknown: it may be anywhere.
            let Ok(compared) = compared.and_then(|c| or_kleene(&c, &is_null(&column)?)) else {
                continue;
            };
            within = Some(match within {
                Some(w) => and(&w, &compared).unwrap_or(compared),
                None => compared,
            });
        }
    }
    within.is_none_or(|w| w.true_count() > 0)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Float64Array, Int64Array, StringArray, TimestampMicrosecondArray, TimestampMillisecondArray};

    use super::*;

    fn longs(v: Vec<Option<i64>>) -> ArrayRef {
        Arc::new(Int64Array::from(v))
    }

    fn range(lo: i64, hi: i64) -> (Option<ArrayRef>, Option<ArrayRef>) {
        (Some(longs(vec![Some(lo)])), Some(longs(vec![Some(hi)])))
    }

    #[test]
    fn a_file_may_hold_a_group_within_its_bounds() {
        let keys = [longs(vec![Some(5), Some(50)])];
        assert!(may_hold(&keys, &[range(0, 9)]));
        assert!(may_hold(&keys, &[range(50, 50)]));
        assert!(!may_hold(&keys, &[range(6, 49)]));
        assert!(!may_hold(&keys, &[range(51, 99)]));
        assert!(may_hold(&keys, &[(None, None)]));
        let null = || Some(longs(vec![None]));
        assert!(may_hold(&keys, &[(null(), null())]));
        assert!(may_hold(&keys, &[(None, Some(longs(vec![Some(5)])))]));
        assert!(!may_hold(&keys, &[(None, Some(longs(vec![Some(4)])))]));
    }

    #[test]
    fn every_key_column_must_fit_for_one_group() {
        // Groups (1, "b") and (9, "a"): a file of (0..5, "a".."a") holds neither.
        let keys = [
            longs(vec![Some(1), Some(9)]),
            Arc::new(StringArray::from(vec!["b", "a"])) as ArrayRef,
        ];
        let a = || -> (Option<ArrayRef>, Option<ArrayRef>) {
            (
                Some(Arc::new(StringArray::from(vec!["a"]))),
                Some(Arc::new(StringArray::from(vec!["a"]))),
            )
        };
        assert!(!may_hold(&keys, &[range(0, 5), a()]));
        assert!(may_hold(&keys, &[range(0, 9), a()]));
    }

    #[test]
    fn null_and_float_keys_rule_nothing_out() {
        assert!(may_hold(&[longs(vec![None, Some(5)])], &[range(10, 20)]));
        let nan: ArrayRef = Arc::new(Float64Array::from(vec![f64::NAN]));
        let one: ArrayRef = Arc::new(Float64Array::from(vec![1.0]));
        assert!(may_hold(&[nan], &[(Some(one.clone()), Some(one))]));
    }

    #[test]
    fn millisecond_keys_compare_exactly_with_microsecond_bounds() {
        let bound = |us: i64| -> Option<ArrayRef> { Some(Arc::new(TimestampMicrosecondArray::from(vec![us]))) };
        let at: ArrayRef = Arc::new(TimestampMillisecondArray::from(vec![2_000]));
        let after: ArrayRef = Arc::new(TimestampMillisecondArray::from(vec![2_001]));
        assert!(may_hold(&[at], &[(bound(1_000_000), bound(2_000_000))]));
        assert!(!may_hold(&[after], &[(bound(1_000_000), bound(2_000_000))]));
    }
}
