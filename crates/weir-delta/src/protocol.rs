//! Which tables weir writes: the protocol's writer features it honours, and
//! how. A writer must honour every feature a table lists (or its writer
//! version implies); weir refuses any other, naming it, before it writes.

use deltalake::kernel::transaction::PROTOCOL;
use deltalake::table::state::DeltaTableState;
use weir_core::OutputMode;

/// What is about to be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    /// A stream's batches in an output mode.
    Stream(OutputMode),
    /// Compaction: rows rewritten as they are, files with deletion vectors
    /// left alone.
    Compaction,
}

/// The writer features weir honours. Most are honoured by refusing a table
/// that uses them where a writer must act: a CHECK constraint, an
/// invariant, a generated or identity column, column mapping other than
/// `none`, the change data feed with Update, `appendOnly` with a mode that
/// removes files (checked where the table's layout is fitted). Deletion
/// vectors are honoured by appends, which add files without them, and by
/// compaction, which leaves files that have them alone.
const HONOURED: [&str; 9] = [
    "appendOnly",
    "invariants",
    "checkConstraints",
    "changeDataFeed",
    "generatedColumns",
    "identityColumns",
    "columnMapping",
    "timestampNtz",
    "deletionVectors",
];

/// What a feature weir does not write is, in words.
fn described(feature: &str) -> Option<&'static str> {
    Some(match feature {
        "rowTracking" => "row tracking: each file's row ids and commit versions",
        "inCommitTimestamp" => "in-commit timestamps: a monotonic timestamp in every commit",
        "domainMetadata" => "domain metadata",
        "clustering" => "liquid clustering",
        "v2Checkpoint" => "v2 checkpoints",
        "vacuumProtocolCheck" => "the vacuum protocol check",
        "typeWidening" | "typeWidening-preview" => "type widening",
        "variantType" | "variantType-preview" | "variantShredding-preview" => "the variant type",
        "icebergCompatV1" | "icebergCompatV2" | "icebergCompatV3" => "Iceberg compatibility (UniForm)",
        "catalogManaged" | "catalogOwned-preview" => "catalog-managed commits",
        "timestampNanos" => "nanosecond timestamps",
        "materializePartitionColumns" => "partition columns materialized in data files",
        _ => return None,
    })
}

/// `Ok` when weir may `write` to the table as the protocol asks; else what
/// it would break, in words that name the feature (as the protocol spells
/// it) for [`DeltaSinkError::Unsupported`](crate::DeltaSinkError).
pub(crate) fn check(snapshot: &DeltaTableState, write: Write) -> Result<(), String> {
    let config = snapshot.metadata().configuration();
    if let Some(mode) = config.get("delta.columnMapping.mode").filter(|m| *m != "none") {
        return Err(format!(
            "column mapping (columnMapping, delta.columnMapping.mode = {mode})"
        ));
    }
    PROTOCOL
        .can_read_from(snapshot)
        .map_err(|e| format!("its protocol's reader features ({e})"))?;
    let protocol = snapshot.protocol();
    let version = protocol.min_writer_version();
    if version > 7 {
        return Err(format!("writer version {version} of the protocol"));
    }
    let features: Vec<String> = match version {
        7 => protocol
            .writer_features()
            .unwrap_or_default()
            .iter()
            .map(|f| f.to_string())
            .collect(),
        // Versions 2 to 6 imply features that are all honoured.
        _ => Vec::new(),
    };
    let unknown: Vec<String> = features
        .iter()
        .filter(|f| !HONOURED.contains(&f.as_str()))
        .map(|f| match described(f) {
            Some(words) => format!("{f} ({words})"),
            None => f.clone(),
        })
        .collect();
    if !unknown.is_empty() {
        return Err(format!("the table features {}", unknown.join(", ")));
    }
    let vectors = features.iter().any(|f| f == "deletionVectors");
    match write {
        Write::Stream(OutputMode::Append) | Write::Compaction => Ok(()),
        Write::Stream(mode) if vectors => Err(format!(
            "deletion vectors (deletionVectors) with the {mode} output mode (it rewrites or removes files that \
             may carry them; Append mode works on such tables)"
        )),
        Write::Stream(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn honoured_features_are_not_described_as_refused() {
        for feature in HONOURED {
            assert!(described(feature).is_none(), "{feature} is honoured and refused");
        }
        assert!(described("rowTracking").is_some_and(|d| d.contains("row ids")));
    }
}
