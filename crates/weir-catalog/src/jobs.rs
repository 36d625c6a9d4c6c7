//! The maintenance jobs of one format, on a table by name: Delta's vacuum,
//! Iceberg's snapshot expiry, orphan removal and manifest rewrite. Each is
//! made by a [`TableRef`] method and run by awaiting it; on a table of the
//! other format it is refused, naming what does that work there.

use std::time::Duration;

use crate::catalogs::Catalogs;
use crate::error::CatalogError;
use crate::table_ref::TableRef;

const VACUUM_IS_DELTAS: &str =
    "vacuum is for Delta tables; an Iceberg table's old files go with snapshot expiry and orphan removal";
const EXPIRY_IS_ICEBERGS: &str = "snapshot expiry is for Iceberg tables; a Delta table's old files go with vacuum";
const ORPHANS_ARE_ICEBERGS: &str = "orphan removal is for Iceberg tables; a Delta table's go with vacuum";
const MANIFESTS_ARE_ICEBERGS: &str = "manifests are Iceberg's; a Delta table's log is kept short by log checkpoints";

impl<'a> TableRef<'a> {
    /// A vacuum of this Delta table (see [`weir_delta::Vacuum`]).
    pub fn vacuum(&self) -> VacuumJob<'a> {
        VacuumJob::new(self.clone())
    }

    /// Expiry of this Iceberg table's old snapshots (see
    /// [`weir_iceberg::ExpireSnapshots`]).
    pub fn expire_snapshots(&self) -> ExpireSnapshotsJob<'a> {
        ExpireSnapshotsJob::new(self.clone())
    }

    /// Removal of this Iceberg table's orphan files (see
    /// [`weir_iceberg::RemoveOrphanFiles`]).
    pub fn remove_orphan_files(&self) -> RemoveOrphanFilesJob<'a> {
        RemoveOrphanFilesJob::new(self.clone())
    }

    /// A merge of this Iceberg table's small manifests (see
    /// [`weir_iceberg::RewriteManifests`]).
    pub fn rewrite_manifests(&self) -> RewriteManifestsJob<'a> {
        RewriteManifestsJob::new(self.clone())
    }
}

/// A vacuum of a Delta table by name (see [`weir_delta::Vacuum`]): files
/// no version within the retention (default 7 days) needs, and files of
/// failed writes older than it.
#[must_use = "a job does nothing until it is awaited"]
#[derive(Debug, Clone)]
pub struct VacuumJob<'a> {
    table: TableRef<'a>,
    retention: Option<Duration>,
    force: bool,
    dry_run: bool,
}

impl<'a> VacuumJob<'a> {
    pub(crate) fn new(table: TableRef<'a>) -> Self {
        VacuumJob {
            table,
            retention: None,
            force: false,
            dry_run: false,
        }
    }

    /// Keeps what versions younger than `retention` need.
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = Some(retention);
        self
    }

    /// Accepts a retention shorter than the table's
    /// `delta.deletedFileRetentionDuration` (see [`weir_delta::Vacuum::with_force`]).
    pub fn with_force(mut self, yes: bool) -> Self {
        self.force = yes;
        self
    }

    /// Lists the files; deletes nothing.
    pub fn with_dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }

    /// Runs the vacuum; awaiting the job does the same.
    pub async fn run(&self) -> Result<weir_delta::VacuumReport, CatalogError> {
        let (table, storage) = self.table.delta(VACUUM_IS_DELTAS).await?;
        let mut vacuum = weir_delta::Vacuum::new(&table.location)?
            .with_storage_options(storage)
            .with_force(self.force)
            .with_dry_run(self.dry_run);
        if let Some(retention) = self.retention {
            vacuum = vacuum.with_retention(retention);
        }
        Ok(vacuum.await?)
    }
}

weir_core::awaitable!(<'a> VacuumJob<'a> => Result<weir_delta::VacuumReport, CatalogError>);

/// Expiry of an Iceberg table's old snapshots, by name (see
/// [`weir_iceberg::ExpireSnapshots`]); by default as the table's
/// `history.expire.*` properties say.
#[must_use = "a job does nothing until it is awaited"]
#[derive(Debug, Clone)]
pub struct ExpireSnapshotsJob<'a> {
    table: TableRef<'a>,
    options: weir_iceberg::ExpireOptions,
}

impl<'a> ExpireSnapshotsJob<'a> {
    pub(crate) fn new(table: TableRef<'a>) -> Self {
        ExpireSnapshotsJob {
            table,
            options: weir_iceberg::ExpireOptions::default(),
        }
    }

    weir_iceberg::expire_setters!(options);

    /// Expires the snapshots and deletes the files only they referenced;
    /// awaiting the job does the same.
    pub async fn run(&self) -> Result<weir_iceberg::ExpireReport, CatalogError> {
        let (catalog, name) = self.table.iceberg(EXPIRY_IS_ICEBERGS).await?;
        let expire = weir_iceberg::ExpireSnapshots::new(catalog, &name)?.with_options(self.options.clone());
        Ok(expire.await?)
    }
}

weir_core::awaitable!(<'a> ExpireSnapshotsJob<'a> => Result<weir_iceberg::ExpireReport, CatalogError>);

/// Removal of an Iceberg table's files that nothing references, by name
/// (see [`weir_iceberg::RemoveOrphanFiles`]); by default of those older
/// than three days.
#[must_use = "a job does nothing until it is awaited"]
#[derive(Debug, Clone)]
pub struct RemoveOrphanFilesJob<'a> {
    table: TableRef<'a>,
    older_than: Option<Duration>,
    allow_recent: bool,
    dry_run: bool,
}

impl<'a> RemoveOrphanFilesJob<'a> {
    pub(crate) fn new(table: TableRef<'a>) -> Self {
        RemoveOrphanFilesJob {
            table,
            older_than: None,
            allow_recent: false,
            dry_run: false,
        }
    }

    /// Only files older than `age` may go (see
    /// [`weir_iceberg::RemoveOrphanFiles::with_older_than`]).
    pub fn with_older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// Accepts an age under an hour, for when no writer is running (see
    /// [`weir_iceberg::RemoveOrphanFiles::with_allow_recent`]).
    pub fn with_allow_recent(mut self, yes: bool) -> Self {
        self.allow_recent = yes;
        self
    }

    /// Lists the orphans; deletes nothing.
    pub fn with_dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }

    /// Finds the orphans and deletes them; awaiting the job does the same.
    pub async fn run(&self) -> Result<weir_iceberg::OrphanReport, CatalogError> {
        let (catalog, name) = self.table.iceberg(ORPHANS_ARE_ICEBERGS).await?;
        let mut job = weir_iceberg::RemoveOrphanFiles::new(catalog, &name)?
            .with_allow_recent(self.allow_recent)
            .with_dry_run(self.dry_run);
        if let Some(age) = self.older_than {
            job = job.with_older_than(age);
        }
        Ok(job.await?)
    }
}

weir_core::awaitable!(<'a> RemoveOrphanFilesJob<'a> => Result<weir_iceberg::OrphanReport, CatalogError>);

/// A merge of an Iceberg table's small manifests, by name (see
/// [`weir_iceberg::RewriteManifests`]).
#[must_use = "a job does nothing until it is awaited"]
#[derive(Debug, Clone)]
pub struct RewriteManifestsJob<'a> {
    table: TableRef<'a>,
    dry_run: bool,
}

impl<'a> RewriteManifestsJob<'a> {
    pub(crate) fn new(table: TableRef<'a>) -> Self {
        RewriteManifestsJob { table, dry_run: false }
    }

    /// Counts the small manifests; changes nothing.
    pub fn with_dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }

    /// Merges the small manifests in one swap; awaiting the job does the
    /// same.
    pub async fn run(&self) -> Result<weir_iceberg::ManifestReport, CatalogError> {
        let (catalog, name) = self.table.iceberg(MANIFESTS_ARE_ICEBERGS).await?;
        let job = weir_iceberg::RewriteManifests::new(catalog, &name)?.with_dry_run(self.dry_run);
        Ok(job.await?)
    }
}

weir_core::awaitable!(<'a> RewriteManifestsJob<'a> => Result<weir_iceberg::ManifestReport, CatalogError>);

/// The positional forms these jobs had before they were builders.
impl Catalogs {
    /// Expires old snapshots of Iceberg table `name`.
    #[deprecated(
        since = "0.1.0",
        note = "use `catalogs.table(name).expire_snapshots().with_*(..).await`"
    )]
    pub async fn expire_snapshots(
        &self,
        name: &str,
        older_than: Option<Duration>,
        retain_last: Option<usize>,
        dry_run: bool,
    ) -> Result<weir_iceberg::ExpireReport, CatalogError> {
        let mut job = self.table(name).expire_snapshots().with_dry_run(dry_run);
        if let Some(age) = older_than {
            job = job.with_older_than(age);
        }
        if let Some(n) = retain_last {
            job = job.with_retain_last(n);
        }
        job.await
    }

    /// Deletes Iceberg table `name`'s orphan files.
    #[deprecated(
        since = "0.1.0",
        note = "use `catalogs.table(name).remove_orphan_files().with_*(..).await`"
    )]
    pub async fn remove_orphan_files(
        &self,
        name: &str,
        older_than: Option<Duration>,
        dry_run: bool,
    ) -> Result<weir_iceberg::OrphanReport, CatalogError> {
        let mut job = self.table(name).remove_orphan_files().with_dry_run(dry_run);
        job.older_than = older_than;
        job.await
    }

    /// Merges Iceberg table `name`'s small manifests.
    #[deprecated(since = "0.1.0", note = "use `catalogs.table(name).rewrite_manifests().await`")]
    pub async fn rewrite_manifests(
        &self,
        name: &str,
        dry_run: bool,
    ) -> Result<weir_iceberg::ManifestReport, CatalogError> {
        self.table(name).rewrite_manifests().with_dry_run(dry_run).await
    }

    /// Vacuums Delta table `name`.
    #[deprecated(since = "0.1.0", note = "use `catalogs.table(name).vacuum().with_*(..).await`")]
    pub async fn vacuum(
        &self,
        name: &str,
        retention: Option<Duration>,
        force: bool,
        dry_run: bool,
    ) -> Result<weir_delta::VacuumReport, CatalogError> {
        let mut job = self.table(name).vacuum().with_force(force).with_dry_run(dry_run);
        job.retention = retention;
        job.await
    }
}
