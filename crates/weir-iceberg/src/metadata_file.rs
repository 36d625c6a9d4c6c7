//! The commit layer's metadata files, for the catalogs that write them (a
//! SQL catalog; a REST catalog's server writes its own): where the next
//! version goes, and an encoding that costs about the same to write at any
//! table history.
//!
//! Every Iceberg metadata file lists all of the table's snapshots, so a
//! streaming table's metadata grows by one snapshot per batch. Encoding it
//! through iceberg's serializer copies every snapshot on every commit (about
//! 60 ms at 10,000 snapshots). A snapshot never changes once written, so
//! [`MetadataFiles`] keeps the JSON of a table's snapshots in sealed chunks
//! and writes a new metadata file as its changed fields, those chunks
//! (shared, not copied), and the new snapshot.
//!
//! iceberg 0.10 does not expose a table's refs (branches and tags), so they
//! are read from the metadata file when a table is loaded and then followed
//! through each commit's changes. Whenever that is not possible (a format
//! other than v2, a table not loaded through this catalog, refs that do not
//! agree with the metadata), the file is encoded by iceberg's serializer.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use iceberg::spec::{
    FormatVersion, MetadataLog, Schema, Snapshot, SnapshotLog, SnapshotReference, Summary, TableMetadata, MAIN_BRANCH,
};
use iceberg::TableUpdate;
use serde::{Deserialize, Serialize};
use uuid::Uuid;
use weir_core::sync::Recover;

/// Snapshots' JSON is sealed into shared chunks of about this size (small
/// in tests, so that they cross chunks).
const CHUNK_BYTES: usize = if cfg!(test) { 256 } else { 1 << 20 };

/// The refs of a metadata file, read without the rest of it.
#[derive(Deserialize)]
struct RefsOnly {
    #[serde(default)]
    refs: Option<HashMap<String, SnapshotReference>>,
    #[serde(rename = "current-snapshot-id", default)]
    current_snapshot_id: Option<i64>,
}

/// Reads a metadata file's refs. A file without refs has only `main`, at the
/// current snapshot (the spec's rule for older writers).
pub fn read_refs(json: &[u8]) -> Option<HashMap<String, SnapshotReference>> {
    try_read_refs(json).ok()
}

/// As [`read_refs`], with the reason JSON that cannot be read has.
pub(crate) fn try_read_refs(json: &[u8]) -> Result<HashMap<String, SnapshotReference>, serde_json::Error> {
    let parsed: RefsOnly = serde_json::from_slice(json)?;
    Ok(parsed.refs.unwrap_or_else(|| {
        parsed
            .current_snapshot_id
            .filter(|id| *id != -1)
            .map(|id| {
                let main = SnapshotReference::new(id, iceberg::spec::SnapshotRetention::branch(None, None, None));
                HashMap::from([(MAIN_BRANCH.to_string(), main)])
            })
            .unwrap_or_default()
    }))
}

/// The JSON of a set of snapshots, comma-separated: sealed chunks and an
/// open one.
#[derive(Default, Clone)]
struct Snapshots {
    sealed: Vec<Bytes>,
    open: Vec<u8>,
    count: usize,
}

impl Snapshots {
    fn push(&mut self, json: &[u8]) {
        if self.count > 0 {
            self.open.push(b',');
        }
        self.open.extend_from_slice(json);
        self.count += 1;
        if self.open.len() >= CHUNK_BYTES {
            self.sealed.push(Bytes::from(std::mem::take(&mut self.open)));
        }
    }
}

/// What is known of one table: the refs and snapshots of one of its
/// metadata files.
#[derive(Default)]
struct Known {
    location: String,
    refs: HashMap<String, SnapshotReference>,
    /// `None` until a file of this table is encoded.
    snapshots: Option<Snapshots>,
}

/// Encodes metadata files, keeping what it can between commits of a table.
#[derive(Default)]
pub struct MetadataFiles {
    tables: Mutex<HashMap<Uuid, Known>>,
}

impl std::fmt::Debug for MetadataFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadataFiles").finish_non_exhaustive()
    }
}

/// How a file was encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// The kept snapshots and the new ones.
    Appended,
    /// Every snapshot encoded anew (after an expiry, or a base not kept).
    Rebuilt,
    /// By iceberg's serializer (refs not known, or not v2).
    Full,
}

/// A metadata file's bytes, in pieces, and what it holds for the cache.
pub struct MetadataJson {
    /// The file is these pieces, in order.
    pub pieces: Vec<Bytes>,
    /// How it was encoded.
    pub encoding: Encoding,
    /// The file's refs and snapshots (not for [`Encoding::Full`]).
    kept: Option<(HashMap<String, SnapshotReference>, Snapshots)>,
}

impl MetadataJson {
    /// The whole file in one buffer.
    #[cfg(test)]
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        self.pieces.concat()
    }
}

impl MetadataFiles {
    /// Records the refs of the metadata file at `location`.
    pub fn loaded(&self, location: &str, metadata: &TableMetadata, refs: HashMap<String, SnapshotReference>) {
        let mut tables = self.tables.lock().recover();
        let known = tables.entry(metadata.uuid()).or_default();
        if known.location != location {
            known.snapshots = None;
        }
        known.location = location.to_string();
        known.refs = refs;
    }

    /// Encodes `metadata`, which is the metadata at `base` with `changes`
    /// (`None` for a new table).
    pub fn encode(
        &self,
        base: Option<&str>,
        metadata: &TableMetadata,
        changes: &[TableUpdate],
    ) -> Result<MetadataJson, serde_json::Error> {
        // What is known of `base`, copied out (the chunks are shared) so
        // that no lock is held while encoding.
        let known = {
            let tables = self.tables.lock().recover();
            tables
                .get(&metadata.uuid())
                .filter(|k| Some(k.location.as_str()) == base)
                .map(|k| (k.refs.clone(), k.snapshots.clone()))
        };
        let (refs, snapshots) = match (base, known) {
            (None, _) => (Some(HashMap::new()), Some(Snapshots::default())),
            (Some(_), Some((refs, snapshots))) => (Some(refs), snapshots),
            (Some(_), None) => (None, None),
        };
        let refs = refs
            .map(|refs| follow(refs, changes))
            .filter(|refs| agrees(refs, metadata));
        let Some(refs) = refs.filter(|_| metadata.format_version() == FormatVersion::V2) else {
            tracing::debug!(table = metadata.location(), "metadata encoded in full");
            return Ok(MetadataJson {
                pieces: vec![Bytes::from(serde_json::to_vec(metadata)?)],
                encoding: Encoding::Full,
                kept: None,
            });
        };
        let (snapshots, encoding) = match snapshots.and_then(|s| appended(s, metadata, changes)) {
            Some(s) => (s, Encoding::Appended),
            None => {
                let mut all = Snapshots::default();
                for snapshot in metadata.snapshots() {
                    all.push(&encode_snapshot(snapshot)?);
                }
                (all, Encoding::Rebuilt)
            }
        };
        let mut head = serde_json::to_vec(&head(metadata, &refs))?;
        let mut pieces = Vec::with_capacity(snapshots.sealed.len() + 3);
        if snapshots.count > 0 {
            head.pop(); // the closing brace
            head.extend_from_slice(br#","snapshots":["#);
            pieces.push(Bytes::from(head));
            pieces.extend(snapshots.sealed.iter().cloned());
            pieces.push(Bytes::copy_from_slice(&snapshots.open));
            pieces.push(Bytes::from_static(b"]}"));
        } else {
            pieces.push(Bytes::from(head));
        }
        Ok(MetadataJson {
            pieces,
            encoding,
            kept: Some((refs, snapshots)),
        })
    }

    /// Records that `json`, encoded from `metadata`, is now the file at
    /// `location`. What is kept describes that file alone, whatever was
    /// recorded meanwhile.
    pub fn written(&self, location: &str, metadata: &TableMetadata, json: MetadataJson) {
        let mut tables = self.tables.lock().recover();
        match json.kept {
            Some((refs, snapshots)) => {
                tables.insert(
                    metadata.uuid(),
                    Known {
                        location: location.to_string(),
                        refs,
                        snapshots: Some(snapshots),
                    },
                );
            }
            None => {
                tables.remove(&metadata.uuid());
            }
        }
    }
}

/// The snapshots of `metadata`, when they are `known` and the ones
/// `changes` added (which are encoded and joined).
fn appended(mut known: Snapshots, metadata: &TableMetadata, changes: &[TableUpdate]) -> Option<Snapshots> {
    let mut added = Vec::new();
    for change in changes {
        match change {
            TableUpdate::AddSnapshot { snapshot } => added.push(snapshot.snapshot_id()),
            TableUpdate::RemoveSnapshots { .. } => return None,
            _ => {}
        }
    }
    if metadata.snapshots().len() != known.count + added.len() {
        return None;
    }
    for id in added {
        let snapshot = metadata.snapshot_by_id(id)?;
        known.push(&encode_snapshot(snapshot).ok()?);
    }
    Some(known)
}

/// The refs after `changes`.
fn follow(mut refs: HashMap<String, SnapshotReference>, changes: &[TableUpdate]) -> HashMap<String, SnapshotReference> {
    for change in changes {
        match change {
            TableUpdate::SetSnapshotRef { ref_name, reference } => {
                refs.insert(ref_name.clone(), reference.clone());
            }
            TableUpdate::RemoveSnapshotRef { ref_name } => {
                refs.remove(ref_name);
            }
            TableUpdate::RemoveSnapshots { snapshot_ids } => {
                refs.retain(|_, r| !snapshot_ids.contains(&r.snapshot_id));
            }
            _ => {}
        }
    }
    refs
}

/// Whether `refs` can be the refs of `metadata`: each points where the
/// metadata says, and `main` is the current snapshot.
fn agrees(refs: &HashMap<String, SnapshotReference>, metadata: &TableMetadata) -> bool {
    let each = refs
        .iter()
        .all(|(name, r)| metadata.snapshot_for_ref(name).map(|s| s.snapshot_id()) == Some(r.snapshot_id));
    let main = refs.get(MAIN_BRANCH).map(|r| r.snapshot_id) == metadata.current_snapshot_id();
    each && main
}

/// The fields of a v2 metadata file other than its snapshots, in the order
/// iceberg writes them.
#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct Head<'a> {
    format_version: u8,
    table_uuid: Uuid,
    location: &'a str,
    last_sequence_number: i64,
    last_updated_ms: i64,
    last_column_id: i32,
    schemas: Vec<&'a Schema>,
    current_schema_id: i32,
    partition_specs: Vec<&'a iceberg::spec::PartitionSpec>,
    default_spec_id: i32,
    last_partition_id: i32,
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    properties: &'a HashMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    current_snapshot_id: Option<i64>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    snapshot_log: &'a [SnapshotLog],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    metadata_log: &'a [MetadataLog],
    sort_orders: Vec<&'a iceberg::spec::SortOrder>,
    default_sort_order_id: i64,
    refs: &'a HashMap<String, SnapshotReference>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    statistics: Vec<&'a iceberg::spec::StatisticsFile>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    partition_statistics: Vec<&'a iceberg::spec::PartitionStatisticsFile>,
}

/// One v2 snapshot, as the spec writes it.
#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct SnapshotV2<'a> {
    snapshot_id: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent_snapshot_id: Option<i64>,
    sequence_number: i64,
    timestamp_ms: i64,
    manifest_list: &'a str,
    summary: &'a Summary,
    #[serde(skip_serializing_if = "Option::is_none")]
    schema_id: Option<i32>,
}

fn head<'a>(metadata: &'a TableMetadata, refs: &'a HashMap<String, SnapshotReference>) -> Head<'a> {
    Head {
        format_version: 2,
        table_uuid: metadata.uuid(),
        location: metadata.location(),
        last_sequence_number: metadata.last_sequence_number(),
        last_updated_ms: metadata.last_updated_ms(),
        last_column_id: metadata.last_column_id(),
        schemas: metadata.schemas_iter().map(|s| s.as_ref()).collect(),
        current_schema_id: metadata.current_schema_id(),
        partition_specs: metadata.partition_specs_iter().map(|s| s.as_ref()).collect(),
        default_spec_id: metadata.default_partition_spec_id(),
        last_partition_id: metadata.last_partition_id(),
        properties: metadata.properties(),
        current_snapshot_id: metadata.current_snapshot_id(),
        snapshot_log: metadata.history(),
        metadata_log: metadata.metadata_log(),
        sort_orders: metadata.sort_orders_iter().map(|s| s.as_ref()).collect(),
        default_sort_order_id: metadata.default_sort_order_id(),
        refs,
        statistics: metadata.statistics_iter().collect(),
        partition_statistics: metadata.partition_statistics_iter().collect(),
    }
}

fn encode_snapshot(snapshot: &Snapshot) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(&SnapshotV2 {
        snapshot_id: snapshot.snapshot_id(),
        parent_snapshot_id: snapshot.parent_snapshot_id(),
        sequence_number: snapshot.sequence_number(),
        timestamp_ms: snapshot.timestamp_ms(),
        manifest_list: snapshot.manifest_list(),
        summary: snapshot.summary(),
        schema_id: snapshot.schema_id(),
    })
}

/// The location of the metadata version after `base` (`None`: the first).
pub fn next_metadata_location(table_location: &str, base: Option<&str>) -> String {
    let version = base
        .and_then(|b| b.rsplit('/').next())
        .and_then(|f| f.split('-').next())
        .and_then(|n| n.parse::<u64>().ok())
        .map_or(0, |n| n + 1);
    format!(
        "{}/metadata/{version:05}-{}.metadata.json",
        table_location.trim_end_matches('/'),
        uuid::Uuid::new_v4()
    )
}

#[cfg(test)]
mod tests {
    use iceberg::spec::{
        NestedField, Operation, PrimitiveType, SnapshotRetention, SortOrder, StatisticsFile, TableMetadataBuilder,
        Type, UnboundPartitionSpec,
    };

    use super::*;

    #[test]
    fn metadata_versions_count_up() {
        assert!(next_metadata_location("file:///w/t", None).starts_with("file:///w/t/metadata/00000-"));
        let next = next_metadata_location("file:///w/t/", Some("file:///w/t/metadata/00041-abc.metadata.json"));
        assert!(next.starts_with("file:///w/t/metadata/00042-"), "{next}");
        assert!(next.ends_with(".metadata.json"));
    }

    fn new_table() -> TableMetadata {
        let schema = Schema::builder()
            .with_fields(vec![
                NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                NestedField::optional(2, "name", Type::Primitive(PrimitiveType::String)).into(),
            ])
            .build()
            .unwrap();
        TableMetadataBuilder::new(
            schema,
            UnboundPartitionSpec::builder().build(),
            SortOrder::unsorted_order(),
            "file:///w/t".into(),
            FormatVersion::V2,
            HashMap::from([("owner".to_string(), "weir".to_string())]),
        )
        .unwrap()
        .build()
        .unwrap()
        .metadata
    }

    fn snapshot(id: i64, parent: Option<i64>, sequence: i64) -> Snapshot {
        Snapshot::builder()
            .with_snapshot_id(id)
            .with_parent_snapshot_id(parent)
            .with_sequence_number(sequence)
            .with_timestamp_ms(chrono::Utc::now().timestamp_millis() + sequence)
            .with_manifest_list(format!("file:///w/t/metadata/snap-{id}.avro"))
            .with_summary(Summary {
                operation: Operation::Append,
                additional_properties: HashMap::from([("weir.batch-id".to_string(), sequence.to_string())]),
            })
            .with_schema_id(0)
            .build()
    }

    fn as_iceberg_writes(metadata: &TableMetadata) -> serde_json::Value {
        sorted(serde_json::to_value(metadata).unwrap())
    }

    /// The file's JSON with its snapshots in id order (iceberg writes them in
    /// a hash map's order).
    fn sorted(mut json: serde_json::Value) -> serde_json::Value {
        if let Some(serde_json::Value::Array(snapshots)) = json.get_mut("snapshots") {
            snapshots.sort_by_key(|s| s["snapshot-id"].as_i64());
        }
        json
    }

    /// Commits `change` on `base` (at `location`) and checks the encoded
    /// file against iceberg's own encoding of the same metadata.
    fn commit(
        files: &MetadataFiles,
        base: &TableMetadata,
        location: &str,
        next: &str,
        change: impl FnOnce(TableMetadataBuilder) -> TableMetadataBuilder,
    ) -> (TableMetadata, &'static str) {
        let built = change(TableMetadataBuilder::new_from_metadata(
            base.clone(),
            Some(location.to_string()),
        ))
        .build()
        .unwrap();
        let json = files.encode(Some(location), &built.metadata, &built.changes).unwrap();
        let ours = sorted(serde_json::from_slice(&json.to_vec()).unwrap());
        assert_eq!(ours, as_iceberg_writes(&built.metadata));
        let how = match json.encoding {
            Encoding::Appended => "append",
            Encoding::Rebuilt => "replace",
            Encoding::Full => "full",
        };
        files.written(next, &built.metadata, json);
        (built.metadata, how)
    }

    #[test]
    fn encodes_as_iceberg_does_commit_after_commit() {
        let files = MetadataFiles::default();
        let mut metadata = new_table();
        let created = files.encode(None, &metadata, &[]).unwrap();
        assert_eq!(
            sorted(serde_json::from_slice(&created.to_vec()).unwrap()),
            as_iceberg_writes(&metadata)
        );
        files.written("m0", &metadata, created);
        let mut parent = None;
        for i in 1..=5i64 {
            let (next, how) = commit(&files, &metadata, &format!("m{}", i - 1), &format!("m{i}"), |b| {
                b.add_snapshot(snapshot(100 + i, parent, i))
                    .unwrap()
                    .set_ref(
                        MAIN_BRANCH,
                        SnapshotReference::new(100 + i, SnapshotRetention::branch(None, None, None)),
                    )
                    .unwrap()
            });
            // Each new snapshot joins the kept ones (chunks of 256 bytes here).
            assert_eq!(how, "append", "commit {i}");
            metadata = next;
            parent = Some(100 + i);
        }
        // A tag, a branch with a retention, statistics, and a new property.
        let (metadata, how) = commit(&files, &metadata, "m5", "m6", |b| {
            b.set_ref(
                "v1",
                SnapshotReference::new(
                    102,
                    SnapshotRetention::Tag {
                        max_ref_age_ms: Some(5),
                    },
                ),
            )
            .unwrap()
            .set_ref(
                "audit",
                SnapshotReference::new(103, SnapshotRetention::branch(Some(2), None, None)),
            )
            .unwrap()
            .set_statistics(StatisticsFile {
                snapshot_id: 105,
                statistics_path: "file:///w/t/metadata/stats.puffin".into(),
                file_size_in_bytes: 10,
                file_footer_size_in_bytes: 5,
                key_metadata: None,
                blob_metadata: vec![],
            })
            .set_properties(HashMap::from([("k".to_string(), "v".to_string())]))
            .unwrap()
        });
        assert_eq!(how, "append");
        // Removing snapshots drops the refs that pointed at them.
        let (metadata, how) = commit(&files, &metadata, "m6", "m7", |b| b.remove_snapshots(&[101, 102]));
        assert_eq!(how, "replace");
        let refs = read_refs(&serde_json::to_vec(&metadata).unwrap()).unwrap();
        let mut names: Vec<_> = refs.keys().map(String::as_str).collect();
        names.sort();
        assert_eq!(names, ["audit", "main"]);
        // A base the cache does not know is encoded in full, still the same.
        let (_, how) = commit(&files, &metadata, "elsewhere", "m8", |b| {
            b.add_snapshot(snapshot(200, Some(105), 6)).unwrap()
        });
        assert_eq!(how, "full");
    }

    #[test]
    fn a_late_record_of_an_older_file_never_mixes_with_a_newer_one() {
        let files = MetadataFiles::default();
        let m0 = new_table();
        let created = files.encode(None, &m0, &[]).unwrap();
        files.written("m0", &m0, created);
        let add = |base: &TableMetadata, at: &str, id: i64, parent: Option<i64>, seq: i64| {
            TableMetadataBuilder::new_from_metadata(base.clone(), Some(at.to_string()))
                .add_snapshot(snapshot(id, parent, seq))
                .unwrap()
                .set_ref(
                    MAIN_BRANCH,
                    SnapshotReference::new(id, SnapshotRetention::branch(None, None, None)),
                )
                .unwrap()
                .build()
                .unwrap()
        };
        // Writer A encodes m1; before it records the swap, writer B (same
        // cache) commits m2 on m1 and records it.
        let a = add(&m0, "m0", 101, None, 1);
        let a_json = files.encode(Some("m0"), &a.metadata, &a.changes).unwrap();
        files.loaded(
            "m1",
            &a.metadata,
            HashMap::from([(
                MAIN_BRANCH.to_string(),
                SnapshotReference::new(101, SnapshotRetention::branch(None, None, None)),
            )]),
        );
        let b = add(&a.metadata, "m1", 102, Some(101), 2);
        let b_json = files.encode(Some("m1"), &b.metadata, &b.changes).unwrap();
        files.written("m2", &b.metadata, b_json);
        // A's late record describes m1 alone.
        files.written("m1", &a.metadata, a_json);
        for (base, at, id, parent, seq) in [
            (&a.metadata, "m1", 103, Some(101), 2),
            (&b.metadata, "m2", 104, Some(102), 3),
        ] {
            let next = add(base, at, id, parent, seq);
            let json = files.encode(Some(at), &next.metadata, &next.changes).unwrap();
            let ours = sorted(serde_json::from_slice(&json.to_vec()).unwrap());
            assert_eq!(ours, as_iceberg_writes(&next.metadata), "on {at}");
        }
    }

    #[test]
    fn refs_of_a_file_without_refs_are_main_at_the_current_snapshot() {
        let refs = read_refs(br#"{"current-snapshot-id": 7}"#).unwrap();
        assert_eq!(refs[MAIN_BRANCH].snapshot_id, 7);
        assert!(read_refs(br#"{"current-snapshot-id": -1}"#).unwrap().is_empty());
        assert!(read_refs(b"not json").is_none());
    }
}
