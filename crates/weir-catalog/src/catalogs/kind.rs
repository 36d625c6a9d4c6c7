//! What `Catalogs` asks of an opened catalog, whatever its kind: one trait,
//! implemented by the `sql`, `rest` and `path` kinds in files of their own.
//!
//! `Catalogs` resolves the name first, then asks [`Kind::find`]; for a new
//! table it asks [`Kind::refuses`] and checks every other table's name
//! ([`Kind::names`]) before [`Kind::place`], so `place` may assume the
//! format is one the kind holds and the name is free.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use iceberg::{NamespaceIdent, TableIdent};
use weir_iceberg::Catalog;

use crate::error::CatalogError;
use crate::format::TableFormat;
use crate::name::TableName;
use crate::options::TableOptions;

/// A table a catalog lists: its namespace, name, format and location.
pub(crate) type Listed = (Vec<String>, String, TableFormat, String);

/// An opened catalog of one kind.
#[async_trait]
pub(crate) trait Kind: std::fmt::Debug + Send + Sync {
    /// The format and location of the table of that name, if there is one.
    async fn find(&self, name: &TableName) -> Result<Option<(TableFormat, String)>, CatalogError>;

    /// The tables, of one namespace or all.
    async fn list(&self, namespace: Option<&[String]>) -> Result<Vec<Listed>, CatalogError>;

    /// Every table name, as parts (namespace levels, table), without
    /// loading the tables.
    async fn names(&self) -> Result<Vec<Vec<String>>, CatalogError>;

    /// Why this catalog cannot hold a table of `format`, if it cannot.
    fn refuses(&self, name: &TableName, format: TableFormat) -> Option<String>;

    /// Where a new table of that name goes. A kind that keeps a registry
    /// registers (or reserves) the name now, so that it is never taken by
    /// both formats; a race lost to the other format is `FormatMismatch`.
    async fn place(
        &self,
        name: &TableName,
        format: TableFormat,
        options: &TableOptions,
    ) -> Result<String, CatalogError>;

    /// Its Iceberg catalog, if it holds Iceberg tables it can write.
    fn iceberg(&self) -> Option<Arc<dyn Catalog>>;

    /// Its storage settings as deltalake's options, if it holds Delta
    /// tables.
    fn delta_storage(&self) -> Option<HashMap<String, String>>;

    /// Removes the table `name` (of `format`, at `location`, as `find`
    /// found it); with `purge` its files too. Whether there was such a
    /// table.
    async fn drop_table(
        &self,
        name: &TableName,
        format: TableFormat,
        location: &str,
        purge: bool,
    ) -> Result<bool, CatalogError>;
}

/// The Iceberg identifier of a resolved name.
pub(crate) fn ident(name: &TableName) -> TableIdent {
    TableIdent::new(
        NamespaceIdent::from_vec(name.namespace.clone()).expect("resolved names have a namespace"),
        name.table.clone(),
    )
}

/// The names of `catalog`'s Iceberg tables, as parts.
pub(crate) async fn iceberg_names(catalog: &dyn Catalog) -> Result<Vec<Vec<String>>, CatalogError> {
    let joined = |ident: TableIdent| {
        ident
            .namespace
            .clone()
            .inner()
            .into_iter()
            .chain([ident.name])
            .collect()
    };
    Ok(catalog.list(None).await?.into_iter().map(joined).collect())
}

/// The Iceberg tables of `catalog` (of one namespace or all), as listed.
pub(crate) async fn iceberg_tables(
    catalog: &dyn Catalog,
    namespace: Option<&[String]>,
) -> Result<Vec<Listed>, CatalogError> {
    let mut out = Vec::new();
    for ident in catalog.list(namespace).await? {
        let location = match catalog.load(&ident).await? {
            Some(t) => t.metadata.location().to_string(),
            None => continue, // dropped meanwhile
        };
        out.push((
            ident.namespace.clone().inner(),
            ident.name.clone(),
            TableFormat::Iceberg,
            location,
        ));
    }
    Ok(out)
}

/// The catalog's storage settings (Iceberg's `s3.*` names) as deltalake's
/// options. Other names pass through, and a setting given under deltalake's
/// own name wins over one derived from an `s3.*` name, whatever the order.
pub(crate) fn delta_storage(storage: &HashMap<String, String>) -> HashMap<String, String> {
    let deltas_name = |key: &str| match key {
        "s3.endpoint" => Some("AWS_ENDPOINT_URL"),
        "s3.region" => Some("AWS_REGION"),
        "s3.access-key-id" => Some("AWS_ACCESS_KEY_ID"),
        "s3.secret-access-key" => Some("AWS_SECRET_ACCESS_KEY"),
        "s3.session-token" => Some("AWS_SESSION_TOKEN"),
        _ => None,
    };
    let mut out: HashMap<String, String> = storage
        .iter()
        .filter(|(k, _)| deltas_name(k).is_none())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (key, value) in storage {
        let Some(name) = deltas_name(key) else { continue };
        if key == "s3.endpoint" && value.starts_with("http://") {
            out.entry("AWS_ALLOW_HTTP".to_string())
                .or_insert_with(|| "true".to_string());
        }
        out.entry(name.to_string()).or_insert_with(|| value.clone());
    }
    out
}

/// Deletes everything below `location` (a table's folder).
pub(crate) async fn delete_tree(
    catalog: &str,
    location: &str,
    storage: &HashMap<String, String>,
) -> Result<(), CatalogError> {
    let prefix = format!("{}/", location.trim_end_matches('/'));
    weir_iceberg::file_io(&prefix, storage.clone())
        .delete_prefix(&prefix)
        .await
        .map_err(|source| CatalogError::Purge {
            catalog: catalog.to_string(),
            location: prefix.clone(),
            source: Box::new(source),
        })
}

/// Shows only the names of storage settings: their values hold secrets.
pub(crate) fn setting_names(storage: &HashMap<String, String>) -> Vec<&String> {
    let mut names: Vec<&String> = storage.keys().collect();
    names.sort();
    names
}
