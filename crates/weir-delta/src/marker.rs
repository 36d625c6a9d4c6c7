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

use deltalake::kernel::Transaction;
use deltalake::{DeltaTable, DeltaTableError};
use weir_core::protocol::SinkMarker;
use weir_core::{BatchId, QueryId, QueryName};

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
/// forward by reading only the commits after it, so a marker lookup costs
/// the new commits, not a replay of the log since its last checkpoint.
#[derive(Debug, Default)]
pub(crate) struct TxnCache {
    version: Option<u64>,
    versions: HashMap<String, Option<i64>>,
}

impl TxnCache {
    /// Brings the cache to the table's loaded version.
    async fn advance(&mut self, table: &DeltaTable) -> Result<(), DeltaTableError> {
        let latest = table.version();
        match (self.version, latest) {
            (Some(seen), Some(latest)) if seen <= latest => {
                let log_store = table.log_store();
                for v in seen + 1..=latest {
                    let Some(bytes) = log_store.read_commit_entry(v).await? else {
                        // The entry is gone (log cleanup): start afresh.
                        self.versions.clear();
                        break;
                    };
                    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                        let Ok(action) = serde_json::from_slice::<serde_json::Value>(line) else {
                            continue;
                        };
                        if let Some(txn) = action.get("txn") {
                            if let (Some(app), Some(version)) = (txn["appId"].as_str(), txn["version"].as_i64()) {
                                self.versions.insert(app.to_string(), Some(version));
                            }
                        }
                    }
                }
            }
            _ => self.versions.clear(),
        }
        self.version = latest;
        Ok(())
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

/// The name's marker on the table's loaded snapshot.
pub(crate) async fn read(
    table: &DeltaTable,
    cache: &mut TxnCache,
    name: &QueryName,
    known_ids: &[QueryId],
) -> Result<Option<SinkMarker>, DeltaTableError> {
    cache.advance(table).await?;
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
