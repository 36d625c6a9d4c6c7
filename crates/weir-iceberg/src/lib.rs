//! # weir-iceberg: the Apache Iceberg sink of weir
//!
//! [`IcebergSink`] writes each micro-batch of a weir streaming query into an
//! Iceberg table exactly once, through weir's own commit step on a catalog
//! that swaps metadata atomically ([`Catalog`]): weir-catalog's
//! `SqlCatalog` (SQLite or PostgreSQL in the JDBC catalog's schema, shared
//! with pyiceberg, Spark and DuckDB) or `RestCatalog` (the Iceberg REST
//! protocol). This crate holds the commit layer and the contract a catalog
//! keeps; weir-catalog holds the catalogs.
//!
//! ## Guarantees
//!
//! - **One atomic swap per batch.** Writers put Parquet files (with Iceberg
//!   field ids, named with the query id, batch id and a per-attempt uuid)
//!   under the table's `data/`, where no reader sees them. The commit writes
//!   one manifest of them, a manifest list and a new metadata file, then
//!   swaps the catalog's pointer from the version it built on to the new one
//!   (`UPDATE ... WHERE metadata_location = <base>`). A reader sees all of a
//!   batch or none of it.
//! - **Exactly once.** The same swap sets `weir.query.<name>.batch-id`,
//!   `.query-id` and `.attempt-id` table properties: the marker is read in
//!   O(1) on the version the commit builds on, and it survives snapshot
//!   expiry. A lost swap reloads the table and checks the marker again
//!   before trying again, so a racing run of the same query commits the
//!   batch once; a swap that landed despite an error is recognised by its
//!   attempt id. Each snapshot's summary also carries `weir.query-name`,
//!   `weir.query-id`, `weir.batch-id` and `weir.attempt-id`.
//! - **Guards.** The marker carries the query name and id, so a deleted and
//!   recreated checkpoint, an old copy of one, or a restored table is caught
//!   by weir-core's start-up guards; the table's uuid is part of the sink's
//!   identity, and a table replaced, repartitioned or stripped of a written
//!   column while the query runs fails the batch before anything of it is
//!   committed.
//! - **Empty batches** set only the marker (a metadata version without a
//!   snapshot), so a restart resumes after them.
//! - **Nothing is deleted after a swap whose outcome is unknown**; a lost
//!   swap's metadata file and manifest list are removed.
//! - **Modes.** Append is a fast append; Complete is one `overwrite`
//!   snapshot that removes every live data file and adds the batch's;
//!   Update is one `overwrite` snapshot that deletes the data files
//!   holding the batch's groups (by the aggregation's key) and adds them
//!   rewritten without those rows beside the batch's: copy-on-write, no
//!   delete files, each group once.
//! - **Manifests** are merged as Java's merge-append does: once
//!   `commit.manifest.min-count-to-merge` (default 100) small data manifests
//!   pile up, their live entries are rewritten into manifests of up to
//!   `commit.manifest.target-size-bytes` (default 1 MiB, where Java's is
//!   8 MiB: a merge holds its manifest's entries in memory;
//!   `commit.manifest-merge.enabled` turns merging off), so a snapshot's
//!   manifest list stays short and a merge's memory bounded. The sink
//!   merges in the background, once a commit leaves that many, and a later
//!   commit whose table still lists every input lists the merged manifests
//!   instead: no batch waits for a merge. A merge no commit can list is
//!   deleted, unless a swap that listed it has an unknown outcome.
//! - **Metadata.** `write.metadata.previous-versions-max` bounds the
//!   metadata log and `write.metadata.delete-after-commit.enabled` deletes
//!   what leaves it (both set, to 100 and true, on tables weir creates); `metadata/version-hint.text` names the current version
//!   for readers that open the table directory.
//!
//! ## Maintenance
//!
//! - [`Compact`] rewrites small data files into files of the target size
//!   and commits them as one `replace` snapshot per commit, built by the
//!   same commit layer and validated on the table as it is at each swap:
//!   appends made meanwhile stay, a group whose input is no longer live is
//!   dropped, a stale view is never committed.
//! - [`RewriteManifests`] merges small manifests in a `replace` snapshot
//!   that changes no row.
//! - [`ExpireSnapshots`] and [`RemoveOrphanFiles`] delete what no kept
//!   snapshot reaches; [`ExpiryPolicy`] runs expiry beside a stream.
//!
//! Schema: the stream must match the table (names and types; required
//! columns present). With `with_merge_schema(true)`, the stream's new
//! nullable columns join the table as optional columns with new field ids,
//! in the swap of the first batch that has them; if another writer changes
//! the columns meanwhile, the batch fails before anything is committed.
//!
//! Storage: a local warehouse, or object storage (`s3://`, any endpoint
//! that speaks S3) through weir-catalog's `SqlCatalog::connect_with_storage`, whose
//! file IO is `object_store` ([`ObjectStorage`]). A catalog of one's own
//! can keep every file in an `object_store` store it gives (instrumented
//! or custom) through [`store_file_io`].
//!
//! weir-catalog's `RestCatalog` is an Iceberg REST catalog (OAuth2 client credentials):
//! the swap is one commit request with the requirements
//! `assert-table-uuid` and `assert-ref-snapshot-id` on `main`, and the
//! updates weir built; the server writes the metadata file. Since those
//! requirements guard the snapshot, not the properties, every batch commits
//! a snapshot there, even an empty one, so the marker stays atomic.
//!
//! ## Example
//!
//! A stream of payments into the Iceberg table `bronze.payments` of a
//! catalog (weir-catalog's `SqlCatalog` or `RestCatalog`, or your own
//! [`Catalog`]), exactly once:
//!
//! ```no_run
//! use std::sync::Arc;
//! use weir_core::prelude::*;
//! use weir_iceberg::{Catalog, IcebergSink};
//!
//! # async fn run(catalog: Arc<dyn Catalog>) -> Result<(), BoxError> {
//! let sink = IcebergSink::try_new(catalog, "bronze.payments")?
//!     .with_partition_by(["day(ts)"]) // for a table it creates
//!     .with_merge_schema(true); // new nullable columns join the table
//! let query = read_stream(RateSource::rows_per_second(1_000))
//!     .write_stream()
//!     .query_name("payments-bronze") // the table's marker properties
//!     .checkpoint_location("chk/payments-bronze")
//!     .start(sink)
//!     .await?;
//! query.await_termination().await?;
//! # Ok(())
//! # }
//! ```

mod catalog;
mod commit;
mod compact;
mod data_files;
mod error;
mod expire;
mod manifests;
mod marker;
mod merge_ahead;
pub mod metadata_file;
mod orphans;
mod reachable;
mod read;
mod sink;
mod storage;
mod table;
mod upsert;
mod writer;

pub use catalog::{check_ident, parse_ident, shown, Catalog, LoadedTable, Swap};
pub use compact::Compact;
pub use error::{IcebergSinkError, PolicyExpiryRefusal};
pub use expire::{ExpireOptions, ExpireReport, ExpireSnapshots};
pub use manifests::{ManifestReport, RewriteManifests};
pub use orphans::{OrphanReport, RemoveOrphanFiles, DEFAULT_ORPHAN_AGE};
pub use read::{current_snapshot, read_rows, table_schema, TableRows};
pub use sink::{ExpiryPolicy, IcebergSink};
pub use storage::{
    file_io, is_secret_setting, local_file_io, object_file_io, object_store_at, store_file_io, LocalStorage,
    LocalStorageFactory, ObjectStorage, ObjectStoreFactory,
};
pub use table::DEFAULT_TARGET_FILE_SIZE;
pub use weir_core::maintenance::{CompactGroup, CompactOptions, CompactProgress, CompactReport};
