//! Catalogs at run time: names resolved to tables, tables found, created
//! (through their sink), listed and dropped.

use std::collections::HashMap;
use std::sync::Arc;

use weir_core::sink::Sink;
use weir_delta::DeltaSink;
use weir_iceberg::{Catalog, IcebergSink};

use crate::config::{CatalogKind, Config};
use crate::error::CatalogError;
use crate::format::TableFormat;
use crate::iceberg_catalogs::RestCatalog;
use crate::name::{self, TableName};
use crate::options::{SnapshotExpiry, TableOptions};

mod kind;
mod path;
mod rest;
mod sql;

pub(crate) use kind::ident;
use kind::Kind;

/// A table found in a catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableEntry {
    /// Its full name.
    pub name: TableName,
    /// Its format.
    pub format: TableFormat,
    /// Where it is stored.
    pub location: String,
}

/// A sink on a table found or about to be created, for
/// `StreamWriter::start_arc`.
pub struct TableSink {
    /// The table.
    pub table: TableEntry,
    /// Whether the table was there already (else the query creates it from
    /// the stream's schema when it starts).
    pub existed: bool,
    /// The Delta or Iceberg sink.
    pub sink: Arc<dyn Sink>,
}

impl std::fmt::Debug for TableSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableSink")
            .field("table", &self.table)
            .field("existed", &self.existed)
            .finish_non_exhaustive()
    }
}

/// The configured catalogs, connected on first use.
///
/// ```no_run
/// # async fn f() -> Result<(), weir_catalog::CatalogError> {
/// use weir_catalog::{Catalogs, TableOptions};
/// let catalogs = Catalogs::from_env()?; // WEIR_CONFIG, or the embedded default
/// let target = catalogs.sink("lake.bronze.payments", &TableOptions::new()).await?;
/// println!("{} is a {} table at {}", target.table.name, target.table.format, target.table.location);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Catalogs {
    config: Config,
    open: tokio::sync::Mutex<HashMap<String, Arc<dyn Kind>>>,
}

impl Catalogs {
    /// The catalogs of `config`.
    pub fn new(config: Config) -> Self {
        Catalogs {
            config,
            open: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// The catalogs of this process: `WEIR_CONFIG`'s file, else the
    /// embedded default under `WEIR_LAKE` (default `./weir-lake`).
    pub fn from_env() -> Result<Self, CatalogError> {
        Ok(Catalogs::new(Config::from_env()?))
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Resolves `catalog.namespace.table` or `namespace.table` (in the
    /// default catalog). A name of three or more parts starts with its
    /// catalog, so a misspelt catalog is an error, not a new namespace.
    pub fn resolve(&self, name: &str) -> Result<TableName, CatalogError> {
        let parts = name::parts(name)?;
        let known = || self.config.names().collect::<Vec<_>>().join(", ");
        let (table, rest) = parts.split_last().expect("at least two parts");
        if parts.len() >= 3 {
            let catalog = &parts[0];
            if self.config.catalog(catalog).is_none() {
                let hint = match self.config.default_catalog() {
                    Some(d) => format!(
                        "; a name of three or more parts starts with its catalog (for a namespace of \
                         several levels in the default catalog, write {d}.{name})"
                    ),
                    None => String::new(),
                };
                return Err(CatalogError::NoSuchCatalog {
                    catalog: catalog.clone(),
                    known: known(),
                    hint,
                });
            }
            return Ok(TableName {
                catalog: catalog.clone(),
                namespace: rest[1..].to_vec(),
                table: table.clone(),
            });
        }
        let Some(default) = self.config.default_catalog() else {
            return Err(CatalogError::NoSuchCatalog {
                catalog: "(default)".into(),
                known: known(),
                hint: format!(
                    "; {name} names no catalog and none is the default: set default_catalog, or write catalog.{name}"
                ),
            });
        };
        Ok(TableName {
            catalog: default.to_string(),
            namespace: rest.to_vec(),
            table: table.clone(),
        })
    }

    async fn open(&self, catalog: &str) -> Result<Arc<dyn Kind>, CatalogError> {
        let mut open = self.open.lock().await;
        if let Some(opened) = open.get(catalog) {
            return Ok(opened.clone());
        }
        let config = self
            .config
            .catalog(catalog)
            .ok_or_else(|| CatalogError::NoSuchCatalog {
                catalog: catalog.to_string(),
                known: self.config.names().collect::<Vec<_>>().join(", "),
                hint: String::new(),
            })?;
        config
            .check(catalog)
            .map_err(|reason| CatalogError::Config { at: None, reason })?;
        let storage: HashMap<String, String> = config.storage.clone().into_iter().collect();
        let uri = config.uri.clone().unwrap_or_default();
        let warehouse = config.warehouse.clone().unwrap_or_default();
        let opened: Arc<dyn Kind> = match config.kind {
            CatalogKind::Sql => Arc::new(sql::SqlKind::open(catalog, &uri, &warehouse, storage).await?),
            CatalogKind::Rest => {
                let credential = config.credential.as_ref().and_then(|c| {
                    c.split_once(':')
                        .map(|(id, secret)| (id.to_string(), secret.to_string()))
                });
                let rest = RestCatalog::connect(catalog, &uri, &warehouse, credential, storage).await?;
                Arc::new(rest::RestKind::new(rest))
            }
            CatalogKind::Path => Arc::new(path::PathKind::open(catalog, &warehouse, storage)?),
        };
        open.insert(catalog.to_string(), opened.clone());
        Ok(opened)
    }

    /// The Iceberg catalog of a `sql` or `rest` catalog, for tools that
    /// work on its tables directly.
    pub async fn iceberg_catalog(&self, catalog: &str) -> Result<Arc<dyn Catalog>, CatalogError> {
        self.open(catalog)
            .await?
            .iceberg()
            .ok_or_else(|| CatalogError::Unsupported {
                catalog: catalog.to_string(),
                reason: "a path catalog has no Iceberg catalog".into(),
            })
    }

    /// The catalog's storage settings as deltalake's options.
    pub(crate) async fn delta_storage(&self, catalog: &str) -> Result<HashMap<String, String>, CatalogError> {
        Ok(self.open(catalog).await?.delta_storage().unwrap_or_default())
    }

    /// The table of that name, if there is one.
    pub async fn find(&self, name: &str) -> Result<Option<TableEntry>, CatalogError> {
        let name = self.resolve(name)?;
        self.find_resolved(&name).await
    }

    async fn find_resolved(&self, name: &TableName) -> Result<Option<TableEntry>, CatalogError> {
        let found = self.open(&name.catalog).await?.find(name).await?;
        Ok(found.map(|(format, location)| TableEntry {
            name: name.clone(),
            format,
            location,
        }))
    }

    /// A sink on the table of that name. A missing table is registered (a
    /// Delta table in a `sql` catalog) and created from the stream's schema
    /// when the query starts, in `options.format` or the catalog's default
    /// format. An existing table keeps its format.
    pub async fn sink(&self, name: &str, options: &TableOptions) -> Result<TableSink, CatalogError> {
        let name = self.resolve(name)?;
        let found = self.find_resolved(&name).await?;
        if let (Some(found), Some(asked)) = (&found, options.format) {
            if found.format != asked {
                return Err(CatalogError::FormatMismatch {
                    name: name.to_string(),
                    existing: found.format.to_string(),
                    asked: asked.to_string(),
                });
            }
        }
        let config = self
            .config
            .catalog(&name.catalog)
            .expect("resolved names have a catalog");
        let format = found
            .as_ref()
            .map(|f| f.format)
            .or(options.format)
            .unwrap_or_else(|| config.default_format());
        let existed = found.is_some();
        let opened = self.open(&name.catalog).await?;
        if let Some(reason) = opened.refuses(&name, format) {
            return Err(CatalogError::Unsupported {
                catalog: name.catalog.clone(),
                reason,
            });
        }
        if format == TableFormat::Delta && matches!(options.snapshot_expiry, SnapshotExpiry::Policy(_)) {
            return Err(CatalogError::Unsupported {
                catalog: name.catalog.clone(),
                reason: format!(
                    "{name} is a Delta table: a snapshot expiry policy is for Iceberg tables (a Delta table's old \
                     files go with vacuum). Nothing was written"
                ),
            });
        }
        if !existed {
            self.check_nesting(&name, opened.as_ref()).await?;
        }
        let location = match found {
            Some(f) => f.location,
            None => opened.place(&name, format, options).await?,
        };
        let sink: Arc<dyn Sink> = match format {
            TableFormat::Iceberg => {
                let catalog = opened
                    .iceberg()
                    .ok_or_else(|| CatalogError::NoSuchTable { name: name.to_string() })?;
                Arc::new(iceberg_sink(catalog, &name, options)?)
            }
            TableFormat::Delta => {
                let storage = opened
                    .delta_storage()
                    .ok_or_else(|| CatalogError::NoSuchTable { name: name.to_string() })?;
                Arc::new(delta_sink(&location, options, storage)?)
            }
        };
        Ok(TableSink {
            table: TableEntry { name, format, location },
            existed,
            sink,
        })
    }

    /// Refuses a new table whose folder would hold, or sit inside, another
    /// table's (`a.b` and `a.b.c` share the folder `a/b`).
    async fn check_nesting(&self, name: &TableName, opened: &dyn Kind) -> Result<(), CatalogError> {
        let new = name.parts();
        for other in opened.names().await? {
            let relation = if other.len() < new.len() && new.starts_with(&other) {
                "sit inside"
            } else if new.len() < other.len() && other.starts_with(&new) {
                "hold"
            } else {
                continue;
            };
            return Err(CatalogError::Nested {
                name: name.to_string(),
                relation,
                other: format!("{}.{}", name.catalog, other.join(".")),
            });
        }
        Ok(())
    }

    /// The tables of a catalog (the default one if `None`), or of one of
    /// its namespaces (`bronze`, or `a.b` for a nested one).
    pub async fn list(&self, catalog: Option<&str>, namespace: Option<&str>) -> Result<Vec<TableEntry>, CatalogError> {
        let catalog = match catalog.or_else(|| self.config.default_catalog()) {
            Some(c) => c.to_string(),
            None => {
                return Err(CatalogError::NoSuchCatalog {
                    catalog: "(default)".into(),
                    known: self.config.names().collect::<Vec<_>>().join(", "),
                    hint: "; name the catalog to list".into(),
                })
            }
        };
        let namespace: Option<Vec<String>> = match namespace {
            Some(ns) => {
                let parts: Vec<String> = ns.split('.').map(str::to_string).collect();
                for part in &parts {
                    name::check_part(ns, part)?;
                }
                Some(parts)
            }
            None => None,
        };
        let listed = self.open(&catalog).await?.list(namespace.as_deref()).await?;
        let mut out: Vec<TableEntry> = listed
            .into_iter()
            .map(|(namespace, table, format, location)| TableEntry {
                name: TableName {
                    catalog: catalog.clone(),
                    namespace,
                    table,
                },
                format,
                location,
            })
            .collect();
        out.sort_by_key(|t| t.name.to_string());
        Ok(out)
    }

    /// Removes the table from its catalog; with `purge`, its files too
    /// (only below the catalog's warehouse, and only after the catalog
    /// entry is gone, so a failed drop deletes nothing). Without `purge`
    /// the files stay where they are: a table created again under the name
    /// finds them (a Delta table comes back whole, with its markers). A
    /// path catalog's tables are their folders, so dropping one there needs
    /// `purge`. Returns whether there was such a table.
    pub async fn drop_table(&self, name: &str, purge: bool) -> Result<bool, CatalogError> {
        let name = self.resolve(name)?;
        let Some(found) = self.find_resolved(&name).await? else {
            return Ok(false);
        };
        let opened = self.open(&name.catalog).await?;
        opened.drop_table(&name, found.format, &found.location, purge).await
    }
}

/// `$sink` with the options a table sink of either format takes alike:
/// partitioning, schema merging, properties, file size and compaction.
macro_rules! with_table_options {
    ($sink:expr, $options:expr) => {{
        let options: &TableOptions = $options;
        let mut sink = $sink
            .with_partition_by(options.partition_by.iter().cloned())
            .with_merge_schema(options.merge_schema);
        for (k, v) in &options.properties {
            sink = sink.with_table_property(k, v);
        }
        if let Some(bytes) = options.target_file_size {
            sink = sink.with_target_file_size(bytes);
        }
        if let Some(policy) = options.compaction {
            sink = sink.with_compaction(policy);
        }
        sink
    }};
}

fn iceberg_sink(
    catalog: Arc<dyn Catalog>,
    name: &TableName,
    options: &TableOptions,
) -> Result<IcebergSink, CatalogError> {
    let mut sink = with_table_options!(IcebergSink::try_new(catalog, &name.in_catalog())?, options);
    if let Some(policy) = options.snapshot_expiry.iceberg_policy() {
        sink = sink.with_snapshot_expiry(policy);
    }
    Ok(sink)
}

fn delta_sink(
    location: &str,
    options: &TableOptions,
    storage: HashMap<String, String>,
) -> Result<DeltaSink, CatalogError> {
    let mut sink = with_table_options!(DeltaSink::try_new(location)?, options);
    for (k, v) in storage {
        sink = sink.with_storage_option(k, v);
    }
    Ok(sink)
}

#[cfg(test)]
mod tests;
