//! Snapshot expiry: old snapshots leave the table's metadata in one
//! compare-and-swap, then the files no remaining snapshot references are
//! deleted.
//!
//! Every Iceberg metadata file lists every snapshot, so a streaming table's
//! commits grow slower with its history; expiry keeps that history bounded.
//! The exactly-once markers live in table properties, which expiry leaves
//! alone: a batch replayed after expiry is still recognised.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use iceberg::spec::{FormatVersion, ManifestStatus, SnapshotReference, SnapshotRetention, TableMetadata, MAIN_BRANCH};
use iceberg::TableIdent;
use serde::Serialize;

use crate::catalog::{after_swap, parse_ident, Catalog, LoadedTable, Swap};
use crate::error::{IcebergSinkError, PolicyExpiryRefusal};
use crate::metadata_file::read_refs;
use crate::reachable::manifests_of;

/// The age past which snapshots expire unless the table or the caller says
/// otherwise (Java's `history.expire.max-snapshot-age-ms` default).
const DEFAULT_MAX_AGE_MS: i64 = 5 * 86_400 * 1000;

/// Snapshots chosen to expire in a commit of their writer's own, and the
/// refs of the version they were chosen on.
#[derive(Debug)]
pub(crate) struct Chosen {
    /// The snapshots to remove.
    pub(crate) expired: BTreeSet<i64>,
    refs: HashMap<String, SnapshotReference>,
}

/// The refs of `metadata`, from its serialised form (iceberg 0.10 does not
/// expose them).
fn refs_in_memory(metadata: &TableMetadata) -> Result<HashMap<String, SnapshotReference>, serde_json::Error> {
    crate::metadata_file::try_read_refs(&serde_json::to_vec(metadata)?)
}

/// Whether `a` and `b` hold the same refs, alike but for `main`'s head.
fn same_but_main_head(a: &HashMap<String, SnapshotReference>, b: &HashMap<String, SnapshotReference>) -> bool {
    a.len() == b.len()
        && a.iter().all(|(name, r)| {
            b.get(name).is_some_and(|other| match name.as_str() {
                MAIN_BRANCH => r.retention == other.retention,
                _ => r == other,
            })
        })
}

/// Why the files of expired snapshots stay when a ref changed between the
/// choice and the swap.
const REFS_CHANGED: &str = "the table's refs changed meanwhile; the files stay (remove orphans later)";

/// How many times a lost swap is planned again before giving up.
const MAX_ATTEMPTS: usize = 50;

/// Expires a table's old snapshots.
///
/// ```no_run
/// # async fn f(catalog: std::sync::Arc<dyn weir_iceberg::Catalog>) -> Result<(), weir_iceberg::IcebergSinkError> {
/// use std::time::Duration;
/// use weir_iceberg::ExpireSnapshots;
/// let report = ExpireSnapshots::new(catalog, "bronze.payments")?
///     .with_older_than(Duration::from_secs(7 * 24 * 3600))
///     .with_retain_last(10)
///     .await?;
/// println!("expired {} snapshots, deleted {} files", report.expired.len(), report.deleted_files());
/// # Ok(()) }
/// ```
#[must_use = "a job does nothing until it is awaited"]
#[derive(Debug)]
pub struct ExpireSnapshots {
    catalog: Arc<dyn Catalog>,
    ident: TableIdent,
    options: ExpireOptions,
}

/// What an expiry keeps, and whether it only plans: the options of
/// [`ExpireSnapshots`], set through its `with_*` setters (weir-catalog's
/// job by name holds them too, with the same setters).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpireOptions {
    older_than: Option<Duration>,
    retain_last: Option<usize>,
    /// The least `retain_last` and `older_than` keep, whatever the
    /// table's `history.expire.*` properties say.
    at_least: Option<(usize, Duration)>,
    dry_run: bool,
}

impl ExpireOptions {
    /// See [`ExpireSnapshots::with_older_than`].
    pub fn with_older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// See [`ExpireSnapshots::with_retain_last`].
    pub fn with_retain_last(mut self, n: usize) -> Self {
        self.retain_last = Some(n.max(1));
        self
    }

    /// See [`ExpireSnapshots::with_keeping_at_least`].
    pub fn with_keeping_at_least(mut self, retain_last: usize, older_than: Duration) -> Self {
        self.retain_last = None;
        self.older_than = None;
        self.at_least = Some((retain_last.max(1), older_than));
        self
    }

    /// See [`ExpireSnapshots::with_dry_run`].
    pub fn with_dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }
}

/// The `with_*` setters of an expiry job that holds its [`ExpireOptions`]
/// in field `$options`, each through the options' own setter.
#[doc(hidden)]
#[macro_export]
macro_rules! expire_setters {
    ($options:ident) => {
        /// Only snapshots older than `age` expire (`Duration::ZERO`: any
        /// age). A branch's own `max-snapshot-age-ms` can keep more of its
        /// history.
        pub fn with_older_than(mut self, age: ::std::time::Duration) -> Self {
            self.$options = ::std::mem::take(&mut self.$options).with_older_than(age);
            self
        }

        /// The newest `n` snapshots of each branch stay, whatever their
        /// age (at least 1; default the table's
        /// `history.expire.min-snapshots-to-keep`, else 1). A branch's own
        /// `min-snapshots-to-keep` takes precedence.
        pub fn with_retain_last(mut self, n: usize) -> Self {
            self.$options = ::std::mem::take(&mut self.$options).with_retain_last(n);
            self
        }

        /// The newest `retain_last` snapshots of each branch stay, and
        /// those younger than `older_than`, or more where the table's
        /// `history.expire.min-snapshots-to-keep` or
        /// `history.expire.max-snapshot-age-ms` keep more: each is the
        /// larger of the two. (`with_retain_last` and `with_older_than`
        /// instead override the table's.)
        pub fn with_keeping_at_least(mut self, retain_last: usize, older_than: ::std::time::Duration) -> Self {
            self.$options = ::std::mem::take(&mut self.$options).with_keeping_at_least(retain_last, older_than);
            self
        }

        /// Plans and reports without changing anything.
        pub fn with_dry_run(mut self, yes: bool) -> Self {
            self.$options = ::std::mem::take(&mut self.$options).with_dry_run(yes);
            self
        }

        /// Every option at once.
        pub fn with_options(mut self, options: $crate::ExpireOptions) -> Self {
            self.$options = options;
            self
        }
    };
}

weir_core::awaitable!(ExpireSnapshots => Result<ExpireReport, IcebergSinkError>);

/// What an expiry did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ExpireReport {
    /// The snapshots removed from the metadata.
    pub expired: Vec<i64>,
    /// The snapshots kept.
    pub retained: usize,
    /// Manifest lists deleted (or to delete).
    pub manifest_lists: Vec<String>,
    /// Manifests deleted (or to delete).
    pub manifests: Vec<String>,
    /// Data files deleted (or to delete).
    pub data_files: Vec<String>,
    /// The bytes of those data files.
    pub data_bytes: u64,
    /// Files that could not be deleted (orphans now; the error is logged).
    pub failed: Vec<String>,
    /// The new metadata file, unless nothing expired or this was a dry run.
    pub metadata_location: Option<String>,
    /// Whether this was a dry run.
    pub dry_run: bool,
    /// Why the files of the expired snapshots were not deleted, if they
    /// were not (they are orphans then, for orphan removal).
    pub deletes_skipped: Option<String>,
}

impl ExpireReport {
    /// Every file deleted (or to delete).
    pub fn deleted_files(&self) -> usize {
        self.manifest_lists.len() + self.manifests.len() + self.data_files.len()
    }
}

impl ExpireSnapshots {
    /// Expiry of table `name` (`namespace.table`) of `catalog`: by default
    /// of the snapshots older than the table's
    /// `history.expire.max-snapshot-age-ms` (else 5 days), keeping every
    /// ref's head, the newest `history.expire.min-snapshots-to-keep` (else
    /// 1) of each branch, and what each branch's own retention keeps.
    pub fn new(catalog: Arc<dyn Catalog>, name: &str) -> Result<Self, IcebergSinkError> {
        Ok(ExpireSnapshots {
            catalog,
            ident: parse_ident(name)?,
            options: ExpireOptions::default(),
        })
    }

    crate::expire_setters!(options);

    weir_core::renamed!(
        older_than => with_older_than(age: Duration),
        retain_last => with_retain_last(n: usize),
        keeping_at_least => with_keeping_at_least(retain_last: usize, older_than: Duration),
        dry_run => with_dry_run(yes: bool),
    );

    fn shown(&self) -> String {
        crate::catalog::shown(&self.ident)
    }

    /// Expires the snapshots, then deletes the files only they referenced;
    /// awaiting the job does the same.
    pub async fn run(&self) -> Result<ExpireReport, IcebergSinkError> {
        for attempt in 0..MAX_ATTEMPTS {
            let base = crate::reachable::load_existing(self.catalog.as_ref(), &self.ident).await?;
            crate::reachable::refuse_without_gc(&base, &self.shown())?;
            let refs = self.refs(&base).await?;
            let expired = self.expired(&base.metadata, &refs)?;
            let mut report = ExpireReport {
                retained: base.metadata.snapshots().len() - expired.len(),
                expired: expired.iter().copied().collect(),
                dry_run: self.options.dry_run,
                ..ExpireReport::default()
            };
            if expired.is_empty() {
                return Ok(report);
            }
            if self.options.dry_run {
                self.plan_deletes(&base.metadata, &expired, &mut report).await?;
                return Ok(report);
            }
            let built = base
                .metadata
                .clone()
                .into_builder(Some(base.metadata_location.clone()))
                .remove_snapshots(&report.expired)
                .build()
                .map_err(self.err("build the new metadata"))?;
            match self
                .catalog
                .swap(&self.ident, &base, built.metadata, &built.changes)
                .await?
            {
                Swap::Swapped(table) => {
                    let expired_logs = built
                        .expired_metadata_logs
                        .into_iter()
                        .map(|l| l.metadata_file)
                        .collect();
                    after_swap(self.catalog.as_ref(), &table, expired_logs).await;
                    report.metadata_location = Some(table.metadata_location.clone());
                    tracing::info!(table = %self.shown(), expired = report.expired.len(), "expired snapshots");
                    // The files to delete are planned on the version the
                    // swap replaced: what its kept snapshots reach stays.
                    // Later commits build on the new version, so they reach
                    // nothing only expired snapshots reached.
                    // Deletes only if the new version holds the refs the
                    // choice was made on (a REST server checks only main).
                    let now = self.refs(&table).await.ok();
                    let skip = (now.as_ref() != Some(&refs)).then_some(REFS_CHANGED);
                    self.delete_planned(&base.metadata, &expired, skip, &mut report).await;
                    return Ok(report);
                }
                // Another writer committed first: choose again on its
                // version (choosing reads only the metadata), after a
                // moment that breaks step with a writer committing back to
                // back.
                Swap::Conflict => {
                    tracing::debug!(table = %self.shown(), attempt, "lost the expiry swap; choosing again");
                    let jitter = u64::from(uuid::Uuid::new_v4().as_u128() as u8 % 8);
                    tokio::time::sleep(Duration::from_millis(jitter + attempt as u64)).await;
                }
            }
        }
        Err(IcebergSinkError::Busy {
            table: self.shown(),
            operation: "snapshot expiry".into(),
            attempts: MAX_ATTEMPTS,
        })
    }

    /// The snapshots to expire from `base`, and its refs, for a writer
    /// that removes them in a commit of its own (a sink's expiry policy):
    /// it reads nothing, the refs coming from the metadata in memory. A
    /// table with `gc.enabled=false`, or of format version 1 (whose refs
    /// iceberg's metadata does not carry), is refused.
    pub(crate) fn choose(&self, base: &LoadedTable) -> Result<Chosen, IcebergSinkError> {
        let refused = |reason| IcebergSinkError::PolicyExpiry {
            table: self.shown(),
            reason,
        };
        if crate::reachable::refuse_without_gc(base, &self.shown()).is_err() {
            return Err(refused(PolicyExpiryRefusal::GcDisabled));
        }
        if base.metadata.format_version() == FormatVersion::V1 {
            return Err(refused(PolicyExpiryRefusal::FormatV1));
        }
        let refs = refs_in_memory(&base.metadata).map_err(|e| refused(PolicyExpiryRefusal::Refs(e)))?;
        let expired = self.expired(&base.metadata, &refs)?;
        Ok(Chosen { expired, refs })
    }

    /// After a commit on `base` that removed `chosen`'s snapshots landed as
    /// `landed`: deletes the files only those snapshots reached. Only if
    /// nothing but that commit came between: `landed` holds `base`'s
    /// snapshots but the expired ones, plus its own new one, and the same
    /// refs but for `main`'s head (a REST catalog's swap checks only
    /// `main`: a snapshot or ref another writer added meanwhile may reach
    /// an expired snapshot's files).
    pub(crate) async fn delete_chosen(
        &self,
        base: &TableMetadata,
        chosen: &Chosen,
        landed: &TableMetadata,
    ) -> ExpireReport {
        let mut report = ExpireReport {
            retained: landed.snapshots().len(),
            expired: chosen.expired.iter().copied().collect(),
            ..ExpireReport::default()
        };
        let kept: BTreeSet<i64> = base
            .snapshots()
            .map(|s| s.snapshot_id())
            .filter(|id| !chosen.expired.contains(id))
            .chain(landed.current_snapshot_id())
            .collect();
        let now: BTreeSet<i64> = landed.snapshots().map(|s| s.snapshot_id()).collect();
        let skip = if now != kept {
            Some("another writer's snapshots came between; the files stay (remove orphans later)")
        } else {
            match refs_in_memory(landed) {
                Ok(refs) if same_but_main_head(&refs, &chosen.refs) => None,
                Ok(_) => Some(REFS_CHANGED),
                Err(_) => Some("the new version's refs cannot be read; the files stay (remove orphans later)"),
            }
        };
        self.delete_planned(base, &chosen.expired, skip, &mut report).await;
        report
    }

    /// Plans (on `base`, the version that still listed `expired`) and
    /// deletes the files only `expired` reached, unless `skip` says why
    /// not; that reason, or a failure to plan, goes into the report, and
    /// nothing is deleted.
    async fn delete_planned(
        &self,
        base: &TableMetadata,
        expired: &BTreeSet<i64>,
        skip: Option<&str>,
        report: &mut ExpireReport,
    ) {
        if let Some(why) = skip {
            report.deletes_skipped = Some(why.into());
        } else if let Err(e) = self.plan_deletes(base, expired, report).await {
            report.deletes_skipped = Some(format!("the files could not be planned: {e}"));
        }
        if let Some(why) = &report.deletes_skipped {
            tracing::warn!(table = %self.shown(), why, "expired snapshots; their files were not deleted");
            report.manifest_lists.clear();
            report.manifests.clear();
            report.data_files.clear();
            report.data_bytes = 0;
        } else {
            self.delete(report).await;
        }
    }

    fn err(&self, context: &str) -> impl Fn(iceberg::Error) -> IcebergSinkError + '_ {
        let context = context.to_string();
        move |source| IcebergSinkError::Iceberg {
            table: self.shown(),
            context: context.clone(),
            source: Box::new(source),
        }
    }

    /// The table's refs, read from its metadata file (iceberg 0.10 does
    /// not expose them).
    async fn refs(&self, table: &LoadedTable) -> Result<HashMap<String, SnapshotReference>, IcebergSinkError> {
        let err = self.err("read the refs of the metadata file");
        let bytes = self
            .catalog
            .file_io()
            .new_input(&table.metadata_location)
            .map_err(&err)?
            .read()
            .await
            .map_err(&err)?;
        read_refs(&bytes).ok_or_else(|| IcebergSinkError::Unsupported {
            table: self.shown(),
            feature: "a metadata file whose refs cannot be read (compressed?)".into(),
        })
    }

    /// The snapshots to expire, as Iceberg's retention rules say: a ref's
    /// head stays; on each branch, the newest snapshots stay while fewer
    /// than its `min-snapshots-to-keep` are kept or while they are younger
    /// than its `max-snapshot-age-ms` (a branch's own settings, else this
    /// job's `retain_last` and `older_than`, else the table's
    /// `history.expire.*` properties, which must parse); any other snapshot
    /// expires once older than the job's age. (Java expires a branch's
    /// ancestors past the branch's rules even when younger than that age;
    /// weir keeps them.)
    fn expired(
        &self,
        metadata: &TableMetadata,
        refs: &HashMap<String, SnapshotReference>,
    ) -> Result<BTreeSet<i64>, IcebergSinkError> {
        let property = |key: &str| -> Result<Option<i64>, IcebergSinkError> {
            let Some(value) = metadata.properties().get(key) else {
                return Ok(None);
            };
            match value.trim().parse::<i64>() {
                Ok(n) if n >= 0 => Ok(Some(n)),
                _ => Err(IcebergSinkError::InvalidProperty {
                    table: self.shown(),
                    key: key.into(),
                    value: value.clone(),
                }),
            }
        };
        let millis = |age: Duration| i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        let (least_keep, least_age) = match self.options.at_least {
            Some((keep, age)) => (keep, Some(millis(age))),
            None => (1, None),
        };
        let age = match (self.options.older_than, property("history.expire.max-snapshot-age-ms")?) {
            (Some(age), _) => millis(age),
            (None, Some(table)) => least_age.map_or(table, |least| table.max(least)),
            (None, None) => least_age.unwrap_or(DEFAULT_MAX_AGE_MS),
        };
        let keep = match self.options.retain_last {
            Some(n) => n,
            None => property("history.expire.min-snapshots-to-keep")?
                .map_or(least_keep, |n| usize::try_from(n).unwrap_or(usize::MAX).max(least_keep)),
        };
        let now = chrono::Utc::now().timestamp_millis();
        let mut kept = HashSet::new();
        for r in refs.values() {
            kept.insert(r.snapshot_id);
            let SnapshotRetention::Branch {
                min_snapshots_to_keep,
                max_snapshot_age_ms,
                ..
            } = r.retention
            else {
                continue;
            };
            let keep = min_snapshots_to_keep.map_or(keep, |n| usize::try_from(n).unwrap_or(1).max(1));
            let cutoff = now.saturating_sub(max_snapshot_age_ms.unwrap_or(age));
            let mut next = Some(r.snapshot_id);
            let mut branch_kept = 0;
            while let Some(s) = next.and_then(|id| metadata.snapshot_by_id(id)) {
                if branch_kept >= keep && s.timestamp_ms() < cutoff {
                    break;
                }
                kept.insert(s.snapshot_id());
                branch_kept += 1;
                next = s.parent_snapshot_id();
            }
        }
        if let Some(current) = metadata.current_snapshot_id() {
            kept.insert(current);
        }
        let cutoff = now.saturating_sub(age);
        Ok(metadata
            .snapshots()
            .filter(|s| !kept.contains(&s.snapshot_id()))
            .filter(|s| s.timestamp_ms() < cutoff)
            .map(|s| s.snapshot_id())
            .collect())
    }

    /// Fills in the files only expired snapshots reference: their manifest
    /// lists, the manifests no kept snapshot lists, and the data files no
    /// kept snapshot holds live.
    async fn plan_deletes(
        &self,
        metadata: &TableMetadata,
        expired: &BTreeSet<i64>,
        report: &mut ExpireReport,
    ) -> Result<(), IcebergSinkError> {
        let err = self.err("read a manifest");
        let (mut live_manifests, mut gone_manifests) = (HashMap::new(), HashMap::new());
        let mut live_lists = HashSet::new();
        for snapshot in metadata.snapshots() {
            let (list, manifests) = manifests_of(self.catalog.file_io(), metadata, snapshot.snapshot_id())
                .await
                .map_err(self.err("read a manifest list"))?;
            let target = if expired.contains(&snapshot.snapshot_id()) {
                report.manifest_lists.push(list);
                &mut gone_manifests
            } else {
                live_lists.insert(list);
                &mut live_manifests
            };
            for m in manifests {
                target.insert(m.manifest_path.clone(), m);
            }
        }
        // A manifest list shared with a kept snapshot (never written so by
        // weir) stays.
        report.manifest_lists.retain(|l| !live_lists.contains(l));
        gone_manifests.retain(|path, _| !live_manifests.contains_key(path));
        if gone_manifests.is_empty() {
            return Ok(());
        }
        let mut live_files = HashSet::new();
        for m in live_manifests.values() {
            let manifest = m.load_manifest(self.catalog.file_io()).await.map_err(&err)?;
            for e in manifest.entries() {
                if e.status() != ManifestStatus::Deleted {
                    live_files.insert(e.file_path().to_string());
                }
            }
        }
        let mut gone_files = BTreeSet::new();
        for (path, m) in gone_manifests {
            let manifest = m.load_manifest(self.catalog.file_io()).await.map_err(&err)?;
            for e in manifest.entries() {
                if !live_files.contains(e.file_path()) && gone_files.insert(e.file_path().to_string()) {
                    report.data_bytes += e.file_size_in_bytes();
                }
            }
            report.manifests.push(path);
        }
        report.manifests.sort();
        report.data_files = gone_files.into_iter().collect();
        Ok(())
    }

    /// Deletes the planned files; a file that cannot be deleted is logged
    /// and listed, and stays an orphan.
    async fn delete(&self, report: &mut ExpireReport) {
        let io = self.catalog.file_io();
        let files: Vec<String> = report
            .data_files
            .iter()
            .chain(&report.manifests)
            .chain(&report.manifest_lists)
            .cloned()
            .collect();
        for file in files {
            if let Err(e) = io.delete(&file).await {
                tracing::warn!(file, error = %e, "could not delete a file of an expired snapshot");
                report.failed.push(file);
            }
        }
    }
}
