//! Maintenance a sink runs beside its query, off the commit path.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Compaction a table sink runs in the background as its query commits:
/// after every `every_commits` commits, one compaction job of the table
/// (never two at once), whose commits change no row. Its failure is
/// logged, never the query's; the next one retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactionPolicy {
    /// Commits between two compactions (at least 1).
    pub every_commits: u64,
    /// The size of the files written (`None`: the table's target size).
    pub target_file_size: Option<u64>,
    /// The fewest small files of a partition worth a rewrite (at least 2):
    /// below it a compaction finds nothing to do and commits nothing.
    pub min_input_files: usize,
}

impl CompactionPolicy {
    /// Every `commits` commits, groups of at least `min_input_files` files,
    /// the table's target size.
    pub fn every(commits: u64, min_input_files: usize) -> Self {
        CompactionPolicy {
            every_commits: commits.max(1),
            target_file_size: None,
            min_input_files: min_input_files.max(2),
        }
    }
}

impl CompactionPolicy {
    /// The options of one background compaction: one rewrite at a time, so
    /// the query keeps its cores; the policy's target size, else
    /// `sink_target` (the sink's own), else the table's.
    pub fn compact_options(&self, sink_target: Option<u64>) -> crate::maintenance::CompactOptions {
        crate::maintenance::CompactOptions {
            target_file_size: self.target_file_size.or(sink_target),
            min_input_files: self.min_input_files.max(2),
            max_concurrent_rewrites: 1,
            ..Default::default()
        }
    }
}

/// Logs how a background compaction of `table` ended: its failure is the
/// job's, never the query's, and the next one retries.
pub fn log_compaction<E: std::fmt::Display>(table: &str, outcome: Result<crate::maintenance::CompactReport, E>) {
    match outcome {
        Ok(r) => tracing::info!(
            table,
            files_removed = r.files_removed,
            files_added = r.files_added,
            "compacted"
        ),
        Err(e) => tracing::warn!(table, error = %e, "compaction failed; the next one retries"),
    }
}

/// Counts a sink's commits and lets at most one background job of a kind
/// run at a time.
#[derive(Debug, Default)]
pub struct Periodic {
    commits: AtomicU64,
    running: Arc<AtomicBool>,
}

/// Held by a running background job; the next one may start once it is
/// dropped (however the job ends, a panic included).
#[derive(Debug)]
pub struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Periodic {
    /// Counts a commit; `Some` when this is a multiple of `every` commits
    /// and no job of this kind is running.
    pub fn after_commit(&self, every: u64) -> Option<Running> {
        let commits = self.commits.fetch_add(1, Ordering::Relaxed) + 1;
        if !commits.is_multiple_of(every.max(1)) || self.running.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(Running(self.running.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_due_every_n_commits_and_never_twice_at_once() {
        let p = Periodic::default();
        assert!(p.after_commit(2).is_none());
        let running = p.after_commit(2).expect("due at 2");
        assert!(p.after_commit(2).is_none());
        assert!(p.after_commit(2).is_none(), "due at 4, but one is running");
        drop(running);
        assert!(p.after_commit(2).is_none());
        assert!(p.after_commit(2).is_some(), "due at 6");
    }
}
