//! Compaction's commit phase: the rewritten groups' `remove`s and `add`s
//! in log entries of its own, put if absent and rebased over other
//! writers' commits, dropping a group another writer removed an input of.

use super::*;

/// The log as far as the job has read it (a table deleted and created
/// again is not written as if it were the same table), and what other
/// writers removed meanwhile.
pub(super) struct LogTail {
    pub(super) cursor: LogCursor,
    /// Every path other writers removed since the planned version: a
    /// group with one of them as input is never committed.
    pub(super) removed: HashSet<String>,
}

impl LogTail {
    pub(super) async fn start(log_store: &dyn LogStore, version: u64, url: &Url) -> Result<Self, DeltaSinkError> {
        let mut cursor = LogCursor::at(version);
        if !cursor.still_there(log_store).await.map_err(delta_err(url))? {
            return Err(replaced(url, version));
        }
        Ok(LogTail {
            cursor,
            removed: HashSet::new(),
        })
    }
}

pub(super) fn replaced(url: &Url, version: u64) -> DeltaSinkError {
    DeltaSinkError::CompactionStopped {
        table: url.to_string(),
        reason: format!("log entry {version}, which it read, is gone or different: the table was replaced"),
    }
}

fn delta_err(url: &Url) -> impl Fn(DeltaTableError) -> DeltaSinkError + '_ {
    move |source| DeltaSinkError::Delta {
        table: url.to_string(),
        source,
    }
}

/// What a commit of rewritten groups came to.
pub(super) struct Outcome {
    pub(super) version: Option<u64>,
    pub(super) committed: Vec<Rewritten>,
    pub(super) dropped: usize,
    /// Other writers' entries read while committing.
    pub(super) concurrent: usize,
}

/// Commits `groups` on top of the latest version: reads every entry after
/// the last one read, drops groups an entry removed an input of, and tries
/// again, until the put-if-absent wins.
pub(super) async fn commit(
    table: &DeltaTable,
    job: &Job,
    log: &mut LogTail,
    mut groups: Vec<Rewritten>,
) -> Result<Outcome, DeltaSinkError> {
    let url = Url::parse(&job.table).map_err(|e| DeltaSinkError::Location {
        location: job.table.clone(),
        reason: e.to_string(),
    })?;
    let log_store = table.log_store();
    let log_store = log_store.as_ref();
    let attempt = uuid::Uuid::new_v4().to_string();
    let (mut dropped, mut concurrent) = (0, 0);
    // Whether a write's outcome was unknown: it may still land, so nothing
    // of this commit is deleted from then on.
    let mut uncertain = false;
    // The entry compaction last read must still be there: otherwise the
    // table was replaced under the job.
    if !log.cursor.still_there(log_store).await.map_err(delta_err(&url))? {
        drop_groups(job, &mut groups, "the table was replaced", !uncertain, |_| true).await;
        return Err(replaced(&url, log.cursor.version()));
    }
    for round in 1..=MAX_COMMIT_ATTEMPTS {
        // Read what other writers committed since.
        while let Some(bytes) = log.cursor.next(log_store).await.map_err(delta_err(&url))? {
            let next = log.cursor.version();
            for action in entry::actions(&bytes) {
                if action["commitInfo"]["weir.attemptId"].as_str() == Some(attempt.as_str()) {
                    // A write that reported an error had landed.
                    return Ok(Outcome {
                        version: Some(next),
                        committed: groups,
                        dropped,
                        concurrent,
                    });
                }
                if let Some(path) = action["remove"]["path"].as_str() {
                    log.removed.insert(decoded(path));
                }
                if action.get("metaData").is_some() || action.get("protocol").is_some() {
                    drop_groups(job, &mut groups, "the table's metadata changed", !uncertain, |_| true).await;
                    return Err(DeltaSinkError::CompactionStopped {
                        table: job.table.clone(),
                        reason: format!("version {next} changed the table's schema, partitioning or protocol"),
                    });
                }
            }
            concurrent += 1;
        }
        let removed = &log.removed;
        dropped += drop_groups(
            job,
            &mut groups,
            "another writer removed one of its inputs",
            !uncertain,
            |g| g.inputs.iter().any(|r| removed.contains(&r.path)),
        )
        .await;
        if groups.is_empty() {
            return Ok(Outcome {
                version: None,
                committed: groups,
                dropped,
                concurrent,
            });
        }
        let version = log.cursor.version() + 1;
        let bytes =
            optimize_entry(job, &groups, log.cursor.version(), &attempt).map_err(|e| DeltaSinkError::Delta {
                table: job.table.clone(),
                source: DeltaTableError::Transaction {
                    source: TransactionError::SerializeLogJson { json_err: e },
                },
            })?;
        match log_store
            .write_commit_entry(version, CommitOrBytes::LogBytes(bytes.clone()), uuid::Uuid::new_v4())
            .await
        {
            Ok(()) => {
                log.cursor.wrote(&bytes);
                return Ok(Outcome {
                    version: Some(version),
                    committed: groups,
                    dropped,
                    concurrent,
                });
            }
            Err(TransactionError::VersionAlreadyExists(_)) => {
                tracing::debug!(version, round, "compaction lost a commit race; rebasing");
            }
            Err(e) => {
                // The outcome is unknown: the entry may have landed. The next
                // round reads it and recognises the attempt id; the outputs
                // are kept either way.
                let e = DeltaSinkError::Delta {
                    table: job.table.clone(),
                    source: DeltaTableError::Transaction { source: e },
                };
                if !e.retryable() {
                    return Err(DeltaSinkError::CompactionStopped {
                        table: job.table.clone(),
                        reason: format!(
                            "committing version {version} failed ({e}); whether it landed is unknown, so its files \
                             are kept (the table's history shows it)"
                        ),
                    });
                }
                tracing::warn!(version, round, error = %e, "a compaction commit failed; reading the log to learn whether it landed");
                uncertain = true;
                tokio::time::sleep(Duration::from_millis(100 * round.min(20) as u64)).await;
            }
        }
        if round > 3 {
            let jitter = u64::from(attempt.as_bytes()[0] % 20);
            tokio::time::sleep(Duration::from_millis((round as u64 * 5).min(200) + jitter)).await;
        }
    }
    if uncertain {
        return Err(DeltaSinkError::CompactionStopped {
            table: job.table.clone(),
            reason: format!(
                "{MAX_COMMIT_ATTEMPTS} commit attempts failed or lost races, some with an unknown outcome; its files \
                 are kept (the table's history shows whether one landed)"
            ),
        });
    }
    drop_groups(job, &mut groups, "the job gave up", true, |_| true).await;
    Err(DeltaSinkError::Busy {
        table: job.table.clone(),
        operation: "compaction".into(),
        attempts: MAX_COMMIT_ATTEMPTS,
    })
}

/// Drops the groups `pred` selects, deleting their outputs if `delete`
/// (only when no write of them may still land). Returns how many were
/// dropped.
pub(super) async fn drop_groups(
    job: &Job,
    groups: &mut Vec<Rewritten>,
    why: &str,
    delete: bool,
    pred: impl Fn(&Rewritten) -> bool,
) -> usize {
    let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(groups).into_iter().partition(|g| pred(g));
    *groups = kept;
    for g in &gone {
        tracing::info!(group = g.index, why, "a compaction group is dropped");
        if delete {
            delete_files(&job.store, &g.outputs).await;
        }
    }
    gone.len()
}

/// The log entry of a compaction commit.
pub(super) fn optimize_entry(
    job: &Job,
    groups: &[Rewritten],
    read_version: u64,
    attempt: &str,
) -> Result<Bytes, serde_json::Error> {
    let removes: Vec<&Remove> = groups.iter().flat_map(|g| &g.inputs).collect();
    let adds: Vec<&AddFile> = groups.iter().flat_map(|g| &g.outputs).collect();
    let now = chrono::Utc::now().timestamp_millis();
    let metrics = json!({
        "numRemovedFiles": removes.len().to_string(),
        "numAddedFiles": adds.len().to_string(),
        "numRemovedBytes": removes.iter().map(|r| r.size.unwrap_or(0)).sum::<i64>().to_string(),
        "numAddedBytes": adds.iter().map(|a| a.size).sum::<i64>().to_string(),
    });
    let mut info = CommitInfo {
        timestamp: Some(now),
        operation: Some("OPTIMIZE".into()),
        operation_parameters: Some(
            [
                ("targetSize".to_string(), json!(job.target.to_string())),
                ("predicate".to_string(), json!("[]")),
                ("zOrderBy".to_string(), json!("[]")),
            ]
            .into_iter()
            .collect(),
        ),
        read_version: Some(read_version),
        is_blind_append: Some(false),
        engine_info: Some(format!("weir-delta/{}", env!("CARGO_PKG_VERSION"))),
        ..Default::default()
    };
    info.info.insert("operationMetrics".into(), metrics);
    info.info.insert("weir.operation".into(), json!("compact"));
    info.info.insert("weir.attemptId".into(), Value::from(attempt));
    // A remove names its file exactly as the add did: engines encode some
    // characters (a space, ...) differently, and readers match the two
    // strings as written.
    let mut actions = vec![serde_json::to_value(Action::CommitInfo(info))?];
    for r in removes {
        let mut remove = serde_json::to_value(Action::Remove(Remove {
            deletion_timestamp: Some(now),
            data_change: false,
            ..r.clone()
        }))?;
        if let Some(raw) = job.raw_paths.get(&r.path) {
            remove["remove"]["path"] = Value::from(raw.as_str());
        }
        actions.push(remove);
    }
    for a in adds {
        actions.push(serde_json::to_value(entry::add(a, false))?);
    }
    entry::encode(actions.into_iter())
}
