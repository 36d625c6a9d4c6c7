//! A path catalog: a warehouse directory of `namespace/table` folders, the
//! format told by what a folder holds (`_delta_log/` or `metadata/`).

use std::path::{Path, PathBuf};

use crate::error::CatalogError;
use crate::format::TableFormat;

/// How deep namespaces are searched when listing.
const MAX_DEPTH: usize = 8;

/// The warehouse directory of a path catalog (created if missing).
pub(crate) fn root(catalog: &str, warehouse: &str) -> Result<PathBuf, CatalogError> {
    let local = match warehouse.strip_prefix("file://") {
        Some(path) => path,
        None if warehouse.contains("://") => {
            return Err(CatalogError::Unsupported {
                catalog: catalog.to_string(),
                reason: format!(
                    "path catalogs are local directories; {warehouse} is object storage: use a sql catalog with that warehouse"
                ),
            })
        }
        None => warehouse,
    };
    let io = |operation: String| {
        let catalog = catalog.to_string();
        move |source| CatalogError::Io {
            catalog,
            operation,
            source,
        }
    };
    std::fs::create_dir_all(local).map_err(io(format!("create the warehouse {local}")))?;
    std::fs::canonicalize(local).map_err(io(format!("open the warehouse {local}")))
}

/// The format of the table in `dir`, `None` if there is no table there.
/// A folder that holds other things is an error: no table is made in it.
pub(crate) fn detect(catalog: &str, dir: &Path) -> Result<Option<TableFormat>, CatalogError> {
    if dir.join("_delta_log").is_dir() {
        return Ok(Some(TableFormat::Delta));
    }
    if dir.join("metadata").is_dir() {
        return Ok(Some(TableFormat::Iceberg));
    }
    let holds_files = std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some());
    if holds_files {
        return Err(CatalogError::Unsupported {
            catalog: catalog.to_string(),
            reason: format!(
                "{} holds files but neither a Delta table (_delta_log/) nor an Iceberg table (metadata/); \
                 no table is made there",
                dir.display()
            ),
        });
    }
    Ok(None)
}

/// Every table folder below `root`: (namespace, table, format).
pub(crate) fn list(root: &Path, namespace: Option<&[String]>) -> Vec<(Vec<String>, String, TableFormat)> {
    let mut found = Vec::new();
    let start: Vec<String> = namespace.map(<[String]>::to_vec).unwrap_or_default();
    walk(root, start, &mut found);
    found.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    found
}

fn walk(root: &Path, namespace: Vec<String>, found: &mut Vec<(Vec<String>, String, TableFormat)>) {
    if namespace.len() > MAX_DEPTH {
        return;
    }
    let dir = namespace.iter().fold(root.to_path_buf(), |d, p| d.join(p));
    let Ok(entries) = std::fs::read_dir(&dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
            continue;
        };
        if !path.is_dir() || name.starts_with(['.', '_']) {
            continue;
        }
        let format = if path.join("_delta_log").is_dir() {
            Some(TableFormat::Delta)
        } else if path.join("metadata").is_dir() {
            Some(TableFormat::Iceberg)
        } else {
            None
        };
        match format {
            Some(format) if !namespace.is_empty() => found.push((namespace.clone(), name, format)),
            Some(_) => {}
            None => {
                let mut deeper = namespace.clone();
                deeper.push(name);
                walk(root, deeper, found);
            }
        }
    }
}
