//! A `replace` of some live data files (compaction's), and Update mode's
//! upsert, an `overwrite` that removes the files holding the batch's groups:
//! the manifests listing them are written again with those entries deleted.

use std::collections::HashSet;

use iceberg::spec::{ManifestFile, ManifestStatus, SnapshotSummaryCollector, TableMetadata};

use super::{AheadUse, Listed, Producer, Replaced};
use crate::error::IcebergSinkError;

impl Producer {
    /// The base's manifests, each that lists a file of `replaced` written
    /// again with it deleted.
    pub(super) async fn replace(
        &self,
        metadata: &TableMetadata,
        existing: Vec<ManifestFile>,
        replaced: Option<&Replaced>,
        collector: &mut SnapshotSummaryCollector,
    ) -> Result<Listed, IcebergSinkError> {
        let empty = Replaced::new();
        let replaced = replaced.unwrap_or(&empty);
        let mut listed = Listed {
            manifests: Vec::new(),
            written: Vec::new(),
            ahead: AheadUse::NotOffered,
        };
        for manifest in existing {
            match replaced.get(&manifest.manifest_path) {
                Some(paths) => {
                    let rewritten = self.replace_in(metadata, &manifest, paths, collector).await?;
                    listed.written.push(rewritten.manifest_path.clone());
                    listed.manifests.push(rewritten);
                }
                None => listed.manifests.push(manifest),
            }
        }
        Ok(listed)
    }

    /// `manifest` again, with the entries of `paths` marked deleted and the
    /// other live entries kept as existing.
    async fn replace_in(
        &self,
        metadata: &TableMetadata,
        manifest: &ManifestFile,
        paths: &HashSet<String>,
        collector: &mut SnapshotSummaryCollector,
    ) -> Result<ManifestFile, IcebergSinkError> {
        let err = self.err("rewrite a manifest of replaced files");
        let spec_id = manifest.partition_spec_id;
        let spec = metadata
            .partition_spec_by_id(spec_id)
            .cloned()
            .unwrap_or_else(|| metadata.default_partition_spec().clone());
        let path = self.manifest_path(metadata, &format!("replaced-{}-{}", self.attempt, uuid::Uuid::new_v4()));
        let mut writer = self.manifest_writer(metadata, &path, spec_id, None)?;
        let loaded = manifest.load_manifest(&self.file_io).await.map_err(&err)?;
        for entry in loaded
            .entries()
            .iter()
            .filter(|e| e.status() != ManifestStatus::Deleted)
        {
            let sequence = entry.sequence_number().unwrap_or(manifest.sequence_number);
            let file_sequence = entry.file_sequence_number.or(Some(sequence));
            let file = entry.data_file().clone();
            if paths.contains(file.file_path()) {
                collector.remove_file(&file, metadata.current_schema().clone(), spec.clone());
                writer.add_delete_file(file, sequence, file_sequence).map_err(&err)?;
            } else {
                let added_by = entry.snapshot_id().unwrap_or(manifest.added_snapshot_id);
                writer
                    .add_existing_file(file, added_by, sequence, file_sequence)
                    .map_err(&err)?;
            }
        }
        writer.write_manifest_file().await.map_err(&err)
    }
}
