//! weir's own table of tables in a SQL catalog's database (`weir_tables`),
//! beside the JDBC catalog's `iceberg_tables`: every Delta table, and every
//! name weir reserved for an Iceberg table before its first query created
//! it, so that one name is never taken by both formats. Each row carries
//! `record_version` (1), the version of its layout.

use std::collections::BTreeMap;

use sqlx::any::AnyRow;
use sqlx::Row;

use crate::error::CatalogError;
use crate::format::TableFormat;
use crate::iceberg_catalogs::SqlCatalog;

/// A row of `weir_tables`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Registered {
    pub namespace: Vec<String>,
    pub table: String,
    pub format: TableFormat,
    pub location: String,
    pub properties: BTreeMap<String, String>,
    pub created_at: String,
}

fn err(catalog: &SqlCatalog, operation: &str) -> impl Fn(sqlx::Error) -> CatalogError {
    let (catalog, operation) = (weir_iceberg::Catalog::name(catalog).to_string(), operation.to_string());
    move |source| CatalogError::Database {
        catalog: catalog.clone(),
        operation: operation.clone(),
        source,
    }
}

/// Creates `weir_tables` if it is missing.
pub(crate) async fn create(catalog: &SqlCatalog) -> Result<(), CatalogError> {
    let statement = "CREATE TABLE IF NOT EXISTS weir_tables (\
        catalog_name VARCHAR(255) NOT NULL, \
        table_namespace VARCHAR(255) NOT NULL, \
        table_name VARCHAR(255) NOT NULL, \
        table_format VARCHAR(16) NOT NULL, \
        location VARCHAR(1000) NOT NULL, \
        properties TEXT, \
        created_at VARCHAR(40) NOT NULL, \
        record_version INTEGER NOT NULL, \
        PRIMARY KEY (catalog_name, table_namespace, table_name))";
    // Two processes creating it at once: the loser's error is harmless if
    // the table is there afterwards.
    if let Err(e) = sqlx::query(statement).execute(catalog.pool()).await {
        tracing::debug!(error = %e, "creating weir_tables failed; checking it exists");
    }
    sqlx::query("SELECT table_name FROM weir_tables WHERE 1 = 0")
        .fetch_all(catalog.pool())
        .await
        .map_err(err(catalog, "create weir_tables"))?;
    Ok(())
}

const COLUMNS: &str = "table_namespace, table_name, table_format, location, properties, created_at";

fn row(catalog: &SqlCatalog, row: AnyRow) -> Result<Registered, CatalogError> {
    let e = err(catalog, "read a row of weir_tables");
    let namespace: String = row.try_get(0).map_err(&e)?;
    let format: String = row.try_get(2).map_err(&e)?;
    let properties: Option<String> = row.try_get(4).map_err(&e)?;
    Ok(Registered {
        namespace: namespace.split('.').map(str::to_string).collect(),
        table: row.try_get(1).map_err(&e)?,
        format: format.parse().map_err(|reason: String| CatalogError::Unsupported {
            catalog: weir_iceberg::Catalog::name(catalog).to_string(),
            reason,
        })?,
        location: row.try_get(3).map_err(&e)?,
        properties: properties
            .and_then(|p| serde_json::from_str(&p).ok())
            .unwrap_or_default(),
        created_at: row.try_get(5).map_err(&e)?,
    })
}

/// The row of one table.
pub(crate) async fn find(
    catalog: &SqlCatalog,
    namespace: &[String],
    table: &str,
) -> Result<Option<Registered>, CatalogError> {
    let sql = catalog.statement(&format!(
        "SELECT {COLUMNS} FROM weir_tables WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?"
    ));
    let found = sqlx::query(&sql)
        .bind(weir_iceberg::Catalog::name(catalog))
        .bind(namespace.join("."))
        .bind(table)
        .fetch_optional(catalog.pool())
        .await
        .map_err(err(catalog, "look up the table"))?;
    found.map(|r| row(catalog, r)).transpose()
}

/// Every row, or those of one namespace.
pub(crate) async fn list(catalog: &SqlCatalog, namespace: Option<&[String]>) -> Result<Vec<Registered>, CatalogError> {
    let mut sql = format!("SELECT {COLUMNS} FROM weir_tables WHERE catalog_name = ?");
    if namespace.is_some() {
        sql.push_str(" AND table_namespace = ?");
    }
    sql.push_str(" ORDER BY table_namespace, table_name");
    let sql = catalog.statement(&sql);
    let mut query = sqlx::query(&sql).bind(weir_iceberg::Catalog::name(catalog));
    if let Some(namespace) = namespace {
        query = query.bind(namespace.join("."));
    }
    let rows = query
        .fetch_all(catalog.pool())
        .await
        .map_err(err(catalog, "list the tables"))?;
    rows.into_iter().map(|r| row(catalog, r)).collect()
}

/// Registers a table unless the name is taken, here or (for a Delta
/// table) in `iceberg_tables`; returns the row that holds the name
/// afterwards (this one, or another writer's), or `None` if an Iceberg
/// table holds it.
pub(crate) async fn register(catalog: &SqlCatalog, table: &Registered) -> Result<Option<Registered>, CatalogError> {
    let iceberg_holds = if table.format == TableFormat::Delta {
        " WHERE NOT EXISTS (SELECT 1 FROM iceberg_tables \
         WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?)"
    } else {
        " WHERE 1 = 1"
    };
    let sql = catalog.statement(&format!(
        "INSERT INTO weir_tables (catalog_name, {COLUMNS}, record_version) \
         SELECT ?, ?, ?, ?, ?, ?, ?, 1{iceberg_holds} ON CONFLICT DO NOTHING"
    ));
    let name = weir_iceberg::Catalog::name(catalog);
    let namespace = table.namespace.join(".");
    let mut query = sqlx::query(&sql)
        .bind(name)
        .bind(&namespace)
        .bind(&table.table)
        .bind(table.format.as_str())
        .bind(&table.location)
        .bind(serde_json::to_string(&table.properties).unwrap_or_default())
        .bind(&table.created_at);
    if table.format == TableFormat::Delta {
        query = query.bind(name).bind(&namespace).bind(&table.table);
    }
    query
        .execute(catalog.pool())
        .await
        .map_err(err(catalog, "register the table"))?;
    find(catalog, &table.namespace, &table.table).await
}

/// Removes a table's row; returns whether there was one.
pub(crate) async fn remove(catalog: &SqlCatalog, namespace: &[String], table: &str) -> Result<bool, CatalogError> {
    let sql =
        catalog.statement("DELETE FROM weir_tables WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?");
    let done = sqlx::query(&sql)
        .bind(weir_iceberg::Catalog::name(catalog))
        .bind(namespace.join("."))
        .bind(table)
        .execute(catalog.pool())
        .await
        .map_err(err(catalog, "drop the table"))?;
    Ok(done.rows_affected() == 1)
}
