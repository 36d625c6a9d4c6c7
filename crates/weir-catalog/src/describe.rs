//! What a table holds and who writes it: `weir describe` and `weir history`.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::catalogs::{Catalogs, TableEntry};
use crate::error::CatalogError;
use crate::format::TableFormat;

/// A table's current state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TableDescription {
    /// The table's full name.
    pub name: String,
    /// Its format.
    pub format: TableFormat,
    /// Where it is stored.
    pub location: String,
    /// Whether it exists in storage yet (a registered Delta table is
    /// created by its first query).
    pub exists: bool,
    /// The Delta version or the Iceberg snapshot id.
    pub version: Option<i64>,
    /// Live data files.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Rows, where the format records them (Iceberg).
    pub rows: Option<u64>,
    /// Partition columns or transforms.
    pub partition_by: Vec<String>,
    /// Each streaming query's last committed batch.
    pub queries: Vec<QueryMarker>,
}

/// A streaming query's marker in a table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueryMarker {
    /// The query's name.
    pub query_name: String,
    /// The id of the query that committed the batch, where recorded.
    pub query_id: Option<String>,
    /// The last committed batch id.
    pub batch_id: i64,
}

/// One commit (Delta) or snapshot (Iceberg).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistoryEntry {
    /// The Delta version or the Iceberg snapshot id.
    pub version: Option<i64>,
    /// When (milliseconds since the Unix epoch).
    pub timestamp_ms: Option<i64>,
    /// The operation.
    pub operation: Option<String>,
    /// The streaming query that made it, if any.
    pub query_name: Option<String>,
    /// Its batch id.
    pub batch_id: Option<i64>,
    /// Everything the commit records (commit info or snapshot summary).
    pub details: BTreeMap<String, serde_json::Value>,
}

impl Catalogs {
    /// The table's format, location, version, files, bytes and streaming
    /// queries.
    pub async fn describe(&self, name: &str) -> Result<TableDescription, CatalogError> {
        let table = self.table(name).await?;
        let mut out = TableDescription {
            name: table.name.to_string(),
            format: table.format,
            location: table.location.clone(),
            exists: false,
            version: None,
            files: 0,
            bytes: 0,
            rows: None,
            partition_by: Vec::new(),
            queries: Vec::new(),
        };
        match table.format {
            TableFormat::Delta => {
                let storage = self.delta_storage(&table.name.catalog).await?;
                if let Some(s) = weir_delta::describe(&table.location, &storage).await? {
                    out.exists = true;
                    out.version = i64::try_from(s.version).ok();
                    out.files = s.files as u64;
                    out.bytes = s.bytes;
                    out.partition_by = s.partition_columns;
                    out.queries = s
                        .queries
                        .into_iter()
                        .map(|q| QueryMarker {
                            query_name: q.query_name,
                            query_id: q.query_id,
                            batch_id: q.batch_id,
                        })
                        .collect();
                }
            }
            TableFormat::Iceberg => {
                let Some(loaded) = self.load_iceberg(&table).await? else {
                    // Reserved; its first query creates it.
                    return Ok(out);
                };
                let m = &loaded.metadata;
                out.exists = true;
                out.version = m.current_snapshot_id();
                if let Some(s) = m.current_snapshot() {
                    let total = |k: &str| s.summary().additional_properties.get(k).and_then(|v| v.parse().ok());
                    out.files = total("total-data-files").unwrap_or(0);
                    out.bytes = total("total-files-size").unwrap_or(0);
                    out.rows = total("total-records");
                }
                let schema = m.current_schema();
                out.partition_by = m
                    .default_partition_spec()
                    .fields()
                    .iter()
                    .map(|f| {
                        let column = schema.name_by_field_id(f.source_id).unwrap_or("?");
                        match f.transform {
                            iceberg::spec::Transform::Identity => column.to_string(),
                            t => format!("{t}({column})"),
                        }
                    })
                    .collect();
                out.queries = iceberg_markers(m.properties());
            }
        }
        Ok(out)
    }

    /// The table's last `limit` commits or snapshots, newest first.
    pub async fn history(&self, name: &str, limit: usize) -> Result<Vec<HistoryEntry>, CatalogError> {
        let table = self.table(name).await?;
        match table.format {
            TableFormat::Delta => {
                let storage = self.delta_storage(&table.name.catalog).await?;
                let commits = weir_delta::history(&table.location, &storage, limit).await?;
                Ok(commits
                    .into_iter()
                    .map(|c| HistoryEntry {
                        version: c.version.and_then(|v| i64::try_from(v).ok()),
                        timestamp_ms: c.timestamp_ms,
                        operation: c.operation,
                        query_name: c
                            .details
                            .get("weir.queryName")
                            .and_then(|v| v.as_str())
                            .map(str::to_string),
                        batch_id: c.details.get("weir.batchId").and_then(|v| v.as_i64()),
                        details: c.details,
                    })
                    .collect())
            }
            TableFormat::Iceberg => {
                let Some(loaded) = self.load_iceberg(&table).await? else {
                    return Ok(Vec::new());
                };
                let mut snapshots: Vec<_> = loaded.metadata.snapshots().cloned().collect();
                snapshots.sort_by_key(|s| std::cmp::Reverse(s.sequence_number()));
                Ok(snapshots
                    .into_iter()
                    .take(limit)
                    .map(|s| {
                        let summary = &s.summary().additional_properties;
                        HistoryEntry {
                            version: Some(s.snapshot_id()),
                            timestamp_ms: Some(s.timestamp_ms()),
                            operation: Some(s.summary().operation.as_str().to_string()),
                            query_name: summary.get("weir.query-name").cloned(),
                            batch_id: summary.get("weir.batch-id").and_then(|v| v.parse().ok()),
                            details: summary
                                .iter()
                                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                                .collect(),
                        }
                    })
                    .collect())
            }
        }
    }

    async fn load_iceberg(&self, table: &TableEntry) -> Result<Option<weir_iceberg::LoadedTable>, CatalogError> {
        let catalog = self.iceberg_catalog(&table.name.catalog).await?;
        Ok(catalog.load(&crate::catalogs::ident(&table.name)).await?)
    }
}

/// The markers weir keeps in an Iceberg table's properties:
/// `weir.query.<name>.batch-id` and `weir.query.<name>.query-id`.
fn iceberg_markers(properties: &std::collections::HashMap<String, String>) -> Vec<QueryMarker> {
    let mut out: Vec<QueryMarker> = properties
        .iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix("weir.query.")?.strip_suffix(".batch-id")?;
            Some(QueryMarker {
                query_name: name.to_string(),
                query_id: properties.get(&format!("weir.query.{name}.query-id")).cloned(),
                batch_id: v.parse().ok()?,
            })
        })
        .collect();
    out.sort_by(|a, b| a.query_name.cmp(&b.query_name));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iceberg_markers_are_read_from_properties_with_dotted_names() {
        let properties = std::collections::HashMap::from([
            ("weir.query.lake.bronze.payments.batch-id".to_string(), "41".to_string()),
            (
                "weir.query.lake.bronze.payments.query-id".to_string(),
                "abc".to_string(),
            ),
            ("weir.query.other.batch-id".to_string(), "3".to_string()),
            ("write.format.default".to_string(), "parquet".to_string()),
        ]);
        let markers = iceberg_markers(&properties);
        assert_eq!(
            markers,
            [
                QueryMarker {
                    query_name: "lake.bronze.payments".into(),
                    query_id: Some("abc".into()),
                    batch_id: 41
                },
                QueryMarker {
                    query_name: "other".into(),
                    query_id: None,
                    batch_id: 3
                },
            ]
        );
    }
}
