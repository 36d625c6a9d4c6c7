//! The error type of weir-catalog.

use std::path::PathBuf;

/// What can go wrong when tables are found, created or dropped by name.
/// Every variant names the catalog, table or setting; none carries a
/// password or secret.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// The configuration file could not be read.
    #[error("cannot read the weir configuration {path}: {source}")]
    ReadConfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The configuration is malformed or incomplete.
    #[error("weir configuration{}: {reason}", at.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Config { at: Option<PathBuf>, reason: String },

    /// A setting refers to an environment variable that is not set.
    #[error("catalog {catalog:?}: setting {setting} needs the environment variable {variable}, which is not set")]
    MissingVariable {
        catalog: String,
        setting: String,
        variable: String,
    },

    /// A table name is not valid.
    #[error("invalid table name {name:?}: {reason}")]
    Name { name: String, reason: String },

    /// No catalog has that name.
    #[error("no catalog named {catalog:?} (configured: {known}){hint}")]
    NoSuchCatalog {
        catalog: String,
        known: String,
        hint: String,
    },

    /// The table is not in its catalog.
    #[error("table {name} does not exist")]
    NoSuchTable { name: String },

    /// The table exists in another format than the one asked for.
    #[error("table {name} is stored as {existing}, not {asked}; nothing was written (leave the format out to write it as {existing})")]
    FormatMismatch {
        name: String,
        existing: String,
        asked: String,
    },

    /// The catalog cannot do this.
    #[error("catalog {catalog:?}: {reason}")]
    Unsupported { catalog: String, reason: String },

    /// The catalog's database failed.
    #[error("catalog {catalog:?}: {operation}: {source}")]
    Database {
        catalog: String,
        operation: String,
        #[source]
        source: sqlx::Error,
    },

    /// A file operation of a path catalog failed.
    #[error("catalog {catalog:?}: {operation}: {source}")]
    Io {
        catalog: String,
        operation: String,
        #[source]
        source: std::io::Error,
    },

    /// A table's folder would hold another table's, or sit inside one.
    #[error("table {name} cannot be created: its folder would {relation} table {other}'s; nothing was created (choose a name that is not a prefix or extension of another table's)")]
    Nested {
        name: String,
        relation: &'static str,
        other: String,
    },

    /// Deleting a table's files failed (some may be gone).
    #[error("catalog {catalog:?}: could not delete the files under {location}: {source}")]
    Purge {
        catalog: String,
        location: String,
        #[source]
        source: Box<iceberg::Error>,
    },

    /// The Delta sink refused or failed.
    #[error(transparent)]
    Delta(Box<weir_delta::DeltaSinkError>),

    /// The Iceberg catalog or sink refused or failed.
    #[error(transparent)]
    Iceberg(Box<weir_iceberg::IcebergSinkError>),
}

impl CatalogError {
    /// Whether trying again may succeed: a database or store that did not
    /// answer, a lost commit race. Not a setting, a name or a refusal, nor a
    /// full or read-only disk.
    pub fn retryable(&self) -> bool {
        match self {
            CatalogError::Database { source, .. } => database_retryable(source),
            CatalogError::Io { source, .. } => weir_core::permanent_io_kind(source).is_none(),
            CatalogError::Purge { source, .. } => source.retryable(),
            CatalogError::Delta(e) => e.retryable(),
            CatalogError::Iceberg(e) => e.retryable(),
            _ => false,
        }
    }
}

impl From<weir_delta::DeltaSinkError> for CatalogError {
    fn from(e: weir_delta::DeltaSinkError) -> Self {
        CatalogError::Delta(Box::new(e))
    }
}

impl From<weir_iceberg::IcebergSinkError> for CatalogError {
    fn from(e: weir_iceberg::IcebergSinkError) -> Self {
        CatalogError::Iceberg(Box::new(e))
    }
}

/// How a request to the REST catalog failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RestError {
    /// The request got no answer: the server could not be reached, the
    /// connection broke, or it did not answer in time.
    #[error("no answer: {0}")]
    Request(#[source] reqwest::Error),

    /// The answer began but its body did not arrive whole: the connection
    /// broke or timed out while it was read. What the request did is
    /// unknown.
    #[error("the answer was cut off: {0}")]
    Cut(#[source] reqwest::Error),

    /// The server answered with an error status.
    #[error("the server answered {status}: {message}")]
    Status {
        status: reqwest::StatusCode,
        /// The error's message from the body, or the start of a body that
        /// is not the protocol's error (a proxy's page).
        message: String,
    },

    /// The server refused the OAuth2 client credential.
    #[error("the server refused the OAuth2 client credential with {status} (the credential is not shown)")]
    Credential { status: reqwest::StatusCode },

    /// Part of a successful answer is not what the protocol describes.
    #[error("the answer's {part} is not valid: {source}")]
    Malformed {
        part: &'static str,
        #[source]
        source: serde_json::Error,
    },

    /// A successful answer lacks a part the protocol requires.
    #[error("the answer has no {part}")]
    Missing { part: &'static str },
}

impl RestError {
    /// Whether trying again may succeed: a request that got no answer or
    /// whose answer was cut off, a server error, or a server that asks to
    /// slow down. Not a refusal
    /// (4xx) or an answer weir cannot read.
    pub fn retryable(&self) -> bool {
        match self {
            RestError::Request(e) => !e.is_builder() && !e.is_redirect() && !e.is_decode(),
            RestError::Cut(_) => true,
            RestError::Status { status, .. } | RestError::Credential { status } => {
                status.is_server_error()
                    || *status == reqwest::StatusCode::TOO_MANY_REQUESTS
                    || *status == reqwest::StatusCode::REQUEST_TIMEOUT
            }
            RestError::Malformed { .. } | RestError::Missing { .. } => false,
        }
    }
}

/// Whether a catalog database's failure may pass on a retry: the
/// connection or its pool, not a query the database refused.
pub fn database_retryable(e: &sqlx::Error) -> bool {
    matches!(
        e,
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed
    )
}
