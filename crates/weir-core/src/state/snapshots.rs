//! Snapshots of operator state made beside the batches, not on their path.
//!
//! A batch writes only the keys it changed. Once an operator's chain of
//! deltas is due a snapshot, a task reads the chain back into a fresh
//! state and writes it whole as the snapshot of the batch whose manifest
//! named the chain; the next batch's manifest names the snapshot instead
//! of the files it was made from. A snapshot's work grows with the whole
//! state: on the batch's path, every few batches waited the longer the
//! larger the state. Beside them it costs CPU and a second copy of the
//! state while it runs, and no batch waits for it.
//!
//! Made from files a manifest names, a snapshot is the state that
//! manifest describes, whatever the batches do meanwhile. One task runs at
//! a time. A failed one fails the next batch, as a failed state write on
//! the batch's path did; a query that ends stops the task under way (its
//! file, if it lands, is named by no manifest and deleted later).

use futures::FutureExt;
use tokio::task::JoinHandle;

use super::{KeyedState, StateManifest, StateSchema, StateStore};
use crate::error::{Error, Result};
use crate::ids::BatchId;

/// A snapshot file made of an operator's chain of files.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Snapshot {
    /// The operator's name.
    pub operator: String,
    /// The batch after which it holds the state.
    pub version: BatchId,
    /// The files it was made from, in order.
    pub from: Vec<String>,
    /// The rows of the deltas among them.
    pub chained_rows: u64,
}

impl Snapshot {
    /// Replaces the files this snapshot was made from by the snapshot, if
    /// `files` still begins with them; whether it did.
    pub(crate) fn replace_in(&self, files: &mut Vec<String>) -> bool {
        if !files.starts_with(&self.from) {
            return false;
        }
        files.splice(..self.from.len(), [format!("{}.snapshot", self.version.0)]);
        true
    }
}

/// The snapshots made beside the batches of one run.
pub(crate) struct Snapshots {
    store: StateStore,
    running: Option<JoinHandle<Result<Vec<Snapshot>>>>,
    /// The longest chain of deltas when the task under way started.
    started_at: usize,
    /// Made, and not yet named by a manifest.
    ready: Vec<Snapshot>,
}

impl Snapshots {
    pub(crate) fn new(store: StateStore) -> Self {
        Snapshots {
            store,
            running: None,
            started_at: 0,
            ready: Vec::new(),
        }
    }

    /// The snapshots made and not yet named by a manifest, taking those of
    /// a task that ended; a task that failed fails here. Once a chain in
    /// `previous` (the manifest the next batch follows) is twice as long as
    /// when the task under way started and holds twice the state's rows,
    /// the batch waits for it, so a restart's reads stay bounded when
    /// snapshots are slower than batches.
    pub(crate) async fn ready(&mut self, previous: Option<&StateManifest>) -> Result<&[Snapshot]> {
        let overgrown = previous.is_some_and(|m| {
            m.operators
                .iter()
                .any(|o| o.deltas() >= 2 * self.started_at && o.chained_rows >= 2 * o.rows)
        });
        let ended = match self.running.as_mut() {
            Some(running) if overgrown => Some(running.await),
            Some(running) => running.now_or_never(),
            None => None,
        };
        if let Some(ended) = ended {
            self.running = None;
            self.ready = self.joined(ended)?;
        }
        Ok(&self.ready)
    }

    /// `manifest` was written with the ready snapshots: starts making the
    /// snapshots its operators are due (each of the schema `schema_of`
    /// gives for its name), unless a task is under way.
    pub(crate) fn written(&mut self, manifest: &StateManifest, schema_of: impl Fn(&str) -> Option<StateSchema>) {
        self.ready.clear();
        if self.running.is_some() {
            return;
        }
        let due: Vec<_> = self
            .store
            .due(manifest)
            .into_iter()
            .filter_map(|files| Some((files.clone(), schema_of(&files.name)?)))
            .collect();
        if due.is_empty() {
            return;
        }
        let (store, batch) = (self.store.clone(), manifest.batch_id);
        self.started_at = longest_chain(manifest);
        self.running = Some(tokio::spawn(async move {
            let mut made = Vec::with_capacity(due.len());
            for (files, schema) in due {
                let started = std::time::Instant::now();
                let state = KeyedState::new(schema)
                    .map_err(|e| Error::arrow(format!("the state of operator {:?}", files.name), e))?;
                made.push(store.snapshot(batch, &files, state).await?);
                tracing::debug!(
                    operator = %files.name,
                    %batch,
                    keys = files.rows,
                    from_files = files.files.len(),
                    ms = started.elapsed().as_secs_f64() * 1e3,
                    "made a snapshot of operator state"
                );
            }
            Ok(made)
        }));
    }

    /// Waits for the task under way (at the query's end, when it ended
    /// well).
    pub(crate) async fn finish(&mut self) -> Result<()> {
        if let Some(running) = self.running.take() {
            self.joined(running.await)?;
        }
        Ok(())
    }

    /// Stops the task under way.
    pub(crate) fn abort(&mut self) {
        if let Some(running) = self.running.take() {
            running.abort();
        }
    }

    fn joined(
        &self,
        ended: std::result::Result<Result<Vec<Snapshot>>, tokio::task::JoinError>,
    ) -> Result<Vec<Snapshot>> {
        ended.unwrap_or_else(|e| {
            Err(Error::CheckpointIo {
                location: self.store.location().to_string(),
                path: "state/".into(),
                source: std::io::Error::other(format!("a snapshot of operator state ended early: {e}")),
            })
        })
    }
}

/// The number of deltas of the longest chain `manifest` names.
fn longest_chain(manifest: &StateManifest) -> usize {
    manifest.operators.iter().map(|o| o.deltas()).max().unwrap_or(0)
}

impl Drop for Snapshots {
    /// No snapshot outlives the run, nor so its lease.
    fn drop(&mut self) {
        self.abort();
    }
}
