//! One batch's commit to an Iceberg table: the snapshot with the query's
//! marker, built on the table's current metadata and swapped in by
//! compare-and-swap, again on a newer base after a lost swap.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use async_trait::async_trait;
use iceberg::spec::DataFile;
use weir_core::protocol::SinkMarker;
use weir_core::sink::{BatchContext, TableCommit, Tried};

use super::IcebergSink;
use crate::catalog::{LoadedTable, Swap};
use crate::commit::{AheadUse, Change, Producer, Request};
use crate::error::IcebergSinkError;
use crate::marker;
use crate::table::Layout;
use crate::upsert;
use weir_core::sync::Recover;

/// One batch's commit to an Iceberg table: a snapshot with the query's
/// marker, swapped in for the metadata it was built on.
pub(super) struct SwapCommit<'a> {
    pub(super) sink: &'a IcebergSink,
    pub(super) ctx: &'a BatchContext,
    /// The table as the sink last saw it (the first try builds on it).
    pub(super) slot: tokio::sync::MutexGuard<'a, Option<LoadedTable>>,
    pub(super) layout: Arc<Layout>,
    pub(super) change: Change,
    pub(super) summary: HashMap<String, String>,
    pub(super) producer: Producer,
    /// Files of a swap that lost: deleted once the reloaded table shows it
    /// was not this attempt's own (a server may answer a retried request
    /// that had landed with a conflict).
    pub(super) lost: Vec<String>,
    /// The metadata a swap of unknown outcome was built on.
    pub(super) unknown_base: Option<String>,
    /// Update mode: the key columns, the batch's own files, and the keys
    /// of its groups (read once).
    pub(super) key: Vec<String>,
    pub(super) batch_files: Vec<DataFile>,
    pub(super) keys: Option<upsert::Keys>,
    /// Tries made, to name each try's rewritten files apart.
    pub(super) tries: usize,
}

impl SwapCommit<'_> {
    fn core(&self, e: IcebergSinkError) -> weir_core::Error {
        e.into_core(Some(self.ctx.batch_id))
    }

    /// Update mode: the live files of `base` holding rows of the batch's
    /// groups, written again without them, and a producer of the batch's
    /// files and those rewrites.
    async fn rewrite(&mut self, base: &LoadedTable) -> Result<upsert::Rewrite, IcebergSinkError> {
        let sink = self.sink;
        let table = upsert::Table {
            shown: sink.shown(),
            io: sink.catalog.file_io(),
            base,
        };
        if self.keys.is_none() {
            self.keys = Some(upsert::Keys::read(&table, &self.key, &self.batch_files).await?);
        }
        self.tries += 1;
        let ctx = self.ctx;
        let prefix = format!(
            "part-{:05}-{}-{}-u{:03}",
            ctx.batch_id.0, ctx.query_id, ctx.attempt_id, self.tries
        );
        let keys = self.keys.as_ref().expect("read above");
        let started = std::time::Instant::now();
        let rewrite = upsert::rewrite(&table, keys, prefix).await?;
        tracing::debug!(
            read = rewrite.read,
            rewritten = rewrite.replaced.values().map(|p| p.len()).sum::<usize>(),
            ms = started.elapsed().as_millis() as u64,
            "rewrote the files holding the batch's groups"
        );
        let files = self.batch_files.iter().chain(&rewrite.adds).cloned().collect();
        self.producer = Producer::new(sink.catalog.file_io().clone(), sink.shown(), files);
        Ok(rewrite)
    }

    /// After a commit of this attempt: counts it for the expiry policy, and
    /// starts a background compaction if one is due.
    fn committed(&self) {
        self.sink.state.expiring.fetch_add(1, Ordering::Relaxed);
        self.sink.maybe_compact(self.producer.files().len());
    }
}

#[async_trait]
impl TableCommit for SwapCommit<'_> {
    type Base = LoadedTable;

    async fn base(&mut self, attempt: usize) -> weir_core::Result<LoadedTable> {
        // The first try builds on the table as this sink last saw it; a
        // later one reloads it.
        let base = match self.slot.take() {
            Some(table) if attempt == 1 => table,
            _ => self.sink.load().await.map_err(|e| self.core(e))?,
        };
        self.sink.check_table(&base, &self.layout).map_err(|e| self.core(e))?;
        Ok(base)
    }

    async fn marker(&mut self, base: &LoadedTable) -> weir_core::Result<Option<SinkMarker>> {
        Ok(marker::read(&base.metadata, &self.ctx.query_name))
    }

    async fn already(&mut self, base: LoadedTable, tried: bool) -> weir_core::Result<Option<Option<i64>>> {
        let ours = tried && marker::set_by(&base.metadata, self.ctx);
        let version = base.metadata.current_snapshot_id();
        *self.slot = Some(base);
        if ours {
            self.committed();
            return Ok(Some(version));
        }
        self.sink.delete(std::mem::take(&mut self.lost)).await;
        Ok(None)
    }

    fn unchanged(&self, base: &LoadedTable) -> bool {
        self.unknown_base.as_deref() == Some(base.metadata_location.as_str())
    }

    async fn try_commit(&mut self, base: LoadedTable, attempt: usize) -> weir_core::Result<Tried> {
        self.sink.delete(std::mem::take(&mut self.lost)).await;
        let rewrite = match self.change {
            Change::Upsert => self.rewrite(&base).await.map_err(|e| self.core(e))?,
            _ => upsert::Rewrite::default(),
        };
        let rewritten: Vec<String> = rewrite.adds.iter().map(|f| f.file_path().to_string()).collect();
        let cached = self.sink.state.manifests.lock().recover().clone();
        let (offered, expired) = self.sink.state.ahead.ready();
        self.sink.delete(expired).await;
        let expiry = self.sink.expiry_due(&base);
        let remove: Vec<i64> = expiry
            .as_ref()
            .map_or_else(Vec::new, |(_, c)| c.expired.iter().copied().collect());
        let produced = self
            .producer
            .produce(
                &base,
                Request {
                    change: self.change,
                    summary: &self.summary,
                    properties: marker::properties(self.ctx),
                    cached: cached.as_ref(),
                    added_columns: self.layout.evolution.as_ref().map_or(&[], |e| &e.fields),
                    always_snapshot: !self.sink.catalog.writes_metadata(),
                    replaced: Some(&rewrite.replaced),
                    merges_ahead: true,
                    merged_ahead: offered.as_deref(),
                    remove_snapshots: &remove,
                },
            )
            .await;
        let produced = match produced {
            Ok(p) => p,
            Err(e) => {
                self.sink.delete(rewritten).await;
                return Err(self.core(e));
            }
        };
        let sink = self.sink;
        let settle = |landed: Option<bool>| match &offered {
            Some(offered) => sink.state.ahead.settle(offered, produced.ahead, landed),
            None => Vec::new(),
        };
        if produced.ahead != AheadUse::Listed {
            sink.delete(settle(Some(false))).await;
        }
        match sink
            .catalog
            .swap(&sink.ident, &base, produced.metadata, &produced.changes)
            .await
        {
            Ok(Swap::Swapped(table)) => {
                settle(Some(true));
                // Only an append lists a merge made ahead.
                if let (Change::Append, Some((_, manifests))) = (self.change, &produced.manifests) {
                    sink.state.ahead.start_if_due(
                        &sink.state.background,
                        sink.catalog.file_io(),
                        sink.shown(),
                        &table.metadata,
                        manifests,
                    );
                }
                let version = table.metadata.current_snapshot_id();
                tracing::debug!(
                    ?version,
                    attempt,
                    files = self.producer.files().len(),
                    "committed to Iceberg"
                );
                if produced.manifests.is_some() {
                    *sink.state.manifests.lock().recover() = produced.manifests;
                }
                crate::catalog::write_hint(sink.catalog.as_ref(), &table).await;
                sink.delete_logs_later(&table, produced.expired);
                sink.expiry_landed(expiry, &base.metadata, &table.metadata);
                *self.slot = Some(*table);
                self.committed();
                Ok(Tried::Landed { version })
            }
            Ok(Swap::Conflict) => {
                // A retried request that had landed may be answered so:
                // a merge it listed is kept until a base shows which.
                settle(None);
                self.lost = produced.attempt_files;
                self.lost.extend(rewritten);
                Ok(Tried::Lost)
            }
            // A refusal is definite: nothing was committed.
            Err(e @ IcebergSinkError::CommitRefused { .. }) => {
                sink.delete(produced.attempt_files).await;
                sink.delete(rewritten).await;
                Err(self.core(e))
            }
            // The swap may have happened: nothing is deleted, and the table
            // tells (this attempt's marker, or the base still current).
            Err(e) => {
                settle(None);
                self.unknown_base = Some(base.metadata_location.clone());
                Ok(Tried::Unknown(self.core(e)))
            }
        }
    }

    fn too_many_conflicts(&self, attempts: usize) -> weir_core::Error {
        self.core(IcebergSinkError::TooManyConflicts {
            table: self.sink.shown(),
            batch_id: self.ctx.batch_id,
            attempts,
        })
    }
}
