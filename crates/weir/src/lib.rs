//! weir: exactly-once micro-batch streaming into Delta Lake and Apache
//! Iceberg tables, by name.
//!
//! ```no_run
//! use std::time::Duration;
//! use weir::prelude::*;
//!
//! # async fn f() -> Result<()> {
//! let payments = read_stream(RateSource::rows_per_batch(1_000));
//! let query = payments
//!     .write_stream()
//!     .checkpoint_location("chk/payments-bronze")
//!     .trigger(Trigger::processing_time(Duration::from_secs(60)))
//!     .to_table("lake.bronze.payments")
//!     .await?;
//! query.await_termination().await?;
//! # Ok(()) }
//! ```
//!
//! `to_table` resolves the name through the catalogs of `WEIR_CONFIG` (or
//! the embedded default: catalog `lake`, SQLite under `./weir-lake`, new
//! tables in Delta), creates the table from the stream's schema when it is
//! missing, and starts the query on its Delta or Iceberg sink.
//!
//! # Guarantees
//!
//! Those of the parts: every batch lands in the table exactly once across
//! crashes and restarts ([`weir_core`], [`delta`], [`iceberg`]); names are
//! checked and resolved as [`catalog`] documents. A query that names no
//! query takes the table's full name as its query name, so a checkpoint
//! deleted while the table keeps its output is refused rather than
//! silently restarted (set [`StreamWriter::query_name`] to run several
//! queries into one table).

pub use weir_catalog as catalog;
pub use weir_core::*;
pub use weir_delta as delta;
pub use weir_files as files;
pub use weir_iceberg as iceberg;
/// The Kafka source and sink (feature `kafka`; `kafka-tls` adds TLS and
/// SASL SCRAM on the system's OpenSSL, `kafka-tls-vendored` on one built
/// from source).
#[cfg(feature = "kafka")]
pub use weir_kafka as kafka;
/// SQL over each micro-batch and the stateful operators (feature `sql`,
/// on DataFusion).
#[cfg(feature = "sql")]
pub use weir_sql as sql;

#[cfg(feature = "sql")]
mod static_table;
#[cfg(feature = "sql")]
pub use static_table::{static_delta_table, static_table};

use weir_catalog::{CatalogError, Catalogs, TableOptions};

/// What can go wrong starting a query on a table by name.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The name, catalog or table was refused.
    #[error(transparent)]
    Catalog(#[from] Box<CatalogError>),
    /// The query failed to start or run.
    #[error(transparent)]
    Query(#[from] weir_core::Error),
}

/// The result type of weir: its [`Error`] composes with `?` from the
/// engine's, the catalogs' and each sink's errors.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether trying again may succeed (a catalog that did not answer, a
    /// lost commit race), not a refusal or a setting to fix.
    pub fn retryable(&self) -> bool {
        match self {
            Error::Catalog(e) => e.retryable(),
            Error::Query(e) => e.retryable(),
        }
    }
}

impl From<CatalogError> for Error {
    fn from(e: CatalogError) -> Self {
        Error::Catalog(Box::new(e))
    }
}

/// A sink's, source's or maintenance job's own error, as the engine reports
/// it (with its retryable judgement).
macro_rules! from_sink_error {
    ($($error:ty),*) => {$(
        impl From<$error> for Error {
            fn from(e: $error) -> Self {
                Error::Query(e.into())
            }
        }
    )*};
}
from_sink_error!(
    weir_delta::DeltaSinkError,
    weir_iceberg::IcebergSinkError,
    weir_files::FileSinkError
);
#[cfg(feature = "kafka")]
from_sink_error!(weir_kafka::KafkaError);

/// An idempotent writer on the table `name` of `catalogs` under the
/// application id `app_id`, for `foreach_batch` functions that write a
/// batch to several tables: each (application id, version) lands once, its
/// marker in the same commit as its rows (see [`sink::TableWriter`]). A
/// missing table is created from the first write's rows, in
/// `options.format` or the catalog's default format.
pub async fn table_writer(
    catalogs: &Catalogs,
    name: &str,
    options: TableOptions,
    app_id: &str,
) -> Result<sink::TableWriter, Error> {
    let target = catalogs.sink(name, &options).await?;
    Ok(sink::TableWriter::from_arc(target.sink, app_id)?)
}

/// `to_table` on a [`StreamWriter`].
#[async_trait::async_trait]
pub trait ToTable {
    /// Starts the query on the table `name` (`catalog.namespace.table` or
    /// `namespace.table`) of the catalogs from the environment, creating
    /// it in the catalog's default format if it is missing.
    async fn to_table(self, name: &str) -> Result<StreamingQuery, Error>;

    /// As [`ToTable::to_table`], with given catalogs and table options
    /// (format, partitioning, properties).
    async fn to_table_in(self, catalogs: &Catalogs, name: &str, options: TableOptions)
        -> Result<StreamingQuery, Error>;
}

#[async_trait::async_trait]
impl ToTable for StreamWriter {
    async fn to_table(self, name: &str) -> Result<StreamingQuery, Error> {
        let catalogs = Catalogs::from_env()?;
        self.to_table_in(&catalogs, name, TableOptions::new()).await
    }

    async fn to_table_in(
        self,
        catalogs: &Catalogs,
        name: &str,
        options: TableOptions,
    ) -> Result<StreamingQuery, Error> {
        let target = catalogs.sink(name, &options).await?;
        let query = self
            .default_query_name(target.table.name.to_string())
            .start_arc(target.sink)
            .await?;
        Ok(query)
    }
}

/// The README and every page of `docs/`: their Rust code blocks are
/// compiled as doc tests, so what they show is the API as it is.
#[cfg(doctest)]
mod docs {
    #[doc = include_str!("../../../README.md")]
    mod readme {}
    #[doc = include_str!("../../../docs/benchmarks.md")]
    mod benchmarks {}
    #[doc = include_str!("../../../docs/catalogs.md")]
    mod catalogs {}
    #[doc = include_str!("../../../docs/command.md")]
    mod command {}
    #[doc = include_str!("../../../docs/commit-sequence.md")]
    mod commit_sequence {}
    #[doc = include_str!("../../../docs/delta.md")]
    mod delta {}
    #[doc = include_str!("../../../docs/files.md")]
    mod files {}
    #[doc = include_str!("../../../docs/foreach-batch.md")]
    mod foreach_batch {}
    #[doc = include_str!("../../../docs/getting-started.md")]
    mod getting_started {}
    #[doc = include_str!("../../../docs/iceberg.md")]
    mod iceberg {}
    #[doc = include_str!("../../../docs/kafka.md")]
    mod kafka {}
    #[cfg(feature = "sql")]
    #[doc = include_str!("../../../docs/stateful.md")]
    mod stateful {}
    #[doc = include_str!("../../../docs/layout.md")]
    mod layout {}
    #[doc = include_str!("../../../docs/maintenance.md")]
    mod maintenance {}
    #[doc = include_str!("../../../docs/testing.md")]
    mod testing {}
}

/// What an application needs: the engine's prelude, `to_table`, catalogs
/// and table options, and weir's [`Error`](crate::Error) and
/// [`Result`](crate::Result) (not the engine's), so `?` works on all of them.
pub mod prelude {
    pub use weir_catalog::{Catalogs, TableFormat, TableOptions};
    pub use weir_core::prelude::*;
    #[cfg(feature = "sql")]
    pub use weir_sql::StreamSqlExt;

    pub use crate::{Error, Result, ToTable};
}
