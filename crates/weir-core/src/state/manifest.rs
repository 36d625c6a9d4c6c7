//! `state/_manifest/N`: which state files make up each operator's state
//! after batch N, and the event-time facts the watermark needs.

use serde::{Deserialize, Serialize};

use crate::ids::BatchId;

/// The state of every operator after a batch. Written after the state
/// files and before the sink's commit, so a batch the sink committed always
/// has one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateManifest {
    /// Format version.
    pub version: u32,
    /// The batch after which this is the state.
    pub batch_id: BatchId,
    /// The latest event time seen up to and including this batch
    /// (milliseconds since the Unix epoch), if the query has a watermark
    /// and has seen a row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_event_time_ms: Option<i64>,
    /// Each operator's files.
    pub operators: Vec<OperatorFiles>,
}

impl StateManifest {
    /// The entry of the named operator.
    pub fn operator(&self, name: &str) -> Option<&OperatorFiles> {
        self.operators.iter().find(|o| o.name == name)
    }
}

/// One operator's state files after a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperatorFiles {
    /// The operator's name.
    pub name: String,
    /// The partition of its state.
    pub partition: u32,
    /// The files to read in order, relative to
    /// `state/<name>/<partition>/`: at most one snapshot, then deltas.
    pub files: Vec<String>,
    /// Keys in the state.
    pub rows: u64,
    /// Bytes of its keys and values in memory.
    pub bytes: u64,
    /// Rows of the deltas after the snapshot (or of all of them, without
    /// one): what a restore reads on top of the snapshot.
    #[serde(default)]
    pub chained_rows: u64,
}

impl OperatorFiles {
    /// The number of deltas after the last snapshot.
    pub(crate) fn deltas(&self) -> usize {
        self.files.iter().filter(|f| f.ends_with(".delta")).count()
    }
}
