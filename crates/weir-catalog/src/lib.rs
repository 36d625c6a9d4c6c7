//! Tables by name for weir.
//!
//! A name such as `lake.bronze.payments` (catalog, namespace, table) or
//! `bronze.payments` (in the default catalog) is resolved by [`Catalogs`]
//! to a Delta or Iceberg table and a sink on it. Catalogs come from a TOML
//! file ([`Config`]) or code; with no configuration, catalog `lake` is the
//! embedded default: SQLite at `./weir-lake/catalog.db`, tables under
//! `./weir-lake/warehouse`, new tables in Delta.
//!
//! Kinds of catalog:
//! - `sql` (SQLite or PostgreSQL): Iceberg tables in the JDBC catalog's
//!   `iceberg_tables` (shared with pyiceberg, Spark and DuckDB); Delta tables
//!   in weir's own `weir_tables` (name, format, location, properties,
//!   creation time) in the same database;
//! - `rest`: an Iceberg REST catalog, for Iceberg tables;
//! - `path`: a warehouse (a local directory or an `s3://` prefix) of
//!   `namespace/table` folders, the format told by the files under
//!   `_delta_log/` or `metadata/`. weir writes Delta tables there; Iceberg
//!   tables in one are listed but not written, as a folder cannot swap
//!   metadata atomically.
//!
//! The Iceberg catalogs of the `sql` and `rest` kinds are [`SqlCatalog`]
//! and [`RestCatalog`], which also serve an `IcebergSink` built by hand.
//!
//! A table by name is also where its maintenance starts: each job is a
//! builder of `with_*` setters, run by awaiting it.
//!
//! ```no_run
//! # async fn f() -> Result<(), weir_catalog::CatalogError> {
//! let catalogs = weir_catalog::Catalogs::from_env()?;
//! let summary = catalogs.table("lake.bronze.payments").compact().with_target_file_size(128 << 20).await?;
//! println!("{} files after", summary.files_after);
//! # Ok(()) }
//! ```
//!
//! # Guarantees
//!
//! - Names are checked before anything is touched: each part is ASCII
//!   letters, digits, `_` and `-`, so a name can neither leave the warehouse
//!   nor change a SQL statement. A name of three or more parts starts with
//!   its catalog: a misspelt catalog is an error, never a new namespace.
//! - One name is one table: an existing table keeps its format (asking for
//!   another is an error), two writers registering the same new name end
//!   up with the same table, a SQL catalog reserves a new Iceberg name until
//!   its table exists, and no table's folder holds or sits inside another's.
//! - Dropping removes the catalog entry only, unless `purge` is asked, and
//!   purge deletes files only below the catalog's warehouse.
//! - Passwords, secrets and tokens in the configuration never appear in
//!   `Debug` output, logs or errors; `${NAME}` reads them from the
//!   environment.

mod catalogs;
mod compact;
mod config;
mod describe;
mod error;
mod format;
mod iceberg_catalogs;
mod jobs;
mod name;
mod options;
mod path;
mod registry;
mod rows;
mod table_ref;

pub use catalogs::{Catalogs, TableEntry, TableSink};
pub use compact::{CompactJob, CompactSummary};
pub use config::{lake_dir, CatalogConfig, CatalogKind, Config, DEFAULT_CATALOG, DEFAULT_LAKE_DIR};
pub use describe::{HistoryEntry, QueryMarker, TableDescription};
pub use error::{database_retryable, CatalogError, RestError};
pub use format::TableFormat;
pub use iceberg_catalogs::{RestCatalog, SqlCatalog};
pub use jobs::{ExpireSnapshotsJob, RemoveOrphanFilesJob, RewriteManifestsJob, VacuumJob};
pub use name::TableName;
pub use options::{SnapshotExpiry, TableOptions};
pub use rows::{TableReader, TableRows};
pub use table_ref::TableRef;
pub use weir_core::maintenance::{CompactGroup, CompactOptions, CompactProgress, CompactReport};
