//! Maintenance a sink runs beside its query, off the commit path.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Compaction a table sink runs in the background as its query commits:
/// after every `every_commits` commits, or once the query has written
/// `after_files` data files since the last compaction began (the small
/// files it made), one compaction job of the table (never two at once),
/// whose commits change no row. Its failure is logged, never the query's;
/// the next one retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactionPolicy {
    /// Commits between two compactions (0: not by commits).
    pub every_commits: u64,
    /// Data files the query writes before a compaction is due (`None`: not
    /// by files).
    pub after_files: Option<u64>,
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
            after_files: None,
            target_file_size: None,
            min_input_files: min_input_files.max(2),
        }
    }

    /// Once the query has written `files` data files since the last
    /// compaction began, groups of at least `min_input_files` files, the
    /// table's target size.
    pub fn after_files(files: u64, min_input_files: usize) -> Self {
        CompactionPolicy {
            every_commits: 0,
            after_files: Some(files.max(1)),
            target_file_size: None,
            min_input_files: min_input_files.max(2),
        }
    }

    /// Counts a commit that wrote `files` data files in `periodic`; `Some`
    /// when a compaction is due and none is running. (`every_commits` 0
    /// with no `after_files` is taken as every commit.)
    pub fn due(&self, periodic: &Periodic, files: u64) -> Option<Running> {
        let every = match (self.every_commits, self.after_files) {
            (0, None) => 1,
            (every, _) => every,
        };
        periodic.after_commit_of(files, every, self.after_files)
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

/// Counts a sink's commits (and the files they wrote) and lets at most one
/// background job of a kind run at a time.
#[derive(Debug, Default)]
pub struct Periodic {
    commits: AtomicU64,
    /// Files written since the last job began.
    files: AtomicU64,
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
        self.after_commit_of(0, every.max(1), None)
    }

    /// Counts a commit that wrote `files` files; `Some` when this is a
    /// multiple of `every` commits (0: never), or `after_files` files were
    /// written since the last job began, and no job of this kind is running.
    pub fn after_commit_of(&self, files: u64, every: u64, after_files: Option<u64>) -> Option<Running> {
        let commits = self.commits.fetch_add(1, Ordering::Relaxed) + 1;
        let written = self.files.fetch_add(files, Ordering::Relaxed) + files;
        let due = (every > 0 && commits.is_multiple_of(every)) || after_files.is_some_and(|n| written >= n);
        if !due || self.running.swap(true, Ordering::AcqRel) {
            return None;
        }
        // Counting starts again from this job; files another commit counted
        // meanwhile stay counted.
        self.files.fetch_sub(written, Ordering::Relaxed);
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

    #[test]
    fn a_job_is_due_once_enough_files_were_written_since_the_last_began() {
        let policy = CompactionPolicy::after_files(10, 2);
        let p = Periodic::default();
        assert!(policy.due(&p, 4).is_none());
        assert!(policy.due(&p, 4).is_none());
        let running = policy.due(&p, 4).expect("12 files");
        assert!(policy.due(&p, 9).is_none(), "9 since it began");
        assert!(policy.due(&p, 1).is_none(), "10 since it began, but it runs");
        drop(running);
        assert!(policy.due(&p, 0).is_some(), "10 files, and it ended");
        assert!(policy.due(&p, 0).is_none(), "counting again from 0");
        // Either trigger: every 3 commits, or 100 files.
        let both = CompactionPolicy {
            after_files: Some(100),
            ..CompactionPolicy::every(3, 2)
        };
        let p = Periodic::default();
        assert!(both.due(&p, 1).is_none());
        assert!(both.due(&p, 1).is_none());
        assert!(both.due(&p, 1).is_some(), "the third commit");
        assert!(both.due(&p, 150).is_some(), "150 files");
    }
}
