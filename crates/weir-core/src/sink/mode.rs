//! Output modes, and why a sink refuses one.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What each trigger hands the sink, as in Spark Structured Streaming.
/// Which modes a query may use depends on its stateful operators
/// ([`crate::operator::check_query_mode`]) and on the sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputMode {
    /// Only rows that can never change: every row of a query without an
    /// aggregation, and the groups of an aggregation whose window the
    /// watermark has closed. The sink adds them.
    Append,
    /// The whole result of the query's aggregation, every trigger. The sink
    /// replaces everything it holds with it, in the same atomic commit.
    Complete,
    /// The rows the trigger changed: the groups of an aggregation updated by
    /// this trigger's input. The sink replaces its rows of the same key.
    Update,
}

impl fmt::Display for OutputMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutputMode::Append => "append",
            OutputMode::Complete => "complete",
            OutputMode::Update => "update",
        })
    }
}

/// Why a sink refuses an output mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModeRefusal {
    /// What the sink writes to (named) only takes new rows: it cannot
    /// replace what earlier batches wrote.
    #[error("{0} only appends: it cannot replace what earlier batches wrote")]
    AppendOnly(&'static str),
    /// What the sink writes to (named) cannot replace rows by key; the
    /// changed groups would be appended beside their old values.
    #[error("{0} cannot replace rows by key, so an aggregation's changed groups would sit beside their old values; use foreach_batch with a writer that merges by key")]
    NoUpdate(&'static str),
}
