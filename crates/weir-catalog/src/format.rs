//! Table formats.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The format a table is stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TableFormat {
    /// Delta Lake.
    Delta,
    /// Apache Iceberg.
    Iceberg,
}

impl TableFormat {
    /// `delta` or `iceberg`.
    pub fn as_str(&self) -> &'static str {
        match self {
            TableFormat::Delta => "delta",
            TableFormat::Iceberg => "iceberg",
        }
    }
}

impl fmt::Display for TableFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TableFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "delta" => Ok(TableFormat::Delta),
            "iceberg" => Ok(TableFormat::Iceberg),
            other => Err(format!("unknown table format {other:?}: use delta or iceberg")),
        }
    }
}
