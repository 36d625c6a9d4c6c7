//! Delta table maintenance on demand: vacuum (files no version within the
//! retention needs, and files of failed writes) and log upkeep (a
//! checkpoint, and cleanup of log entries past the log retention).

use std::collections::HashMap;
use std::time::Duration;

use deltalake::operations::vacuum::VacuumMode;
use deltalake::table::config::TablePropertiesExt as _;
use serde::Serialize;

use crate::error::DeltaSinkError;
use crate::table::{self, Files};

/// The default retention of vacuum, and the shortest accepted without
/// [`Vacuum::force`]: readers and writers of versions younger than this
/// may still need their files.
pub const DEFAULT_VACUUM_RETENTION: Duration = Duration::from_secs(7 * 86_400);

/// Deletes the files of a Delta table that no version within the retention
/// references: files removed (by compaction, overwrites) longer ago than
/// the retention, and files no commit ever added (failed writes) older
/// than it.
///
/// ```no_run
/// # async fn f() -> Result<(), weir_delta::DeltaSinkError> {
/// let report = weir_delta::Vacuum::new("lake/bronze/payments")?.dry_run(true).run().await?;
/// println!("{} files to delete", report.files.len());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Vacuum {
    location: String,
    storage: HashMap<String, String>,
    retention: Duration,
    force: bool,
    dry_run: bool,
}

/// What a vacuum deleted (or, in a dry run, would delete).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct VacuumReport {
    /// The files, as paths in the table.
    pub files: Vec<String>,
    /// Whether this was a dry run.
    pub dry_run: bool,
}

impl Vacuum {
    /// A vacuum of the table at `location` with the default retention.
    pub fn new(location: &str) -> Result<Self, DeltaSinkError> {
        table::table_url(location)?;
        Ok(Vacuum {
            location: location.to_string(),
            storage: HashMap::new(),
            retention: DEFAULT_VACUUM_RETENTION,
            force: false,
            dry_run: false,
        })
    }

    /// Object storage options (as `DeltaSink::with_storage_option`).
    pub fn with_storage_options(mut self, storage: HashMap<String, String>) -> Self {
        self.storage = storage;
        self
    }

    /// Keeps what versions younger than `retention` need.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Accepts a retention shorter than the table's
    /// `delta.deletedFileRetentionDuration` (7 days by default): readers of
    /// older versions, and writers whose files are not committed yet, may
    /// then lose files.
    pub fn force(mut self, yes: bool) -> Self {
        self.force = yes;
        self
    }

    /// Lists the files; deletes nothing.
    pub fn dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }

    /// Runs the vacuum.
    pub async fn run(&self) -> Result<VacuumReport, DeltaSinkError> {
        let (url, t) = table::load_existing(&self.location, &self.storage, Files::Tracked).await?;
        let err = |source| DeltaSinkError::Delta {
            table: url.to_string(),
            source,
        };
        // A live file whose path holds characters that partition folders
        // escape (`:` as `%3A`, ...) is matched against the listing decoded
        // on one side only, and could be taken for an untracked file.
        let escaped = t
            .snapshot()
            .map_err(err)?
            .log_data()
            .iter()
            .map(|f| f.path().to_string())
            .find(|p| !table::plain_path(p));
        if let Some(escaped) = escaped {
            return Err(DeltaSinkError::Location {
                location: self.location.clone(),
                reason: format!(
                    "the table has files whose paths hold characters partition folders escape ({escaped}), which \
                     this vacuum cannot match safely against the listing; nothing was deleted"
                ),
            });
        }
        let minimum = t
            .snapshot()
            .map_err(err)?
            .table_config()
            .deleted_file_retention_duration();
        if self.retention < minimum && !self.force {
            return Err(DeltaSinkError::Location {
                location: self.location.clone(),
                reason: format!(
                    "a vacuum retention of {:?} is shorter than the table's delta.deletedFileRetentionDuration \
                     ({:?}): readers of older versions and writers still writing could lose files. Nothing was \
                     deleted; use a longer retention, or force it when no reader or writer needs them",
                    self.retention, minimum
                ),
            });
        }
        let retention = chrono::Duration::from_std(self.retention).unwrap_or(chrono::TimeDelta::MAX);
        let (_, metrics) = t
            .vacuum()
            .with_retention_period(retention)
            .with_mode(VacuumMode::Full)
            .with_enforce_retention_duration(false)
            .with_dry_run(self.dry_run)
            .await
            .map_err(err)?;
        let mut files = metrics.files_deleted;
        files.sort();
        tracing::info!(table = %url, files = files.len(), dry_run = self.dry_run, "vacuumed");
        Ok(VacuumReport {
            files,
            dry_run: self.dry_run,
        })
    }
}

/// What log upkeep did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LogReport {
    /// The version the checkpoint was written at.
    pub checkpoint_version: u64,
    /// Log entries deleted for being past `delta.logRetentionDuration` (30
    /// days by default) and older than the checkpoint.
    pub entries_deleted: usize,
}

/// Writes a checkpoint of the table's log at its current version, then
/// deletes the log entries past the log retention that the checkpoint
/// makes unneeded.
pub async fn checkpoint_log(location: &str, storage: &HashMap<String, String>) -> Result<LogReport, DeltaSinkError> {
    let (url, t) = table::load_existing(location, storage, Files::Tracked).await?;
    let err = |source| DeltaSinkError::Delta {
        table: url.to_string(),
        source,
    };
    deltalake::checkpoints::create_checkpoint(&t, None).await.map_err(err)?;
    let entries_deleted = deltalake::checkpoints::cleanup_metadata(&t, None).await.map_err(err)?;
    Ok(LogReport {
        checkpoint_version: t.snapshot().map_err(err)?.version(),
        entries_deleted,
    })
}
