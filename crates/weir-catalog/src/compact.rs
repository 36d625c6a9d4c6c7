//! Compaction of a table by name, in either format, with the options,
//! progress and report the formats share ([`weir_core::maintenance`]).

use serde::Serialize;
use weir_core::maintenance::{CompactOptions, CompactProgress, CompactReport};

use crate::catalogs::Catalogs;
use crate::error::CatalogError;
use crate::format::TableFormat;

/// What a compaction of a table by name did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CompactSummary {
    /// The table's full name.
    pub name: String,
    /// Its format.
    pub format: TableFormat,
    /// Live files and bytes after, of those at the planned version.
    pub files_after: usize,
    pub bytes_after: u64,
    /// The format's report.
    #[serde(flatten)]
    pub report: CompactReport,
}

impl Catalogs {
    /// Rewrites the small files of table `name` into files of the target
    /// size without changing its rows (see [`weir_delta::Compact`] and
    /// [`weir_iceberg::Compact`]), calling `progress` as it goes.
    pub async fn compact(
        &self,
        name: &str,
        options: &CompactOptions,
        progress: impl Fn(CompactProgress) + Send + Sync + 'static,
    ) -> Result<CompactSummary, CatalogError> {
        let table = self.table(name).await?;
        let report = match table.format {
            TableFormat::Delta => {
                let storage = self.delta_storage(&table.name.catalog).await?;
                weir_delta::Compact::new(&table.location)?
                    .with_storage_options(storage)
                    .with_options(options.clone())
                    .on_progress(progress)
                    .run()
                    .await?
            }
            TableFormat::Iceberg => {
                let catalog = self.iceberg_catalog(&table.name.catalog).await?;
                weir_iceberg::Compact::new(catalog, &table.name.in_catalog())?
                    .with_options(options.clone())
                    .on_progress(progress)
                    .run()
                    .await?
            }
        };
        Ok(CompactSummary {
            name: table.name.to_string(),
            format: table.format,
            files_after: report.files_after(),
            bytes_after: report.bytes_after(),
            report,
        })
    }
}
