//! The Iceberg catalogs: a SQL database in the JDBC catalog's schema, and
//! the Iceberg REST protocol. Each keeps weir-iceberg's [`Catalog`]
//! contract, the one swap the commit layer asks of a catalog.
//!
//! [`Catalog`]: weir_iceberg::Catalog

mod rest;
mod sql;

pub use rest::RestCatalog;
pub use sql::SqlCatalog;
