//! Catalog configuration: a TOML file, or built in code.
//!
//! ```toml
//! default_catalog = "lake"
//!
//! [catalogs.lake]
//! type = "sql"                          # sql | rest | path
//! uri = "sqlite://weir-lake/catalog.db" # or postgres://user:${PGPASSWORD}@host/db
//! warehouse = "weir-lake/warehouse"     # a directory or s3://bucket/path
//! format = "delta"                      # default format of new tables
//!
//! [catalogs.lake.storage]               # object storage settings
//! "s3.endpoint" = "http://127.0.0.1:9000"
//! "s3.secret-access-key" = "${S3_SECRET}"
//! ```
//!
//! `${NAME}` in a value is replaced by the environment variable `NAME`;
//! secrets belong there rather than in the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::CatalogError;
use crate::format::TableFormat;

/// The embedded default catalog's name.
pub const DEFAULT_CATALOG: &str = "lake";

/// Where the embedded default lives unless `WEIR_LAKE` says otherwise.
pub const DEFAULT_LAKE_DIR: &str = "weir-lake";

/// The kind of a catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CatalogKind {
    /// A SQL database (SQLite or PostgreSQL): Iceberg tables in the JDBC
    /// catalog's tables, Delta tables in weir's own `weir_tables`.
    Sql,
    /// An Iceberg REST catalog (Iceberg tables only).
    Rest,
    /// A warehouse directory of `namespace/table` folders.
    Path,
}

/// One catalog's settings.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatalogConfig {
    /// The kind of catalog.
    #[serde(rename = "type")]
    pub kind: CatalogKind,
    /// The database (`sql`) or server (`rest`). May hold a password: never
    /// shown.
    #[serde(default)]
    pub uri: Option<String>,
    /// Where new tables go (`sql`, `path`), or the REST warehouse.
    #[serde(default)]
    pub warehouse: Option<String>,
    /// The format of new tables (default: delta; iceberg on `rest`).
    #[serde(default)]
    pub format: Option<TableFormat>,
    /// OAuth2 client credentials of a REST catalog, `client_id:secret`.
    /// Never shown.
    #[serde(default)]
    pub credential: Option<String>,
    /// Object storage settings: `s3.endpoint`, `s3.region`,
    /// `s3.access-key-id`, `s3.secret-access-key`, `s3.session-token`.
    #[serde(default)]
    pub storage: BTreeMap<String, String>,
}

impl std::fmt::Debug for CatalogConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let storage: BTreeMap<&String, &str> = self
            .storage
            .iter()
            .map(|(k, v)| {
                (
                    k,
                    if weir_iceberg::is_secret_setting(k) {
                        "<hidden>"
                    } else {
                        v.as_str()
                    },
                )
            })
            .collect();
        f.debug_struct("CatalogConfig")
            .field("kind", &self.kind)
            .field("uri", &self.uri.as_ref().map(|_| "<hidden>"))
            .field("warehouse", &self.warehouse)
            .field("format", &self.format)
            .field("credential", &self.credential.as_ref().map(|_| "<hidden>"))
            .field("storage", &storage)
            .finish()
    }
}

impl CatalogConfig {
    /// A SQL catalog.
    pub fn sql(uri: impl Into<String>, warehouse: impl Into<String>) -> Self {
        Self::new(CatalogKind::Sql, Some(uri.into()), Some(warehouse.into()))
    }

    /// An Iceberg REST catalog.
    pub fn rest(uri: impl Into<String>, warehouse: impl Into<String>) -> Self {
        Self::new(CatalogKind::Rest, Some(uri.into()), Some(warehouse.into()))
    }

    /// A warehouse directory.
    pub fn path(warehouse: impl Into<String>) -> Self {
        Self::new(CatalogKind::Path, None, Some(warehouse.into()))
    }

    fn new(kind: CatalogKind, uri: Option<String>, warehouse: Option<String>) -> Self {
        CatalogConfig {
            kind,
            uri,
            warehouse,
            format: None,
            credential: None,
            storage: BTreeMap::new(),
        }
    }

    /// With a default format for new tables.
    pub fn with_format(mut self, format: TableFormat) -> Self {
        self.format = Some(format);
        self
    }

    /// With an object storage setting.
    pub fn with_storage(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.storage.insert(key.into(), value.into());
        self
    }

    /// With OAuth2 client credentials (`client_id:secret`).
    pub fn with_credential(mut self, credential: impl Into<String>) -> Self {
        self.credential = Some(credential.into());
        self
    }

    /// The format of new tables.
    pub fn default_format(&self) -> TableFormat {
        self.format.unwrap_or(match self.kind {
            CatalogKind::Rest => TableFormat::Iceberg,
            _ => TableFormat::Delta,
        })
    }

    /// Checks the settings the kind needs, naming what is missing.
    pub(crate) fn check(&self, name: &str) -> Result<(), String> {
        let needs = |what: &str, value: &Option<String>| match value {
            Some(v) if !v.is_empty() => Ok(()),
            _ => Err(format!("catalog {name:?} ({:?}) needs `{what}`", self.kind)),
        };
        match self.kind {
            CatalogKind::Sql => {
                needs("uri", &self.uri)?;
                needs("warehouse", &self.warehouse)?;
            }
            CatalogKind::Rest => {
                needs("uri", &self.uri)?;
                needs("warehouse", &self.warehouse)?;
                if self.format == Some(TableFormat::Delta) {
                    return Err(format!(
                        "catalog {name:?} is a REST catalog, which holds Iceberg tables only; remove `format = \"delta\"`"
                    ));
                }
            }
            CatalogKind::Path => needs("warehouse", &self.warehouse)?,
        }
        if let Some(c) = &self.credential {
            if !c.contains(':') {
                return Err(format!("catalog {name:?}: `credential` must be client_id:secret"));
            }
        }
        Ok(())
    }

    /// Replaces `${NAME}` in every value with the environment variable.
    fn substitute(&mut self, name: &str) -> Result<(), CatalogError> {
        let fill = |setting: &str, value: &mut String| -> Result<(), CatalogError> {
            *value = substitute(value).map_err(|variable| CatalogError::MissingVariable {
                catalog: name.to_string(),
                setting: setting.to_string(),
                variable,
            })?;
            Ok(())
        };
        for (setting, value) in [
            ("uri", &mut self.uri),
            ("warehouse", &mut self.warehouse),
            ("credential", &mut self.credential),
        ] {
            if let Some(v) = value.as_mut() {
                fill(setting, v)?;
            }
        }
        for (key, value) in self.storage.iter_mut() {
            fill(&format!("storage.{key}"), value)?;
        }
        Ok(())
    }
}

/// `${NAME}` replaced by the variable; the name of a missing one as error.
fn substitute(value: &str) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let variable = &rest[start + 2..start + end];
        out.push_str(&std::env::var(variable).map_err(|_| variable.to_string())?);
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    default_catalog: Option<String>,
    #[serde(default)]
    catalogs: BTreeMap<String, CatalogConfig>,
}

/// Every configured catalog, and which one a `namespace.table` name uses.
#[derive(Debug, Clone)]
pub struct Config {
    catalogs: BTreeMap<String, CatalogConfig>,
    default_catalog: Option<String>,
}

impl Config {
    /// No catalogs yet.
    pub fn empty() -> Self {
        Config {
            catalogs: BTreeMap::new(),
            default_catalog: None,
        }
    }

    /// The embedded default: catalog `lake`, SQLite at `<root>/catalog.db`,
    /// tables under `<root>/warehouse`, new tables in Delta.
    pub fn embedded(root: &Path) -> Self {
        let uri = format!("sqlite://{}", root.join("catalog.db").display());
        let warehouse = root.join("warehouse").display().to_string();
        Config::empty().with_catalog(DEFAULT_CATALOG, CatalogConfig::sql(uri, warehouse))
    }

    /// The configuration of this process: the file named by `WEIR_CONFIG`,
    /// else the embedded default under `WEIR_LAKE` (default `./weir-lake`).
    pub fn from_env() -> Result<Self, CatalogError> {
        match std::env::var_os("WEIR_CONFIG") {
            Some(path) => Config::from_file(Path::new(&path)),
            None => Ok(Config::embedded(&lake_dir(None))),
        }
    }

    /// Reads a TOML configuration file.
    pub fn from_file(path: &Path) -> Result<Self, CatalogError> {
        let text = std::fs::read_to_string(path).map_err(|source| CatalogError::ReadConfig {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_toml(&text).map_err(|e| match e {
            CatalogError::Config { at: None, reason } => CatalogError::Config {
                at: Some(path.to_path_buf()),
                reason,
            },
            other => other,
        })
    }

    /// Parses a TOML configuration.
    pub fn from_toml(text: &str) -> Result<Self, CatalogError> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| CatalogError::Config {
            at: None,
            reason: e.message().to_string(),
        })?;
        let mut config = Config {
            catalogs: BTreeMap::new(),
            default_catalog: file.default_catalog,
        };
        for (name, mut catalog) in file.catalogs {
            crate::name::check_part(&name, &name)?;
            catalog.substitute(&name)?;
            config.catalogs.insert(name, catalog);
        }
        config.check()?;
        Ok(config)
    }

    /// With one more catalog (the first one added is the default).
    pub fn with_catalog(mut self, name: impl Into<String>, catalog: CatalogConfig) -> Self {
        let name = name.into();
        if self.default_catalog.is_none() {
            self.default_catalog = Some(name.clone());
        }
        self.catalogs.insert(name, catalog);
        self
    }

    /// With `name` as the catalog of `namespace.table` names.
    pub fn with_default_catalog(mut self, name: impl Into<String>) -> Self {
        self.default_catalog = Some(name.into());
        self
    }

    /// The catalog of `namespace.table` names: the configured default, or
    /// the only catalog.
    pub fn default_catalog(&self) -> Option<&str> {
        self.default_catalog
            .as_deref()
            .or_else(|| (self.catalogs.len() == 1).then(|| self.catalogs.keys().next().unwrap().as_str()))
    }

    /// A catalog's settings.
    pub fn catalog(&self, name: &str) -> Option<&CatalogConfig> {
        self.catalogs.get(name)
    }

    /// The catalogs' names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.catalogs.keys().map(String::as_str)
    }

    /// Checks every catalog's settings.
    pub fn check(&self) -> Result<(), CatalogError> {
        let err = |reason: String| CatalogError::Config { at: None, reason };
        for (name, catalog) in &self.catalogs {
            catalog.check(name).map_err(err)?;
        }
        if let Some(default) = &self.default_catalog {
            if !self.catalogs.contains_key(default) {
                return Err(err(format!("default_catalog {default:?} is not among the catalogs")));
            }
        }
        if self.catalogs.is_empty() {
            return Err(err("no catalogs are configured ([catalogs.<name>] sections)".into()));
        }
        Ok(())
    }
}

/// The embedded default's root: `dir`, else `WEIR_LAKE`, else `./weir-lake`.
pub fn lake_dir(dir: Option<&Path>) -> PathBuf {
    dir.map(Path::to_path_buf)
        .or_else(|| std::env::var_os("WEIR_LAKE").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_LAKE_DIR))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
        default_catalog = "lake"

        [catalogs.lake]
        type = "sql"
        uri = "sqlite://lake/catalog.db"
        warehouse = "lake/warehouse"

        [catalogs.pg]
        type = "sql"
        uri = "postgres://weir:${WEIR_CATALOG_TEST_PASSWORD}@127.0.0.1/weir"
        warehouse = "s3://bucket/wh"
        format = "iceberg"
        [catalogs.pg.storage]
        "s3.endpoint" = "http://127.0.0.1:9000"
        "s3.secret-access-key" = "${WEIR_CATALOG_TEST_PASSWORD}"

        [catalogs.rest]
        type = "rest"
        uri = "http://127.0.0.1:8181"
        warehouse = "s3://tables/"
        credential = "weir:${WEIR_CATALOG_TEST_PASSWORD}"

        [catalogs.files]
        type = "path"
        warehouse = "/data/lake"
    "#;

    #[test]
    fn a_full_file_parses_with_variables_and_defaults() {
        std::env::set_var("WEIR_CATALOG_TEST_PASSWORD", "s3cr3t-pw");
        let config = Config::from_toml(FULL).unwrap();
        assert_eq!(config.names().collect::<Vec<_>>(), ["files", "lake", "pg", "rest"]);
        assert_eq!(config.default_catalog(), Some("lake"));
        let pg = config.catalog("pg").unwrap();
        assert_eq!(pg.uri.as_deref(), Some("postgres://weir:s3cr3t-pw@127.0.0.1/weir"));
        assert_eq!(pg.storage["s3.secret-access-key"], "s3cr3t-pw");
        assert_eq!(pg.default_format(), TableFormat::Iceberg);
        assert_eq!(config.catalog("lake").unwrap().default_format(), TableFormat::Delta);
        assert_eq!(config.catalog("rest").unwrap().default_format(), TableFormat::Iceberg);
        // Secrets never reach Debug output.
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cr3t-pw"), "{shown}");
        assert!(shown.contains("http://127.0.0.1:9000"), "{shown}");
    }

    #[test]
    fn a_missing_variable_is_named() {
        let text =
            "[catalogs.a]\ntype = \"sql\"\nuri = \"postgres://u:${WEIR_CATALOG_TEST_UNSET}@h/db\"\nwarehouse = \"w\"";
        let e = Config::from_toml(text).unwrap_err().to_string();
        assert!(
            e.contains("WEIR_CATALOG_TEST_UNSET") && e.contains("uri") && e.contains("\"a\""),
            "{e}"
        );
    }

    #[test]
    fn incomplete_or_wrong_settings_are_refused() {
        for (text, says) in [
            ("[catalogs.a]\ntype = \"sql\"\nwarehouse = \"w\"", "needs `uri`"),
            ("[catalogs.a]\ntype = \"path\"", "needs `warehouse`"),
            (
                "[catalogs.a]\ntype = \"rest\"\nuri = \"http://x\"\nwarehouse = \"w\"\nformat = \"delta\"",
                "Iceberg tables only",
            ),
            ("[catalogs.a]\ntype = \"hive\"\nwarehouse = \"w\"", "unknown variant"),
            (
                "[catalogs.a]\ntype = \"path\"\nwarehouse = \"w\"\nwarehose = \"x\"",
                "unknown field",
            ),
            (
                "default_catalog = \"b\"\n[catalogs.a]\ntype = \"path\"\nwarehouse = \"w\"",
                "not among",
            ),
            ("", "no catalogs"),
            ("[catalogs.\"a.b\"]\ntype = \"path\"\nwarehouse = \"w\"", "'.'"),
        ] {
            let e = Config::from_toml(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn the_embedded_default_is_sqlite_under_the_lake_dir() {
        let root = tempfile::tempdir().unwrap();
        let config = Config::embedded(root.path());
        let lake = config.catalog(DEFAULT_CATALOG).unwrap();
        assert_eq!(lake.kind, CatalogKind::Sql);
        let db = root.path().join("catalog.db");
        assert_eq!(lake.uri.clone().unwrap(), format!("sqlite://{}", db.display()));
        let warehouse = root.path().join("warehouse");
        assert_eq!(lake.warehouse.clone().unwrap(), warehouse.display().to_string());
        assert_eq!(lake.default_format(), TableFormat::Delta);
        assert_eq!(config.default_catalog(), Some(DEFAULT_CATALOG));
    }
}
