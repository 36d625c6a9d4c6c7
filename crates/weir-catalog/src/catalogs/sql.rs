//! A `sql` catalog: Iceberg tables in the JDBC catalog's tables, Delta
//! tables (and Iceberg names reserved before their table exists) in weir's
//! registry in the same database.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use weir_iceberg::Catalog;

use super::kind::{delete_tree, delta_storage, iceberg_names, iceberg_tables, ident, setting_names, Kind, Listed};
use crate::error::CatalogError;
use crate::format::TableFormat;
use crate::iceberg_catalogs::SqlCatalog;
use crate::name::TableName;
use crate::options::TableOptions;
use crate::registry;

pub(crate) struct SqlKind {
    sql: Arc<SqlCatalog>,
    storage: HashMap<String, String>,
}

impl std::fmt::Debug for SqlKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sql")
            .field("catalog", &self.sql)
            .field("storage", &setting_names(&self.storage))
            .finish()
    }
}

impl SqlKind {
    /// Connects, creating the registry's table if it is missing.
    pub(crate) async fn open(
        catalog: &str,
        uri: &str,
        warehouse: &str,
        storage: HashMap<String, String>,
    ) -> Result<Self, CatalogError> {
        let sql = SqlCatalog::connect_with_storage(catalog, uri, warehouse, storage.clone()).await?;
        registry::create(&sql).await?;
        Ok(SqlKind {
            sql: Arc::new(sql),
            storage,
        })
    }
}

#[async_trait]
impl Kind for SqlKind {
    async fn find(&self, name: &TableName) -> Result<Option<(TableFormat, String)>, CatalogError> {
        if let Some(t) = self.sql.load(&ident(name)).await? {
            return Ok(Some((TableFormat::Iceberg, t.metadata.location().to_string())));
        }
        // A Delta table, or an Iceberg name reserved before its first query
        // created the table.
        let row = registry::find(&self.sql, &name.namespace, &name.table).await?;
        Ok(row.map(|r| (r.format, r.location)))
    }

    async fn list(&self, namespace: Option<&[String]>) -> Result<Vec<Listed>, CatalogError> {
        let mut out = iceberg_tables(self.sql.as_ref(), namespace).await?;
        for r in registry::list(&self.sql, namespace).await? {
            // An Iceberg name stays reserved once its table exists.
            if !out.iter().any(|(ns, t, ..)| *ns == r.namespace && *t == r.table) {
                out.push((r.namespace, r.table, r.format, r.location));
            }
        }
        Ok(out)
    }

    async fn names(&self) -> Result<Vec<Vec<String>>, CatalogError> {
        let registered = registry::list(&self.sql, None).await?.into_iter();
        let mut names: Vec<Vec<String>> = registered
            .map(|r| r.namespace.into_iter().chain([r.table]).collect())
            .collect();
        names.extend(iceberg_names(self.sql.as_ref()).await?);
        Ok(names)
    }

    fn refuses(&self, _: &TableName, _: TableFormat) -> Option<String> {
        None
    }

    async fn place(
        &self,
        name: &TableName,
        format: TableFormat,
        options: &TableOptions,
    ) -> Result<String, CatalogError> {
        let location = match format {
            TableFormat::Delta => format!("{}/{}", self.sql.warehouse(), name.relative_path()),
            TableFormat::Iceberg => self.sql.default_location(&ident(name)),
        };
        let row = registry::Registered {
            namespace: name.namespace.clone(),
            table: name.table.clone(),
            format,
            location,
            properties: options.properties.clone(),
            created_at: chrono::Utc::now().to_rfc3339(),
        };
        match registry::register(&self.sql, &row).await? {
            Some(won) if won.format == format => {
                tracing::info!(table = %name, %format, location = won.location, "registered the table");
                Ok(won.location)
            }
            other => Err(CatalogError::FormatMismatch {
                name: name.to_string(),
                existing: other.map_or(TableFormat::Iceberg, |w| w.format).to_string(),
                asked: format.to_string(),
            }),
        }
    }

    fn iceberg(&self) -> Option<Arc<dyn Catalog>> {
        Some(self.sql.clone())
    }

    fn delta_storage(&self) -> Option<HashMap<String, String>> {
        Some(delta_storage(&self.storage))
    }

    async fn drop_table(
        &self,
        name: &TableName,
        format: TableFormat,
        location: &str,
        purge: bool,
    ) -> Result<bool, CatalogError> {
        if format == TableFormat::Iceberg {
            let dropped = self.sql.drop_table(&ident(name), purge).await?;
            let unreserved = registry::remove(&self.sql, &name.namespace, &name.table).await?;
            return Ok(dropped || unreserved);
        }
        if purge {
            let warehouse = format!("{}/", self.sql.warehouse());
            if !location.starts_with(&warehouse) {
                return Err(CatalogError::Unsupported {
                    catalog: name.catalog.clone(),
                    reason: format!(
                        "{name} is at {location}, outside the catalog's warehouse: it is not purged; drop it \
                         without purge and delete its files yourself"
                    ),
                });
            }
        }
        let removed = registry::remove(&self.sql, &name.namespace, &name.table).await?;
        if purge {
            delete_tree(&name.catalog, location, &self.storage).await?;
        }
        tracing::info!(table = %name, purge, "dropped the Delta table");
        Ok(removed)
    }
}
