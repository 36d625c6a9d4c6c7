//! A Delta table as the `weir` command shows it: its version, files, the
//! streaming queries that write it, and its commits.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::error::DeltaSinkError;
use crate::table::{self, Files};

/// How many recent commits are searched for the queries writing a table.
const QUERY_SEARCH_COMMITS: usize = 1000;

/// A Delta table's current state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeltaTableSummary {
    /// The current version.
    pub version: u64,
    /// Live data files.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The partition columns.
    pub partition_columns: Vec<String>,
    /// The streaming queries found in the last 1,000 commits, with their
    /// markers.
    pub queries: Vec<DeltaQueryMarker>,
}

/// A streaming query's marker in a Delta table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeltaQueryMarker {
    /// The query's name (its `txn` app id).
    pub query_name: String,
    /// The query id that committed the marker's batch, if found.
    pub query_id: Option<String>,
    /// The last committed batch id.
    pub batch_id: i64,
}

/// One commit of a Delta table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeltaCommit {
    /// The table version it made, when its commit info says.
    pub version: Option<u64>,
    /// When (milliseconds since the Unix epoch).
    pub timestamp_ms: Option<i64>,
    /// The operation (`STREAMING UPDATE`, `WRITE`, `OPTIMIZE`, ...).
    pub operation: Option<String>,
    /// weir's fields (`weir.queryName`, `weir.batchId`, ...) and the
    /// operation metrics, as written.
    pub details: BTreeMap<String, serde_json::Value>,
}

/// The table at `location`, or `None` if there is none yet.
pub async fn describe(
    location: &str,
    storage: &HashMap<String, String>,
) -> Result<Option<DeltaTableSummary>, DeltaSinkError> {
    let (url, Some(t)) = table::load_at(location, storage, Files::Tracked).await? else {
        return Ok(None);
    };
    let err = |source| DeltaSinkError::Delta {
        table: url.to_string(),
        source,
    };
    let state = t.snapshot().map_err(err)?;
    let (mut files, mut bytes) = (0, 0u64);
    for file in state.log_data().iter() {
        files += 1;
        bytes += u64::try_from(file.size()).unwrap_or(0);
    }
    // Each name's batches and the query ids that committed them, from
    // recent history (newest first).
    let mut owners: HashMap<(String, i64), Option<String>> = HashMap::new();
    let mut names = std::collections::BTreeSet::new();
    for info in t.history(Some(QUERY_SEARCH_COMMITS)).await.map_err(err)? {
        let info = info.info;
        let (Some(name), Some(batch)) = (
            info.get("weir.queryName").and_then(|v| v.as_str()),
            info.get("weir.batchId").and_then(|v| v.as_i64()),
        ) else {
            continue;
        };
        let id = info.get("weir.queryId").and_then(|v| v.as_str()).map(str::to_string);
        names.insert(name.to_string());
        owners.entry((name.to_string(), batch)).or_insert(id);
    }
    let mut queries = Vec::new();
    for name in names {
        let Some(batch) = state
            .transaction_version(t.log_store().as_ref(), &name)
            .await
            .map_err(err)?
        else {
            continue;
        };
        let query_id = owners.get(&(name.clone(), batch)).cloned().flatten();
        queries.push(DeltaQueryMarker {
            query_name: name,
            query_id,
            batch_id: batch,
        });
    }
    Ok(Some(DeltaTableSummary {
        version: state.version(),
        files,
        bytes,
        partition_columns: state.metadata().partition_columns().to_vec(),
        queries,
    }))
}

/// The table's last `limit` commits, newest first (empty if no table).
pub async fn history(
    location: &str,
    storage: &HashMap<String, String>,
    limit: usize,
) -> Result<Vec<DeltaCommit>, DeltaSinkError> {
    let (url, Some(t)) = table::load_at(location, storage, Files::Untracked).await? else {
        return Ok(Vec::new());
    };
    let infos = t.history(Some(limit)).await.map_err(|source| DeltaSinkError::Delta {
        table: url.to_string(),
        source,
    })?;
    Ok(infos
        .map(|c| {
            let mut details: BTreeMap<String, serde_json::Value> = c.info.into_iter().collect();
            if let Some(parameters) = c.operation_parameters {
                details.extend(
                    parameters
                        .into_iter()
                        .map(|(k, v)| (format!("operationParameters.{k}"), v)),
                );
            }
            DeltaCommit {
                version: c.read_version.map(|v| v + 1),
                timestamp_ms: c.timestamp,
                operation: c.operation,
                details,
            }
        })
        .collect())
}
