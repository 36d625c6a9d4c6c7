//! Operator state, kept exactly once in the checkpoint.
//!
//! Layout under the checkpoint:
//!
//! ```text
//! state/_manifest/N              which files make up every operator's state after batch N
//! state/<operator>/<part>/N.delta     the keys batch N changed (Arrow IPC)
//! state/<operator>/<part>/N.snapshot  every key after batch N (Arrow IPC)
//! ```
//!
//! Batch N reads the state after N-1 (the manifest of the batch before it),
//! changes it, and writes its deltas and then `state/_manifest/N` before
//! the sink commits. A replay of N starts again from the manifest of N-1
//! and writes version N again, replacing what the failed attempt wrote;
//! once the sink holds N, the manifest of N is the one it was committed
//! with. Every few versions a snapshot replaces the chain of deltas, and
//! files no retained manifest names are deleted with the logs.

mod files;
mod keyed;
mod manifest;

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;

pub use keyed::{KeyedState, StateSchema, Values};
pub use manifest::{OperatorFiles, StateManifest};

use crate::checkpoint::{decode, CheckpointStore, WriteContents, FORMAT_VERSION};
use crate::error::{Error, Result};
use crate::ids::BatchId;

const MANIFESTS: &str = "state/_manifest";

/// How many deltas an operator's state may chain before a snapshot
/// replaces them (by default).
pub const DEFAULT_SNAPSHOT_EVERY: usize = 10;

/// The operator state of one checkpoint.
#[derive(Debug, Clone)]
pub struct StateStore {
    store: Arc<dyn CheckpointStore>,
    snapshot_every: usize,
    /// About how many bytes of a state file go in one record batch.
    chunk_bytes: usize,
}

/// About how many bytes of a state file go in one of its record batches.
const CHUNK_BYTES: usize = 4 << 20;

/// Whether `name` can name an operator's state directory.
pub(crate) fn valid_operator_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && !name.starts_with(['_', '.'])
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn file_version(name: &str) -> Option<u64> {
    name.strip_suffix(".delta")
        .or_else(|| name.strip_suffix(".snapshot"))?
        .parse()
        .ok()
}

impl StateStore {
    /// The state of the checkpoint on `store`; a snapshot after at most
    /// `snapshot_every` deltas.
    pub fn new(store: Arc<dyn CheckpointStore>, snapshot_every: usize) -> Self {
        StateStore {
            store,
            snapshot_every: snapshot_every.max(1),
            chunk_bytes: CHUNK_BYTES,
        }
    }

    /// Writes state files in record batches of about `bytes` each.
    #[cfg(test)]
    pub(crate) fn with_chunk_bytes(mut self, bytes: usize) -> Self {
        self.chunk_bytes = bytes;
        self
    }

    fn dir(name: &str, partition: u32) -> String {
        format!("state/{name}/{partition}")
    }

    fn corrupt(&self, path: &str, reason: impl Into<String>) -> Error {
        Error::CorruptCheckpoint {
            location: self.store.location().to_string(),
            path: path.to_string(),
            reason: reason.into(),
        }
    }

    /// The batch ids that have a manifest, ascending.
    pub async fn manifest_ids(&self) -> Result<Vec<BatchId>> {
        let mut ids = Vec::new();
        for name in self.store.list(MANIFESTS).await? {
            let id = name.parse::<u64>().map_err(|_| {
                self.corrupt(
                    &format!("{MANIFESTS}/{name}"),
                    "a manifest whose name is not a batch id",
                )
            })?;
            ids.push(BatchId(id));
        }
        ids.sort_unstable();
        Ok(ids)
    }

    /// The manifest of `batch`, if written.
    pub async fn manifest(&self, batch: BatchId) -> Result<Option<StateManifest>> {
        let path = format!("{MANIFESTS}/{}", batch.0);
        match self.store.get(&path).await? {
            Some(bytes) => {
                let m: StateManifest = decode(self.store.location(), &path, &bytes)?;
                if m.batch_id != batch {
                    return Err(self.corrupt(&path, format!("it describes batch {}", m.batch_id)));
                }
                Ok(Some(m))
            }
            None => Ok(None),
        }
    }

    /// Reads an operator's state files into `state` (which should be empty).
    pub async fn restore(&self, files: &OperatorFiles, state: &mut KeyedState) -> Result<()> {
        let dir = Self::dir(&files.name, files.partition);
        for file in &files.files {
            let path = format!("{dir}/{file}");
            let bytes = self
                .store
                .get(&path)
                .await?
                .ok_or_else(|| self.corrupt(&path, "a state file the manifest names is missing"))?;
            let batches = files::decode(bytes).map_err(|e| self.corrupt(&path, e.to_string()))?;
            for (i, batch) in batches.iter().enumerate() {
                // A file's metadata (a range of removed keys) is its
                // schema's, which every record batch of it carries: it
                // applies once, before the first batch's rows.
                let batch = if i == 0 {
                    batch.clone()
                } else {
                    let plain = batch.schema().as_ref().clone().with_metadata(Default::default());
                    arrow_array::RecordBatch::try_new(Arc::new(plain), batch.columns().to_vec())
                        .map_err(|e| self.corrupt(&path, e.to_string()))?
                };
                let batch = &batch;
                let expected = if file.ends_with(".delta") {
                    state.schema().delta()
                } else {
                    state.schema().snapshot()
                };
                if batch.schema().fields() != expected.fields() {
                    return Err(Error::SchemaMismatch {
                        context: format!(
                            "state file {path} of {}: the operator's state is laid out otherwise than when it was written (its input, its aggregates, the query's output mode or the weir that wrote it changed); use a new checkpoint",
                            self.store.location()
                        ),
                        expected: expected.to_string(),
                        found: batch.schema().to_string(),
                    });
                }
                state.apply(batch).map_err(|e| self.corrupt(&path, e.to_string()))?;
            }
        }
        if state.len() as u64 != files.rows {
            return Err(self.corrupt(
                &dir,
                format!(
                    "the state files hold {} keys, the manifest says {}",
                    state.len(),
                    files.rows
                ),
            ));
        }
        Ok(())
    }

    /// Writes what each operator's state changed in `batch` (a delta, or a
    /// snapshot once the chain is long), then the batch's manifest, which
    /// replaces one an earlier attempt of the batch wrote.
    pub(crate) async fn write(
        &self,
        batch: BatchId,
        previous: Option<&StateManifest>,
        states: &mut [(&str, &mut KeyedState)],
        max_event_time_ms: Option<i64>,
    ) -> Result<StateManifest> {
        let mut operators = Vec::with_capacity(states.len());
        for (name, state) in states.iter_mut() {
            let before = previous.and_then(|m| m.operator(name));
            let mut files = before.map(|b| b.files.clone()).unwrap_or_default();
            let dir = Self::dir(name, 0);
            let context = || format!("writing the state of operator {name} for batch {batch}");
            let written = if before.map_or(0, |b| b.deltas()) + 1 >= self.snapshot_every && state.changed() > 0 {
                let snapshot = state.snapshot().map_err(|e| Error::arrow(context(), e))?;
                Some((format!("{}.snapshot", batch.0), snapshot))
            } else {
                let changes = state.take_changes().map_err(|e| Error::arrow(context(), e))?;
                changes.map(|c| (format!("{}.delta", batch.0), c))
            };
            if let Some((file, rows)) = written {
                // Streamed into the store: a large delta is not copied
                // into one buffer first.
                let chunk_bytes = self.chunk_bytes;
                let contents: WriteContents = Box::new(move |out| files::write(&rows, out, chunk_bytes));
                self.store.put_written(&format!("{dir}/{file}"), contents).await?;
                if file.ends_with(".snapshot") {
                    files.clear();
                }
                files.push(file);
            }
            operators.push(OperatorFiles {
                name: name.to_string(),
                partition: 0,
                files,
                rows: state.len() as u64,
                bytes: state.bytes() as u64,
            });
        }
        let manifest = StateManifest {
            version: FORMAT_VERSION,
            batch_id: batch,
            max_event_time_ms,
            operators,
        };
        let bytes = Bytes::from(serde_json::to_vec(&manifest).expect("manifests serialise"));
        self.store.put(&format!("{MANIFESTS}/{}", batch.0), bytes).await?;
        Ok(manifest)
    }

    /// Deletes the manifests before `keep_from`, and the state files that
    /// no remaining manifest names.
    pub async fn purge_before(&self, keep_from: BatchId) -> Result<()> {
        let ids = self.manifest_ids().await?;
        let Some(newest) = ids.last().copied() else {
            return Ok(());
        };
        let mut kept = Vec::new();
        for id in ids {
            if id < keep_from && id < newest {
                self.store.delete(&format!("{MANIFESTS}/{}", id.0)).await?;
            } else if let Some(m) = self.manifest(id).await? {
                kept.push(m);
            }
        }
        let mut dirs: HashSet<(String, u32)> = HashSet::new();
        let mut named: HashSet<String> = HashSet::new();
        for m in &kept {
            for op in &m.operators {
                let dir = Self::dir(&op.name, op.partition);
                named.extend(op.files.iter().map(|f| format!("{dir}/{f}")));
                dirs.insert((op.name.clone(), op.partition));
            }
        }
        for (name, partition) in dirs {
            let dir = Self::dir(&name, partition);
            for file in self.store.list(&dir).await? {
                let path = format!("{dir}/{file}");
                // Files newer than the newest manifest belong to a batch in
                // flight; unnamed older ones are replaced or superseded.
                if file_version(&file).is_some_and(|v| v <= newest.0) && !named.contains(&path) {
                    self.store.delete(&path).await?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
