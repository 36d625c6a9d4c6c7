//! What a table's snapshots reach, for the maintenance jobs.

use iceberg::io::FileIO;
use iceberg::spec::{ManifestFile, ManifestList, TableMetadata};
use iceberg::TableIdent;

use crate::catalog::{shown, Catalog, LoadedTable};
use crate::error::IcebergSinkError;

/// The table, or [`IcebergSinkError::NoSuchTable`].
pub(crate) async fn load_existing(catalog: &dyn Catalog, ident: &TableIdent) -> Result<LoadedTable, IcebergSinkError> {
    catalog.load(ident).await?.ok_or_else(|| IcebergSinkError::NoSuchTable {
        catalog: catalog.name().to_string(),
        table: shown(ident),
    })
}

/// The manifest list of `snapshot` and the manifests it lists.
pub(crate) async fn manifests_of(
    io: &FileIO,
    metadata: &TableMetadata,
    snapshot: i64,
) -> iceberg::Result<(String, Vec<ManifestFile>)> {
    let list = metadata
        .snapshot_by_id(snapshot)
        .map(|s| s.manifest_list().to_string())
        .unwrap_or_default();
    let bytes = io.new_input(&list)?.read().await?;
    let entries = ManifestList::parse_with_version(&bytes, metadata.format_version())?
        .entries()
        .to_vec();
    Ok((list, entries))
}

/// Refuses a table whose files may belong to others (`gc.enabled=false`,
/// as Spark's `snapshot`, `migrate` and `add_files` leave it): nothing of
/// it may be deleted.
pub(crate) fn refuse_without_gc(table: &LoadedTable, shown: &str) -> Result<(), IcebergSinkError> {
    if table
        .metadata
        .properties()
        .get("gc.enabled")
        .is_some_and(|v| v.eq_ignore_ascii_case("false"))
    {
        return Err(IcebergSinkError::Unsupported {
            table: shown.to_string(),
            feature: "gc.enabled=false (its files may belong to other tables); nothing was deleted".into(),
        });
    }
    Ok(())
}

/// The snapshot whose summary has `key` = `value` (a job's own id, by
/// which it recognises a swap that landed although it saw an error).
pub(crate) fn snapshot_with(table: &LoadedTable, key: &str, value: &str) -> Option<i64> {
    table
        .metadata
        .snapshots()
        .find(|s| s.summary().additional_properties.get(key).map(String::as_str) == Some(value))
        .map(|s| s.snapshot_id())
}

/// Deletes files known to be in no committed version (a lost swap's),
/// logging what it cannot delete: those are orphans, never lost rows.
pub(crate) async fn delete_quietly(io: &FileIO, files: &[String]) {
    for f in files {
        if let Err(e) = io.delete(f).await {
            tracing::debug!(file = %f, error = %e, "could not delete a file of a lost swap");
        }
    }
}
