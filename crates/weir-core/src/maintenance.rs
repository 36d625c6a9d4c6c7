//! What the table formats' compaction jobs share: their options, the
//! progress they report, their plan and their report. The jobs themselves
//! live with each format (`weir_delta::Compact`, `weir_iceberg::Compact`);
//! every job is a builder of `with_*` setters that is awaited.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

mod builder;
mod plan;

use crate::sync::Recover;
pub use plan::{plan_groups, PlanFile};

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

impl CompactOptions {
    /// The size of the files written; files under three quarters of it are
    /// inputs.
    pub fn with_target_file_size(mut self, bytes: u64) -> Self {
        self.target_file_size = Some(bytes);
        self.limited()
    }

    /// The fewest files a group must have to be rewritten.
    pub fn with_min_input_files(mut self, files: usize) -> Self {
        self.min_input_files = files;
        self.limited()
    }

    /// How many groups are rewritten at once.
    pub fn with_max_concurrent_rewrites(mut self, groups: usize) -> Self {
        self.max_concurrent_rewrites = groups;
        self.limited()
    }

    /// Commit every `groups` groups instead of once at the end.
    pub fn with_groups_per_commit(mut self, groups: usize) -> Self {
        self.groups_per_commit = Some(groups);
        self.limited()
    }

    /// Only the partitions where `column` has `value` (`None`: null); each
    /// call adds a condition.
    pub fn with_partition(mut self, column: impl Into<String>, value: Option<String>) -> Self {
        self.partition.insert(column.into(), value);
        self
    }

    /// Plans only.
    pub fn with_dry_run(mut self, yes: bool) -> Self {
        self.dry_run = yes;
        self
    }

    /// These options within their limits, where every setter keeps them:
    /// at least 2 input files a group, 1 rewrite at a time, 1 group a
    /// commit, and a target of 1 byte. (A commit every 0 groups would
    /// never commit.)
    pub fn limited(mut self) -> Self {
        self.min_input_files = self.min_input_files.max(2);
        self.max_concurrent_rewrites = self.max_concurrent_rewrites.max(1);
        self.groups_per_commit = self.groups_per_commit.map(|g| g.max(1));
        self.target_file_size = self.target_file_size.map(|b| b.max(1));
        self
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

/// Runs `work` on each of `items` on `threads` threads of its own (named
/// `name`), each taking items one after another; `done` sees each result
/// as it arrives (for progress). Returns every result, or the first
/// failure with the results of the items that did finish (whose outputs
/// the caller must clean up).
///
/// This is how rewrites run: decoding and encoding are CPU work that would
/// hold the runtime's workers (and whatever they should poll meanwhile),
/// and the allocator keeps memory per thread, so a fixed set of threads
/// keeps a job's memory bounded by `threads`, whatever the number of
/// items. The threads are not the runtime's blocking pool, so `work` may
/// wait there for futures that need that pool (`Handle::block_on`).
///
/// `work` gets a flag that is set once an item failed, a thread panicked,
/// or the returned future was dropped; it should then stop at its next
/// step, clean up, and return `Ok(None)`. An error is reported before the
/// flag is set, so the first error is the cause, not another thread's
/// stop. A thread that panicked, or could not start, fails the run with
/// `stopped(reason)` once every thread has ended.
pub async fn on_threads<T, R, E>(
    name: &str,
    items: Vec<T>,
    threads: usize,
    work: impl Fn(T, &AtomicBool) -> Result<Option<R>, E> + Send + Sync + 'static,
    mut done: impl FnMut(&R),
    stopped: impl FnOnce(String) -> E,
) -> Result<Vec<R>, (E, Vec<R>)>
where
    T: Send + 'static,
    R: Send + 'static,
    E: Send + 'static,
{
    let threads = threads.clamp(1, items.len().max(1));
    let queue = Arc::new(Mutex::new(VecDeque::from(items)));
    let stop = StopOnDrop(Arc::new(AtomicBool::new(false)));
    let work = Arc::new(work);
    let (sent, mut results) = tokio::sync::mpsc::unbounded_channel();
    let mut handles = Vec::new();
    let mut failure = None;
    for n in 0..threads {
        let (queue, halted, work, tx) = (queue.clone(), stop.0.clone(), work.clone(), sent.clone());
        let spawned = std::thread::Builder::new().name(format!("{name}-{n}")).spawn(move || {
            // A panic stops the other threads too.
            let _panicking = StopOnPanic(halted.clone());
            while !halted.load(Ordering::Relaxed) {
                let Some(item) = queue.lock().recover().pop_front() else {
                    break;
                };
                match work(item, &halted) {
                    Ok(Some(result)) => {
                        if tx.send(Ok(result)).is_err() {
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        halted.store(true, Ordering::Relaxed);
                    }
                }
            }
        });
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(e) => {
                stop.0.store(true, Ordering::Relaxed);
                failure = Some(format!("could not start a thread: {e}"));
                break;
            }
        }
    }
    drop(sent);
    let (mut finished, mut first_error) = (Vec::new(), None);
    while let Some(result) = results.recv().await {
        match result {
            Ok(r) => {
                done(&r);
                finished.push(r);
            }
            Err(e) => first_error = first_error.or(Some(e)),
        }
    }
    // Every thread has dropped its sender: each has ended or is ending.
    for handle in handles {
        if let Err(panic) = handle.join() {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            failure = failure.or(Some(format!("a {name} thread panicked: {message}")));
        }
    }
    match (first_error, failure) {
        (Some(e), _) => Err((e, finished)),
        (None, Some(reason)) => Err((stopped(reason), finished)),
        (None, None) => Ok(finished),
    }
}

/// Sets its flag when dropped: work on other threads sees it and stops.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Sets its flag if dropped while its thread panics.
struct StopOnPanic(Arc<AtomicBool>);

impl Drop for StopOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_item_is_done_once_on_the_threads() {
        let mut seen = 0;
        let done = on_threads(
            "test",
            (0..100u32).collect(),
            3,
            |n, _| Ok::<_, String>(Some((n, std::thread::current().name().unwrap().to_string()))),
            |_| seen += 1,
            |reason| reason,
        )
        .await
        .unwrap();
        assert_eq!(seen, 100);
        let mut ids: Vec<u32> = done.iter().map(|(n, _)| *n).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..100).collect::<Vec<_>>());
        assert!(done.iter().all(|(_, t)| t.starts_with("test-")));
    }

    /// Work that watches the flag, as a rewrite does per batch.
    fn watching(n: u32, stopped: &AtomicBool) -> Result<Option<u32>, String> {
        for _ in 0..200 {
            if stopped.load(Ordering::Relaxed) {
                return Ok(None);
            }
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        Ok(Some(n))
    }

    #[tokio::test]
    async fn an_error_is_reported_first_and_stops_the_others() {
        let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = started.clone();
        let (e, finished) = on_threads(
            "test",
            (0..1000u32).collect(),
            2,
            move |n, stopped| {
                counted.fetch_add(1, Ordering::Relaxed);
                if n == 3 {
                    return Err(format!("item {n} failed"));
                }
                watching(n, stopped)
            },
            |_| {},
            |reason| reason,
        )
        .await
        .unwrap_err();
        assert_eq!(e, "item 3 failed");
        assert!(!finished.contains(&3));
        assert!(started.load(Ordering::Relaxed) < 1000, "the others stopped");
    }

    #[tokio::test]
    async fn a_panic_stops_the_others_and_is_reported() {
        let (e, _) = on_threads(
            "test",
            (0..1000u32).collect(),
            2,
            |n, stopped| {
                if n == 5 {
                    panic!("item {n} is malformed");
                }
                watching(n, stopped)
            },
            |_| {},
            |reason| reason,
        )
        .await
        .unwrap_err();
        assert!(e.contains("item 5 is malformed"), "{e}");
    }
}
