//! A `path` catalog: a warehouse of `namespace/table` folders, the format
//! told by the files in each. weir writes Delta tables there and lists
//! Iceberg tables, which a folder cannot swap atomically.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use weir_iceberg::Catalog;

use super::kind::{delete_tree, delta_storage, setting_names, Kind, Listed};
use crate::error::CatalogError;
use crate::format::TableFormat;
use crate::name::TableName;
use crate::options::TableOptions;
use crate::path::Warehouse;

pub(crate) struct PathKind {
    warehouse: Warehouse,
    storage: HashMap<String, String>,
}

impl std::fmt::Debug for PathKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Path")
            .field("warehouse", &self.warehouse)
            .field("storage", &setting_names(&self.storage))
            .finish()
    }
}

impl PathKind {
    pub(crate) fn open(catalog: &str, warehouse: &str, storage: HashMap<String, String>) -> Result<Self, CatalogError> {
        Ok(PathKind {
            warehouse: Warehouse::open(catalog, warehouse, &storage)?,
            storage,
        })
    }
}

#[async_trait]
impl Kind for PathKind {
    async fn find(&self, name: &TableName) -> Result<Option<(TableFormat, String)>, CatalogError> {
        let parts = name.parts();
        let format = self.warehouse.detect(&parts).await?;
        Ok(format.map(|f| (f, self.warehouse.location(&parts))))
    }

    async fn list(&self, namespace: Option<&[String]>) -> Result<Vec<Listed>, CatalogError> {
        let mut out = Vec::new();
        for (ns, table, format) in self.warehouse.list(namespace).await? {
            let parts: Vec<String> = ns.iter().cloned().chain([table.clone()]).collect();
            let location = self.warehouse.location(&parts);
            out.push((ns, table, format, location));
        }
        Ok(out)
    }

    async fn names(&self) -> Result<Vec<Vec<String>>, CatalogError> {
        let listed = self.warehouse.list(None).await?.into_iter();
        Ok(listed
            .map(|(ns, table, _)| ns.into_iter().chain([table]).collect())
            .collect())
    }

    fn refuses(&self, name: &TableName, format: TableFormat) -> Option<String> {
        (format == TableFormat::Iceberg).then(|| {
            format!(
                "{name}: weir writes Iceberg tables only through a catalog that swaps their metadata \
                 atomically (sql or rest); a path catalog lists and reads them. Nothing was written"
            )
        })
    }

    async fn place(&self, name: &TableName, _: TableFormat, _: &TableOptions) -> Result<String, CatalogError> {
        Ok(self.warehouse.location(&name.parts()))
    }

    fn iceberg(&self) -> Option<Arc<dyn Catalog>> {
        None
    }

    fn delta_storage(&self) -> Option<HashMap<String, String>> {
        Some(delta_storage(&self.storage))
    }

    async fn drop_table(
        &self,
        name: &TableName,
        _: TableFormat,
        location: &str,
        purge: bool,
    ) -> Result<bool, CatalogError> {
        if !purge {
            return Err(CatalogError::Unsupported {
                catalog: name.catalog.clone(),
                reason: format!(
                    "{name}: a path catalog's tables are their folders; dropping one deletes it, so ask for purge"
                ),
            });
        }
        delete_tree(&name.catalog, location, &self.storage).await?;
        Ok(true)
    }
}
