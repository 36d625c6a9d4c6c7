//! Output modes, and why a sink refuses one.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How a batch's output relates to what the sink already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputMode {
    /// Each batch's rows are added to the sink.
    Append,
    /// Each batch's rows replace everything the sink holds, in the same
    /// atomic commit.
    Complete,
}

impl fmt::Display for OutputMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutputMode::Append => "append",
            OutputMode::Complete => "complete",
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
}
