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
//! with. Once an operator's chain of deltas is long, a snapshot of its
//! whole state is made beside the batches ([`Snapshots`]), off their path,
//! and a later manifest names it instead of the deltas it was made from;
//! files no retained manifest names are deleted with the logs.

mod files;
mod keyed;
mod manifest;
mod snapshots;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;

pub use keyed::{KeyedState, StateSchema, Values};
pub use manifest::{OperatorFiles, StateManifest};
pub(crate) use snapshots::{Snapshot, Snapshots};

use crate::checkpoint::{decode, CheckpointStore, WriteContents, FORMAT_VERSION};
use crate::error::{Error, Result};
use crate::ids::BatchId;

const MANIFESTS: &str = "state/_manifest";

/// How many deltas an operator's state chains before a snapshot of it is
/// made (by default).
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

/// How many state files a restore fetches at once.
const RESTORE_FETCHES: usize = 8;

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
    /// The state of the checkpoint on `store`; a snapshot is due after
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

    /// The checkpoint's location.
    pub(crate) fn location(&self) -> &str {
        self.store.location()
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
    /// Files are fetched a few at a time (each is a request on object
    /// storage) and applied in order.
    pub async fn restore(&self, files: &OperatorFiles, state: &mut KeyedState) -> Result<()> {
        let mut fetched = self.fetch(files);
        while let Some((path, got)) = fetched.next().await {
            let bytes = got?.ok_or_else(|| self.corrupt(&path, "a state file the manifest names is missing"))?;
            self.apply(&path, bytes, state)?;
        }
        self.check_rows(files, state)
    }

    /// The operator's state files, fetched [`RESTORE_FETCHES`] at a time,
    /// in order: each path and what the store holds there.
    fn fetch(
        &self,
        files: &OperatorFiles,
    ) -> impl futures::Stream<Item = (String, Result<Option<Bytes>>)> + Send + 'static {
        let dir = Self::dir(&files.name, files.partition);
        let paths: Vec<String> = files.files.iter().map(|file| format!("{dir}/{file}")).collect();
        let store = self.store.clone();
        futures::stream::iter(paths.into_iter().map(move |path| {
            let store = store.clone();
            async move {
                let got = store.get(&path).await;
                (path, got)
            }
        }))
        .buffered(RESTORE_FETCHES)
    }

    /// Applies the state file at `path`, holding `bytes`, to `state`.
    fn apply(&self, path: &str, bytes: Bytes, state: &mut KeyedState) -> Result<()> {
        let batches = files::decode(bytes).map_err(|e| self.corrupt(path, e.to_string()))?;
        let expected = if path.ends_with(".delta") {
            state.schema().delta()
        } else {
            state.schema().snapshot()
        };
        for (i, batch) in batches.iter().enumerate() {
            // A file's metadata (a range of removed keys) is its schema's,
            // which every record batch of it carries: it applies once,
            // before the first batch's rows.
            let batch = if i == 0 {
                batch.clone()
            } else {
                let plain = batch.schema().as_ref().clone().with_metadata(Default::default());
                arrow_array::RecordBatch::try_new(Arc::new(plain), batch.columns().to_vec())
                    .map_err(|e| self.corrupt(path, e.to_string()))?
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
            state.apply(&batch).map_err(|e| self.corrupt(path, e.to_string()))?;
        }
        Ok(())
    }

    /// Refuses a restored state whose size is not the manifest's.
    fn check_rows(&self, files: &OperatorFiles, state: &KeyedState) -> Result<()> {
        if state.len() as u64 != files.rows {
            return Err(self.corrupt(
                &Self::dir(&files.name, files.partition),
                format!(
                    "the state files hold {} keys, the manifest says {}",
                    state.len(),
                    files.rows
                ),
            ));
        }
        Ok(())
    }

    /// Writes what each operator's state changed in `batch` as a delta,
    /// then the batch's manifest, which replaces one an earlier attempt of
    /// the batch wrote. Each of `snapshots` (made beside earlier batches)
    /// replaces the files it was made from, if the chain still begins with
    /// them.
    pub(crate) async fn write(
        &self,
        batch: BatchId,
        previous: Option<&StateManifest>,
        states: &mut [(&str, &mut KeyedState)],
        max_event_time_ms: Option<i64>,
        snapshots: &[Snapshot],
    ) -> Result<StateManifest> {
        let mut operators = Vec::with_capacity(states.len());
        for (name, state) in states.iter_mut() {
            let before = previous.and_then(|m| m.operator(name));
            let mut files = before.map(|b| b.files.clone()).unwrap_or_default();
            let mut chained_rows = before.map_or(0, |b| b.chained_rows);
            if let Some(snapshot) = snapshots.iter().find(|s| s.operator == *name) {
                if snapshot.replace_in(&mut files) {
                    chained_rows = chained_rows.saturating_sub(snapshot.chained_rows);
                }
            }
            let dir = Self::dir(name, 0);
            let context = || format!("writing the state of operator {name} for batch {batch}");
            let changes = state.take_changes().map_err(|e| Error::arrow(context(), e))?;
            if let Some(rows) = changes {
                chained_rows += rows.num_rows() as u64;
                let file = format!("{}.delta", batch.0);
                // Streamed into the store: a large delta is not copied
                // into one buffer first.
                let chunk_bytes = self.chunk_bytes;
                let contents: WriteContents = Box::new(move |out| files::write(&rows, out, chunk_bytes));
                self.store.put_written(&format!("{dir}/{file}"), contents).await?;
                files.push(file);
            }
            operators.push(OperatorFiles {
                name: name.to_string(),
                partition: 0,
                files,
                rows: state.len() as u64,
                bytes: state.bytes() as u64,
                chained_rows,
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

    /// The operators of `manifest` whose chain of deltas is due a snapshot:
    /// at least `snapshot_every` deltas, holding at least half as many rows
    /// as the state. A snapshot's work grows with the state, so it is made
    /// once the batches have changed a share of it: its cost spread over
    /// them stays in proportion to what they changed, however large the
    /// state, and a restore reads at most about one and a half states.
    pub(crate) fn due<'a>(&self, manifest: &'a StateManifest) -> Vec<&'a OperatorFiles> {
        manifest
            .operators
            .iter()
            .filter(|o| o.deltas() >= self.snapshot_every && o.chained_rows >= o.rows / 2)
            .collect()
    }

    /// Reads the operator's `files` (its state after `batch`) back into
    /// `state` (empty, of the operator's schema) and writes it whole as
    /// `batch`'s snapshot, which a later manifest can name instead.
    pub(crate) async fn snapshot(
        &self,
        batch: BatchId,
        files: &OperatorFiles,
        mut state: KeyedState,
    ) -> Result<Snapshot> {
        // The files are fetched here; decoding, applying and sorting them
        // (a second or more for a large state) run on a blocking thread,
        // so the batches' tasks keep the runtime's workers.
        let fetched: Vec<_> = self.fetch(files).collect().await;
        let (this, owned) = (self.clone(), files.clone());
        let rows = tokio::task::spawn_blocking(move || {
            for (path, got) in fetched {
                let bytes = got?.ok_or_else(|| this.corrupt(&path, "a state file the manifest names is missing"))?;
                this.apply(&path, bytes, &mut state)?;
            }
            this.check_rows(&owned, &state)?;
            let context = || format!("a snapshot of the state of operator {} after batch {batch}", owned.name);
            state.snapshot().map_err(|e| Error::arrow(context(), e))
        })
        .await
        .unwrap_or_else(|e| match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => Err(Error::CheckpointIo {
                location: self.store.location().to_string(),
                path: Self::dir(&files.name, files.partition),
                source: std::io::Error::other(format!("the snapshot was cancelled: {e}")),
            }),
        })?;
        let chunk_bytes = self.chunk_bytes;
        let contents: WriteContents = Box::new(move |out| files::write(&rows, out, chunk_bytes));
        let dir = Self::dir(&files.name, files.partition);
        self.store
            .put_written(&format!("{dir}/{}.snapshot", batch.0), contents)
            .await?;
        Ok(Snapshot {
            operator: files.name.clone(),
            version: batch,
            from: files.files.clone(),
            chained_rows: files.chained_rows,
        })
    }

    /// Deletes the manifests before `keep_from`, and the state files that
    /// no remaining manifest names (but a snapshot newer than those they
    /// name: it is being made, or waits for a manifest to name it).
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
        let mut newest_snapshot: HashMap<String, u64> = HashMap::new();
        for m in &kept {
            for op in &m.operators {
                let dir = Self::dir(&op.name, op.partition);
                named.extend(op.files.iter().map(|f| format!("{dir}/{f}")));
                for version in op
                    .files
                    .iter()
                    .filter(|f| f.ends_with(".snapshot"))
                    .filter_map(|f| file_version(f))
                {
                    let newest = newest_snapshot.entry(dir.clone()).or_default();
                    *newest = (*newest).max(version);
                }
                dirs.insert((op.name.clone(), op.partition));
            }
        }
        for (name, partition) in dirs {
            let dir = Self::dir(&name, partition);
            let pending_after = newest_snapshot.get(&dir).copied();
            for file in self.store.list(&dir).await? {
                let path = format!("{dir}/{file}");
                let Some(version) = file_version(&file) else { continue };
                // Files newer than the newest manifest belong to a batch in
                // flight, and a snapshot newer than every named one is yet
                // to be named; other unnamed ones are replaced or
                // superseded.
                let pending = file.ends_with(".snapshot") && pending_after.is_none_or(|after| version > after);
                if version <= newest.0 && !pending && !named.contains(&path) {
                    self.store.delete(&path).await?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
