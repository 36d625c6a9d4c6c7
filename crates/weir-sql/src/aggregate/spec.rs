//! What a query names: the keys of a `group_by` (columns, windows,
//! sessions) and its aggregates.

use std::time::Duration;

use crate::quoted;
use crate::session::SessionWindow;
use crate::window::Window;

/// A key of a `group_by`: a column, or the window an event time falls in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupKey {
    /// The values of a column.
    Column(String),
    /// Event-time windows of a timestamp column.
    Window(Window),
    /// Sessions of events of a timestamp column.
    Session(SessionWindow),
}

impl From<&str> for GroupKey {
    fn from(name: &str) -> Self {
        GroupKey::Column(name.to_string())
    }
}

impl From<String> for GroupKey {
    fn from(name: String) -> Self {
        GroupKey::Column(name)
    }
}

/// Groups by the column `name`.
pub fn col(name: impl Into<String>) -> GroupKey {
    GroupKey::Column(name.into())
}

/// Groups by tumbling windows of `size` over the timestamp `column`: the
/// output gets `window_start` and `window_end` columns.
pub fn window(column: impl Into<String>, size: Duration) -> GroupKey {
    GroupKey::Window(Window {
        column: column.into(),
        size,
        slide: size,
    })
}

/// Groups by windows of `size` starting every `slide` (a row falls in
/// each window that holds its event time).
pub fn sliding_window(column: impl Into<String>, size: Duration, slide: Duration) -> GroupKey {
    GroupKey::Window(Window {
        column: column.into(),
        size,
        slide,
    })
}

/// Groups by sessions over the timestamp `column`: a session of a key
/// lasts while its events follow each other within `gap` (an event at `t`
/// keeps it open until `t + gap`). The output gets `session_start` and
/// `session_end` columns. Sessions merge, so their aggregation works in
/// Append mode (each session once, when the watermark passed its end) and
/// Complete mode, not in Update mode.
pub fn session_window(column: impl Into<String>, gap: Duration) -> GroupKey {
    GroupKey::Session(SessionWindow {
        column: column.into(),
        gap,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Func {
    Sum,
    Count,
    Min,
    Max,
    Avg,
    CountDistinct,
}

/// One aggregate of a `group_by`: `sum("amount")`, `count()`, ...
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aggregate {
    pub(super) func: Func,
    pub(super) column: Option<String>,
    pub(super) alias: Option<String>,
}

/// The sum of `column` (null when every value is null).
pub fn sum(column: impl Into<String>) -> Aggregate {
    Aggregate::new(Func::Sum, Some(column.into()))
}

/// The number of rows.
pub fn count() -> Aggregate {
    Aggregate::new(Func::Count, None)
}

/// The number of non-null values of `column`.
pub fn count_of(column: impl Into<String>) -> Aggregate {
    Aggregate::new(Func::Count, Some(column.into()))
}

/// The least value of `column`.
pub fn min(column: impl Into<String>) -> Aggregate {
    Aggregate::new(Func::Min, Some(column.into()))
}

/// The greatest value of `column`.
pub fn max(column: impl Into<String>) -> Aggregate {
    Aggregate::new(Func::Max, Some(column.into()))
}

/// The mean of `column`, as a double.
pub fn avg(column: impl Into<String>) -> Aggregate {
    Aggregate::new(Func::Avg, Some(column.into()))
}

/// The number of distinct non-null values of `column`. Its state is the
/// group's distinct values themselves, so it grows with them: bound it by
/// windows a watermark closes.
pub fn count_distinct(column: impl Into<String>) -> Aggregate {
    Aggregate::new(Func::CountDistinct, Some(column.into()))
}

impl Aggregate {
    pub(super) fn new(func: Func, column: Option<String>) -> Self {
        Aggregate {
            func,
            column,
            alias: None,
        }
    }

    /// Names the output column (default: `sum_amount`, `count`, ...).
    pub fn alias(mut self, name: impl Into<String>) -> Self {
        self.alias = Some(name.into());
        self
    }

    /// The name of partial `j` in the state: the function and column are
    /// in it, so a changed aggregate does not take over another's state.
    pub(super) fn partial_name(&self, i: usize, j: usize) -> String {
        let column: String = self
            .column
            .as_deref()
            .unwrap_or("rows")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
            .collect();
        format!("__p{i}_{j}_{:?}_{column}", self.func).to_lowercase()
    }

    pub(super) fn output_name(&self) -> String {
        if let Some(a) = &self.alias {
            return a.clone();
        }
        let f = match self.func {
            Func::Sum => "sum",
            Func::Count => "count",
            Func::Min => "min",
            Func::Max => "max",
            Func::Avg => "avg",
            Func::CountDistinct => "count_distinct",
        };
        match &self.column {
            Some(c) => format!("{f}_{c}"),
            None => f.to_string(),
        }
    }

    /// What the aggregate `i` reads, as a column `__a{i}` of the rows
    /// (each aggregate its own, so no two partial expressions are alike).
    pub(super) fn argument(&self, i: usize) -> Option<String> {
        let c = quoted(self.column.as_deref()?);
        Some(match self.func {
            Func::Avg => format!("CAST({c} AS DOUBLE) AS \"__a{i}\""),
            _ => format!("{c} AS \"__a{i}\""),
        })
    }

    /// The partial aggregates of aggregate `i` (SQL over its argument) and
    /// how partials merge (SQL over the partial `$`).
    pub(super) fn partials(&self, i: usize) -> Vec<(String, &'static str)> {
        let a = format!("\"__a{i}\"");
        match (self.func, &self.column) {
            (Func::Count, None) => vec![("count(*)".into(), "sum($)")],
            (Func::Count, Some(_)) => vec![(format!("count({a})"), "sum($)")],
            (Func::Sum, Some(_)) => vec![(format!("sum({a})"), "sum($)")],
            (Func::Min, Some(_)) => vec![(format!("min({a})"), "min($)")],
            (Func::Max, Some(_)) => vec![(format!("max({a})"), "max($)")],
            (Func::Avg, Some(_)) => vec![(format!("sum({a})"), "sum($)"), (format!("count({a})"), "sum($)")],
            // The group's distinct values, sorted; merged as their union.
            (Func::CountDistinct, Some(_)) => vec![(
                format!("array_agg(DISTINCT {a} ORDER BY {a}) FILTER (WHERE {a} IS NOT NULL)"),
                "array_sort(array_distinct(flatten(array_agg($) FILTER (WHERE $ IS NOT NULL))))",
            )],
            (_, None) => unreachable!("only count has no column"),
        }
    }
}
