//! Compaction's commit phase: one `replace` snapshot of the rewritten
//! groups, built on the table as it is at each swap, dropping a group one
//! of whose inputs is no longer live.

use super::*;

impl Compact {
    /// Swaps in one `replace` snapshot of `groups`, validated on the table
    /// as it is at each attempt.
    ///
    /// Outputs and attempt files are deleted only while every earlier swap
    /// of this commit is known not to have landed: once a swap ended in an
    /// error (its outcome unknown), nothing of it is deleted, since a slow
    /// swap may still land, and each attempt first looks for this commit's
    /// snapshot (by its `weir.compaction-id`).
    pub(super) async fn commit(
        &self,
        planned: &LoadedTable,
        since: Option<i64>,
        job: &Job,
        mut groups: Vec<Rewritten>,
    ) -> Result<Committed, IcebergSinkError> {
        let compaction_id = uuid::Uuid::new_v4().to_string();
        let summary: HashMap<String, String> = [
            ("weir.operation".to_string(), "compact".to_string()),
            ("weir.compaction-id".to_string(), compaction_id.clone()),
        ]
        .into_iter()
        .collect();
        let mut done = Committed::default();
        let mut producer: Option<Producer> = None;
        let mut uncertain = false;
        // Files of swaps that lost, deleted once the table shows they were
        // not this commit's (a server may answer a retried request that had
        // landed with a conflict).
        let mut lost: Vec<String> = Vec::new();
        // An error that ends the commit once the table shows its swap did
        // not land.
        let mut failed: Option<IcebergSinkError> = None;
        for attempt in 1..=MAX_ATTEMPTS {
            let base = load_existing(self.catalog.as_ref(), &self.ident).await?;
            if let Some(id) = snapshot_with(&base, &compaction_id) {
                tracing::info!(attempt, "an earlier swap of this compaction had landed");
                done.snapshot = Some(id);
                done.groups = groups;
                return Ok(done);
            }
            if uncertain {
                // Its snapshot may have been expired meanwhile: its outputs
                // being live tells as well.
                let live = self.live_files(&base).await?;
                if groups
                    .iter()
                    .any(|g| g.outputs.iter().any(|f| live.manifest_of.contains_key(f.file_path())))
                {
                    tracing::info!(attempt, "an earlier swap of this compaction had landed");
                    done.snapshot = base.metadata.current_snapshot_id();
                    done.groups = groups;
                    return Ok(done);
                }
            }
            if let Some(e) = failed.take() {
                return Err(IcebergSinkError::CompactionStopped {
                    table: self.shown(),
                    reason: format!(
                        "its swap failed ({e}) and did not land as far as the table shows; its files are kept, as \
                         a late swap could still land"
                    ),
                });
            }
            if !uncertain {
                delete_quietly(self.catalog.file_io(), &std::mem::take(&mut lost)).await;
            }
            let live = match self.still_fits(planned, &base) {
                Ok(()) => self.live_files(&base).await,
                Err(e) => Err(e),
            };
            let live = match live {
                Ok(l) => l,
                Err(e) => {
                    if !uncertain {
                        self.discard(job, &groups).await;
                    }
                    return Err(e);
                }
            };
            let (stale, kept): (Vec<Rewritten>, Vec<Rewritten>) = groups
                .into_iter()
                .partition(|g| g.inputs.iter().any(|f| !live.manifest_of.contains_key(f.file_path())));
            groups = kept;
            if !stale.is_empty() {
                tracing::info!(
                    groups = stale.len(),
                    "another writer removed inputs of these groups; they are dropped"
                );
                done.dropped += stale.len();
                if !uncertain {
                    self.discard(job, &stale).await;
                }
                producer = None;
            }
            if groups.is_empty() {
                return Ok(done);
            }
            let mut replaced = Replaced::new();
            for f in groups.iter().flat_map(|g| &g.inputs) {
                let manifest = live.manifest_of[f.file_path()].clone();
                replaced.entry(manifest).or_default().insert(f.file_path().to_string());
            }
            let producer = producer.get_or_insert_with(|| {
                let outputs = groups.iter().flat_map(|g| g.outputs.iter().cloned()).collect();
                Producer::new(self.catalog.file_io().clone(), self.shown(), outputs)
            });
            let produced = producer
                .produce(
                    &base,
                    Request {
                        change: Change::Replace,
                        summary: &summary,
                        properties: HashMap::new(),
                        cached: None,
                        added_columns: &[],
                        always_snapshot: false,
                        replaced: Some(&replaced),
                        merges_ahead: false,
                        merged_ahead: None,
                        remove_snapshots: &[],
                    },
                )
                .await?;
            let others = commits_since(&base.metadata, since);
            match self
                .catalog
                .swap(&self.ident, &base, produced.metadata, &produced.changes)
                .await
            {
                Ok(Swap::Swapped(table)) => {
                    done.snapshot = snapshot_with(&table, &compaction_id).or(table.metadata.current_snapshot_id());
                    done.concurrent = others;
                    done.groups = groups;
                    after_swap(self.catalog.as_ref(), &table, produced.expired).await;
                    return Ok(done);
                }
                Ok(Swap::Conflict) => {
                    tracing::debug!(attempt, "compaction lost a metadata swap; validating again");
                    lost.extend(produced.attempt_files);
                    if attempt > 3 {
                        let jitter = u64::from(compaction_id.as_bytes()[0] % 20);
                        tokio::time::sleep(Duration::from_millis((attempt as u64 * 5).min(200) + jitter)).await;
                    }
                }
                // Whether the swap landed is unknown (even a refusal: a proxy
                // may answer a request that reached the catalog): nothing of
                // it is deleted, and the table is asked before going on.
                Err(e) if matches!(e, IcebergSinkError::CommitRefused { .. }) || !e.retryable() => {
                    tracing::warn!(attempt, error = %e, "a compaction swap failed; reading the table to learn whether it landed");
                    uncertain = true;
                    failed = Some(e);
                }
                Err(e) => {
                    tracing::warn!(attempt, error = %e, "a compaction swap failed; its outcome is unknown, so nothing of it is deleted");
                    uncertain = true;
                    tokio::time::sleep(Duration::from_millis(100 * attempt.min(20) as u64)).await;
                }
            }
        }
        if !uncertain {
            delete_quietly(self.catalog.file_io(), &lost).await;
            self.discard(job, &groups).await;
        }
        Err(IcebergSinkError::CompactionStopped {
            table: self.shown(),
            reason: if uncertain {
                format!(
                    "{MAX_ATTEMPTS} swaps lost or failed, some with an unknown outcome; its files are kept (the table's \
                     snapshots show whether one landed)"
                )
            } else {
                format!("a commit lost {MAX_ATTEMPTS} metadata swaps in a row to other writers")
            },
        })
    }

    /// The table may only be compacted as planned while it is the same
    /// table with the same schema and partition spec.
    pub(super) fn still_fits(&self, planned: &LoadedTable, now: &LoadedTable) -> Result<(), IcebergSinkError> {
        let (a, b) = (&planned.metadata, &now.metadata);
        if a.uuid() != b.uuid() {
            return Err(IcebergSinkError::TableReplaced {
                table: self.shown(),
                expected: a.uuid().to_string(),
                found: b.uuid().to_string(),
            });
        }
        if a.current_schema_id() != b.current_schema_id()
            || a.default_partition_spec_id() != b.default_partition_spec_id()
        {
            return Err(IcebergSinkError::CompactionStopped {
                table: self.shown(),
                reason: "another writer changed the table's schema or partition spec".into(),
            });
        }
        Ok(())
    }

    /// Deletes the outputs of groups that will not be committed.
    pub(super) async fn discard(&self, job: &Job, groups: &[Rewritten]) {
        for g in groups {
            writer::delete_files(&job.file_io, &g.outputs).await;
        }
    }
}

/// What one commit came to.
#[derive(Default)]
pub(super) struct Committed {
    /// The snapshot swapped in, if any group was left to commit.
    pub(super) snapshot: Option<i64>,
    /// The groups it committed.
    pub(super) groups: Vec<Rewritten>,
    /// Groups dropped as stale.
    pub(super) dropped: usize,
    /// Other writers' commits it was built on top of.
    pub(super) concurrent: usize,
}

/// How many snapshots the current one is after snapshot `since` (all of
/// its ancestors when `since` is `None` or expired).
pub(super) fn commits_since(metadata: &TableMetadata, since: Option<i64>) -> usize {
    let mut n = 0;
    let mut at = metadata.current_snapshot();
    while let Some(s) = at {
        if Some(s.snapshot_id()) == since {
            break;
        }
        n += 1;
        at = s.parent_snapshot_id().and_then(|p| metadata.snapshot_by_id(p));
    }
    n
}

/// The snapshot whose summary carries `compaction_id`.
pub(super) fn snapshot_with(table: &LoadedTable, compaction_id: &str) -> Option<i64> {
    table
        .metadata
        .snapshots()
        .find(|s| {
            s.summary()
                .additional_properties
                .get("weir.compaction-id")
                .map(String::as_str)
                == Some(compaction_id)
        })
        .map(|s| s.snapshot_id())
}
