//! Compaction of a table by name, in either format, with one set of options,
//! one progress type and one summary.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::catalogs::Catalogs;
use crate::error::CatalogError;
use crate::format::TableFormat;

/// How a compaction runs. Unset fields take each format's defaults: the
/// table's target file size, groups of at least 2 files, up to 4 rewrites
/// at once, one commit for the whole job.
#[derive(Debug, Clone, Default)]
pub struct CompactOptions {
    /// The size of the files written (inputs are files under 3/4 of it).
    pub target_file_size: Option<u64>,
    /// The fewest files a group must have to be rewritten.
    pub min_input_files: Option<usize>,
    /// How many groups are rewritten at once (peak memory is about this
    /// many target-size files).
    pub max_concurrent_rewrites: Option<usize>,
    /// Commit every N groups (partial progress) instead of once at the end.
    pub groups_per_commit: Option<usize>,
    /// Only partitions with these values (Delta: partition columns; Iceberg:
    /// partition fields, values as Iceberg shows them). `None` is null.
    pub partition: Vec<(String, Option<String>)>,
    /// Plan only; change nothing.
    pub dry_run: bool,
}

/// What a compaction reports as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompactProgress {
    /// The plan: groups, input files and bytes.
    Planned { groups: usize, files: usize, bytes: u64 },
    /// One group was rewritten (its input bytes).
    Rewritten { bytes: u64 },
    /// A commit landed with this many groups.
    Committed { groups: usize },
}

/// One planned group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CompactGroupSummary {
    /// The partition's values.
    pub partition: BTreeMap<String, Option<String>>,
    /// The input files.
    pub files: Vec<String>,
    /// Their bytes.
    pub bytes: u64,
}

/// What a compaction did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CompactSummary {
    /// The table's full name.
    pub name: String,
    /// Its format.
    pub format: TableFormat,
    /// Whether this was a dry run.
    pub dry_run: bool,
    /// The target file size used.
    pub target_file_size: u64,
    /// The planned groups.
    pub groups: Vec<CompactGroupSummary>,
    /// Groups dropped because another writer removed one of their inputs.
    pub groups_dropped: usize,
    /// The versions (Delta) or snapshot ids (Iceberg) committed.
    pub commits: Vec<i64>,
    /// Live files and bytes before, at the planned version.
    pub files_before: usize,
    pub bytes_before: u64,
    /// Live files and bytes after, of those (files others added meanwhile
    /// are not counted).
    pub files_after: usize,
    pub bytes_after: u64,
    /// What the commits removed and added.
    pub files_removed: usize,
    pub files_added: usize,
    /// Rows rewritten.
    pub rows: u64,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
}

/// Applies the options both formats' builders share (they have the same
/// method names).
macro_rules! configured {
    ($job:expr, $options:expr) => {{
        let options: &CompactOptions = $options;
        let mut job = $job.dry_run(options.dry_run);
        if let Some(n) = options.target_file_size {
            job = job.target_file_size(n);
        }
        if let Some(n) = options.min_input_files {
            job = job.min_input_files(n);
        }
        if let Some(n) = options.max_concurrent_rewrites {
            job = job.max_concurrent_rewrites(n);
        }
        if let Some(n) = options.groups_per_commit {
            job = job.groups_per_commit(n);
        }
        for (column, value) in &options.partition {
            job = job.partition(column.clone(), value.clone());
        }
        job
    }};
}

/// The summary of either format's report (same field names).
macro_rules! summary {
    ($r:expr, $name:expr, $format:expr, $commits:expr, $rows:expr) => {{
        let r = $r;
        CompactSummary {
            name: $name,
            format: $format,
            dry_run: r.dry_run,
            target_file_size: r.target_file_size,
            groups: r
                .groups
                .iter()
                .map(|g| CompactGroupSummary {
                    partition: g.partition.clone(),
                    files: g.files.clone(),
                    bytes: g.bytes,
                })
                .collect(),
            groups_dropped: r.groups_dropped,
            commits: $commits,
            files_before: r.files_before,
            bytes_before: r.bytes_before,
            files_after: r.files_after(),
            bytes_after: r.bytes_after(),
            files_removed: r.files_removed,
            files_added: r.files_added,
            rows: $rows,
            duration_ms: u64::try_from(r.duration.as_millis()).unwrap_or(u64::MAX),
        }
    }};
}

impl Catalogs {
    /// Rewrites the small files of table `name` into files of the target
    /// size without changing its rows (see [`weir_delta::Compact`] and
    /// [`weir_iceberg::Compact`]), calling `progress` as it goes.
    pub async fn compact(
        &self,
        name: &str,
        options: &CompactOptions,
        progress: impl Fn(CompactProgress) + Send + Sync + 'static,
    ) -> Result<CompactSummary, CatalogError> {
        let table = self.table(name).await?;
        let shown = table.name.to_string();
        match table.format {
            TableFormat::Delta => {
                let storage = self.delta_storage(&table.name.catalog).await?;
                let job = weir_delta::Compact::new(&table.location)?
                    .with_storage_options(storage)
                    .on_progress(move |p| from_delta(p).into_iter().for_each(&progress));
                let r = configured!(job, options).run().await?;
                let commits = r.commits.iter().map(|v| *v as i64).collect();
                Ok(summary!(&r, shown, TableFormat::Delta, commits, r.rows.max(0) as u64))
            }
            TableFormat::Iceberg => {
                let catalog = self.iceberg_catalog(&table.name.catalog).await?;
                let job = weir_iceberg::Compact::new(catalog, &table.name.in_catalog())?
                    .on_progress(move |p| from_iceberg(p).into_iter().for_each(&progress));
                let r = configured!(job, options).run().await?;
                Ok(summary!(&r, shown, TableFormat::Iceberg, r.commits.clone(), r.rows))
            }
        }
    }
}

fn from_delta(p: weir_delta::CompactProgress) -> Option<CompactProgress> {
    Some(match p {
        weir_delta::CompactProgress::Planned { groups, files, bytes } => {
            CompactProgress::Planned { groups, files, bytes }
        }
        weir_delta::CompactProgress::Rewritten { bytes, .. } => CompactProgress::Rewritten { bytes },
        weir_delta::CompactProgress::Committed { groups, .. } => CompactProgress::Committed { groups },
        _ => return None,
    })
}

fn from_iceberg(p: weir_iceberg::CompactProgress) -> Option<CompactProgress> {
    Some(match p {
        weir_iceberg::CompactProgress::Planned { groups, files, bytes } => {
            CompactProgress::Planned { groups, files, bytes }
        }
        weir_iceberg::CompactProgress::Rewritten { bytes, .. } => CompactProgress::Rewritten { bytes },
        weir_iceberg::CompactProgress::Committed { groups, .. } => CompactProgress::Committed { groups },
        _ => return None,
    })
}
