//! Merging small data manifests, as Java's merge-append does: in a
//! commit (a batch's, or a manifest rewrite's), or ahead of the commit, in
//! the background, for a later commit to list in place of its inputs.

use super::*;

/// How many small manifests a merge waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MergeAt {
    /// Any two small manifests of a spec (a manifest rewrite).
    All,
    /// `commit.manifest.min-count-to-merge` (default 100), the commit's
    /// own manifest counted.
    MinCount,
    /// Twice that: the writer merges ahead in the background, so a commit
    /// merges only when the background has fallen a whole round behind.
    Fallback,
}

/// Manifests merged ahead of the commit that lists them: their entries are
/// those of the inputs, so any later commit whose base still lists every
/// input may list them instead.
#[derive(Debug)]
pub(crate) struct MergedAhead {
    /// The paths of the manifests merged.
    pub inputs: HashSet<String>,
    /// When they were merged.
    pub made: std::time::Instant,
    /// The merged manifests.
    pub merged: Vec<ManifestFile>,
}

/// What a commit did with the manifests merged ahead it was offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum AheadUse {
    /// None was offered, or the change merges nothing.
    #[default]
    NotOffered,
    /// The new snapshot lists them in place of their inputs.
    Listed,
    /// The base lists them already: a commit that listed them landed.
    AlreadyListed,
    /// The base lacks some input (another writer rewrote it): they can
    /// never be listed.
    Stale,
}

impl MergedAhead {
    /// Their paths.
    pub(crate) fn paths(&self) -> Vec<String> {
        self.merged.iter().map(|m| m.manifest_path.clone()).collect()
    }

    /// What a commit on a base listing `existing` can do with them.
    fn usable(&self, existing: &[ManifestFile]) -> AheadUse {
        let listed: HashSet<&str> = existing.iter().map(|m| m.manifest_path.as_str()).collect();
        if self.merged.iter().any(|m| listed.contains(m.manifest_path.as_str())) {
            AheadUse::AlreadyListed
        } else if self.inputs.iter().all(|p| listed.contains(p.as_str())) {
            AheadUse::Listed
        } else {
            AheadUse::Stale
        }
    }

    /// `existing` with the inputs replaced by the merged manifests, which
    /// the snapshot `snapshot_id` adds.
    fn apply(&self, existing: Vec<ManifestFile>, snapshot_id: i64) -> Vec<ManifestFile> {
        let merged = self.merged.iter().cloned().map(|mut m| {
            m.added_snapshot_id = snapshot_id;
            m
        });
        merged
            .chain(existing.into_iter().filter(|m| !self.inputs.contains(&m.manifest_path)))
            .collect()
    }
}

/// The manifests a merge keeps as they are, and the groups of small data
/// manifests it merges, by partition spec: up to
/// `commit.manifest.target-size-bytes` (default [`DEFAULT_TARGET`]) each,
/// once a spec has as many as `at` says (none if the table sets
/// `commit.manifest-merge.enabled` to false, unless `at` is
/// [`MergeAt::All`]).
pub(crate) fn plan_merge(
    metadata: &TableMetadata,
    existing: Vec<ManifestFile>,
    at: MergeAt,
) -> (Vec<ManifestFile>, Vec<(i32, Vec<ManifestFile>)>) {
    let property = |key: &str, default: u64| {
        metadata
            .properties()
            .get(key)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(default)
    };
    let enabled = metadata
        .properties()
        .get("commit.manifest-merge.enabled")
        .is_none_or(|v| v != "false");
    let all = at == MergeAt::All;
    let min_count = match at {
        MergeAt::All => 2,
        MergeAt::MinCount => property("commit.manifest.min-count-to-merge", 100).max(2),
        MergeAt::Fallback => property("commit.manifest.min-count-to-merge", 100).max(2) * 2,
    };
    let target = property("commit.manifest.target-size-bytes", DEFAULT_TARGET);
    // Manifests of only deleted entries matter to no later snapshot.
    let existing = existing
        .into_iter()
        .filter(|m| m.content != ManifestContentType::Data || m.has_added_files() || m.has_existing_files());
    let (small, mut kept): (Vec<ManifestFile>, Vec<ManifestFile>) =
        existing.partition(|m| m.content == ManifestContentType::Data && (m.manifest_length as u64) < target);
    if !enabled && !all {
        kept.splice(0..0, small);
        return (kept, Vec::new());
    }
    let default_spec = metadata.default_partition_spec().spec_id();
    let mut by_spec: BTreeMap<i32, Vec<ManifestFile>> = BTreeMap::new();
    for m in small {
        by_spec.entry(m.partition_spec_id).or_default().push(m);
    }
    let mut planned = Vec::new();
    for (spec_id, small) in by_spec {
        // The commit's own manifest counts too, in the default spec.
        let count = small.len() as u64 + u64::from(spec_id == default_spec && !all);
        if count < min_count {
            kept.extend(small);
            continue;
        }
        let mut groups: Vec<Vec<ManifestFile>> = vec![Vec::new()];
        let mut size = 0u64;
        for m in small {
            if size + m.manifest_length as u64 > target && !groups.last().is_some_and(Vec::is_empty) {
                groups.push(Vec::new());
                size = 0;
            }
            size += m.manifest_length as u64;
            groups.last_mut().expect("one group").push(m);
        }
        for group in groups {
            match group.len() {
                0 | 1 => kept.extend(group),
                _ => planned.push((spec_id, group)),
            }
        }
    }
    (kept, planned)
}

impl Producer {
    /// Merges small data manifests as [`plan_merge`] plans: their live
    /// entries go, as existing entries with their snapshot ids and sequence
    /// numbers, into new manifests. Returns the manifests kept as they are
    /// and the merged ones.
    pub(super) async fn merge(
        &self,
        metadata: &TableMetadata,
        existing: Vec<ManifestFile>,
        at: MergeAt,
    ) -> Result<(Vec<ManifestFile>, Vec<ManifestFile>), IcebergSinkError> {
        let (kept, planned) = plan_merge(metadata, existing, at);
        let mut merged = Vec::with_capacity(planned.len());
        for (n, (spec_id, group)) in planned.iter().enumerate() {
            merged.push(self.write_merged(metadata, *spec_id, group, "merged", n).await?);
        }
        Ok((kept, merged))
    }

    /// The merge the next commit on `metadata`, whose current snapshot
    /// lists `manifests`, would make, made now; `None` when it would make
    /// none.
    pub(crate) async fn merge_ahead(
        &self,
        metadata: &TableMetadata,
        manifests: Vec<ManifestFile>,
    ) -> Result<Option<MergedAhead>, IcebergSinkError> {
        let (_, planned) = plan_merge(metadata, manifests, MergeAt::MinCount);
        if planned.is_empty() {
            return Ok(None);
        }
        let inputs = planned
            .iter()
            .flat_map(|(_, group)| group.iter().map(|m| m.manifest_path.clone()))
            .collect();
        let mut merged: Vec<ManifestFile> = Vec::with_capacity(planned.len());
        for (n, (spec_id, group)) in planned.iter().enumerate() {
            match self.write_merged(metadata, *spec_id, group, "merged-ahead", n).await {
                Ok(m) => merged.push(m),
                Err(e) => {
                    // Nothing lists them yet.
                    for m in &merged {
                        let _ = self.file_io.delete(&m.manifest_path).await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(Some(MergedAhead {
            inputs,
            merged,
            made: std::time::Instant::now(),
        }))
    }

    /// Lists [`MergedAhead`] in place of its inputs if `existing` still
    /// lists them all; says what it did.
    pub(super) fn list_ahead(
        &self,
        ahead: Option<&MergedAhead>,
        existing: Vec<ManifestFile>,
    ) -> (Vec<ManifestFile>, AheadUse) {
        match ahead {
            Some(a) => match a.usable(&existing) {
                AheadUse::Listed => (a.apply(existing, self.snapshot_id), AheadUse::Listed),
                other => (existing, other),
            },
            None => (existing, AheadUse::NotOffered),
        }
    }

    async fn write_merged(
        &self,
        metadata: &TableMetadata,
        spec_id: i32,
        group: &[ManifestFile],
        kind: &str,
        n: usize,
    ) -> Result<ManifestFile, IcebergSinkError> {
        let err = self.err("merge manifests");
        let path = self.manifest_path(metadata, &format!("{kind}-{spec_id}-{}-{n}", self.attempt));
        let mut writer = self.manifest_writer(metadata, &path, spec_id, None)?;
        for manifest in group {
            let (entries, _) = manifest.load_manifest(&self.file_io).await.map_err(&err)?.into_parts();
            for entry in entries {
                if entry.status() == ManifestStatus::Deleted {
                    continue;
                }
                // The loaded manifest is the only owner: its files move
                // into the writer rather than being copied.
                let entry = Arc::unwrap_or_clone(entry);
                let sequence = entry.sequence_number().unwrap_or(manifest.sequence_number);
                let snapshot = entry.snapshot_id().unwrap_or(manifest.added_snapshot_id);
                let file_sequence = entry.file_sequence_number.or(Some(sequence));
                writer
                    .add_existing_file(entry.data_file, snapshot, sequence, file_sequence)
                    .map_err(&err)?;
            }
        }
        writer.write_manifest_file().await.map_err(&err)
    }
}
