//! Compaction of a table by name, in either format, with the options,
//! progress and report the formats share ([`weir_core::maintenance`]).

use std::sync::Arc;

use serde::Serialize;
use weir_core::maintenance::{CompactOptions, CompactProgress, CompactReport};

use crate::catalogs::Catalogs;
use crate::error::CatalogError;
use crate::format::TableFormat;
use crate::table_ref::TableRef;

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

impl<'a> TableRef<'a> {
    /// Compaction of its small files, in either format (see
    /// [`weir_delta::Compact`] and [`weir_iceberg::Compact`]).
    pub fn compact(&self) -> CompactJob<'a> {
        CompactJob::new(self.clone())
    }
}

/// Rewrites the small files of a table by name into files of the target
/// size without changing its rows (see [`weir_delta::Compact`] and
/// [`weir_iceberg::Compact`]); made by [`TableRef::compact`], run by
/// awaiting it.
#[must_use = "a job does nothing until it is awaited"]
#[derive(Clone)]
pub struct CompactJob<'a> {
    table: TableRef<'a>,
    options: CompactOptions,
    progress: Option<Arc<dyn Fn(CompactProgress) + Send + Sync>>,
}

impl std::fmt::Debug for CompactJob<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompactJob")
            .field("table", &self.table.name())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl<'a> CompactJob<'a> {
    pub(crate) fn new(table: TableRef<'a>) -> Self {
        CompactJob {
            table,
            options: CompactOptions::default(),
            progress: None,
        }
    }

    weir_core::compact_setters!(options, progress);

    /// Plans, rewrites and commits; awaiting the job does the same.
    pub async fn run(&self) -> Result<CompactSummary, CatalogError> {
        let catalogs = self.table.catalogs();
        let table = self.table.entry().await?;
        let progress = self.progress.clone();
        let progress = move |p| {
            if let Some(f) = &progress {
                f(p)
            }
        };
        let report = match table.format {
            TableFormat::Delta => {
                let storage = catalogs.delta_storage(&table.name.catalog).await?;
                weir_delta::Compact::new(&table.location)?
                    .with_storage_options(storage)
                    .with_options(self.options.clone())
                    .with_progress(progress)
                    .await?
            }
            TableFormat::Iceberg => {
                let catalog = catalogs.iceberg_catalog(&table.name.catalog).await?;
                weir_iceberg::Compact::new(catalog, &table.name.in_catalog())?
                    .with_options(self.options.clone())
                    .with_progress(progress)
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

weir_core::awaitable!(<'a> CompactJob<'a> => Result<CompactSummary, CatalogError>);

impl Catalogs {
    /// Compacts table `name`, calling `progress` as it goes.
    #[deprecated(
        since = "0.1.0",
        note = "use `catalogs.table(name).compact().with_options(..).await`"
    )]
    pub async fn compact(
        &self,
        name: &str,
        options: &CompactOptions,
        progress: impl Fn(CompactProgress) + Send + Sync + 'static,
    ) -> Result<CompactSummary, CatalogError> {
        self.table(name)
            .compact()
            .with_options(options.clone())
            .with_progress(progress)
            .await
    }
}
