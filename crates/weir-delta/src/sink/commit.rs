//! The Delta sink's part of the commit loop (`weir_core::sink::commit_batch`).

use super::*;

/// One batch's commit to a Delta table: its files and the query's `txn`
/// marker in one log entry, by one of two strategies. An append that
/// changes no metadata writes its entry itself, put if absent at the
/// version after the marker cache's; anything else (Complete mode, a schema
/// change, a log store without put-if-absent) commits through deltalake,
/// which checks for conflicts from the table's version on.
pub(super) struct DeltaCommit<'a> {
    pub(super) sink: &'a DeltaSink,
    pub(super) ctx: &'a BatchContext,
    /// The table, kept between commits (locked before `txns`).
    pub(super) slot: tokio::sync::MutexGuard<'a, Option<DeltaTable>>,
    pub(super) txns: tokio::sync::MutexGuard<'a, marker::TxnCache>,
    pub(super) files: Vec<AddFile>,
    /// The latest version before this batch's first try: a commit of this
    /// attempt can only be after it.
    pub(super) first_try: Option<u64>,
    /// Whether the last try wrote its entry itself.
    pub(super) direct_tried: bool,
    /// Update mode: the keys of the batch's groups, read once.
    pub(super) keys: Option<upsert::Keys>,
    /// Tries made, to name each try's rewritten files apart.
    pub(super) tries: usize,
    /// The rewritten files of tries that lost a race: deleted once the
    /// table shows the try did not land after all (a retried request can
    /// report a conflict for a put that had landed).
    pub(super) lost: Vec<AddFile>,
    /// Whether a try ended with an unknown outcome: later tries through
    /// deltalake then do not let it rebase on a version that may be that
    /// try's own commit.
    pub(super) uncertain: bool,
}

/// What one try builds on, besides the sink's table.
pub(super) struct DeltaBase {
    /// The entry is written directly (see [`DeltaCommit`]).
    direct: bool,
    /// Complete and Update modes: the table with every live file, at the
    /// latest version, whose files the batch removes or rewrites.
    full: Option<DeltaTable>,
    layout: Arc<Layout>,
}

impl DeltaCommit<'_> {
    fn core(&self, e: DeltaSinkError) -> weir_core::Error {
        e.into_core(Some(self.ctx.batch_id))
    }
}

#[async_trait]
impl TableCommit for DeltaCommit<'_> {
    type Base = DeltaBase;

    async fn base(&mut self, _attempt: usize) -> weir_core::Result<DeltaBase> {
        let (sink, ctx) = (self.sink, self.ctx);
        let core = |e: DeltaSinkError| e.into_core(Some(ctx.batch_id));
        sink.refresh(&mut self.slot, &mut self.txns).await.map_err(core)?;
        let layout = sink.layout()?;
        let direct = sink
            .direct(self.slot.as_ref().expect("refreshed"), ctx, &layout)
            .map_err(core)?;
        // deltalake's commit checks for conflicts from its table's version
        // on, and Complete and Update modes' removes need every live file: either
        // table is loaded at the latest version, and the marker cache
        // brought past it, so that the marker check and the conflict check
        // cover every version between them.
        let mut full = None;
        if !direct {
            match ctx.output_mode {
                OutputMode::Append => {
                    sink.latest(&mut self.slot).await.map_err(core)?;
                }
                OutputMode::Complete | OutputMode::Update => {
                    let loaded = table::load(&sink.url, &sink.options, Files::Tracked).await;
                    let gone = || {
                        sink.err(DeltaTableError::NotATable(format!(
                            "{} has no Delta table (was it deleted?)",
                            sink.url
                        )))
                    };
                    full = Some(loaded.map_err(core)?.ok_or_else(|| core(gone()))?);
                }
            }
            sink.refresh(&mut self.slot, &mut self.txns).await.map_err(core)?;
        }
        // The refresh may have fitted the stream to a changed table.
        let layout = sink.layout()?;
        let table = self.slot.as_ref().expect("refreshed");
        let snapshot = table.snapshot().map_err(|e| core(sink.err(e)))?;
        if snapshot.metadata().id() != layout.table_id {
            return Err(core(DeltaSinkError::TableReplaced {
                table: sink.url.to_string(),
                expected: layout.table_id.clone(),
                found: snapshot.metadata().id().to_string(),
            }));
        }
        Ok(DeltaBase { direct, full, layout })
    }

    async fn marker(&mut self, _base: &DeltaBase) -> weir_core::Result<Option<SinkMarker>> {
        let table = self.slot.as_ref().expect("refreshed");
        let found = marker::read(table, &mut self.txns, &self.ctx.query_name, &self.ctx.known_ids()).await;
        let found = found.map_err(|e| self.core(self.sink.err(e)))?;
        Ok(found)
    }

    async fn already(&mut self, _base: DeltaBase, _tried: bool) -> weir_core::Result<Option<Option<i64>>> {
        let Some(since) = self.first_try else {
            return Ok(None);
        };
        let log_store = self.slot.as_ref().expect("refreshed").log_store();
        let attempt_id = self.ctx.attempt_id.to_string();
        let latest = self.txns.version().unwrap_or(0);
        let landed = marker::attempt_landed(log_store.as_ref(), since + 1, latest, &attempt_id).await;
        if !landed.map_err(|e| self.core(self.sink.err(e)))? {
            self.delete_lost().await;
            return Ok(None);
        }
        // A lost try's rewrites are deleted at the start of the next try,
        // so what is left is the last try's: the one that landed.
        self.lost.clear();
        self.sink.maybe_compact(self.files.len());
        Ok(Some(None))
    }

    async fn try_commit(&mut self, base: DeltaBase, attempt: usize) -> weir_core::Result<Tried> {
        let (sink, ctx) = (self.sink, self.ctx);
        // The marker check before this try found the batch absent, so no
        // earlier try of it landed: their rewrites are in no commit.
        self.delete_lost().await;
        // The version the marker check read up to: the cache moves only
        // when a commit lands.
        let latest = self.txns.version().unwrap_or(0);
        self.first_try.get_or_insert(latest);
        self.direct_tried = base.direct;
        let rewrite = match (ctx.output_mode, base.full.as_ref()) {
            (OutputMode::Update, Some(full)) => self.rewrite(full, &base.layout).await?,
            _ => upsert::Rewrite::default(),
        };
        let table = self.slot.as_ref().expect("refreshed");
        if base.direct {
            let version = latest + 1;
            let written = sink.write_entry(table, &mut self.txns, ctx, &self.files, version).await;
            let written = match written {
                Ok(written) => written,
                Err(e) => return self.failed(e),
            };
            if !written {
                return Ok(Tried::Lost);
            }
            tracing::debug!(version, attempt, files = self.files.len(), "committed to Delta");
            sink.after_commit(table, version, self.files.len());
            return Ok(Tried::Landed {
                version: Some(version as i64),
            });
        }
        let on = base.full.as_ref().unwrap_or(table);
        let mut actions = match sink.actions(on, ctx, &self.files, &base.layout) {
            Ok(actions) => actions,
            Err(e) => {
                // Nothing was sent: the try's rewrites are in no commit.
                if let Ok(Prepared { store, .. }) = sink.prepared() {
                    delete_files(&store, &rewrite.adds).await;
                }
                return Err(self.core(e));
            }
        };
        actions.extend(rewrite.removes.iter().cloned().map(Action::Remove));
        actions.extend(rewrite.adds.iter().map(|f| entry::add(f, true)));
        match sink.try_commit(on, ctx, actions, !self.uncertain).await {
            Ok(version) => {
                tracing::debug!(
                    version,
                    attempt,
                    files = self.files.len(),
                    rewritten = rewrite.removes.len(),
                    "committed to Delta"
                );
                Ok(Tried::Landed { version: Some(version) })
            }
            Err(e) if lost_race(&e) => {
                tracing::info!(attempt, error = %e, "lost a commit race; re-reading the table");
                self.lost.extend(rewrite.adds);
                Ok(Tried::Lost)
            }
            // The try's rewrites stay: its commit may hold them (vacuum
            // removes them if not).
            Err(e) => self.failed(sink.err(e)),
        }
    }

    /// A try of unknown outcome that the next base does not show can be
    /// tried again on any base: every try puts the log entry of the version
    /// after its base only if that entry is absent, so the unknown try
    /// either never lands (its version is taken, or the new try's entry
    /// takes it first) or lands in place of the new try, which then loses
    /// the race and finds the batch in the log.
    fn unchanged(&self, _base: &DeltaBase) -> bool {
        true
    }

    /// The winner of a direct write is read at once; only a crowd of
    /// writers needs spreading out. deltalake's own retries lost already.
    fn backs_off(&self, attempt: usize) -> bool {
        !self.direct_tried || attempt > 3
    }

    fn too_many_conflicts(&self, attempts: usize) -> weir_core::Error {
        self.core(DeltaSinkError::TooManyConflicts {
            table: self.sink.url.to_string(),
            batch_id: self.ctx.batch_id,
            attempts,
        })
    }
}

impl DeltaCommit<'_> {
    /// A try that failed: a failure that may pass on a retry may also have
    /// come after the log entry landed, so its outcome is unknown and the
    /// next base reads the log for this attempt's entry.
    fn failed(&mut self, e: DeltaSinkError) -> weir_core::Result<Tried> {
        if !e.retryable() {
            return Err(self.core(e));
        }
        self.uncertain = true;
        Ok(Tried::Unknown(self.core(e)))
    }

    async fn delete_lost(&mut self) {
        if self.lost.is_empty() {
            return;
        }
        if let Ok(Prepared { store, .. }) = self.sink.prepared() {
            delete_files(&store, &std::mem::take(&mut self.lost)).await;
        }
    }

    /// Update mode: the live files of `table` that hold rows of the batch's
    /// groups, written again without them.
    async fn rewrite(&mut self, table: &DeltaTable, layout: &Layout) -> weir_core::Result<upsert::Rewrite> {
        let (sink, ctx) = (self.sink, self.ctx);
        let core = |e: DeltaSinkError| e.into_core(Some(ctx.batch_id));
        let Prepared { store, key, .. } = sink.prepared().map_err(core)?;
        if self.keys.is_none() {
            let name = sink.url.to_string();
            let keys = upsert::Keys::read(&name, &store, layout, &key, &self.files).await;
            self.keys = Some(keys.map_err(core)?);
        }
        self.tries += 1;
        let keys = self.keys.as_ref().expect("read above");
        let started = Instant::now();
        let rewrite = upsert::rewrite(sink, table, ctx, keys, self.tries)
            .await
            .map_err(core)?;
        tracing::debug!(
            read = rewrite.read,
            rewritten = rewrite.removes.len(),
            ms = started.elapsed().as_millis() as u64,
            "rewrote the files holding the batch's groups"
        );
        Ok(rewrite)
    }
}

/// Whether a failed commit lost a race that a re-read and a retry can win.
fn lost_race(e: &DeltaTableError) -> bool {
    match e {
        DeltaTableError::VersionAlreadyExists(_) => true,
        DeltaTableError::Transaction { source } => matches!(
            source,
            TransactionError::CommitConflict(
                CommitConflictError::ConcurrentTransaction
                    | CommitConflictError::ConcurrentAppend
                    | CommitConflictError::ConcurrentDeleteRead
                    | CommitConflictError::ConcurrentDeleteDelete
                    | CommitConflictError::MetadataChanged
            ) | TransactionError::VersionAlreadyExists(_)
                | TransactionError::MaxCommitAttempts(_)
        ),
        _ => false,
    }
}
