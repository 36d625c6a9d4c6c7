//! An `overwrite` that removes every live data file of the base: Complete
//! mode's snapshot.

use std::collections::BTreeMap;

use iceberg::spec::{ManifestContentType, ManifestFile, ManifestStatus, SnapshotSummaryCollector, TableMetadata};

use super::AheadUse;
use super::{Listed, Producer};
use crate::error::IcebergSinkError;

impl Producer {
    /// The base's live data files marked deleted, one manifest per
    /// partition spec; none of the base's manifests stays listed.
    pub(super) async fn overwrite(
        &self,
        metadata: &TableMetadata,
        existing: &[ManifestFile],
        collector: &mut SnapshotSummaryCollector,
    ) -> Result<Listed, IcebergSinkError> {
        let manifests = self.deleted_manifests(metadata, existing, collector).await?;
        Ok(Listed {
            written: manifests.iter().map(|m| m.manifest_path.clone()).collect(),
            manifests,
            ahead: AheadUse::NotOffered,
        })
    }

    /// Manifests (one per partition spec) marking every live data file of
    /// `existing` deleted.
    async fn deleted_manifests(
        &self,
        metadata: &TableMetadata,
        existing: &[ManifestFile],
        collector: &mut SnapshotSummaryCollector,
    ) -> Result<Vec<ManifestFile>, IcebergSinkError> {
        let err = self.err("read a manifest of the current snapshot");
        let write_err = self.err("write the manifest of removed files");
        let mut by_spec: BTreeMap<i32, Vec<&ManifestFile>> = BTreeMap::new();
        for m in existing.iter().filter(|m| m.content == ManifestContentType::Data) {
            by_spec.entry(m.partition_spec_id).or_default().push(m);
        }
        let mut out = Vec::new();
        for (spec_id, manifests) in by_spec {
            let spec = metadata
                .partition_spec_by_id(spec_id)
                .cloned()
                .unwrap_or_else(|| metadata.default_partition_spec().clone());
            let path = self.manifest_path(metadata, &format!("deleted-{spec_id}-{}", self.attempt));
            let mut writer = self.manifest_writer(metadata, &path, spec_id, None)?;
            let mut any = false;
            for manifest in manifests {
                let loaded = manifest.load_manifest(&self.file_io).await.map_err(&err)?;
                for entry in loaded
                    .entries()
                    .iter()
                    .filter(|e| e.status() != ManifestStatus::Deleted)
                {
                    collector.remove_file(entry.data_file(), metadata.current_schema().clone(), spec.clone());
                    let sequence = entry.sequence_number().unwrap_or(manifest.sequence_number);
                    writer
                        .add_delete_file(
                            entry.data_file().clone(),
                            sequence,
                            entry.file_sequence_number.or(Some(sequence)),
                        )
                        .map_err(&write_err)?;
                    any = true;
                }
            }
            if any {
                out.push(writer.write_manifest_file().await.map_err(&write_err)?);
            }
        }
        Ok(out)
    }
}
