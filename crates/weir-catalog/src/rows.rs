//! Reading a table's live rows whole, by name: the static side of a
//! stream-static join.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use iceberg::TableIdent;
use weir_iceberg::Catalog;

use crate::error::CatalogError;
use crate::format::TableFormat;
use crate::table_ref::TableRef;

/// A table's live rows at one version.
#[derive(Debug, Clone)]
pub struct TableRows {
    /// The version they are of: a Delta table's version, an Iceberg
    /// table's snapshot id (`None` before its first snapshot).
    pub version: Option<i64>,
    /// The table's columns.
    pub schema: SchemaRef,
    /// The rows.
    pub batches: Vec<RecordBatch>,
}

/// Reads a table's live rows, the table found once.
#[derive(Debug, Clone)]
pub enum TableReader {
    /// A Delta table at a location, with its storage options.
    Delta {
        /// The table's path or URL.
        location: String,
        /// Object storage options.
        storage: HashMap<String, String>,
    },
    /// An Iceberg table of a catalog.
    Iceberg {
        /// Its catalog.
        catalog: Arc<dyn Catalog>,
        /// Its name in the catalog.
        ident: TableIdent,
    },
}

fn delta_version(version: u64) -> Option<i64> {
    i64::try_from(version).ok()
}

impl TableReader {
    /// A reader of the Delta table at `location` (a path or URL).
    pub fn delta(location: impl Into<String>) -> Self {
        TableReader::Delta {
            location: location.into(),
            storage: HashMap::new(),
        }
    }

    /// The table's version now, without reading its rows.
    pub async fn version(&self) -> Result<Option<i64>, CatalogError> {
        Ok(match self {
            TableReader::Delta { location, storage } => {
                delta_version(weir_delta::latest_version(location, storage).await?)
            }
            TableReader::Iceberg { catalog, ident } => weir_iceberg::current_snapshot(catalog.as_ref(), ident).await?,
        })
    }

    /// The table's columns now, as [`TableReader::rows`] reports them,
    /// without reading its rows.
    pub async fn schema(&self) -> Result<SchemaRef, CatalogError> {
        Ok(match self {
            TableReader::Delta { location, storage } => weir_delta::table_schema(location, storage).await?,
            TableReader::Iceberg { catalog, ident } => weir_iceberg::table_schema(catalog.as_ref(), ident).await?,
        })
    }

    /// Every live row of the table now.
    pub async fn rows(&self) -> Result<TableRows, CatalogError> {
        Ok(match self {
            TableReader::Delta { location, storage } => {
                let rows = weir_delta::read_rows(location, storage).await?;
                TableRows {
                    version: delta_version(rows.version),
                    schema: rows.schema,
                    batches: rows.batches,
                }
            }
            TableReader::Iceberg { catalog, ident } => {
                let rows = weir_iceberg::read_rows(catalog.as_ref(), ident).await?;
                TableRows {
                    version: rows.snapshot_id,
                    schema: rows.schema,
                    batches: rows.batches,
                }
            }
        })
    }
}

impl TableRef<'_> {
    /// A reader of the table's live rows (it must exist).
    pub async fn reader(&self) -> Result<TableReader, CatalogError> {
        let table = self.entry().await?;
        let catalogs = self.catalogs();
        Ok(match table.format {
            TableFormat::Delta => TableReader::Delta {
                location: table.location.clone(),
                storage: catalogs.delta_storage(&table.name.catalog).await?,
            },
            TableFormat::Iceberg => TableReader::Iceberg {
                catalog: catalogs.iceberg_catalog(&table.name.catalog).await?,
                ident: weir_iceberg::parse_ident(&table.name.in_catalog())?,
            },
        })
    }
}
