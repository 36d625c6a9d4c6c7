//! What a table's snapshots reach, for the maintenance jobs.

use iceberg::io::FileIO;
use iceberg::spec::{ManifestFile, ManifestList, TableMetadata};
use iceberg::TableIdent;

use crate::catalog::{Catalog, LoadedTable};
use crate::error::IcebergSinkError;

/// `namespace.table`.
pub(crate) fn shown(ident: &TableIdent) -> String {
    format!("{}.{}", ident.namespace.join("."), ident.name)
}

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
