//! A table by name: awaited, its catalog entry. The maintenance jobs on it
//! are made by methods that sit beside each job (`compact.rs`, `jobs.rs`),
//! so the jobs build on this module and it knows none of them.

use std::collections::HashMap;
use std::sync::Arc;

use weir_iceberg::Catalog;

use crate::catalogs::{Catalogs, TableEntry};
use crate::error::CatalogError;
use crate::format::TableFormat;

impl Catalogs {
    /// The table of that name: awaited, its entry or
    /// [`CatalogError::NoSuchTable`]; its methods start maintenance jobs on
    /// it (`catalogs.table(name).compact().await`).
    pub fn table(&self, name: &str) -> TableRef<'_> {
        TableRef {
            catalogs: self,
            name: name.to_string(),
        }
    }
}

/// A table by name, looked up when awaited ([`Catalogs::table`]).
///
/// ```no_run
/// # async fn f() -> Result<(), weir_catalog::CatalogError> {
/// use std::time::Duration;
/// let catalogs = weir_catalog::Catalogs::from_env()?;
/// let table = catalogs.table("lake.bronze.payments").await?;
/// println!("{} is a {} table", table.name, table.format);
/// let report = catalogs.table("lake.bronze.payments").compact().with_target_file_size(128 << 20).await?;
/// println!("{} files into {}", report.report.files_removed, report.report.files_added);
/// catalogs
///     .table("lake.bronze.payments")
///     .vacuum()
///     .with_retention(Duration::from_secs(7 * 24 * 3600))
///     .await?;
/// # Ok(()) }
/// ```
#[must_use = "a table by name is looked up when it is awaited"]
#[derive(Debug, Clone)]
pub struct TableRef<'a> {
    catalogs: &'a Catalogs,
    name: String,
}

impl<'a> TableRef<'a> {
    /// The name as given.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The catalogs it is looked up in.
    pub(crate) fn catalogs(&self) -> &'a Catalogs {
        self.catalogs
    }

    /// Its entry, or [`CatalogError::NoSuchTable`]; awaiting it does the
    /// same.
    pub async fn entry(&self) -> Result<TableEntry, CatalogError> {
        self.catalogs
            .find(&self.name)
            .await?
            .ok_or_else(|| CatalogError::NoSuchTable {
                name: self.name.clone(),
            })
    }

    /// Its entry if it is of `format`; else `Unsupported` with `reason`
    /// (what the job is for, and what does its work in the other format).
    pub(crate) async fn of_format(&self, format: TableFormat, reason: &str) -> Result<TableEntry, CatalogError> {
        let table = self.entry().await?;
        if table.format != format {
            return Err(CatalogError::Unsupported {
                catalog: table.name.catalog.clone(),
                reason: format!("{}: {reason}", table.name),
            });
        }
        Ok(table)
    }

    /// A Delta table's entry and its catalog's storage options, for a job
    /// of Delta's alone (`Unsupported` with `reason` on an Iceberg table).
    pub(crate) async fn delta(&self, reason: &str) -> Result<(TableEntry, HashMap<String, String>), CatalogError> {
        let table = self.of_format(TableFormat::Delta, reason).await?;
        let storage = self.catalogs.delta_storage(&table.name.catalog).await?;
        Ok((table, storage))
    }

    /// An Iceberg table's catalog and its name there, for a job of
    /// Iceberg's alone (`Unsupported` with `reason` on a Delta table).
    pub(crate) async fn iceberg(&self, reason: &str) -> Result<(Arc<dyn Catalog>, String), CatalogError> {
        let table = self.of_format(TableFormat::Iceberg, reason).await?;
        let catalog = self.catalogs.iceberg_catalog(&table.name.catalog).await?;
        Ok((catalog, table.name.in_catalog()))
    }
}

impl<'a> std::future::IntoFuture for TableRef<'a> {
    type Output = Result<TableEntry, CatalogError>;
    type IntoFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Self::Output> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.entry().await })
    }
}
