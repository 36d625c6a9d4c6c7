//! The contract between the commit layer and a catalog: where tables are
//! found and how a new metadata version is swapped in. The catalogs
//! themselves (SQL, REST) live in weir-catalog.
//!
//! weir owns the Iceberg commit step: it builds each new metadata version
//! itself and asks the catalog for one compare-and-swap from the version it
//! built on. A catalog never merges or retries anything on its own.

use std::fmt::Debug;

use async_trait::async_trait;
use iceberg::io::FileIO;
use iceberg::spec::TableMetadata;
use iceberg::{NamespaceIdent, TableIdent, TableUpdate};

use crate::error::IcebergSinkError;

/// A table's metadata and the file it was read from.
#[derive(Debug, Clone)]
pub struct LoadedTable {
    /// The table's current metadata.
    pub metadata: TableMetadata,
    /// Where that metadata is stored (`.../metadata/NNNNN-<uuid>.metadata.json`).
    pub metadata_location: String,
}

/// How a swap ended.
#[derive(Debug)]
pub enum Swap {
    /// The table now has the new metadata.
    Swapped(Box<LoadedTable>),
    /// Another writer moved the table first; nothing changed.
    Conflict,
}

/// A catalog of Iceberg tables that can swap a table's metadata atomically.
#[async_trait]
pub trait Catalog: Debug + Send + Sync {
    /// The catalog's name (`catalog_name` in the SQL catalog's tables).
    fn name(&self) -> &str;

    /// The file IO for metadata and data files.
    fn file_io(&self) -> &FileIO;

    /// Where a new table of this name goes: `<warehouse>/<namespace>/<table>`.
    fn default_location(&self, ident: &TableIdent) -> String;

    /// The object storage settings the catalog's files are read with, for
    /// jobs that list a table's files (they hold secrets: never print them).
    fn storage_settings(&self) -> std::collections::HashMap<String, String> {
        std::collections::HashMap::new()
    }

    /// Whether weir writes the metadata files (a SQL catalog), rather than
    /// the catalog's server (REST).
    fn writes_metadata(&self) -> bool {
        true
    }

    /// The table's current metadata, or `None` if the catalog has no such
    /// table.
    async fn load(&self, ident: &TableIdent) -> Result<Option<LoadedTable>, IcebergSinkError>;

    /// Registers a table whose first metadata is `metadata` (creating the
    /// namespace if missing). If another writer registered the name first,
    /// returns that table instead.
    async fn create(&self, ident: &TableIdent, metadata: TableMetadata) -> Result<LoadedTable, IcebergSinkError>;

    /// The tables of `namespace`, or of every namespace.
    async fn list(&self, namespace: Option<&[String]>) -> Result<Vec<TableIdent>, IcebergSinkError>;

    /// Removes the table from the catalog; with `purge`, its files too.
    /// Returns whether there was such a table.
    async fn drop_table(&self, ident: &TableIdent, purge: bool) -> Result<bool, IcebergSinkError>;

    /// Makes `metadata` (which is `base` with `changes`) the table's next
    /// version, if the table is still at `base`. On a conflict nothing is
    /// left behind.
    async fn swap(
        &self,
        ident: &TableIdent,
        base: &LoadedTable,
        metadata: TableMetadata,
        changes: &[TableUpdate],
    ) -> Result<Swap, IcebergSinkError>;
}

/// `namespace.table`, as errors and logs show a table.
#[doc(hidden)]
pub fn shown(ident: &TableIdent) -> String {
    format!("{}.{}", ident.namespace.join("."), ident.name)
}

/// Checks a table name's parts: non-empty, no path separators, no dots in a
/// part, no control characters, at most 255 bytes.
pub fn check_ident(ident: &TableIdent) -> Result<(), IcebergSinkError> {
    let shown = shown(ident);
    let err = |reason: String| IcebergSinkError::Name {
        name: shown.clone(),
        reason,
    };
    if ident.namespace.is_empty() {
        return Err(err("a table needs a namespace (namespace.table)".into()));
    }
    for part in ident.namespace.iter().chain(std::iter::once(&ident.name)) {
        if part.is_empty() {
            return Err(err("a part of the name is empty".into()));
        }
        if part == "." || part == ".." || part.contains(['/', '\\', '.']) {
            return Err(err(format!("{part:?} contains '.', '/' or '\\'")));
        }
        if part.chars().any(char::is_control) || part.len() > 255 {
            return Err(err(format!("{part:?} has control characters or is over 255 bytes")));
        }
    }
    Ok(())
}

/// Parses `namespace.table` (namespace parts separated by dots).
pub fn parse_ident(name: &str) -> Result<TableIdent, IcebergSinkError> {
    let parts: Vec<String> = name.split('.').map(str::to_string).collect();
    let Some((table, namespace)) = parts.split_last() else {
        return Err(IcebergSinkError::Name {
            name: name.into(),
            reason: "empty".into(),
        });
    };
    let ident = TableIdent::new(
        NamespaceIdent::from_vec(namespace.to_vec()).unwrap_or_else(|_| {
            // An empty namespace; `check_ident` names the problem.
            NamespaceIdent::new(String::new())
        }),
        table.clone(),
    );
    check_ident(&ident)?;
    Ok(ident)
}

/// Best-effort work after a swap: `version-hint.text` for readers that
/// open the table directory, and the metadata files the new version
/// dropped from its log (`expired`), deleted when the table asks for it
/// (`write.metadata.delete-after-commit.enabled`). Nothing for a catalog
/// whose server owns the metadata files.
pub(crate) async fn after_swap(catalog: &dyn Catalog, table: &LoadedTable, expired: Vec<String>) {
    write_hint(catalog, table).await;
    if deletes_dropped_logs(catalog, table) {
        delete_logs(catalog.file_io(), expired).await;
    }
}

/// Writes `version-hint.text` naming `table`'s current metadata file, for
/// readers that open the table directory (unless the catalog's server owns
/// the metadata files).
pub(crate) async fn write_hint(catalog: &dyn Catalog, table: &LoadedTable) {
    if !catalog.writes_metadata() {
        return;
    }
    let location = table.metadata.location().trim_end_matches('/');
    // The current file's stem (`NNNNN-<uuid>`): readers that open the
    // directory read `<hint>.metadata.json`.
    let Some(stem) = table
        .metadata_location
        .rsplit('/')
        .next()
        .and_then(|f| f.strip_suffix(".metadata.json"))
    else {
        return;
    };
    let hint = format!("{location}/metadata/version-hint.text");
    let written = match catalog.file_io().new_output(&hint) {
        Ok(out) => out.write(bytes::Bytes::from(stem.to_string())).await,
        Err(e) => Err(e),
    };
    if let Err(e) = written {
        tracing::warn!(error = %e, "could not write version-hint.text");
    }
}

/// Whether the metadata files a swap drops from `table`'s log are deleted:
/// when the table asks for it (`write.metadata.delete-after-commit.enabled`)
/// and the catalog writes the metadata files.
pub(crate) fn deletes_dropped_logs(catalog: &dyn Catalog, table: &LoadedTable) -> bool {
    catalog.writes_metadata()
        && table
            .metadata
            .properties()
            .get("write.metadata.delete-after-commit.enabled")
            .is_some_and(|v| v == "true")
}

/// Deletes metadata files no version lists any more (a failure is logged:
/// the file stays an orphan).
pub(crate) async fn delete_logs(io: &FileIO, files: Vec<String>) {
    for file in files {
        if let Err(e) = io.delete(&file).await {
            tracing::warn!(file, error = %e, "could not delete an expired metadata file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(parse_ident("bronze.payments").is_ok());
        assert!(parse_ident("a.b.payments").is_ok());
        for bad in ["payments", "bronze.", ".payments", "bronze/x.t", "b.t\u{7}", "a..t"] {
            assert!(parse_ident(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
