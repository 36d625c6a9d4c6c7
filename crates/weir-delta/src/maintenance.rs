//! Delta table maintenance on demand: vacuum (files no version within the
//! retention needs, and files of failed writes) and log upkeep (a
//! checkpoint, and cleanup of log entries past the log retention).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use deltalake::operations::vacuum::VacuumMode;
use deltalake::table::config::TablePropertiesExt as _;
use deltalake::DeltaTableError;
use futures::StreamExt as _;
use object_store::ObjectStoreExt;
use serde::Serialize;

use crate::error::DeltaSinkError;
use crate::log_checkpoint;
use crate::table::{self, Files};

/// How many files a vacuum looks up and deletes at once.
const VACUUM_CONCURRENCY: usize = 16;

/// The default retention of vacuum, and the shortest accepted without
/// [`Vacuum::with_force`]: readers and writers of versions younger than this
/// may still need their files.
pub const DEFAULT_VACUUM_RETENTION: Duration = Duration::from_secs(7 * 86_400);

/// Deletes the files of a Delta table that no version within the retention
/// references: files removed (by compaction, overwrites) longer ago than
/// the retention, and files no commit ever added (failed writes) older
/// than it; hidden files (`.` or `_` first, such as the `.crc` checksums
/// Hadoop writes beside Spark's files) stay. deltalake plans it; weir checks the plan against the table as
/// it is after planning (paths compared fully decoded, since escaped
/// partition folders are spelled differently in the log, the listing and a
/// removal): a live file in the plan refuses the vacuum, a file removed
/// within the retention is kept. Tables with deletion vectors are refused.
///
/// ```no_run
/// # async fn f() -> Result<(), weir_delta::DeltaSinkError> {
/// let report = weir_delta::Vacuum::new("lake/bronze/payments")?.with_dry_run(true).await?;
/// println!("{} files to delete", report.files.len());
/// # Ok(()) }
/// ```
#[must_use = "a job does nothing until it is awaited"]
#[derive(Debug, Clone)]
pub struct Vacuum {
    location: String,
    storage: HashMap<String, String>,
    retention: Duration,
    force: bool,
    dry_run: bool,
}

weir_core::awaitable!(Vacuum => Result<VacuumReport, DeltaSinkError>);

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
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    weir_core::renamed!(retention => with_retention(retention: Duration));

    /// Accepts a retention shorter than the table's
    /// `delta.deletedFileRetentionDuration` (7 days by default): readers of
    /// older versions, and writers whose files are not committed yet, may
    /// then lose files.
    pub fn with_force(mut self, yes: bool) -> Self {
        self.force = yes;
        self
    }

    weir_core::renamed!(force => with_force(yes: bool));

    /// Lists the files; deletes nothing.
    pub fn with_dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }

    weir_core::renamed!(dry_run => with_dry_run(yes: bool));

    /// Runs the vacuum; awaiting the job does the same.
    pub async fn run(&self) -> Result<VacuumReport, DeltaSinkError> {
        let (url, t) = table::load_existing(&self.location, &self.storage, Files::Tracked).await?;
        let err = |source| DeltaSinkError::Delta {
            table: url.to_string(),
            source,
        };
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
        // deltalake plans; weir checks the plan against the live files and
        // the recent removals, and deletes. Paths with escapes
        // (`zone=10%3A00`) reach the plan in more than one spelling, so the
        // checks compare them decoded.
        let mut live = live_files(&t).map_err(|e| self.refused(e))?;
        let retention = chrono::Duration::from_std(self.retention).unwrap_or(chrono::TimeDelta::MAX);
        let started = chrono::Utc::now().timestamp_millis();
        let (t, metrics) = t
            .vacuum()
            .with_retention_period(retention)
            .with_mode(VacuumMode::Full)
            .with_enforce_retention_duration(false)
            .with_dry_run(true)
            .await
            .map_err(err)?;
        // The table as it is now: files committed or removed while the plan
        // was made count too.
        let (_, now) = table::load_existing(&self.location, &self.storage, Files::Tracked).await?;
        live.extend(live_files(&now).map_err(|e| self.refused(e))?);
        let kept = recently_removed(&now, started - retention.num_milliseconds())
            .await
            .map_err(err)?;
        if let Some(path) = live_in_plan(&live, &metrics.files_deleted) {
            return Err(DeltaSinkError::Location {
                location: self.location.clone(),
                reason: format!(
                    "vacuum's plan names {path}, a file the table still references; nothing was deleted (a \
                     mismatch of path spellings between the log and the store's listing)"
                ),
            });
        }
        let store = t.log_store().object_store(None);
        let planned: Vec<String> = metrics
            .files_deleted
            .into_iter()
            // Removed within the retention; the plan matched its removal in
            // another spelling.
            .filter(|planned| !kept.contains(&fully_decoded(planned)))
            // Hidden files are no table's data: the checksums Hadoop's
            // file systems write beside each file (`.part-....crc`), kept
            // as Delta Lake on Spark's VACUUM keeps them.
            .filter(|planned| !hidden(planned))
            .collect();
        // Each file is looked up first and not reported if it is not there:
        // the plan names removed files an earlier vacuum already deleted
        // (and a store deletes a missing object without complaint), and a
        // path with escapes may be spelled as no object is (a removal's
        // path encoded once more than the listing's).
        let dry_run = self.dry_run;
        let outcomes = futures::stream::iter(planned.into_iter().map(|planned| {
            let store = store.clone();
            async move {
                let location = match object_store::path::Path::parse(&planned) {
                    Ok(location) => location,
                    Err(e) => return (planned, Err(e.into())),
                };
                let mut found = store.head(&location).await.map(|_| ());
                if found.is_ok() && !dry_run {
                    found = store.delete(&location).await;
                }
                (planned, found)
            }
        }))
        .buffer_unordered(VACUUM_CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
        let mut files = Vec::new();
        for (planned, found) in outcomes {
            match found {
                Ok(()) => files.push(planned),
                Err(object_store::Error::NotFound { .. }) => {}
                Err(source) => {
                    return Err(DeltaSinkError::Store {
                        table: url.to_string(),
                        path: planned,
                        source,
                    })
                }
            }
        }
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
    let (url, t) = table::load_existing(location, storage, Files::Untracked).await?;
    let err = |source| DeltaSinkError::Delta {
        table: url.to_string(),
        source,
    };
    let version = t.snapshot().map_err(err)?.version();
    log_checkpoint::write(t.log_store().as_ref(), version)
        .await
        .map_err(|source| DeltaSinkError::LogCheckpoint {
            table: url.to_string(),
            version,
            source: Box::new(source),
        })?;
    let entries_deleted = deltalake::checkpoints::cleanup_metadata(&t, None).await.map_err(err)?;
    Ok(LogReport {
        checkpoint_version: version,
        entries_deleted,
    })
}

impl Vacuum {
    fn refused(&self, reason: String) -> DeltaSinkError {
        DeltaSinkError::Location {
            location: self.location.clone(),
            reason,
        }
    }
}

/// The live files' paths, fully decoded; refused for a table with deletion
/// vectors, whose files this vacuum does not yet tell apart.
fn live_files(table: &deltalake::DeltaTable) -> Result<HashSet<String>, String> {
    let snapshot = table.snapshot().map_err(|e| e.to_string())?;
    let mut live = HashSet::new();
    for f in snapshot.log_data().iter() {
        if f.remove_action(false).deletion_vector.is_some() {
            return Err(format!(
                "the table has deletion vectors ({} has one), whose files vacuum does not keep apart yet; nothing \
                 was deleted",
                f.path()
            ));
        }
        if table::absolute_path(&f.path()) {
            return Err(format!(
                "the table has a file outside its folder's naming ({}, an absolute path, as a shallow clone has), \
                 which vacuum cannot match against the listing; nothing was deleted",
                f.path()
            ));
        }
        live.insert(fully_decoded(&f.path()));
    }
    Ok(live)
}

/// The paths, fully decoded, of files removed at or after `since` (Unix
/// milliseconds): readers of versions within the retention need them.
async fn recently_removed(table: &deltalake::DeltaTable, since: i64) -> Result<HashSet<String>, DeltaTableError> {
    use futures::TryStreamExt;
    let snapshot = table.snapshot()?;
    let log_store = table.log_store();
    snapshot
        .all_tombstones(log_store.as_ref())
        .try_filter(|t| std::future::ready(t.deletion_timestamp().unwrap_or(0) >= since))
        .map_ok(|t| fully_decoded(&t.path()))
        .try_collect()
        .await
}

/// Whether a path names a hidden file (its name begins with `.` or `_`).
fn hidden(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with('.') || name.starts_with('_')
}

/// The first planned path that is, decoded, one of the `live` files'
/// (fully decoded) paths.
fn live_in_plan<'a>(live: &HashSet<String>, plan: &'a [String]) -> Option<&'a String> {
    plan.iter().find(|p| live.contains(&fully_decoded(p)))
}

/// A path with every percent escape decoded, however many times it was
/// encoded: the one spelling of a file the log, the listing and a removal
/// may each spell differently.
fn fully_decoded(path: &str) -> String {
    let mut path = path.to_string();
    loop {
        let next = percent_encoding::percent_decode_str(&path)
            .decode_utf8_lossy()
            .into_owned();
        if next == path {
            return path;
        }
        path = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_files_are_told_by_their_names() {
        assert!(hidden("zone=a b/.part-0.parquet.crc"));
        assert!(hidden("_SUCCESS"));
        assert!(!hidden("_zone=a/part-0.parquet"));
        assert!(!hidden("part-0.parquet"));
    }

    #[test]
    fn a_live_file_is_found_in_the_plan_however_it_is_spelled() {
        // The log's path decoded once, as the snapshot gives it.
        let live: HashSet<String> = [fully_decoded("zone=10%3A00 utc/live.parquet")].into();
        for spelling in [
            "zone=10%3A00 utc/live.parquet",
            "zone=10%253A00 utc/live.parquet",
            "zone=10%253A00%2520utc/live.parquet",
            "zone=10:00 utc/live.parquet",
        ] {
            let plan = vec!["zone=10%3A00 utc/old.parquet".to_string(), spelling.to_string()];
            assert_eq!(live_in_plan(&live, &plan), Some(&plan[1]), "{spelling}");
        }
        let plan = vec!["zone=10%3A00 utc/old.parquet".to_string()];
        assert_eq!(live_in_plan(&live, &plan), None);
    }
}
