//! The SQL catalog on SQLite or PostgreSQL, in the JDBC catalog's schema
//! (`iceberg_tables`, `iceberg_namespace_properties`) that pyiceberg's
//! `SqlCatalog`, Spark's JDBC catalog and DuckDB share.
//!
//! A swap is one statement: `UPDATE iceberg_tables SET metadata_location =
//! <new> ... WHERE ... AND metadata_location = <base>`; it changed a row or
//! another writer moved the table first.

use std::collections::HashMap;
use std::sync::{Arc, Once};

use async_trait::async_trait;
use iceberg::io::FileIO;
use iceberg::spec::TableMetadata;
use iceberg::TableIdent;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};

use weir_iceberg::metadata_file::{next_metadata_location, read_refs, MetadataFiles, MetadataJson};
use weir_iceberg::{check_ident, shown, Catalog, IcebergSinkError, LoadedTable, Swap};

use crate::error::database_retryable;

static DRIVERS: Once = Once::new();

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Sqlite,
    Postgres,
}

/// An Iceberg catalog in a SQL database (SQLite or PostgreSQL).
///
/// ```no_run
/// # async fn f() -> Result<(), weir_iceberg::IcebergSinkError> {
/// use weir_catalog::SqlCatalog;
/// let lake = SqlCatalog::connect("lake", "sqlite://weir-lake/catalog.db", "weir-lake/warehouse").await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqlCatalog {
    name: String,
    pool: AnyPool,
    dialect: Dialect,
    warehouse: String,
    file_io: FileIO,
    /// Whether `iceberg_tables` has the `iceberg_type` column (the JDBC
    /// catalog's schema v1).
    typed: bool,
    /// What is kept between commits to write metadata files quickly.
    files: Arc<MetadataFiles>,
    /// The storage settings (secrets: never shown).
    storage: HashMap<String, String>,
}

impl std::fmt::Debug for SqlCatalog {
    // The connection string may hold a password: it is never shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlCatalog")
            .field("name", &self.name)
            .field("dialect", &self.dialect)
            .field("warehouse", &self.warehouse)
            .finish_non_exhaustive()
    }
}

impl SqlCatalog {
    /// Connects to the catalog database at `uri` (`sqlite://path/catalog.db`,
    /// created if missing, or `postgres://user:password@host/db`), creating
    /// the catalog's tables if they are missing. New tables go under
    /// `warehouse` (a local directory).
    pub async fn connect(name: &str, uri: &str, warehouse: &str) -> Result<Self, IcebergSinkError> {
        Self::connect_with_storage(name, uri, warehouse, HashMap::new()).await
    }

    /// As [`SqlCatalog::connect`], with the warehouse in object storage
    /// (`s3://bucket/path`) or local, and the storage's settings
    /// (`s3.endpoint`, `s3.access-key-id`, `s3.secret-access-key`,
    /// `s3.region`; the `AWS_*` variables fill in what is missing).
    pub async fn connect_with_storage(
        name: &str,
        uri: &str,
        warehouse: &str,
        storage: HashMap<String, String>,
    ) -> Result<Self, IcebergSinkError> {
        DRIVERS.call_once(sqlx::any::install_default_drivers);
        let config = |reason: String| IcebergSinkError::Config {
            catalog: name.to_string(),
            reason,
        };
        let (dialect, uri) = if let Some(path) = uri.strip_prefix("sqlite://") {
            let path = path.split('?').next().unwrap_or(path);
            if let Some(dir) = std::path::Path::new(path)
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
            {
                std::fs::create_dir_all(dir)
                    .map_err(|e| config(format!("cannot create the directory of the catalog database: {e}")))?;
            }
            let uri = if uri.contains('?') {
                uri.to_string()
            } else {
                format!("{uri}?mode=rwc")
            };
            (Dialect::Sqlite, uri)
        } else if uri.starts_with("postgres://") || uri.starts_with("postgresql://") {
            (Dialect::Postgres, uri.to_string())
        } else {
            return Err(config(
                "the catalog URI must start with sqlite:// or postgres:// (it is not shown, as it may hold a password)"
                    .into(),
            ));
        };
        let mut options = AnyPoolOptions::new().max_connections(4);
        if dialect == Dialect::Sqlite {
            // Other processes (readers, other queries) hold the file's lock
            // for moments: wait for them rather than fail, and let readers
            // read while a swap writes.
            options = options.after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::query("PRAGMA busy_timeout = 30000").execute(&mut *conn).await?;
                    sqlx::query("PRAGMA journal_mode = WAL").execute(&mut *conn).await?;
                    Ok(())
                })
            });
        }
        let pool = options
            .connect(&uri)
            .await
            .map_err(|source| IcebergSinkError::Catalog {
                catalog: name.to_string(),
                operation: "connect".into(),
                retryable: database_retryable(&source),
                source: Box::new(redact(source)),
            })?;
        let warehouse = warehouse_url(warehouse).map_err(config)?;
        let mut catalog = SqlCatalog {
            name: name.to_string(),
            pool,
            dialect,
            file_io: weir_iceberg::file_io(&warehouse, storage.clone()),
            storage,
            warehouse,
            typed: true,
            files: Arc::default(),
        };
        catalog.create_tables().await?;
        Ok(catalog)
    }

    /// The catalog's database, for tables kept beside the catalog's own
    /// (weir's catalog keeps its Delta tables there).
    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// `template` with its `?` placeholders in this database's style.
    pub(crate) fn statement(&self, template: &str) -> String {
        self.sql(template)
    }

    /// The warehouse new tables go under, as a URL (`file:///...`, `s3://...`).
    pub fn warehouse(&self) -> &str {
        &self.warehouse
    }

    fn err(&self, operation: &str) -> impl Fn(sqlx::Error) -> IcebergSinkError + '_ {
        let operation = operation.to_string();
        move |source| IcebergSinkError::Catalog {
            catalog: self.name.clone(),
            operation: operation.clone(),
            retryable: database_retryable(&source),
            source: Box::new(source),
        }
    }

    /// `?` placeholders in this database's style.
    fn sql(&self, template: &str) -> String {
        match self.dialect {
            Dialect::Sqlite => template.to_string(),
            Dialect::Postgres => {
                let mut out = String::with_capacity(template.len() + 8);
                let mut n = 0;
                for c in template.chars() {
                    if c == '?' {
                        n += 1;
                        out.push_str(&format!("${n}"));
                    } else {
                        out.push(c);
                    }
                }
                out
            }
        }
    }

    async fn create_tables(&mut self) -> Result<(), IcebergSinkError> {
        let statements = [
            "CREATE TABLE IF NOT EXISTS iceberg_tables (\
                catalog_name VARCHAR(255) NOT NULL, \
                table_namespace VARCHAR(255) NOT NULL, \
                table_name VARCHAR(255) NOT NULL, \
                metadata_location VARCHAR(1000), \
                previous_metadata_location VARCHAR(1000), \
                iceberg_type VARCHAR(5), \
                PRIMARY KEY (catalog_name, table_namespace, table_name))",
            "CREATE TABLE IF NOT EXISTS iceberg_namespace_properties (\
                catalog_name VARCHAR(255) NOT NULL, \
                namespace VARCHAR(255) NOT NULL, \
                property_key VARCHAR(255) NOT NULL, \
                property_value VARCHAR(1000) NOT NULL, \
                PRIMARY KEY (catalog_name, namespace, property_key))",
        ];
        for statement in statements {
            // Two processes creating the tables at once: the loser's error
            // is harmless if the table is there afterwards.
            if let Err(e) = sqlx::query(statement).execute(&self.pool).await {
                tracing::debug!(error = %e, "creating a catalog table failed; checking it exists");
            }
        }
        sqlx::query("SELECT catalog_name FROM iceberg_namespace_properties WHERE 1 = 0")
            .fetch_all(&self.pool)
            .await
            .map_err(self.err("create the catalog tables"))?;
        // A catalog made by an older JDBC catalog or pyiceberg lacks the
        // `iceberg_type` column; it is used only where present.
        self.typed = sqlx::query("SELECT iceberg_type FROM iceberg_tables WHERE 1 = 0")
            .fetch_all(&self.pool)
            .await
            .is_ok();
        Ok(())
    }

    fn tables_only(&self) -> &'static str {
        if self.typed {
            " AND (iceberg_type = 'TABLE' OR iceberg_type IS NULL)"
        } else {
            ""
        }
    }

    async fn ensure_namespace(&self, namespace: &str) -> Result<(), IcebergSinkError> {
        let sql = self.sql(
            "INSERT INTO iceberg_namespace_properties (catalog_name, namespace, property_key, property_value) \
             VALUES (?, ?, 'exists', 'true') ON CONFLICT DO NOTHING",
        );
        sqlx::query(&sql)
            .bind(&self.name)
            .bind(namespace)
            .execute(&self.pool)
            .await
            .map_err(self.err("create the namespace"))?;
        Ok(())
    }

    /// Writes `metadata` (the metadata at `base` with `changes`) to
    /// `location`.
    async fn write_metadata(
        &self,
        location: &str,
        base: Option<&str>,
        metadata: &TableMetadata,
        changes: &[iceberg::TableUpdate],
    ) -> Result<MetadataJson, IcebergSinkError> {
        let err = |context: &str| {
            let context = context.to_string();
            move |source| IcebergSinkError::Iceberg {
                table: metadata.location().to_string(),
                context: context.clone(),
                source: Box::new(source),
            }
        };
        let invalid = |e: String| iceberg::Error::new(iceberg::ErrorKind::DataInvalid, e);
        let json = self
            .files
            .encode(base, metadata, changes)
            .map_err(|e| err("encode the metadata")(invalid(e.to_string())))?;
        #[cfg(debug_assertions)]
        {
            // Debug builds (the tests) check every file against the metadata
            // it was encoded from.
            let parsed: TableMetadata = serde_json::from_slice(&json.pieces.concat())
                .map_err(|e| err("check the encoded metadata")(invalid(e.to_string())))?;
            if &parsed != metadata {
                return Err(err("check the encoded metadata")(invalid(
                    "the encoded metadata file does not read back as the metadata".into(),
                )));
            }
        }
        // The pieces go out as they are: the kept snapshots are not copied.
        let mut file = self
            .file_io
            .new_output(location)
            .map_err(err("open the metadata file"))?
            .writer()
            .await
            .map_err(err("open the metadata file"))?;
        for piece in &json.pieces {
            file.write(piece.clone())
                .await
                .map_err(err("write the metadata file"))?;
        }
        file.close().await.map_err(err("write the metadata file"))?;
        tracing::debug!(location, encoding = ?json.encoding, "wrote a metadata file");
        Ok(json)
    }

    async fn read_metadata(&self, ident: &TableIdent, location: String) -> Result<LoadedTable, IcebergSinkError> {
        let err = |source| IcebergSinkError::Iceberg {
            table: shown(ident),
            context: format!("read the metadata file {location}"),
            source: Box::new(source),
        };
        let bytes = self
            .file_io
            .new_input(&location)
            .map_err(err)?
            .read()
            .await
            .map_err(err)?;
        let metadata = if bytes.starts_with(&[0x1F, 0x8B]) {
            // A gzip-compressed file: iceberg reads it.
            TableMetadata::read_from(&self.file_io, &location).await.map_err(err)?
        } else {
            let metadata: TableMetadata = serde_json::from_slice(&bytes).map_err(|e| err(e.into()))?;
            if let Some(refs) = read_refs(&bytes) {
                self.files.loaded(&location, &metadata, refs);
            }
            metadata
        };
        Ok(LoadedTable {
            metadata,
            metadata_location: location,
        })
    }

    /// Removes a metadata file that no swap made current.
    async fn discard(&self, location: &str) {
        if let Err(e) = self.file_io.delete(location).await {
            tracing::warn!(location, error = %e, "could not delete an unused metadata file; it is an orphan");
        }
    }
}

#[async_trait]
impl Catalog for SqlCatalog {
    fn name(&self) -> &str {
        &self.name
    }

    fn file_io(&self) -> &FileIO {
        &self.file_io
    }

    fn storage_settings(&self) -> HashMap<String, String> {
        self.storage.clone()
    }

    fn default_location(&self, ident: &TableIdent) -> String {
        format!("{}/{}/{}", self.warehouse, ident.namespace.join("/"), ident.name)
    }

    async fn load(&self, ident: &TableIdent) -> Result<Option<LoadedTable>, IcebergSinkError> {
        check_ident(ident)?;
        let sql = self.sql(&format!(
            "SELECT metadata_location FROM iceberg_tables \
             WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?{}",
            self.tables_only()
        ));
        let row: Option<AnyRow> = sqlx::query(&sql)
            .bind(&self.name)
            .bind(ident.namespace.join("."))
            .bind(&ident.name)
            .fetch_optional(&self.pool)
            .await
            .map_err(self.err("look up the table"))?;
        let Some(row) = row else { return Ok(None) };
        let location: Option<String> = row.try_get(0).map_err(self.err("read the table's row"))?;
        match location {
            Some(location) => Ok(Some(self.read_metadata(ident, location).await?)),
            None => Ok(None),
        }
    }

    async fn create(&self, ident: &TableIdent, metadata: TableMetadata) -> Result<LoadedTable, IcebergSinkError> {
        check_ident(ident)?;
        let namespace = ident.namespace.join(".");
        self.ensure_namespace(&namespace).await?;
        let location = next_metadata_location(metadata.location(), None);
        let json = self.write_metadata(&location, None, &metadata, &[]).await?;
        let (columns, values) = if self.typed {
            (", iceberg_type", ", 'TABLE'")
        } else {
            ("", "")
        };
        let sql = self.sql(&format!(
            "INSERT INTO iceberg_tables \
             (catalog_name, table_namespace, table_name, metadata_location, previous_metadata_location{columns}) \
             VALUES (?, ?, ?, ?, NULL{values}) ON CONFLICT DO NOTHING"
        ));
        let inserted = sqlx::query(&sql)
            .bind(&self.name)
            .bind(&namespace)
            .bind(&ident.name)
            .bind(&location)
            .execute(&self.pool)
            .await;
        match inserted {
            Ok(done) if done.rows_affected() == 1 => {
                tracing::info!(table = %shown(ident), location, "created the Iceberg table");
                self.files.written(&location, &metadata, json);
                Ok(LoadedTable {
                    metadata,
                    metadata_location: location,
                })
            }
            Ok(_) => {
                self.discard(&location).await;
                self.load(ident).await?.ok_or_else(|| IcebergSinkError::NoSuchTable {
                    catalog: self.name.clone(),
                    table: shown(ident),
                })
            }
            Err(e) => Err(self.err("register the table")(e)),
        }
    }

    async fn list(&self, namespace: Option<&[String]>) -> Result<Vec<TableIdent>, IcebergSinkError> {
        let mut sql = format!(
            "SELECT table_namespace, table_name FROM iceberg_tables WHERE catalog_name = ?{}",
            self.tables_only()
        );
        if namespace.is_some() {
            sql.push_str(" AND table_namespace = ?");
        }
        sql.push_str(" ORDER BY table_namespace, table_name");
        let sql = self.sql(&sql);
        let mut query = sqlx::query(&sql).bind(&self.name);
        if let Some(namespace) = namespace {
            query = query.bind(namespace.join("."));
        }
        let rows = query.fetch_all(&self.pool).await.map_err(self.err("list the tables"))?;
        let mut tables = Vec::with_capacity(rows.len());
        for row in rows {
            let namespace: String = row.try_get(0).map_err(self.err("read a table's row"))?;
            let name: String = row.try_get(1).map_err(self.err("read a table's row"))?;
            let parts = namespace.split('.').map(str::to_string).collect::<Vec<_>>();
            if let Ok(namespace) = iceberg::NamespaceIdent::from_vec(parts) {
                tables.push(TableIdent::new(namespace, name));
            }
        }
        Ok(tables)
    }

    async fn drop_table(&self, ident: &TableIdent, purge: bool) -> Result<bool, IcebergSinkError> {
        check_ident(ident)?;
        let Some(table) = self.load(ident).await? else {
            return Ok(false);
        };
        let location = table.metadata.location().trim_end_matches('/').to_string();
        if purge && !location.starts_with(&format!("{}/", self.warehouse)) {
            return Err(IcebergSinkError::Config {
                catalog: self.name.clone(),
                reason: format!(
                    "table {} is at {location}, outside the catalog's warehouse {}: it is not purged; \
                     drop it without purge and delete its files yourself",
                    shown(ident),
                    self.warehouse
                ),
            });
        }
        let sql = self.sql(&format!(
            "DELETE FROM iceberg_tables WHERE catalog_name = ? AND table_namespace = ? AND table_name = ?{}",
            self.tables_only()
        ));
        let deleted = sqlx::query(&sql)
            .bind(&self.name)
            .bind(ident.namespace.join("."))
            .bind(&ident.name)
            .execute(&self.pool)
            .await
            .map_err(self.err("drop the table"))?;
        // Purge only what this drop removed: had another writer dropped and
        // re-created the name meanwhile, these could be its files.
        if purge && deleted.rows_affected() == 1 {
            self.file_io
                .delete_prefix(&format!("{location}/"))
                .await
                .map_err(|source| IcebergSinkError::Iceberg {
                    table: shown(ident),
                    context: format!("purge the table's files under {location}"),
                    source: Box::new(source),
                })?;
        }
        tracing::info!(table = %shown(ident), purge, "dropped the Iceberg table");
        Ok(deleted.rows_affected() == 1)
    }

    async fn swap(
        &self,
        ident: &TableIdent,
        base: &LoadedTable,
        metadata: TableMetadata,
        changes: &[iceberg::TableUpdate],
    ) -> Result<Swap, IcebergSinkError> {
        let location = next_metadata_location(metadata.location(), Some(&base.metadata_location));
        let json = self
            .write_metadata(&location, Some(&base.metadata_location), &metadata, changes)
            .await?;
        let sql = self.sql(
            "UPDATE iceberg_tables SET metadata_location = ?, previous_metadata_location = ? \
             WHERE catalog_name = ? AND table_namespace = ? AND table_name = ? AND metadata_location = ?",
        );
        let updated = sqlx::query(&sql)
            .bind(&location)
            .bind(&base.metadata_location)
            .bind(&self.name)
            .bind(ident.namespace.join("."))
            .bind(&ident.name)
            .bind(&base.metadata_location)
            .execute(&self.pool)
            .await
            // An error here may hide a swap that happened: the new file stays.
            .map_err(self.err("swap the table's metadata"))?;
        if updated.rows_affected() == 1 {
            self.files.written(&location, &metadata, json);
            Ok(Swap::Swapped(Box::new(LoadedTable {
                metadata,
                metadata_location: location,
            })))
        } else {
            self.discard(&location).await;
            Ok(Swap::Conflict)
        }
    }
}

/// A connection error without the connection string, which may hold a
/// password.
fn redact(e: sqlx::Error) -> sqlx::Error {
    match e {
        sqlx::Error::Configuration(_) => {
            sqlx::Error::Configuration("the catalog URI is malformed (not shown, as it may hold a password)".into())
        }
        other => other,
    }
}

/// The warehouse as a URL: a local directory becomes `file:///<absolute>`.
fn warehouse_url(warehouse: &str) -> Result<String, String> {
    if warehouse.contains("://") {
        return Ok(warehouse.trim_end_matches('/').to_string());
    }
    std::fs::create_dir_all(warehouse).map_err(|e| format!("cannot create the warehouse {warehouse:?}: {e}"))?;
    let absolute = std::fs::canonicalize(warehouse).map_err(|e| format!("warehouse {warehouse:?}: {e}"))?;
    let path = absolute
        .to_str()
        .ok_or_else(|| format!("warehouse {warehouse:?} is not valid UTF-8"))?;
    Ok(format!("file://{}", path.trim_end_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_warehouses_become_file_urls() {
        let dir = tempfile::tempdir().unwrap();
        let url = warehouse_url(dir.path().join("wh").to_str().unwrap()).unwrap();
        assert!(url.starts_with("file:///"), "{url}");
        assert!(url.ends_with("/wh"), "{url}");
        assert_eq!(warehouse_url("s3://bucket/wh/").unwrap(), "s3://bucket/wh");
    }
}
