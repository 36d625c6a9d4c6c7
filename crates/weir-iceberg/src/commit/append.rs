//! A fast append (a batch's files), and a manifest rewrite: the base's
//! manifests stay listed, small ones merged as Java's merge-append does,
//! or replaced by manifests merged ahead in the background.

use iceberg::spec::{ManifestFile, TableMetadata};

use super::{AheadUse, Change, Listed, MergeAt, MergedAhead, Producer};
use crate::error::IcebergSinkError;

impl Producer {
    /// The base's manifests for an append or a manifest rewrite: merged
    /// where enough small ones wait (any two, for a rewrite), or with the
    /// merge made ahead listed in place of its inputs.
    pub(super) async fn append(
        &self,
        metadata: &TableMetadata,
        existing: Vec<ManifestFile>,
        change: Change,
        merges_ahead: bool,
        merged_ahead: Option<&MergedAhead>,
    ) -> Result<Listed, IcebergSinkError> {
        let at = match change {
            Change::RewriteManifests => MergeAt::All,
            _ if merges_ahead => MergeAt::Fallback,
            _ => MergeAt::MinCount,
        };
        let (existing, ahead) = match change {
            Change::Append => self.list_ahead(merged_ahead, existing),
            _ => (existing, AheadUse::NotOffered),
        };
        // A commit that lists a merge made ahead merges no more.
        let (kept, merged) = match ahead {
            AheadUse::Listed => (existing, Vec::new()),
            _ => self.merge(metadata, existing, at).await?,
        };
        let written = merged.iter().map(|m| m.manifest_path.clone()).collect();
        let mut manifests = merged;
        manifests.extend(kept);
        Ok(Listed {
            manifests,
            written,
            ahead,
        })
    }
}
