//! Session windows: a key's events grouped into sessions, a session ending
//! once no event follows for a gap.
//!
//! An event at time `t` opens the session `[t, t + gap]`; two sessions of a
//! key that touch or overlap (the later starts at or before the earlier's
//! end) are one session, as in Spark Structured Streaming. Each batch, the
//! batch's events are grouped into sessions (one partial row per key and
//! session), then merged with the key's open sessions in the state that
//! they touch. The state holds a row per open session: the key and the
//! session's start, then its end and partial aggregates. A session is final
//! once the watermark reaches its end: any later event is after the
//! watermark, so it starts a new session.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch};
use arrow_schema::{ArrowError, DataType, Field, Schema};
use weir_core::state::KeyedState;

use crate::quoted;
use crate::window::event_millis;

/// The column of session starts (milliseconds since the Unix epoch).
pub(crate) const SESSION_START: &str = "session_start";
/// The column of session ends (the last event's time plus the gap).
pub(crate) const SESSION_END: &str = "session_end";
/// The column of event times in milliseconds that rows get before they are
/// grouped into sessions.
pub(crate) const EVENT_MS: &str = "__event_ms";

/// Names [`sessions_sql`] gives its own columns, which a key column may not
/// have.
pub(crate) const RESERVED: [&str; 5] = [EVENT_MS, "__start", "__end", "__new", "__session"];

/// The longest gap: event times plus a gap stay far from overflowing.
const MAX_GAP: Duration = Duration::from_secs(36_500 * 86_400);

/// Session windows over an event-time column: a session lasts while events
/// follow each other within `gap`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionWindow {
    /// The event-time column.
    pub column: String,
    /// How long a session waits for its next event.
    pub gap: Duration,
}

impl SessionWindow {
    /// Why the sessions cannot be used, if they cannot.
    pub(crate) fn invalid(&self) -> Option<String> {
        if self.gap.as_millis() == 0 {
            return Some("a session's gap is at least one millisecond".into());
        }
        if !self.gap.subsec_nanos().is_multiple_of(1_000_000) {
            return Some("a session's gap is whole milliseconds".into());
        }
        if self.gap > MAX_GAP {
            return Some(format!(
                "a session's gap is at most {} days",
                MAX_GAP.as_secs() / 86_400
            ));
        }
        None
    }

    /// The gap in milliseconds.
    pub(crate) fn gap_ms(&self) -> i64 {
        i64::try_from(self.gap.as_millis()).unwrap_or(i64::MAX).max(1)
    }

    /// `batch` with its event times in milliseconds in a first column;
    /// rows without an event time belong to no session and are left out.
    pub(crate) fn assign(&self, batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
        let times = batch
            .column_by_name(&self.column)
            .ok_or_else(|| ArrowError::SchemaError(format!("no column {:?}", self.column)))?;
        let times = Int64Array::from(event_millis(times)?);
        let mut fields = vec![Arc::new(Field::new(EVENT_MS, DataType::Int64, true))];
        fields.extend(batch.schema().fields().iter().cloned());
        let mut columns: Vec<ArrayRef> = vec![Arc::new(times.clone())];
        columns.extend(batch.columns().iter().cloned());
        let assigned = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
        if times.null_count() == 0 {
            return Ok(assigned);
        }
        let timed = arrow_select::filter::filter_record_batch(
            &assigned,
            &arrow_array::BooleanArray::from_iter(times.iter().map(|t| Some(t.is_some()))),
        )?;
        Ok(timed)
    }
}

/// SQL grouping rows of `input` into sessions per key (`keys`, quoted):
/// each row is the interval `[start, end]` of the expressions `start` and
/// `end`; sorted by start, a row begins a new session when it starts after
/// every earlier row of its key ended. Reads the columns `carried` (SELECT
/// items over `input`) and computes `aggregates` (SELECT items over them)
/// per session, after the keys and the session's start and end.
pub(crate) fn sessions_sql(
    keys: &[String],
    start: &str,
    end: &str,
    carried: &[String],
    aggregates: &[String],
) -> String {
    let partition = if keys.is_empty() {
        String::new()
    } else {
        format!("PARTITION BY {} ", keys.join(", "))
    };
    let (s, e, new, session) = (quoted("__start"), quoted("__end"), quoted("__new"), quoted("__session"));
    let mut inner = keys.to_vec();
    inner.push(format!("{start} AS {s}"));
    inner.push(format!("{end} AS {e}"));
    inner.extend(carried.iter().cloned());
    let mut select = keys.to_vec();
    select.push(format!("min({s}) AS {}", quoted(SESSION_START)));
    select.push(format!("max({e}) AS {}", quoted(SESSION_END)));
    select.extend(aggregates.iter().cloned());
    let mut group = keys.to_vec();
    group.push(session.clone());
    // A row's session number is the count of session beginnings up to it
    // (its peers of equal start included, so they share a session).
    format!(
        "SELECT {select} FROM (\
            SELECT *, sum({new}) OVER ({partition}ORDER BY {s}) AS {session} FROM (\
                SELECT *, CASE WHEN {s} <= max({e}) OVER ({partition}ORDER BY {s} \
                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) THEN 0 ELSE 1 END AS {new} \
                FROM (SELECT {inner} FROM {input})\
            )\
        ) GROUP BY {group}",
        select = select.join(", "),
        inner = inner.join(", "),
        input = crate::INPUT,
        group = group.join(", "),
    )
}

/// Removes from `state` the open sessions of the groups of `rows` (partial
/// rows: the `groups` group columns first) and returns them sorted by key,
/// or `None` when the state holds none. A state key is a group's encoding
/// followed by the session's start, so a key's group is its bytes but the
/// start's, matched without decoding.
pub(crate) fn take_sessions_of(
    state: &mut KeyedState,
    rows: &RecordBatch,
    groups: usize,
) -> Result<Option<RecordBatch>, ArrowError> {
    if state.is_empty() || rows.num_rows() == 0 {
        return Ok(None);
    }
    let held = if groups == 0 {
        state.take_if(|_, _| true)?
    } else {
        let prefixes = state.key_prefix(&rows.columns()[..groups])?;
        let whole = state.encode_keys(&rows.columns()[..=groups])?;
        let start_len = whole.row(0).as_ref().len() - prefixes.row(0).as_ref().len();
        let wanted: HashSet<&[u8]> = prefixes.iter().map(|r| r.data()).collect();
        state.take_if(|k, _| k.len() >= start_len && wanted.contains(&k[..k.len() - start_len]))?
    };
    Ok((held.num_rows() > 0).then_some(held))
}

/// Removes from `state` the sessions that ended at or before `watermark`
/// (a value's first column is the session's end) and returns them sorted
/// by key.
pub(crate) fn take_ended(state: &mut KeyedState, watermark: i64) -> Result<RecordBatch, ArrowError> {
    let bound = state.value_prefix(&[Arc::new(Int64Array::from(vec![watermark])) as ArrayRef])?;
    let bound = bound.row(0);
    let bound = bound.as_ref();
    state.take_if(|_, v| v.len() >= bound.len() && v[..bound.len()] <= *bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_whole_positive_milliseconds() {
        let s = |gap| SessionWindow {
            column: "ts".into(),
            gap,
        };
        assert!(s(Duration::ZERO).invalid().is_some());
        assert!(s(Duration::from_micros(1500)).invalid().is_some());
        assert!(s(Duration::from_secs(30)).invalid().is_none());
        assert_eq!(s(Duration::from_secs(30)).gap_ms(), 30_000);
        assert!(s(Duration::MAX).invalid().is_some());
    }
}
