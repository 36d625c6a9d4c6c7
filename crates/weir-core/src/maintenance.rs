//! What the table formats' compaction jobs share: their options, the
//! progress they report, their plan and their report. The jobs themselves
//! live with each format (`weir_delta::Compact`, `weir_iceberg::Compact`).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

/// How a compaction runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactOptions {
    /// The size of the files written (`None`: the table's target size);
    /// files under 3/4 of it are inputs, packed into groups of at most its
    /// bytes, each group rewritten as one file.
    pub target_file_size: Option<u64>,
    /// The fewest files a group must have to be rewritten (at least 2).
    pub min_input_files: usize,
    /// How many groups are rewritten at once; memory grows with it, not
    /// with the table.
    pub max_concurrent_rewrites: usize,
    /// Commit every this many groups (partial progress) instead of once at
    /// the end.
    pub groups_per_commit: Option<usize>,
    /// Only partitions with these values (Delta: partition columns; Iceberg:
    /// partition fields, values as Iceberg shows them); `None` is null.
    pub partition: BTreeMap<String, Option<String>>,
    /// Plan only; change nothing.
    pub dry_run: bool,
}

impl Default for CompactOptions {
    fn default() -> Self {
        CompactOptions {
            target_file_size: None,
            min_input_files: 2,
            max_concurrent_rewrites: std::thread::available_parallelism().map_or(2, |n| n.get().min(4)),
            groups_per_commit: None,
            partition: BTreeMap::new(),
            dry_run: false,
        }
    }
}

/// What a compaction reports as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CompactProgress {
    /// The plan: groups, input files and bytes.
    Planned { groups: usize, files: usize, bytes: u64 },
    /// One group's files were rewritten (not yet committed).
    Rewritten { group: usize, bytes: u64, files_out: usize },
    /// A commit landed (a Delta version or an Iceberg snapshot id) with
    /// this many groups.
    Committed { commit: i64, groups: usize },
}

/// One group of the plan: small files of one partition, rewritten together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CompactGroup {
    /// The partition's values (empty for an unpartitioned table).
    pub partition: BTreeMap<String, Option<String>>,
    /// The input files.
    pub files: Vec<String>,
    /// Their bytes.
    pub bytes: u64,
}

/// What a compaction did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CompactReport {
    /// Whether this was a dry run (nothing written).
    pub dry_run: bool,
    /// The version (Delta) or snapshot id (Iceberg) the plan was made on.
    pub read_version: Option<i64>,
    /// The target file size used.
    pub target_file_size: u64,
    /// Live files and bytes at the planned version.
    pub files_before: usize,
    pub bytes_before: u64,
    /// The planned groups.
    pub groups: Vec<CompactGroup>,
    /// Groups dropped because another writer removed one of their inputs.
    pub groups_dropped: usize,
    /// Other writers' commits this job's commits were built on top of.
    pub concurrent_commits: usize,
    /// The versions (Delta) or snapshot ids (Iceberg) this job committed.
    pub commits: Vec<i64>,
    /// Files and bytes removed and added by those commits.
    pub files_removed: usize,
    pub bytes_removed: u64,
    pub files_added: usize,
    pub bytes_added: u64,
    /// Rows rewritten.
    pub rows: u64,
    /// How long the job took.
    #[serde(rename = "duration_ms", serialize_with = "millis")]
    pub duration: Duration,
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl CompactReport {
    /// Live files after the job, counting only the planned version's files
    /// (files other writers added meanwhile are not included).
    pub fn files_after(&self) -> usize {
        self.files_before + self.files_added - self.files_removed
    }

    /// Live bytes after the job, counted as [`files_after`](Self::files_after).
    pub fn bytes_after(&self) -> u64 {
        self.bytes_before + self.bytes_added - self.bytes_removed
    }

    /// Counts a committed group: its input files and bytes, and its outputs'
    /// files, bytes and rows.
    pub fn count_group(&mut self, inputs: (usize, u64), outputs: (usize, u64, u64)) {
        self.files_removed += inputs.0;
        self.bytes_removed += inputs.1;
        self.files_added += outputs.0;
        self.bytes_added += outputs.1;
        self.rows += outputs.2;
    }
}

/// Casts that fail rather than turn a value that does not fit into null: a
/// rewrite must never change a row.
pub const STRICT_CAST: arrow_cast::CastOptions<'static> = arrow_cast::CastOptions {
    safe: false,
    format_options: arrow_cast::display::FormatOptions::new(),
};

/// A spawned rewrite, aborted when dropped: a job that is stopped does not
/// go on writing files.
#[derive(Debug)]
pub struct AbortOnDrop<T>(pub tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl<T> std::future::Future for AbortOnDrop<T> {
    type Output = Result<T, tokio::task::JoinError>;
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx)
    }
}
