//! Maintenance a sink runs beside its query, off the commit path.
//!
//! Background jobs run on a runtime of their own whose threads (workers and
//! blocking pool) have a lower scheduling priority than the query's
//! (Linux: nice 10). A job's CPU work (decoding and encoding manifests,
//! log checkpoints, files being compacted) then yields the cores to the
//! query's batches whenever both want them, instead of taking an equal
//! share of them. A job still runs at full speed on idle cores, and at
//! about a tenth of a core beside a query that keeps every core busy. (Its
//! disk writes still share the disk with the query's.)

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};

use crate::sync::Recover;
use futures::FutureExt;
use tokio::runtime::{Handle, Runtime};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// How a query's end closes its sink ([`super::Sink::close`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// The query ran to its end (its last batch, or all the data there
    /// was): background work the sink started for it finishes first.
    Finish,
    /// The query was stopped, or failed: background work stops at its next
    /// await. A job stopped before its commit changes nothing (a file it
    /// finished is an orphan for vacuum); the next one does the work. A
    /// commit already under way may still land a moment later, and a
    /// rewrite thread stops at its next batch: neither changes a row.
    Cancel,
}

/// The background jobs a sink started beside its query, ended by the
/// sink's [`super::Sink::close`] so that none outlives the query.
#[derive(Debug)]
pub struct Background {
    /// How many jobs have not ended.
    live: Arc<watch::Sender<usize>>,
    /// To cancel them.
    jobs: Mutex<Vec<AbortHandle>>,
}

impl Default for Background {
    fn default() -> Self {
        Background {
            live: Arc::new(watch::Sender::new(0)),
            jobs: Mutex::default(),
        }
    }
}

/// Counts a job as ended when its task is gone, however it ends.
struct Live(Arc<watch::Sender<usize>>);

/// A job and its count, dropped in that order (a struct's fields drop in
/// the order they are declared): the count falls only once all of the
/// job's state is gone, even when another thread drops a cancelled job
/// while [`Background::close`] waits.
struct Tracked {
    job: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
    _live: Live,
}

impl Future for Tracked {
    type Output = ();

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.job.as_mut().poll(cx)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

/// The nice value of the background runtime's threads: their CPU share
/// against a thread of the query's is about 1 to 9 when both want a core.
const BACKGROUND_NICE: i32 = 10;

/// The runtime background jobs run on: two workers and a blocking pool,
/// every thread at [`BACKGROUND_NICE`]. It lives as long as the process.
fn background_runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("weir-background")
            .on_thread_start(lower_priority)
            .enable_all()
            .build()
            .expect("the background runtime's threads start")
    })
}

/// Lowers the calling thread's scheduling priority to [`BACKGROUND_NICE`]
/// (Linux gives each thread its own nice value). Elsewhere it does nothing:
/// there the call would lower the whole process.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid and setpriority take no pointers; setpriority on
        // the thread's own id changes that thread alone.
        let failed = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, BACKGROUND_NICE) != 0
        };
        if failed {
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                "a background thread keeps the query's priority"
            );
        }
    }
}

impl Background {
    /// Runs `job` beside the query, on the background runtime (threads of
    /// a lower priority than the query's). Its panic is logged; it is
    /// never the query's.
    pub fn spawn(&self, job: impl Future<Output = ()> + Send + 'static) {
        self.live.send_modify(|n| *n += 1);
        let job = Box::pin(async move {
            if std::panic::AssertUnwindSafe(job).catch_unwind().await.is_err() {
                tracing::error!("a background job panicked");
            }
        });
        let task = background_runtime().spawn(Tracked {
            job,
            _live: Live(self.live.clone()),
        });
        let mut jobs = self.jobs.lock().recover();
        jobs.retain(|j| !j.is_finished());
        jobs.push(task.abort_handle());
    }

    /// Runs `job`, and again while another became due as it ran (see
    /// [`Running::next`]), holding `running` until none is.
    pub fn spawn_chained<F, J>(&self, running: Running, job: J)
    where
        J: Fn() -> F + Send + 'static,
        F: Future<Output = ()> + Send,
    {
        self.spawn(async move {
            let mut running = running;
            loop {
                job().await;
                match running.next() {
                    Some(again) => running = again,
                    None => break,
                }
            }
        });
    }

    /// Ends every job: waits for each to finish (`Close::Finish`), or stops
    /// each at its next await (`Close::Cancel`), and returns once every
    /// job's task is gone. A `Finish` abandoned (its future dropped) can be
    /// followed by a `Cancel`; two closes at once both return.
    pub async fn close(&self, how: Close) {
        if how == Close::Cancel {
            for job in self.jobs.lock().recover().iter() {
                job.abort();
            }
        }
        let mut live = self.live.subscribe();
        // The sender lives as long as `self`: this cannot fail.
        let _ = live.wait_for(|n| *n == 0).await;
    }
}

/// Compaction a table sink runs in the background as its query commits:
/// once the query has made `every_commits` commits, or written
/// `after_files` data files (the small files it made), since the last
/// compaction began, one compaction job of the table (never two at once),
/// whose commits change no row. A job that falls due while one runs
/// starts as that one ends. Its failure is logged, never the query's; the
/// next one retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactionPolicy {
    /// Commits from one compaction's start to the next (0: not by commits;
    /// 0 with no `after_files` is taken as every commit).
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
            min_input_files: self.min_input_files,
            max_concurrent_rewrites: 1,
            ..Default::default()
        }
        .limited()
    }

    /// After a commit that wrote `files` data files: when a compaction is
    /// due (counted in `periodic`), runs `compact` with this policy's
    /// options ([`compact_options`](Self::compact_options) of `sink_target`)
    /// in `background`, one at a time, and logs how it ended on `table`.
    /// Outside a tokio runtime nothing runs.
    pub fn compact_when_due<J, F, E>(
        &self,
        periodic: &Periodic,
        background: &Background,
        files: usize,
        table: String,
        sink_target: Option<u64>,
        compact: J,
    ) where
        J: Fn(crate::maintenance::CompactOptions) -> F + Send + Sync + 'static,
        F: Future<Output = Result<crate::maintenance::CompactReport, E>> + Send,
        E: std::fmt::Display,
    {
        if Handle::try_current().is_err() {
            return;
        }
        let Some(running) = self.due(periodic, files as u64) else {
            return;
        };
        let options = self.compact_options(sink_target);
        background.spawn_chained(running, move || {
            let (job, table) = (compact(options.clone()), table.clone());
            async move { log_compaction(&table, job.await) }
        });
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

/// Counts a sink's commits (and the files they wrote) since the last
/// background job of a kind began, and lets at most one run at a time.
#[derive(Debug, Default)]
pub struct Periodic(Arc<Mutex<Counts>>);

#[derive(Debug, Default)]
struct Counts {
    /// Commits since the last job began.
    commits: u64,
    /// Files written since the last job began.
    files: u64,
    running: bool,
}

/// Held by a running background job; the next one may start once it is
/// dropped (however the job ends, a panic included) or passed to
/// [`Running::next`]. It keeps the trigger it was started by.
#[derive(Debug)]
pub struct Running {
    counts: Arc<Mutex<Counts>>,
    trigger: Trigger,
}

/// When a job is due: after `every` commits (0: never) or `after_files`
/// files since the last began.
#[derive(Debug, Clone, Copy)]
struct Trigger {
    every: u64,
    after_files: Option<u64>,
}

impl Drop for Running {
    fn drop(&mut self) {
        lock(&self.counts).running = false;
    }
}

fn lock(counts: &Mutex<Counts>) -> std::sync::MutexGuard<'_, Counts> {
    counts.lock().recover()
}

impl Periodic {
    /// Counts a commit; `Some` when `every` commits were made since the
    /// last job began and no job of this kind is running.
    pub fn after_commit(&self, every: u64) -> Option<Running> {
        self.after_commit_of(0, every.max(1), None)
    }

    /// Counts a commit that wrote `files` files; `Some` when `every`
    /// commits were made (0: never) or `after_files` files written since
    /// the last job began, and no job of this kind is running.
    pub fn after_commit_of(&self, files: u64, every: u64, after_files: Option<u64>) -> Option<Running> {
        let mut counts = lock(&self.0);
        counts.commits += 1;
        counts.files += files;
        start(&self.0, &mut counts, Trigger { every, after_files })
    }
}

impl Running {
    /// Ends this job; `Some` (the next job) when another became due while
    /// it ran, so a job due meanwhile runs now, not at some later commit.
    pub fn next(self) -> Option<Running> {
        let (shared, trigger) = (self.counts.clone(), self.trigger);
        // A commit in between may start the next job itself: both check
        // under the lock after their own update, so none is missed.
        drop(self);
        let mut counts = lock(&shared);
        start(&shared, &mut counts, trigger)
    }
}

/// Starts a job if one is due and none runs; counting starts again from it.
fn start(shared: &Arc<Mutex<Counts>>, counts: &mut Counts, trigger: Trigger) -> Option<Running> {
    let Trigger { every, after_files } = trigger;
    let due = (every > 0 && counts.commits >= every) || after_files.is_some_and(|n| counts.files >= n);
    if !due || counts.running {
        return None;
    }
    *counts = Counts {
        commits: 0,
        files: 0,
        running: true,
    };
    Some(Running {
        counts: shared.clone(),
        trigger,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[tokio::test]
    async fn closing_waits_for_jobs_to_finish_or_cancels_them() {
        let background = Background::default();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let finished = Arc::new(AtomicBool::new(false));
        let flag = finished.clone();
        background.spawn(async move {
            rx.await.unwrap();
            flag.store(true, Ordering::SeqCst);
        });
        let release = tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.send(()).unwrap();
        });
        // Two closes at once (clones of a sink) both return.
        tokio::join!(background.close(Close::Finish), background.close(Close::Finish));
        assert!(
            finished.load(Ordering::SeqCst),
            "close(Finish) returned before the job finished"
        );
        release.await.unwrap();

        // A panicking job is logged and counted as ended.
        background.spawn(async { panic!("a job's bug") });
        background.close(Close::Finish).await;

        // A job that would never end is stopped; its state is dropped.
        let dropped = Arc::new(AtomicBool::new(false));
        struct OnDrop(Arc<AtomicBool>);
        impl Drop for OnDrop {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let guard = OnDrop(dropped.clone());
        background.spawn(async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        });
        // A Finish abandoned (as the driver does when the query is stopped
        // meanwhile) leaves the job held, for the Cancel that follows.
        let abandoned = background.close(Close::Finish).now_or_never();
        assert!(abandoned.is_none(), "a job that never ends never finishes");
        assert!(!dropped.load(Ordering::SeqCst));
        background.close(Close::Cancel).await;
        assert!(dropped.load(Ordering::SeqCst), "the cancelled job is gone");
        // Closing with nothing running returns at once.
        background.close(Close::Finish).await;
    }

    #[test]
    fn a_job_is_due_every_n_commits_and_never_twice_at_once() {
        let p = Periodic::default();
        assert!(p.after_commit(2).is_none());
        let running = p.after_commit(2).expect("due at 2");
        assert!(p.after_commit(2).is_none());
        assert!(p.after_commit(2).is_none(), "due at 4, but one is running");
        assert!(p.after_commit(2).is_none(), "still running");
        drop(running);
        let running = p.after_commit(2).expect("kept due: the first commit after it ended");
        drop(running);
        assert!(p.after_commit(2).is_none(), "counting again from this job");
        assert!(p.after_commit(2).is_some(), "2 since it began");
    }

    #[test]
    fn a_job_due_while_one_runs_starts_when_that_one_ends() {
        let p = Periodic::default();
        assert!(p.after_commit(1).is_some(), "ended at once");
        let running = p.after_commit(1).expect("due");
        assert!(p.after_commit(1).is_none(), "due, but one is running");
        let running = running.next().expect("the job due meanwhile");
        assert!(running.next().is_none(), "nothing committed since it began");
        assert!(p.after_commit(1).is_some(), "free again");
        let policy = CompactionPolicy::after_files(10, 2);
        let p = Periodic::default();
        let running = policy.due(&p, 10).expect("10 files");
        assert!(policy.due(&p, 6).is_none(), "one is running");
        assert!(running.next().is_none(), "6 files are not due");
        assert!(policy.due(&p, 4).is_some(), "10 since the job began, and it ended");
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
