//! Manifest rewrite: a table's small data manifests merged into manifests
//! of the target size, in one `replace` snapshot that adds and removes no
//! file, so that planning a scan reads few manifests.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use iceberg::spec::ManifestContentType;
use iceberg::TableIdent;
use serde::Serialize;

use crate::catalog::{after_swap, parse_ident, shown, Catalog, Swap};
use crate::commit::{Change, Producer, Request};
use crate::error::IcebergSinkError;
use crate::reachable::{delete_quietly, load_existing, manifests_of, snapshot_with};

/// How many times a lost swap is tried again on the new version.
const MAX_ATTEMPTS: usize = 50;

/// Merges a table's small data manifests.
///
/// Small manifests (under `commit.manifest.target-size-bytes`, default 1
/// MiB: see [`crate::commit::DEFAULT_TARGET`]) of each partition spec are merged, two or more at a time, into
/// manifests of up to that size; their live entries are kept as existing
/// entries with their snapshot ids and sequence numbers. The snapshot
/// changes no row. On a lost swap it is built again on the new version, so
/// files appended meanwhile stay.
///
/// ```no_run
/// # async fn f(catalog: std::sync::Arc<dyn weir_iceberg::Catalog>) -> Result<(), weir_iceberg::IcebergSinkError> {
/// let report = weir_iceberg::RewriteManifests::new(catalog, "bronze.payments")?.await?;
/// println!("{} manifests -> {}", report.manifests_before, report.manifests_after);
/// # Ok(()) }
/// ```
#[must_use = "a job does nothing until it is awaited"]
#[derive(Debug)]
pub struct RewriteManifests {
    catalog: Arc<dyn Catalog>,
    ident: TableIdent,
    dry_run: bool,
}

weir_core::awaitable!(RewriteManifests => Result<ManifestReport, IcebergSinkError>);

/// What a manifest rewrite did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ManifestReport {
    /// Whether this was a dry run.
    pub dry_run: bool,
    /// Manifests of the current snapshot before.
    pub manifests_before: usize,
    /// Small data manifests (the candidates).
    pub small_manifests: usize,
    /// Manifests of the new snapshot (unchanged in a dry run).
    pub manifests_after: usize,
    /// The snapshot committed, if any.
    pub snapshot_id: Option<i64>,
    /// How long it took.
    pub duration: Duration,
}

impl RewriteManifests {
    /// A rewrite of the manifests of table `name` of `catalog`.
    pub fn new(catalog: Arc<dyn Catalog>, name: &str) -> Result<Self, IcebergSinkError> {
        Ok(RewriteManifests {
            catalog,
            ident: parse_ident(name)?,
            dry_run: false,
        })
    }

    /// Counts the small manifests; changes nothing.
    pub fn with_dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }

    weir_core::renamed!(dry_run => with_dry_run(yes: bool));

    /// Merges the small manifests in one swap; awaiting the job does the
    /// same.
    pub async fn run(&self) -> Result<ManifestReport, IcebergSinkError> {
        let started = std::time::Instant::now();
        let table = shown(&self.ident);
        let io = self.catalog.file_io();
        let rewrite_id = uuid::Uuid::new_v4().to_string();
        let summary: HashMap<String, String> = [
            ("weir.operation".to_string(), "rewrite-manifests".to_string()),
            ("weir.rewrite-id".to_string(), rewrite_id.clone()),
        ]
        .into_iter()
        .collect();
        let mut producer = Producer::new(io.clone(), table.clone(), Vec::new());
        // Files of lost swaps, deleted once the table shows they were not
        // this rewrite's (a server may answer a retried request that had
        // landed with a conflict).
        let mut lost: Vec<String> = Vec::new();
        for attempt in 1..=MAX_ATTEMPTS {
            let base = load_existing(self.catalog.as_ref(), &self.ident).await?;
            let mut report = ManifestReport {
                dry_run: self.dry_run,
                ..ManifestReport::default()
            };
            if let Some(id) = snapshot_with(&base, "weir.rewrite-id", &rewrite_id) {
                tracing::info!(attempt, "an earlier swap of this rewrite had landed");
                report.snapshot_id = Some(id);
                report.duration = started.elapsed();
                return Ok(report);
            }
            delete_quietly(io, &std::mem::take(&mut lost)).await;
            let Some(snapshot) = base.metadata.current_snapshot_id() else {
                report.duration = started.elapsed();
                return Ok(report);
            };
            let (_, manifests) =
                manifests_of(io, &base.metadata, snapshot)
                    .await
                    .map_err(|source| IcebergSinkError::Iceberg {
                        table: table.clone(),
                        context: "read the current snapshot's manifest list".into(),
                        source: Box::new(source),
                    })?;
            let target = base
                .metadata
                .properties()
                .get("commit.manifest.target-size-bytes")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(crate::commit::DEFAULT_TARGET);
            let mut small_by_spec: HashMap<i32, usize> = HashMap::new();
            for m in &manifests {
                if m.content == ManifestContentType::Data && (m.manifest_length as u64) < target {
                    *small_by_spec.entry(m.partition_spec_id).or_default() += 1;
                }
            }
            report.manifests_before = manifests.len();
            report.small_manifests = small_by_spec.values().sum();
            report.manifests_after = manifests.len();
            if self.dry_run || small_by_spec.values().all(|n| *n < 2) {
                report.duration = started.elapsed();
                return Ok(report);
            }
            let produced = producer
                .produce(
                    &base,
                    Request {
                        change: Change::RewriteManifests,
                        summary: &summary,
                        properties: HashMap::new(),
                        cached: None,
                        added_columns: &[],
                        always_snapshot: false,
                        replaced: None,
                        merges_ahead: false,
                        merged_ahead: None,
                        remove_snapshots: &[],
                    },
                )
                .await?;
            // Only the manifest list written: small manifests there were,
            // but no two of a spec fit together under the target.
            if produced.attempt_files.len() <= 1 {
                delete_quietly(io, &produced.attempt_files).await;
                report.duration = started.elapsed();
                return Ok(report);
            }
            report.manifests_after = produced.manifests.as_ref().map_or(0, |(_, m)| m.len());
            match self
                .catalog
                .swap(&self.ident, &base, produced.metadata, &produced.changes)
                .await?
            {
                Swap::Swapped(new) => {
                    report.snapshot_id = new.metadata.current_snapshot_id();
                    after_swap(self.catalog.as_ref(), &new, produced.expired).await;
                    report.duration = started.elapsed();
                    tracing::info!(table = %table, before = report.manifests_before, after = report.manifests_after, "rewrote manifests");
                    return Ok(report);
                }
                Swap::Conflict => {
                    tracing::debug!(attempt, "lost the manifest rewrite's swap; building it again");
                    lost.extend(produced.attempt_files);
                    tokio::time::sleep(Duration::from_millis((attempt as u64 * 5).min(200))).await;
                }
            }
        }
        Err(IcebergSinkError::Busy {
            table,
            operation: "manifest rewrite".into(),
            attempts: MAX_ATTEMPTS,
        })
    }
}
