//! Catalogs at run time: names resolved to tables, tables found, created
//! (through their sink), listed and dropped.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::{NamespaceIdent, TableIdent};
use weir_core::sink::Sink;
use weir_delta::DeltaSink;
use weir_iceberg::{Catalog, IcebergSink};

use crate::iceberg::{RestCatalog, SqlCatalog};

use crate::config::{CatalogKind, Config};
use crate::error::CatalogError;
use crate::format::TableFormat;
use crate::name::{self, TableName};
use crate::options::{SnapshotExpiry, TableOptions};
use crate::table_ref::TableRef;
use crate::{path, registry};

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

enum Opened {
    Sql {
        sql: Arc<SqlCatalog>,
        storage: HashMap<String, String>,
    },
    Rest {
        rest: Arc<RestCatalog>,
    },
    Path {
        warehouse: path::Warehouse,
        storage: HashMap<String, String>,
    },
}

impl std::fmt::Debug for Opened {
    // The storage settings hold secrets: only their names are shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Opened::Sql { sql, storage } => f
                .debug_struct("Sql")
                .field("catalog", sql)
                .field("storage", &storage.keys().collect::<Vec<_>>())
                .finish(),
            Opened::Rest { rest } => f.debug_struct("Rest").field("catalog", rest).finish(),
            Opened::Path { warehouse, storage } => f
                .debug_struct("Path")
                .field("warehouse", warehouse)
                .field("storage", &storage.keys().collect::<Vec<_>>())
                .finish(),
        }
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
    open: tokio::sync::Mutex<HashMap<String, Arc<Opened>>>,
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

    async fn open(&self, catalog: &str) -> Result<Arc<Opened>, CatalogError> {
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
        let opened = match config.kind {
            CatalogKind::Sql => {
                let sql = SqlCatalog::connect_with_storage(catalog, &uri, &warehouse, storage.clone()).await?;
                registry::create(&sql).await?;
                Opened::Sql {
                    sql: Arc::new(sql),
                    storage,
                }
            }
            CatalogKind::Rest => {
                let credential = config.credential.as_ref().and_then(|c| {
                    c.split_once(':')
                        .map(|(id, secret)| (id.to_string(), secret.to_string()))
                });
                let rest = RestCatalog::connect(catalog, &uri, &warehouse, credential, storage).await?;
                Opened::Rest { rest: Arc::new(rest) }
            }
            CatalogKind::Path => Opened::Path {
                warehouse: path::Warehouse::open(catalog, &warehouse, &storage)?,
                storage,
            },
        };
        let opened = Arc::new(opened);
        open.insert(catalog.to_string(), opened.clone());
        Ok(opened)
    }

    /// The Iceberg catalog of a `sql` or `rest` catalog, for tools that
    /// work on its tables directly.
    pub async fn iceberg_catalog(&self, catalog: &str) -> Result<Arc<dyn Catalog>, CatalogError> {
        match &*self.open(catalog).await? {
            Opened::Sql { sql, .. } => Ok(sql.clone()),
            Opened::Rest { rest } => Ok(rest.clone()),
            Opened::Path { .. } => Err(CatalogError::Unsupported {
                catalog: catalog.to_string(),
                reason: "a path catalog has no Iceberg catalog".into(),
            }),
        }
    }

    /// The catalog's storage settings as deltalake's options.
    pub(crate) async fn delta_storage(&self, catalog: &str) -> Result<HashMap<String, String>, CatalogError> {
        Ok(match &*self.open(catalog).await? {
            Opened::Sql { storage, .. } | Opened::Path { storage, .. } => delta_storage(storage).into_iter().collect(),
            Opened::Rest { .. } => HashMap::new(),
        })
    }

    /// The table of that name, if there is one.
    pub async fn find(&self, name: &str) -> Result<Option<TableEntry>, CatalogError> {
        let name = self.resolve(name)?;
        self.find_resolved(&name).await
    }

    /// The table of that name: awaited, its entry or
    /// [`CatalogError::NoSuchTable`]; its methods start maintenance jobs on
    /// it (`catalogs.table(name).compact().await`).
    pub fn table(&self, name: &str) -> TableRef<'_> {
        TableRef::new(self, name)
    }

    async fn find_resolved(&self, name: &TableName) -> Result<Option<TableEntry>, CatalogError> {
        let entry = |format, location: String| {
            Some(TableEntry {
                name: name.clone(),
                format,
                location,
            })
        };
        match &*self.open(&name.catalog).await? {
            Opened::Sql { sql, .. } => {
                if let Some(t) = sql.load(&ident(name)).await? {
                    return Ok(entry(TableFormat::Iceberg, t.metadata.location().to_string()));
                }
                // A Delta table, or an Iceberg name reserved before its
                // first query created the table.
                let row = registry::find(sql, &name.namespace, &name.table).await?;
                Ok(row.and_then(|r| entry(r.format, r.location)))
            }
            Opened::Rest { rest } => {
                let table = rest.load(&ident(name)).await?;
                Ok(table.and_then(|t| entry(TableFormat::Iceberg, t.metadata.location().to_string())))
            }
            Opened::Path { warehouse, .. } => {
                let parts = name.parts();
                let format = warehouse.detect(&parts).await?;
                Ok(format.and_then(|f| entry(f, warehouse.location(&parts))))
            }
        }
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
        if let Some(refused) = refusal(&name, &opened, format) {
            return Err(refused);
        }
        if !existed {
            self.check_nesting(&name, &opened).await?;
        }
        let location = match (&*opened, found) {
            (_, Some(f)) => f.location,
            (Opened::Sql { sql, .. }, None) => {
                // The name is registered (a Delta table) or reserved (an
                // Iceberg table, until its first query creates it) now, so
                // that it is never taken by both formats.
                let location = match format {
                    TableFormat::Delta => format!("{}/{}", sql.warehouse(), name.relative_path()),
                    TableFormat::Iceberg => sql.default_location(&ident(&name)),
                };
                let row = registry::Registered {
                    namespace: name.namespace.clone(),
                    table: name.table.clone(),
                    format,
                    location,
                    properties: options.properties.clone(),
                    created_at: chrono::Utc::now().to_rfc3339(),
                };
                let won = registry::register(sql, &row).await?;
                match won {
                    Some(won) if won.format == format => {
                        tracing::info!(table = %name, %format, location = won.location, "registered the table");
                        won.location
                    }
                    other => {
                        return Err(CatalogError::FormatMismatch {
                            name: name.to_string(),
                            existing: other.map_or(TableFormat::Iceberg, |w| w.format).to_string(),
                            asked: format.to_string(),
                        })
                    }
                }
            }
            (Opened::Rest { rest }, None) => rest.default_location(&ident(&name)),
            (Opened::Path { warehouse, .. }, None) => warehouse.location(&name.parts()),
        };
        let sink: Arc<dyn Sink> = match (&*opened, format) {
            (Opened::Sql { sql, .. }, TableFormat::Iceberg) => Arc::new(iceberg_sink(sql.clone(), &name, options)?),
            (Opened::Rest { rest }, TableFormat::Iceberg) => Arc::new(iceberg_sink(rest.clone(), &name, options)?),
            (Opened::Sql { storage, .. } | Opened::Path { storage, .. }, TableFormat::Delta) => {
                if matches!(options.snapshot_expiry, SnapshotExpiry::Policy(_)) {
                    return Err(CatalogError::Unsupported {
                        catalog: name.catalog.clone(),
                        reason: format!(
                            "{name} is a Delta table: a snapshot expiry policy is for Iceberg tables (a Delta \
                             table's old files go with vacuum). Nothing was written"
                        ),
                    });
                }
                Arc::new(delta_sink(&location, options, storage)?)
            }
            (opened, format) => {
                return Err(
                    refusal(&name, opened, format).unwrap_or(CatalogError::NoSuchTable { name: name.to_string() })
                )
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
    async fn check_nesting(&self, name: &TableName, opened: &Opened) -> Result<(), CatalogError> {
        let new = name.parts();
        for other in table_names(opened).await? {
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
        let entry = |namespace: Vec<String>, table: String, format, location| TableEntry {
            name: TableName {
                catalog: catalog.clone(),
                namespace,
                table,
            },
            format,
            location,
        };
        let mut out = Vec::new();
        match &*self.open(&catalog).await? {
            Opened::Sql { sql, .. } => {
                out.extend(iceberg_entries(sql.as_ref(), namespace.as_deref(), &entry).await?);
                for r in registry::list(sql, namespace.as_deref()).await? {
                    let e = entry(r.namespace, r.table, r.format, r.location);
                    // An Iceberg name stays reserved once its table exists.
                    if !out.iter().any(|o| o.name == e.name) {
                        out.push(e);
                    }
                }
            }
            Opened::Rest { rest } => out.extend(iceberg_entries(rest.as_ref(), namespace.as_deref(), &entry).await?),
            Opened::Path { warehouse, .. } => {
                for (ns, table, format) in warehouse.list(namespace.as_deref()).await? {
                    let location = warehouse.location(&ns.iter().cloned().chain([table.clone()]).collect::<Vec<_>>());
                    out.push(entry(ns, table, format, location));
                }
            }
        }
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
        match (&*self.open(&name.catalog).await?, found.format) {
            (Opened::Sql { sql, .. }, TableFormat::Iceberg) => {
                let dropped = sql.drop_table(&ident(&name), purge).await?;
                let unreserved = registry::remove(sql, &name.namespace, &name.table).await?;
                Ok(dropped || unreserved)
            }
            (Opened::Rest { rest }, _) => Ok(rest.drop_table(&ident(&name), purge).await?),
            (Opened::Sql { sql, storage }, TableFormat::Delta) => {
                if purge {
                    let warehouse = format!("{}/", sql.warehouse());
                    if !found.location.starts_with(&warehouse) {
                        return Err(CatalogError::Unsupported {
                            catalog: name.catalog.clone(),
                            reason: format!(
                                "{name} is at {}, outside the catalog's warehouse: it is not purged; drop it \
                                 without purge and delete its files yourself",
                                found.location
                            ),
                        });
                    }
                }
                let removed = registry::remove(sql, &name.namespace, &name.table).await?;
                if purge {
                    delete_tree(&name.catalog, &found.location, storage).await?;
                }
                tracing::info!(table = %name, purge, "dropped the Delta table");
                Ok(removed)
            }
            (Opened::Path { storage, .. }, _) => {
                if !purge {
                    return Err(CatalogError::Unsupported {
                        catalog: name.catalog.clone(),
                        reason: format!(
                            "{name}: a path catalog's tables are their folders; dropping one deletes it, so ask \
                             for purge"
                        ),
                    });
                }
                delete_tree(&name.catalog, &found.location, storage).await?;
                Ok(true)
            }
        }
    }
}

/// Why a catalog cannot write a table of `format`, if it cannot.
fn refusal(name: &TableName, opened: &Opened, format: TableFormat) -> Option<CatalogError> {
    let reason = match (opened, format) {
        (Opened::Rest { .. }, TableFormat::Delta) => format!("{name}: a REST catalog holds Iceberg tables only"),
        (Opened::Path { .. }, TableFormat::Iceberg) => format!(
            "{name}: weir writes Iceberg tables only through a catalog that swaps their metadata \
             atomically (sql or rest); a path catalog lists and reads them. Nothing was written"
        ),
        _ => return None,
    };
    Some(CatalogError::Unsupported {
        catalog: name.catalog.clone(),
        reason,
    })
}

/// The Iceberg identifier of a resolved name.
pub(crate) fn ident(name: &TableName) -> TableIdent {
    TableIdent::new(
        NamespaceIdent::from_vec(name.namespace.clone()).expect("resolved names have a namespace"),
        name.table.clone(),
    )
}

/// Every table name of a catalog, as parts (namespace levels, table).
async fn table_names(opened: &Opened) -> Result<Vec<Vec<String>>, CatalogError> {
    let joined = |ident: TableIdent| {
        ident
            .namespace
            .clone()
            .inner()
            .into_iter()
            .chain([ident.name])
            .collect()
    };
    Ok(match opened {
        Opened::Sql { sql, .. } => {
            let mut names: Vec<Vec<String>> = registry::list(sql, None)
                .await?
                .into_iter()
                .map(|r| r.namespace.into_iter().chain([r.table]).collect())
                .collect();
            names.extend(sql.list(None).await?.into_iter().map(joined));
            names
        }
        Opened::Rest { rest } => rest.list(None).await?.into_iter().map(joined).collect(),
        Opened::Path { warehouse, .. } => warehouse
            .list(None)
            .await?
            .into_iter()
            .map(|(ns, table, _)| ns.into_iter().chain([table]).collect())
            .collect(),
    })
}

async fn iceberg_entries(
    catalog: &dyn Catalog,
    namespace: Option<&[String]>,
    entry: &impl Fn(Vec<String>, String, TableFormat, String) -> TableEntry,
) -> Result<Vec<TableEntry>, CatalogError> {
    let mut out = Vec::new();
    for ident in catalog.list(namespace).await? {
        let location = match catalog.load(&ident).await? {
            Some(t) => t.metadata.location().to_string(),
            None => continue, // dropped meanwhile
        };
        out.push(entry(
            ident.namespace.clone().inner(),
            ident.name.clone(),
            TableFormat::Iceberg,
            location,
        ));
    }
    Ok(out)
}

fn iceberg_sink(
    catalog: Arc<dyn Catalog>,
    name: &TableName,
    options: &TableOptions,
) -> Result<IcebergSink, CatalogError> {
    let mut sink = IcebergSink::try_new(catalog, &name.in_catalog())?
        .with_partition_by(options.partition_by.iter().cloned())
        .with_merge_schema(options.merge_schema);
    for (k, v) in &options.properties {
        sink = sink.with_table_property(k, v);
    }
    if let Some(bytes) = options.target_file_size {
        sink = sink.with_target_file_size(bytes);
    }
    if let Some(policy) = options.snapshot_expiry.iceberg_policy() {
        sink = sink.with_snapshot_expiry(policy);
    }
    if let Some(policy) = options.compaction {
        sink = sink.with_compaction(policy);
    }
    Ok(sink)
}

fn delta_sink(
    location: &str,
    options: &TableOptions,
    storage: &HashMap<String, String>,
) -> Result<DeltaSink, CatalogError> {
    let mut sink = DeltaSink::try_new(location)?
        .with_partition_by(options.partition_by.iter().cloned())
        .with_merge_schema(options.merge_schema);
    for (k, v) in &options.properties {
        sink = sink.with_table_property(k, v);
    }
    if let Some(bytes) = options.target_file_size {
        sink = sink.with_target_file_size(bytes);
    }
    for (k, v) in delta_storage(storage) {
        sink = sink.with_storage_option(k, v);
    }
    if let Some(policy) = options.compaction {
        sink = sink.with_compaction(policy);
    }
    Ok(sink)
}

/// The catalog's storage settings (Iceberg's `s3.*` names) as deltalake's
/// options. Other names pass through.
fn delta_storage(storage: &HashMap<String, String>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (key, value) in storage {
        let key = match key.as_str() {
            "s3.endpoint" => {
                if value.starts_with("http://") {
                    out.push(("AWS_ALLOW_HTTP".to_string(), "true".to_string()));
                }
                "AWS_ENDPOINT_URL"
            }
            "s3.region" => "AWS_REGION",
            "s3.access-key-id" => "AWS_ACCESS_KEY_ID",
            "s3.secret-access-key" => "AWS_SECRET_ACCESS_KEY",
            "s3.session-token" => "AWS_SESSION_TOKEN",
            other => other,
        };
        out.push((key.to_string(), value.clone()));
    }
    out
}

/// Deletes everything below `location` (a table's folder).
async fn delete_tree(catalog: &str, location: &str, storage: &HashMap<String, String>) -> Result<(), CatalogError> {
    let prefix = format!("{}/", location.trim_end_matches('/'));
    weir_iceberg::file_io(&prefix, storage.clone())
        .delete_prefix(&prefix)
        .await
        .map_err(|source| CatalogError::Purge {
            catalog: catalog.to_string(),
            location: prefix.clone(),
            source: Box::new(source),
        })
}

#[cfg(test)]
mod tests;
