//! A `rest` catalog: Iceberg tables alone, behind the Iceberg REST
//! protocol.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use weir_iceberg::Catalog;

use super::kind::{iceberg_names, iceberg_tables, ident, Kind, Listed};
use crate::error::CatalogError;
use crate::format::TableFormat;
use crate::iceberg_catalogs::RestCatalog;
use crate::name::TableName;
use crate::options::TableOptions;

#[derive(Debug)]
pub(crate) struct RestKind {
    rest: Arc<RestCatalog>,
}

impl RestKind {
    pub(crate) fn new(rest: RestCatalog) -> Self {
        RestKind { rest: Arc::new(rest) }
    }
}

#[async_trait]
impl Kind for RestKind {
    async fn find(&self, name: &TableName) -> Result<Option<(TableFormat, String)>, CatalogError> {
        let table = self.rest.load(&ident(name)).await?;
        Ok(table.map(|t| (TableFormat::Iceberg, t.metadata.location().to_string())))
    }

    async fn list(&self, namespace: Option<&[String]>) -> Result<Vec<Listed>, CatalogError> {
        iceberg_tables(self.rest.as_ref(), namespace).await
    }

    async fn names(&self) -> Result<Vec<Vec<String>>, CatalogError> {
        iceberg_names(self.rest.as_ref()).await
    }

    fn refuses(&self, name: &TableName, format: TableFormat) -> Option<String> {
        (format == TableFormat::Delta).then(|| format!("{name}: a REST catalog holds Iceberg tables only"))
    }

    async fn place(&self, name: &TableName, _: TableFormat, _: &TableOptions) -> Result<String, CatalogError> {
        Ok(self.rest.default_location(&ident(name)))
    }

    fn iceberg(&self) -> Option<Arc<dyn Catalog>> {
        Some(self.rest.clone())
    }

    fn delta_storage(&self) -> Option<HashMap<String, String>> {
        None
    }

    async fn drop_table(&self, name: &TableName, _: TableFormat, _: &str, purge: bool) -> Result<bool, CatalogError> {
        Ok(self.rest.drop_table(&ident(name), purge).await?)
    }
}
