//! weir's own Iceberg commit step: the batch's manifest, a manifest list and
//! the new metadata, built with iceberg's public spec types on one base
//! version; the catalog then swaps that version in if the table is still at
//! the base.
//!
//! The manifest of the batch's files is written once: its entries inherit
//! the snapshot id and sequence number, so a retry on a newer base writes
//! only a new manifest list and metadata.
//!
//! Each kind of snapshot lists the base's manifests in a file of its own:
//! `append.rs` (a fast append, merging small manifests as Java's
//! merge-append does, and a manifest rewrite), `overwrite.rs` (every live
//! file removed), `replace.rs` (some files replaced: compaction, and
//! Update mode's upsert).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use iceberg::io::FileIO;
use iceberg::spec::{
    DataFile, FormatVersion, ManifestContentType, ManifestFile, ManifestList, ManifestListWriter, ManifestStatus,
    ManifestWriterBuilder, NestedFieldRef, Operation, SchemaRef, Snapshot, SnapshotSummaryCollector, Summary,
    TableMetadata, TableMetadataBuilder, MAIN_BRANCH,
};

use crate::catalog::LoadedTable;
use crate::error::IcebergSinkError;

mod append;
mod merge;
mod overwrite;
mod replace;

use merge::MergeAt;
pub(crate) use merge::{AheadUse, MergedAhead};

/// The size manifests are merged up to, and below which a data manifest is
/// merged, unless the table sets `commit.manifest.target-size-bytes`.
/// Java's default is 8 MiB, which Java streams; iceberg-rust holds a
/// manifest's entries in memory while it reads or writes one, about 2.7 KB
/// a file (its column statistics are maps of their own) against 330 bytes
/// encoded. Merging an 8 MiB manifest of 25,000 files again would cost a
/// streaming process some 70 MB each time; 1 MiB manifests, of about 3,000
/// files each, keep a merge under 10 MB whatever the table's size.
pub(crate) const DEFAULT_TARGET: u64 = 1 << 20;

/// Whether a commit on `metadata`, whose current snapshot lists
/// `manifests`, would merge some of them.
pub(crate) fn merge_due(metadata: &TableMetadata, manifests: &[ManifestFile]) -> bool {
    !merge::plan_merge(metadata, manifests.to_vec(), MergeAt::MinCount)
        .1
        .is_empty()
}

/// The totals a snapshot summary carries, counted from the parent's.
const TOTALS: [(&str, &str, &str); 3] = [
    ("total-records", "added-records", "deleted-records"),
    ("total-data-files", "added-data-files", "deleted-data-files"),
    ("total-files-size", "added-files-size", "removed-files-size"),
];

/// What the new snapshot does to the table's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Adds the batch's files (a fast append).
    Append,
    /// Removes every live data file and adds the batch's (one `overwrite`).
    Overwrite,
    /// Replaces some live data files with files of the same rows (one
    /// `replace`, as compaction makes): [`Request::replaced`] names them.
    Replace,
    /// Update mode: removes the live data files [`Request::replaced`]
    /// names (they hold rows of the batch's groups) and adds the batch's
    /// files with their other rows rewritten (one `overwrite`).
    Upsert,
    /// Merges every spec's small data manifests (two or more) into
    /// manifests of the target size; no file is added or removed (one
    /// `replace`).
    RewriteManifests,
}

/// What a change lists in the new snapshot beside the batch's own manifest:
/// the base's manifests it keeps, and those it wrote in their place.
struct Listed {
    manifests: Vec<ManifestFile>,
    /// The manifests this try wrote (deleted if its swap is lost).
    written: Vec<String>,
    /// Whether it listed manifests merged ahead.
    ahead: AheadUse,
}

/// The live data files a `replace` removes, by the manifest that lists them
/// in the base's current snapshot.
pub(crate) type Replaced = HashMap<String, HashSet<String>>;

/// A new metadata version, not yet swapped in.
#[derive(Debug)]
pub(crate) struct Produced {
    pub metadata: TableMetadata,
    /// The new snapshot's manifests, kept so the next commit on it need not
    /// read its manifest list.
    pub manifests: Option<(i64, Vec<ManifestFile>)>,
    /// Files written for this base only (manifest list, merged manifests),
    /// removed if the swap loses.
    pub attempt_files: Vec<String>,
    /// Metadata files that left the metadata log
    /// (`write.metadata.previous-versions-max`).
    pub expired: Vec<String>,
    /// The changes from the base, as a REST catalog takes them.
    pub changes: Vec<iceberg::TableUpdate>,
    /// What it did with the manifests merged ahead it was offered.
    pub ahead: AheadUse,
}

/// What one commit attempt makes of its base.
pub(crate) struct Request<'a> {
    /// What the snapshot does (there is none for an append of nothing,
    /// unless `always_snapshot`).
    pub change: Change,
    /// Added to the snapshot's summary.
    pub summary: &'a HashMap<String, String>,
    /// Table properties set in the same version (the marker).
    pub properties: HashMap<String, String>,
    /// The manifests of a snapshot whose manifest list need not be read.
    pub cached: Option<&'a (i64, Vec<ManifestFile>)>,
    /// New columns (schema merging) to add to the base's schema.
    pub added_columns: &'a [NestedFieldRef],
    /// Make a snapshot even of nothing (a REST catalog's swap asserts the
    /// snapshot id, so the marker needs one).
    pub always_snapshot: bool,
    /// For [`Change::Replace`] and [`Change::Upsert`]: the files it removes
    /// (all live in the base).
    pub replaced: Option<&'a Replaced>,
    /// For [`Change::Append`]: the writer merges manifests ahead, in the
    /// background, so this commit merges only if that has fallen behind.
    pub merges_ahead: bool,
    /// Manifests merged ahead, listed in place of their inputs if the base
    /// still lists them all.
    pub merged_ahead: Option<&'a MergedAhead>,
    /// Snapshots of the base to remove in the same version (the writer's
    /// expiry policy), none of them a ref's head.
    pub remove_snapshots: &'a [i64],
}

/// Builds the snapshots of one batch's commit, attempt after attempt.
pub(crate) struct Producer {
    file_io: FileIO,
    table: String,
    files: Vec<DataFile>,
    commit_uuid: uuid::Uuid,
    snapshot_id: i64,
    added: Option<ManifestFile>,
    attempt: u32,
}

impl Producer {
    pub(crate) fn new(file_io: FileIO, table: String, files: Vec<DataFile>) -> Self {
        Producer {
            file_io,
            table,
            files,
            commit_uuid: uuid::Uuid::new_v4(),
            snapshot_id: new_snapshot_id(),
            added: None,
            attempt: 0,
        }
    }

    fn err(&self, context: &str) -> impl Fn(iceberg::Error) -> IcebergSinkError + '_ {
        let context = context.to_string();
        move |source| IcebergSinkError::Iceberg {
            table: self.table.clone(),
            context: context.clone(),
            source: Box::new(source),
        }
    }

    /// The batch's files.
    pub(crate) fn files(&self) -> &[DataFile] {
        &self.files
    }

    /// The new metadata on `base`, as `request` says.
    pub(crate) async fn produce(
        &mut self,
        base: &LoadedTable,
        request: Request<'_>,
    ) -> Result<Produced, IcebergSinkError> {
        let Request {
            change,
            summary,
            properties,
            cached,
            added_columns,
            always_snapshot,
            replaced,
            merges_ahead,
            merged_ahead,
            remove_snapshots,
        } = request;
        let metadata = &base.metadata;
        let table = self.table.clone();
        let build_err = move |source| IcebergSinkError::Iceberg {
            table: table.clone(),
            context: "build the new metadata".into(),
            source: Box::new(source),
        };
        let mut builder =
            TableMetadataBuilder::new_from_metadata(metadata.clone(), Some(base.metadata_location.clone()));
        if !remove_snapshots.is_empty() {
            builder = builder.remove_snapshots(remove_snapshots);
        }
        let parent = metadata.current_snapshot();
        let (schema, mut builder) = self.with_added_columns(metadata, builder, added_columns)?;
        let needs_snapshot = always_snapshot
            || !self.files.is_empty()
            || (matches!(change, Change::Overwrite | Change::RewriteManifests) && parent.is_some());
        let mut produced_manifests = None;
        let mut attempt_files = Vec::new();
        let mut ahead = AheadUse::NotOffered;
        if needs_snapshot {
            if metadata.snapshot_by_id(self.snapshot_id).is_some() {
                // Another writer's snapshot took the id: start this one anew.
                self.snapshot_id = new_snapshot_id();
                self.added = None;
            }
            let existing = match (parent, cached) {
                (None, _) => Vec::new(),
                (Some(p), Some((id, manifests))) if p.snapshot_id() == *id => manifests.clone(),
                (Some(p), _) => self.read_manifest_list(metadata, p.manifest_list()).await?,
            };
            let mut collector = SnapshotSummaryCollector::default();
            let spec = metadata.default_partition_spec().clone();
            for f in &self.files {
                collector.add_file(f, schema.clone(), spec.clone());
            }
            let mut manifests = Vec::new();
            if !self.files.is_empty() {
                let added = self.added_manifest(metadata, &schema).await?;
                if change == Change::Upsert {
                    // An upsert's producer serves one try (its rewrites
                    // differ each try): its manifest goes with the try.
                    attempt_files.push(added.manifest_path.clone());
                }
                manifests.push(added);
            }
            self.attempt += 1;
            let listed = match change {
                Change::Append | Change::RewriteManifests => {
                    self.append(metadata, existing, change, merges_ahead, merged_ahead)
                        .await?
                }
                Change::Overwrite => self.overwrite(metadata, &existing, &mut collector).await?,
                Change::Replace | Change::Upsert => self.replace(metadata, existing, replaced, &mut collector).await?,
            };
            ahead = listed.ahead;
            attempt_files.extend(listed.written);
            manifests.extend(listed.manifests);
            let (path, written) = self.write_manifest_list(metadata, manifests).await?;
            attempt_files.push(path.clone());
            let mut properties_of_summary = summary.clone();
            properties_of_summary.extend(collector.build());
            add_totals(&mut properties_of_summary, parent.map(|p| p.summary()), change);
            let snapshot = Snapshot::builder()
                .with_snapshot_id(self.snapshot_id)
                .with_parent_snapshot_id(parent.map(|p| p.snapshot_id()))
                .with_sequence_number(metadata.next_sequence_number())
                .with_timestamp_ms(chrono::Utc::now().timestamp_millis())
                .with_manifest_list(path.clone())
                .with_summary(Summary {
                    operation: match change {
                        Change::Append => Operation::Append,
                        Change::Overwrite | Change::Upsert => Operation::Overwrite,
                        Change::Replace | Change::RewriteManifests => Operation::Replace,
                    },
                    additional_properties: properties_of_summary,
                })
                .with_schema_id(schema.schema_id())
                .build();
            // `main` moves to the new snapshot and keeps the retention
            // another engine may have set on it.
            builder = builder.set_branch_snapshot(snapshot, MAIN_BRANCH).map_err(&build_err)?;
            produced_manifests = Some((self.snapshot_id, written));
        }
        let built = builder
            .set_properties(properties)
            .and_then(|b| b.build())
            .map_err(&build_err)?;
        Ok(Produced {
            metadata: built.metadata,
            manifests: produced_manifests,
            attempt_files,
            expired: built
                .expired_metadata_logs
                .into_iter()
                .map(|l| l.metadata_file)
                .collect(),
            changes: built.changes,
            ahead,
        })
    }

    /// `builder` with the base's current schema evolved by `added`
    /// (schema merging) in this same version, under the field ids the
    /// files were written with; the schema the snapshot has.
    fn with_added_columns(
        &self,
        metadata: &TableMetadata,
        mut builder: TableMetadataBuilder,
        added: &[NestedFieldRef],
    ) -> Result<(SchemaRef, TableMetadataBuilder), IcebergSinkError> {
        let build_err = |source| IcebergSinkError::Iceberg {
            table: self.table.clone(),
            context: "build the new metadata".into(),
            source: Box::new(source),
        };
        let mut schema = metadata.current_schema().clone();
        if added.iter().any(|f| schema.field_by_id(f.id).is_none()) {
            let highest = metadata.schemas_iter().map(|s| s.schema_id()).max().unwrap_or(0);
            let evolved = schema
                .as_ref()
                .clone()
                .into_builder()
                .with_schema_id(highest + 1)
                .with_fields(added.iter().cloned())
                .build()
                .map_err(&build_err)?;
            schema = Arc::new(evolved);
            builder = builder
                .add_current_schema(schema.as_ref().clone())
                .map_err(&build_err)?;
        }
        Ok((schema, builder))
    }

    async fn read_manifest_list(
        &self,
        metadata: &TableMetadata,
        location: &str,
    ) -> Result<Vec<ManifestFile>, IcebergSinkError> {
        let err = self.err("read the current snapshot's manifest list");
        let bytes = self
            .file_io
            .new_input(location)
            .map_err(&err)?
            .read()
            .await
            .map_err(&err)?;
        Ok(ManifestList::parse_with_version(&bytes, metadata.format_version())
            .map_err(&err)?
            .entries()
            .to_vec())
    }

    /// The manifest of the batch's files, written on the first attempt.
    async fn added_manifest(
        &mut self,
        metadata: &TableMetadata,
        schema: &SchemaRef,
    ) -> Result<ManifestFile, IcebergSinkError> {
        if let Some(m) = &self.added {
            return Ok(m.clone());
        }
        let path = self.manifest_path(metadata, "m0");
        let spec_id = metadata.default_partition_spec().spec_id();
        let mut writer = self.manifest_writer(metadata, &path, spec_id, Some(schema))?;
        for f in &self.files {
            // A negative sequence number leaves it unassigned: the entry
            // inherits the snapshot's, whichever base the swap lands on.
            writer
                .add_file(f.clone(), -1)
                .map_err(self.err("write the batch's manifest"))?;
        }
        let manifest = writer
            .write_manifest_file()
            .await
            .map_err(self.err("write the batch's manifest"))?;
        self.added = Some(manifest.clone());
        Ok(manifest)
    }

    /// The path of a manifest this commit writes: `metadata/<commit
    /// uuid>-<name>.avro` under the table.
    fn manifest_path(&self, metadata: &TableMetadata, name: &str) -> String {
        format!(
            "{}/metadata/{}-{name}.avro",
            metadata.location().trim_end_matches('/'),
            self.commit_uuid
        )
    }

    /// A writer of a manifest of files of partition spec `spec_id`.
    fn manifest_writer(
        &self,
        metadata: &TableMetadata,
        path: &str,
        spec_id: i32,
        schema: Option<&SchemaRef>,
    ) -> Result<iceberg::spec::ManifestWriter, IcebergSinkError> {
        let spec = metadata
            .partition_spec_by_id(spec_id)
            .ok_or_else(|| IcebergSinkError::Unsupported {
                table: self.table.clone(),
                feature: format!("a manifest of partition spec {spec_id}, which the metadata lacks"),
            })?;
        let output = self.file_io.new_output(path).map_err(self.err("open a manifest"))?;
        let builder = ManifestWriterBuilder::new(
            output,
            Some(self.snapshot_id),
            schema.unwrap_or(metadata.current_schema()).clone(),
            spec.as_ref().clone(),
        );
        match metadata.format_version() {
            FormatVersion::V1 => Ok(builder.build_v1()),
            FormatVersion::V2 => Ok(builder.build_v2_data()),
            FormatVersion::V3 => Ok(builder.build_v3_data()),
        }
    }

    async fn write_manifest_list(
        &mut self,
        metadata: &TableMetadata,
        manifests: Vec<ManifestFile>,
    ) -> Result<(String, Vec<ManifestFile>), IcebergSinkError> {
        let path = format!(
            "{}/metadata/snap-{}-{}-{}.avro",
            metadata.location().trim_end_matches('/'),
            self.snapshot_id,
            self.attempt,
            self.commit_uuid
        );
        let err = self.err("write the manifest list");
        let out = self
            .file_io
            .new_output(&path)
            .map_err(&err)?
            .writer()
            .await
            .map_err(&err)?;
        let parent = metadata.current_snapshot_id();
        let sequence = metadata.next_sequence_number();
        let mut writer = match metadata.format_version() {
            FormatVersion::V1 => ManifestListWriter::v1(out, self.snapshot_id, parent),
            FormatVersion::V2 => ManifestListWriter::v2(out, self.snapshot_id, parent, sequence),
            FormatVersion::V3 => {
                return Err(IcebergSinkError::Unsupported {
                    table: self.table.clone(),
                    feature: "format version 3".into(),
                })
            }
        };
        // The list assigns the new manifests their sequence number; the
        // written entries are what a reader of this snapshot sees.
        let assigned: Vec<ManifestFile> = manifests
            .into_iter()
            .map(|mut m| {
                if m.sequence_number == iceberg::spec::UNASSIGNED_SEQUENCE_NUMBER {
                    m.sequence_number = sequence;
                }
                if m.min_sequence_number == iceberg::spec::UNASSIGNED_SEQUENCE_NUMBER {
                    m.min_sequence_number = sequence;
                }
                m
            })
            .collect();
        writer.add_manifests(assigned.iter().cloned()).map_err(&err)?;
        writer.close().await.map_err(&err)?;
        Ok((path, assigned))
    }
}

fn new_snapshot_id() -> i64 {
    // Positive, as Java's ids are; uuid bits are random enough.
    (uuid::Uuid::new_v4().as_u64_pair().0 & (i64::MAX as u64)) as i64
}

/// `total-*` of the new snapshot from its parent's (an overwrite's totals
/// are its own files; a replace subtracts what it removed).
fn add_totals(summary: &mut HashMap<String, String>, parent: Option<&Summary>, change: Change) {
    let number = |map: &HashMap<String, String>, key: &str| map.get(key).and_then(|v| v.parse::<u64>().ok());
    for (total, added, removed) in TOTALS {
        let before = match change {
            Change::Append | Change::Replace | Change::Upsert | Change::RewriteManifests => parent
                .and_then(|p| number(&p.additional_properties, total))
                .unwrap_or(0),
            Change::Overwrite => 0,
        };
        let added = number(summary, added).unwrap_or(0);
        let removed = match change {
            Change::Replace | Change::Upsert => number(summary, removed).unwrap_or(0),
            _ => 0,
        };
        summary.insert(total.to_string(), (before + added).saturating_sub(removed).to_string());
    }
    // An append, a replace or an upsert keeps other engines' delete files;
    // an overwrite's snapshot lists none.
    for total in ["total-delete-files", "total-position-deletes", "total-equality-deletes"] {
        let before = match change {
            Change::Append | Change::Replace | Change::Upsert | Change::RewriteManifests => {
                parent.and_then(|p| p.additional_properties.get(total)).cloned()
            }
            Change::Overwrite => None,
        };
        summary.insert(total.to_string(), before.unwrap_or_else(|| "0".to_string()));
    }
}
