//! The query's marker in the table: properties set in the same metadata
//! swap as the batch's snapshot, so reading it is O(1) and it survives
//! snapshot expiry.
//!
//! - `weir.query.<name>.batch-id`: the last batch the query named `<name>`
//!   committed;
//! - `weir.query.<name>.query-id`: the query id that committed it (a new
//!   checkpoint of the same name is caught by weir-core's guards, I4b);
//! - `weir.query.<name>.attempt-id`: the attempt that committed it, by
//!   which a writer recognises its own swap after an error.
//!
//! Each snapshot's summary carries `weir.query-name`, `weir.query-id`,
//! `weir.batch-id` and `weir.attempt-id` as well.

use std::collections::HashMap;

use iceberg::spec::TableMetadata;
use weir_core::protocol::SinkMarker;
use weir_core::sink::BatchContext;
use weir_core::{BatchId, QueryId, QueryName};

fn key(name: &QueryName, field: &str) -> String {
    format!("weir.query.{name}.{field}")
}

/// The name's marker in the table's properties.
pub(crate) fn read(metadata: &TableMetadata, name: &QueryName) -> Option<SinkMarker> {
    let properties = metadata.properties();
    let batch = properties.get(&key(name, "batch-id"))?;
    let Ok(batch) = batch.parse::<u64>() else {
        tracing::warn!(query = %name, value = %batch, "the marker property is not a batch id");
        return Some(SinkMarker {
            query_id: QueryId::unknown(),
            batch_id: BatchId(0),
        });
    };
    let query_id = properties
        .get(&key(name, "query-id"))
        .and_then(|id| uuid::Uuid::parse_str(id).ok())
        .map(QueryId)
        .unwrap_or_else(QueryId::unknown);
    Some(SinkMarker {
        query_id,
        batch_id: BatchId(batch),
    })
}

/// Whether the marker was set by this attempt.
pub(crate) fn set_by(metadata: &TableMetadata, ctx: &BatchContext) -> bool {
    metadata.properties().get(&key(&ctx.query_name, "attempt-id")) == Some(&ctx.attempt_id.to_string())
        && read(metadata, &ctx.query_name).is_some_and(|m| m.batch_id == ctx.batch_id)
}

/// The properties that record the batch as committed.
pub(crate) fn properties(ctx: &BatchContext) -> HashMap<String, String> {
    HashMap::from([
        (key(&ctx.query_name, "batch-id"), ctx.batch_id.0.to_string()),
        (key(&ctx.query_name, "query-id"), ctx.query_id.to_string()),
        (key(&ctx.query_name, "attempt-id"), ctx.attempt_id.to_string()),
    ])
}

/// weir's fields of the batch's snapshot summary.
pub(crate) fn summary(ctx: &BatchContext) -> HashMap<String, String> {
    HashMap::from([
        ("weir.query-name".to_string(), ctx.query_name.to_string()),
        ("weir.query-id".to_string(), ctx.query_id.to_string()),
        ("weir.batch-id".to_string(), ctx.batch_id.0.to_string()),
        ("weir.run-id".to_string(), ctx.run_id.to_string()),
        ("weir.attempt-id".to_string(), ctx.attempt_id.to_string()),
    ])
}
