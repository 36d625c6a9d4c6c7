//! A path catalog: a warehouse (a local directory or `s3://` prefix) of
//! `namespace/table` folders, the format told by what a folder holds
//! (`_delta_log/` or `metadata/`).

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use object_store::path::Path;
use object_store::ObjectStore;

use crate::error::CatalogError;
use crate::format::TableFormat;

/// How deep namespaces are searched when listing.
const MAX_DEPTH: usize = 8;

/// A path catalog's warehouse.
pub(crate) struct Warehouse {
    catalog: String,
    /// `file:///...` or `s3://bucket/prefix`, without a trailing slash.
    url: String,
    store: Arc<dyn ObjectStore>,
    prefix: Path,
}

impl std::fmt::Debug for Warehouse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warehouse")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Warehouse {
    /// Opens the warehouse (a local one is created if missing).
    pub(crate) fn open(
        catalog: &str,
        warehouse: &str,
        storage: &HashMap<String, String>,
    ) -> Result<Self, CatalogError> {
        let url = match warehouse.strip_prefix("file://") {
            Some(path) => local_url(catalog, path)?,
            None if warehouse.contains("://") => warehouse.trim_end_matches('/').to_string(),
            None => local_url(catalog, warehouse)?,
        };
        let (store, prefix) =
            weir_iceberg::object_store_at(&url, storage.clone()).map_err(|e| CatalogError::Unsupported {
                catalog: catalog.to_string(),
                reason: format!("cannot open the warehouse {url}: {e}"),
            })?;
        Ok(Warehouse {
            catalog: catalog.to_string(),
            url,
            store,
            prefix,
        })
    }

    /// The location of the folder `parts` (namespace levels, table).
    pub(crate) fn location(&self, parts: &[String]) -> String {
        format!("{}/{}", self.url, parts.join("/"))
    }

    fn path(&self, parts: &[String]) -> Path {
        parts.iter().fold(self.prefix.clone(), |p, part| p.join(part.as_str()))
    }

    /// The folders directly in `parts`.
    async fn children(&self, parts: &[String]) -> Result<Vec<String>, CatalogError> {
        let listed = match self.store.list_with_delimiter(Some(&self.path(parts))).await {
            Ok(listed) => listed,
            Err(object_store::Error::NotFound { .. }) => return Ok(Vec::new()),
            Err(e) => {
                return Err(CatalogError::Unsupported {
                    catalog: self.catalog.clone(),
                    reason: format!("cannot list {}: {e}", self.location(parts)),
                })
            }
        };
        Ok(listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .collect())
    }

    /// Whether any object lies below folder `parts`. Folders are looked
    /// into, not trusted: some stores (and local directories) keep empty
    /// ones after their files are deleted.
    async fn holds_objects(&self, parts: &[String]) -> Result<bool, CatalogError> {
        match self.store.list(Some(&self.path(parts))).next().await {
            None | Some(Err(object_store::Error::NotFound { .. })) => Ok(false),
            Some(Ok(_)) => Ok(true),
            Some(Err(e)) => Err(CatalogError::Unsupported {
                catalog: self.catalog.clone(),
                reason: format!("cannot list {}: {e}", self.location(parts)),
            }),
        }
    }

    /// The format of the table in folder `parts`, if it holds one.
    async fn format_of(&self, parts: &[String]) -> Result<Option<TableFormat>, CatalogError> {
        for (folder, format) in [("_delta_log", TableFormat::Delta), ("metadata", TableFormat::Iceberg)] {
            let mut inner = parts.to_vec();
            inner.push(folder.to_string());
            if self.holds_objects(&inner).await? {
                return Ok(Some(format));
            }
        }
        Ok(None)
    }

    /// The format of the table in folder `parts`, `None` if there is no
    /// table there. A folder that holds other things is an error: no table
    /// is made in it.
    pub(crate) async fn detect(&self, parts: &[String]) -> Result<Option<TableFormat>, CatalogError> {
        if let Some(format) = self.format_of(parts).await? {
            return Ok(Some(format));
        }
        if self.holds_objects(parts).await? {
            return Err(CatalogError::Unsupported {
                catalog: self.catalog.clone(),
                reason: format!(
                    "{} holds files but neither a Delta table (_delta_log/) nor an Iceberg table (metadata/); \
                     no table is made there",
                    self.location(parts)
                ),
            });
        }
        Ok(None)
    }

    /// Every table folder below `namespace` (or the whole warehouse):
    /// (namespace, table, format), sorted.
    pub(crate) async fn list(
        &self,
        namespace: Option<&[String]>,
    ) -> Result<Vec<(Vec<String>, String, TableFormat)>, CatalogError> {
        let mut found = Vec::new();
        let mut pending = vec![namespace.map(<[String]>::to_vec).unwrap_or_default()];
        while let Some(ns) = pending.pop() {
            if ns.len() > MAX_DEPTH {
                continue;
            }
            let dirs = self.children(&ns).await?;
            for dir in dirs.into_iter().filter(|d| !d.starts_with(['.', '_'])) {
                let mut parts = ns.clone();
                parts.push(dir.clone());
                match self.format_of(&parts).await? {
                    // A table needs a namespace: one at the top is not listed.
                    Some(format) if !ns.is_empty() => found.push((ns.clone(), dir, format)),
                    Some(_) => {}
                    None => pending.push(parts),
                }
            }
            if namespace.is_some() {
                // Only the namespace asked for, not the ones below it.
                break;
            }
        }
        found.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        Ok(found)
    }
}

/// A local warehouse as a `file://` URL of its absolute path (created if
/// missing).
fn local_url(catalog: &str, path: &str) -> Result<String, CatalogError> {
    let io = |operation: String| {
        let catalog = catalog.to_string();
        move |source| CatalogError::Io {
            catalog,
            operation,
            source,
        }
    };
    std::fs::create_dir_all(path).map_err(io(format!("create the warehouse {path}")))?;
    let absolute = std::fs::canonicalize(path).map_err(io(format!("open the warehouse {path}")))?;
    Ok(format!(
        "file://{}",
        absolute.display().to_string().trim_end_matches('/')
    ))
}
