//! The query's marker in the Delta log.
//!
//! Each batch commit carries two `txn` actions: `{appId: <query name>,
//! version: <batch id>}`, the marker Spark's Delta sink also uses (so a
//! deleted and recreated checkpoint finds the name's marker ahead of it),
//! and `{appId: <query name>@<query id>, version: <batch id>}`, which tells in
//! one lookup whether the marker belongs to a given query id. The commit
//! info holds `weir.queryName`, `weir.queryId` and `weir.batchId` as well.
//! Delta's conflict checker fails a commit whose `txn` app ids were updated
//! by a concurrent winner, which fences two runs of the same query.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use deltalake::kernel::Transaction;
use deltalake::logstore::LogStore;
use deltalake::{DeltaTable, DeltaTableError};
use weir_core::protocol::SinkMarker;
use weir_core::{BatchId, QueryId, QueryName};

use crate::entry::actions;
use crate::log_cursor::LogCursor;

/// How many commits back the owner of a foreign marker is searched for (only
/// on the refusal path).
const OWNER_SEARCH_COMMITS: usize = 1000;

pub(crate) fn name_app_id(name: &QueryName) -> String {
    name.to_string()
}

pub(crate) fn owner_app_id(name: &QueryName, id: QueryId) -> String {
    format!("{name}@{id}")
}

/// The two `txn` actions of batch `batch` of query `id` named `name`.
pub(crate) fn transactions(name: &QueryName, id: QueryId, batch: BatchId) -> Vec<Transaction> {
    let now = Some(chrono::Utc::now().timestamp_millis());
    vec![
        Transaction::new_with_last_update(name_app_id(name), batch.0 as i64, now),
        Transaction::new_with_last_update(owner_app_id(name, id), batch.0 as i64, now),
    ]
}

/// `txn` versions by app id, valid at one table version and brought
/// forward by reading only the log entries after it, one read each, until
/// the first that does not exist. A marker lookup therefore costs the new
/// commits, not a listing of the log or a replay since its last checkpoint.
///
/// Versions not in the map are read from the loaded table, whose version is
/// never past the cache's and whose later txns the map holds.
#[derive(Debug, Default)]
pub(crate) struct TxnCache {
    /// The version the map is valid at.
    cursor: Option<LogCursor>,
    versions: HashMap<String, Option<i64>>,
    /// When the entry after the cursor's was last seen not to exist.
    confirmed: Option<Instant>,
    /// Entries with metadata or protocol changes were read (or skipped by a
    /// reset) and the stream has not been fitted to the table since.
    refit: bool,
}

/// What reading the log's new entries found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tail {
    /// Appends, removes and markers only (or nothing new).
    Data,
    /// Another writer changed the table's metadata or protocol: reload the
    /// table and fit the stream to it again.
    TableChanged,
    /// The entry the cache last knew is gone or different: the table was
    /// deleted or replaced under it. Load it afresh.
    LogReplaced,
}

impl TxnCache {
    /// Starts afresh at the table's loaded version, which was the latest at
    /// `listed` (when its load listed the log). What happened before is not
    /// known, so the stream is fitted to the table again.
    pub(crate) fn reset(&mut self, table: &DeltaTable, listed: Instant) {
        *self = TxnCache {
            cursor: table.version().map(LogCursor::at),
            confirmed: Some(listed),
            refit: true,
            ..TxnCache::default()
        };
    }

    /// The latest version the cache has read.
    pub(crate) fn version(&self) -> Option<u64> {
        self.cursor.map(|c| c.version())
    }

    /// Whether the cache's version was the log's latest within `age`. Past
    /// that, log cleanup may have removed entries after it, so a missing
    /// entry no longer proves the version is the latest.
    pub(crate) fn confirmed_within(&self, age: Duration) -> bool {
        self.confirmed.is_some_and(|at| at.elapsed() < age)
    }

    /// Whether the stream must be fitted to the table again.
    pub(crate) fn needs_refit(&self) -> bool {
        self.refit
    }

    /// The stream fits the table as loaded.
    pub(crate) fn refitted(&mut self) {
        self.refit = false;
    }

    /// Reads the entries after the cache's version until the first missing
    /// one (`TableChanged` if any of them changed the table's metadata or
    /// protocol), after checking that the entry at the cache's version is still
    /// the one it read (a table deleted and created again under the query
    /// must not get an entry after a version it does not have).
    pub(crate) async fn catch_up(&mut self, log_store: &dyn LogStore) -> Result<Tail, DeltaTableError> {
        let Some(cursor) = self.cursor.as_mut() else {
            return Ok(Tail::LogReplaced);
        };
        if !cursor.still_there(log_store).await? {
            return Ok(Tail::LogReplaced);
        }
        let mut changed = false;
        loop {
            let asked = Instant::now();
            let Some(bytes) = cursor.next(log_store).await? else {
                self.confirmed = Some(asked);
                break;
            };
            for action in actions(&bytes) {
                if let Some(txn) = action.get("txn") {
                    if let (Some(app), Some(v)) = (txn["appId"].as_str(), txn["version"].as_i64()) {
                        self.versions.insert(app.to_string(), Some(v));
                    }
                }
                changed |= action.get("metaData").is_some() || action.get("protocol").is_some();
            }
        }
        self.refit |= changed;
        Ok(if changed { Tail::TableChanged } else { Tail::Data })
    }

    /// Records the sink's own commit at `version`, written with a
    /// put-if-absent that started at `asked` (so `version - 1` was the
    /// latest then).
    pub(crate) fn committed(&mut self, version: u64, entry: &[u8], txns: &[Transaction], asked: Instant) {
        debug_assert_eq!(self.version().map(|v| v + 1), Some(version));
        for txn in txns {
            self.versions.insert(txn.app_id.clone(), Some(txn.version));
        }
        let mut cursor = self.cursor.unwrap_or(LogCursor::at(version - 1));
        cursor.wrote(entry);
        self.cursor = Some(cursor);
        self.confirmed = Some(asked);
    }

    /// The app id's txn version at the cache's version.
    async fn get(&mut self, table: &DeltaTable, app_id: String) -> Result<Option<i64>, DeltaTableError> {
        if let Some(v) = self.versions.get(&app_id) {
            return Ok(*v);
        }
        let v = table
            .snapshot()?
            .transaction_version(table.log_store().as_ref(), &app_id)
            .await?;
        self.versions.insert(app_id, v);
        Ok(v)
    }
}

/// Whether an entry in `from..=to` was committed by `attempt` (a commit that
/// landed although its writer saw an error or lost a race to itself).
pub(crate) async fn attempt_landed(
    log_store: &dyn LogStore,
    from: u64,
    to: u64,
    attempt: &str,
) -> Result<bool, DeltaTableError> {
    for version in from..=to {
        let Some(bytes) = log_store.read_commit_entry(version).await? else {
            continue;
        };
        let ours = actions(&bytes).any(|a| a["commitInfo"]["weir.attemptId"].as_str() == Some(attempt));
        if ours {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The name's marker at the cache's version (bring it up to date first).
pub(crate) async fn read(
    table: &DeltaTable,
    cache: &mut TxnCache,
    name: &QueryName,
    known_ids: &[QueryId],
) -> Result<Option<SinkMarker>, DeltaTableError> {
    let Some(version) = cache.get(table, name_app_id(name)).await? else {
        return Ok(None);
    };
    let Ok(batch) = u64::try_from(version) else {
        // Another tool's txn under this app id; it has no weir batch.
        tracing::warn!(app_id = %name, version, "a txn with a negative version under the query's name");
        return Ok(Some(SinkMarker {
            query_id: QueryId::unknown(),
            batch_id: BatchId(0),
        }));
    };
    let batch_id = BatchId(batch);
    for id in known_ids {
        if cache.get(table, owner_app_id(name, *id)).await? == Some(version) {
            return Ok(Some(SinkMarker {
                query_id: *id,
                batch_id,
            }));
        }
    }
    let query_id = find_owner(table, name, batch_id).await.unwrap_or_else(QueryId::unknown);
    Ok(Some(SinkMarker { query_id, batch_id }))
}

/// The query id that committed batch `batch` under `name`, from the commit
/// infos of recent history.
async fn find_owner(table: &DeltaTable, name: &QueryName, batch: BatchId) -> Option<QueryId> {
    let history = table.history(Some(OWNER_SEARCH_COMMITS)).await.ok()?;
    for info in history {
        let info = info.info;
        let same_name = info.get("weir.queryName").and_then(|v| v.as_str()) == Some(name.as_str());
        let same_batch = info.get("weir.batchId").and_then(|v| v.as_u64()) == Some(batch.0);
        if same_name && same_batch {
            let id = info.get("weir.queryId")?.as_str()?;
            return uuid::Uuid::parse_str(id).ok().map(QueryId);
        }
    }
    None
}
