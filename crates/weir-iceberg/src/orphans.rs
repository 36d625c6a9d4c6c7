//! Orphan file removal: files under a table's location that no snapshot,
//! metadata file or statistics file of the table references, left by
//! failed writes or by jobs that died before deleting what they replaced.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use iceberg::TableIdent;
use serde::Serialize;

use crate::catalog::{parse_ident, Catalog};
use crate::error::IcebergSinkError;
use crate::reachable::manifests_of;

/// The default age below which a file is never an orphan: a commit in
/// flight writes its files before it swaps them in.
pub const DEFAULT_ORPHAN_AGE: Duration = Duration::from_secs(3 * 86_400);

/// The shortest age accepted without [`RemoveOrphanFiles::with_allow_recent`].
const MIN_ORPHAN_AGE: Duration = Duration::from_secs(3600);

/// Deletes a table's orphan files older than a threshold.
///
/// ```no_run
/// # async fn f(catalog: std::sync::Arc<dyn weir_iceberg::Catalog>) -> Result<(), weir_iceberg::IcebergSinkError> {
/// use weir_iceberg::RemoveOrphanFiles;
/// let report = RemoveOrphanFiles::new(catalog, "bronze.payments")?.with_dry_run(true).await?;
/// println!("{} orphan files, {} bytes", report.orphans.len(), report.bytes);
/// # Ok(()) }
/// ```
#[must_use = "a job does nothing until it is awaited"]
#[derive(Debug)]
pub struct RemoveOrphanFiles {
    catalog: Arc<dyn Catalog>,
    ident: TableIdent,
    older_than: Duration,
    allow_recent: bool,
    dry_run: bool,
}

weir_core::awaitable!(RemoveOrphanFiles => Result<OrphanReport, IcebergSinkError>);

/// What orphan removal found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OrphanReport {
    /// Files listed under the table's location.
    pub listed: usize,
    /// The orphans older than the threshold, deleted unless a dry run.
    pub orphans: Vec<String>,
    /// Their bytes.
    pub bytes: u64,
    /// Orphans that could not be deleted (the error is logged).
    pub failed: Vec<String>,
    /// Whether this was a dry run.
    pub dry_run: bool,
}

impl RemoveOrphanFiles {
    /// Orphan removal for table `name` (`namespace.table`) of `catalog`,
    /// of files older than three days by default.
    pub fn new(catalog: Arc<dyn Catalog>, name: &str) -> Result<Self, IcebergSinkError> {
        Ok(RemoveOrphanFiles {
            catalog,
            ident: parse_ident(name)?,
            older_than: DEFAULT_ORPHAN_AGE,
            allow_recent: false,
            dry_run: false,
        })
    }

    /// Only files older than `age` may go (at least an hour, unless
    /// [`RemoveOrphanFiles::with_allow_recent`]).
    pub fn with_older_than(mut self, age: Duration) -> Self {
        self.older_than = age;
        self
    }

    weir_core::renamed!(older_than => with_older_than(age: Duration));

    /// Accepts an age under an hour: files of a commit in flight may then
    /// be taken for orphans, so only when no writer is running.
    pub fn with_allow_recent(mut self, yes: bool) -> Self {
        self.allow_recent = yes;
        self
    }

    weir_core::renamed!(allow_recent => with_allow_recent(yes: bool));

    /// Lists the orphans; deletes nothing.
    pub fn with_dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }

    weir_core::renamed!(dry_run => with_dry_run(yes: bool));

    fn shown(&self) -> String {
        crate::catalog::shown(&self.ident)
    }

    fn refuse(&self, why: String) -> IcebergSinkError {
        IcebergSinkError::Unsupported {
            table: self.shown(),
            feature: format!("orphan removal here: {why}; nothing was deleted"),
        }
    }

    /// Finds the orphans and deletes them; awaiting the job does the same.
    pub async fn run(&self) -> Result<OrphanReport, IcebergSinkError> {
        if self.older_than < MIN_ORPHAN_AGE && !self.allow_recent {
            return Err(IcebergSinkError::Config {
                catalog: self.catalog.name().to_string(),
                reason: format!(
                    "an orphan age of {:?} could take the files of a commit in flight for orphans; use an hour or \
                     more, or allow_recent when no writer is running",
                    self.older_than
                ),
            });
        }
        let table = crate::reachable::load_existing(self.catalog.as_ref(), &self.ident).await?;
        crate::reachable::refuse_without_gc(&table, &self.shown())?;
        let m = &table.metadata;
        let err = |context: &str| {
            let context = context.to_string();
            let table = self.shown();
            move |source| IcebergSinkError::Iceberg {
                table: table.clone(),
                context: context.clone(),
                source: Box::new(source),
            }
        };

        // Everything the current metadata reaches.
        let mut referenced: HashSet<String> = HashSet::new();
        let mut add = |location: &str| referenced.insert(key(location));
        add(&table.metadata_location);
        add(&format!(
            "{}/metadata/version-hint.text",
            m.location().trim_end_matches('/')
        ));
        for log in m.metadata_log() {
            add(&log.metadata_file);
        }
        for s in m.statistics_iter() {
            add(&s.statistics_path);
        }
        for s in m.partition_statistics_iter() {
            add(&s.statistics_path);
        }
        // What must exist: if the listing lacks any of it, locations are
        // not being compared right and nothing may be deleted.
        let mut present: HashSet<String> = HashSet::new();
        present.insert(key(&table.metadata_location));
        let mut manifests = HashSet::new();
        for snapshot in m.snapshots() {
            let (list, files) = manifests_of(self.catalog.file_io(), m, snapshot.snapshot_id())
                .await
                .map_err(err("read a manifest list"))?;
            add(&list);
            present.insert(key(&list));
            for f in files {
                if manifests.insert(f.manifest_path.clone()) {
                    add(&f.manifest_path);
                    present.insert(key(&f.manifest_path));
                    let manifest = f
                        .load_manifest(self.catalog.file_io())
                        .await
                        .map_err(err("read a manifest"))?;
                    for e in manifest.entries() {
                        add(e.file_path());
                        if e.status() != iceberg::spec::ManifestStatus::Deleted {
                            present.insert(key(e.file_path()));
                        }
                    }
                }
            }
        }

        // Everything under the table's location.
        let location = m.location().trim_end_matches('/').to_string();
        let (store, prefix) = crate::storage::object_store_at(&location, self.catalog.storage_settings())
            .map_err(err("open the table's storage"))?;
        let listed: Vec<_> = store.list(Some(&prefix)).try_collect().await.map_err(|e| {
            err("list the table's files")(iceberg::Error::new(iceberg::ErrorKind::Unexpected, e.to_string()))
        })?;
        if prefix.as_ref().is_empty() {
            return Err(self.refuse(format!("the table is at the root of its storage ({location})")));
        }
        let listed_keys: HashSet<String> = listed
            .iter()
            .map(|o| key(&full_location(&location, o.location.as_ref())))
            .collect();
        let root = format!("{}/", key(&location));
        if let Some(missing) = present
            .iter()
            .find(|k| k.starts_with(&root) && !listed_keys.contains(*k))
        {
            return Err(self.refuse(format!(
                "{missing} is referenced but not found by listing the table's location: locations do not compare \
                 as expected"
            )));
        }
        let cutoff = chrono::Duration::from_std(self.older_than)
            .ok()
            .and_then(|age| chrono::Utc::now().checked_sub_signed(age));
        let mut report = OrphanReport {
            listed: listed.len(),
            dry_run: self.dry_run,
            ..OrphanReport::default()
        };
        let table_prefix = format!("{}/", prefix.as_ref());
        for object in listed {
            let relative = object.location.as_ref().strip_prefix(&table_prefix).unwrap_or_default();
            // Another table inside this one's folder: its files are not
            // this table's to judge.
            let nested_metadata = relative.contains("/metadata/") && relative.ends_with(".metadata.json");
            if relative.split('/').any(|part| part == "_delta_log") || nested_metadata {
                return Err(self.refuse(format!("{} holds another table ({relative})", location)));
            }
            // Only the table's own folders are searched.
            if !(relative.starts_with("data/") || relative.starts_with("metadata/")) {
                continue;
            }
            let full = full_location(&location, object.location.as_ref());
            let old = cutoff.is_some_and(|c| object.last_modified < c);
            if old && !referenced.contains(&key(&full)) {
                report.bytes += object.size;
                report.orphans.push(full);
            }
        }
        report.orphans.sort();
        if !self.dry_run {
            for file in &report.orphans {
                if let Err(e) = self.catalog.file_io().delete(file).await {
                    tracing::warn!(file, error = %e, "could not delete an orphan file");
                    report.failed.push(file.clone());
                }
            }
            tracing::info!(table = %self.shown(), orphans = report.orphans.len(), "removed orphan files");
        }
        Ok(report)
    }
}

/// A location without its scheme or leading slashes, so that `s3://b/k`,
/// `s3a://b/k`, `file:///p`, `file:/p`, `file://localhost/p` and `/p`
/// compare by bucket and key or path.
fn key(location: &str) -> String {
    let rest = if let Some(local) = location.strip_prefix("file:") {
        let local = local.strip_prefix("//localhost").unwrap_or(local);
        local.trim_start_matches('/')
    } else {
        location.split_once("://").map_or(location, |(_, rest)| rest)
    };
    rest.trim_start_matches('/').to_string()
}

/// The location of a listed object (`path` is its key in the store) of a
/// table at `table` (`s3://bucket/...`, `file:///...` or a path).
fn full_location(table: &str, path: &str) -> String {
    match table.split_once("://") {
        Some((scheme, rest)) if scheme != "file" => {
            let bucket = rest.split('/').next().unwrap_or_default();
            format!("{scheme}://{bucket}/{path}")
        }
        _ => format!("file:///{path}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_compare_by_bucket_and_key() {
        assert_eq!(key("s3://b/w/t/data/x.parquet"), key("s3a://b/w/t/data/x.parquet"));
        assert_eq!(key("file:///lake/w/t/x"), key("/lake/w/t/x"));
        assert_eq!(key("file:/lake/w/t/x"), key("/lake/w/t/x"));
        assert_eq!(key("file://localhost/lake/w/t/x"), key("/lake/w/t/x"));
        assert_eq!(full_location("s3://b/w/t", "w/t/data/x"), "s3://b/w/t/data/x");
        assert_eq!(full_location("file:///lake/w/t", "lake/w/t/x"), "file:///lake/w/t/x");
        assert_eq!(full_location("/lake/w/t", "lake/w/t/x"), "file:///lake/w/t/x");
    }
}
