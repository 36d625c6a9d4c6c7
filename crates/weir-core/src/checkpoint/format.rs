//! The persisted checkpoint formats. Every file carries a format version;
//! tests pin the bytes of each with golden files.

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ids::Offset;
use crate::ids::{BatchId, QueryId, QueryName};
use crate::protocol::{SinkIdentity, SinkMarker};

/// The checkpoint format version this weir writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// `metadata`: written once when the checkpoint is created.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    /// Format version.
    pub version: u32,
    /// The query's id, created with the checkpoint.
    pub query_id: QueryId,
    /// The query's stable name.
    pub query_name: QueryName,
    /// When the checkpoint was created.
    pub created_at: DateTime<Utc>,
    /// The sink the query writes to (invariant I6).
    pub sink: SinkIdentity,
    /// The marker of another query id whose output this query took over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_over: Option<SinkMarker>,
    /// The first batch written to `sink` after a sink change or a takeover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink_since: Option<BatchId>,
    /// What each source reads ([`crate::source::Source::description`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
}

/// `offsets/N`: the write-ahead entry that defines batch N forever.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OffsetEntry {
    /// Format version.
    pub version: u32,
    /// The batch this entry defines.
    pub batch_id: BatchId,
    /// When the batch was planned (milliseconds since the Unix epoch); a
    /// replay sees the same timestamp.
    pub timestamp_ms: i64,
    /// The event-time watermark when the batch was planned, in milliseconds.
    pub watermark_ms: i64,
    /// The end offset of each source (the batch reads up to and including it).
    pub sources: Vec<SourceOffset>,
}

impl OffsetEntry {
    /// The end offset of the named source.
    pub fn offset_of(&self, source: &str) -> Option<&Offset> {
        self.sources.iter().find(|s| s.source == source).map(|s| &s.offset)
    }
}

/// One source's end offset in an [`OffsetEntry`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceOffset {
    /// The source's name within the query.
    pub source: String,
    /// Its offset.
    pub offset: Offset,
}

/// `commits/N`: written only after the sink committed batch N.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommitEntry {
    /// Format version.
    pub version: u32,
    /// The committed batch.
    pub batch_id: BatchId,
    /// When the commit was recorded (milliseconds since the Unix epoch).
    pub committed_at_ms: i64,
    /// The sink's version after the commit (table version, snapshot id), if
    /// the batch made one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink_version: Option<i64>,
}

#[derive(Deserialize)]
struct VersionOnly {
    version: u32,
}

/// Decodes a checkpoint file, refusing newer format versions by name.
pub(crate) fn decode<T: DeserializeOwned>(location: &str, path: &str, bytes: &[u8]) -> Result<T> {
    let corrupt = |e: serde_json::Error| Error::CorruptCheckpoint {
        location: location.to_string(),
        path: path.to_string(),
        reason: e.to_string(),
    };
    let found = serde_json::from_slice::<VersionOnly>(bytes).map_err(corrupt)?.version;
    if found > FORMAT_VERSION {
        return Err(Error::UnsupportedCheckpointVersion {
            location: location.to_string(),
            path: path.to_string(),
            found,
            supported: FORMAT_VERSION,
        });
    }
    serde_json::from_slice(bytes).map_err(corrupt)
}
