//! The sink's Delta log checkpoints, written in the background.
//!
//! A checkpoint summarises the log up to one version, so it can be written
//! while later commits land: commits never wait for it. One is written at a
//! time; one falling due while another is written waits for it, and a newer
//! one due replaces it (the newest summarises all the older would). A
//! query's stop cuts the running one short ([`crate::log_checkpoint`]) and
//! drops the waiting one; the next due checkpoint does their work.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::future::BoxFuture;
use tokio::runtime::Handle;
use weir_core::sink::Background;
use weir_core::sync::Recover;

/// Writing one checkpoint; resolves to whether the table has it.
pub(super) type Write = BoxFuture<'static, bool>;

/// The sink's checkpoint writer: at most one running, at most one waiting.
#[derive(Debug, Clone, Default)]
pub(super) struct Checkpoints(Arc<Shared>);

#[derive(Default)]
struct Shared {
    slot: Mutex<Slot>,
    /// One past the newest version written (0: none yet).
    written: AtomicU64,
}

#[derive(Default)]
struct Slot {
    running: bool,
    next: Option<(u64, Write)>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let slot = self.slot();
        f.debug_struct("Checkpoints")
            .field("running", &slot.running)
            .field("waiting", &slot.next.as_ref().map(|(v, _)| *v))
            .field("written", &self.written())
            .finish()
    }
}

impl Shared {
    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().recover()
    }

    fn written(&self) -> Option<u64> {
        self.written.load(Ordering::Acquire).checked_sub(1)
    }
}

/// Frees the slot if the job ends early (cancelled by the query's stop, or
/// a panic); disarmed when it ends by itself.
struct Running(Option<Arc<Shared>>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(shared) = self.0.take() {
            let mut slot = shared.slot();
            slot.running = false;
            slot.next = None;
        }
    }
}

impl Checkpoints {
    /// Writes the checkpoint of `version` in `background`, now if none is
    /// being written, else after the running one (unless a newer one is
    /// already waiting). Outside a tokio runtime nothing runs.
    pub(super) fn start(&self, background: &Background, version: u64, write: Write) {
        if Handle::try_current().is_err() {
            return;
        }
        {
            let mut slot = self.0.slot();
            if slot.running {
                if slot.next.as_ref().is_none_or(|(waiting, _)| *waiting < version) {
                    slot.next = Some((version, write));
                }
                return;
            }
            slot.running = true;
        }
        let shared = self.0.clone();
        // Made here, not in the job: a job cancelled before it first runs
        // frees the slot too.
        let running = Running(Some(shared.clone()));
        background.spawn(async move {
            let mut running = running;
            let (mut version, mut write) = (version, write);
            loop {
                if write.await {
                    shared.written.fetch_max(version + 1, Ordering::AcqRel);
                }
                let mut slot = shared.slot();
                match slot.next.take() {
                    Some(next) => (version, write) = next,
                    None => {
                        slot.running = false;
                        running.0 = None;
                        return;
                    }
                }
            }
        });
    }

    /// The newest version this sink wrote a checkpoint of.
    pub(super) fn written(&self) -> Option<u64> {
        self.0.written()
    }

    #[cfg(test)]
    fn busy(&self) -> bool {
        let slot = self.0.slot();
        slot.running || slot.next.is_some()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use futures::FutureExt;
    use weir_core::sink::Close;

    use super::*;

    /// Waits (at most ten seconds) until no checkpoint runs or waits.
    async fn idle(checkpoints: &Checkpoints) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while checkpoints.busy() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the checkpoints did not finish");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_newest_due_checkpoint_follows_the_running_one() {
        let (checkpoints, background) = (Checkpoints::default(), Background::default());
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        let ran = Arc::new(Mutex::new(Vec::new()));
        let log = |v: u64, ran: &Arc<Mutex<Vec<u64>>>| {
            let ran = ran.clone();
            async move {
                ran.lock().unwrap().push(v);
                true
            }
        };
        let first = {
            let ran = ran.clone();
            async move {
                let _ = wait.await;
                ran.lock().unwrap().push(99);
                true
            }
        };
        checkpoints.start(&background, 99, first.boxed());
        checkpoints.start(&background, 199, log(199, &ran).boxed());
        checkpoints.start(&background, 299, log(299, &ran).boxed());
        // An older one due after a newer waits never replaces it.
        checkpoints.start(&background, 249, log(249, &ran).boxed());
        assert!(ran.lock().unwrap().is_empty());
        release.send(()).unwrap();
        idle(&checkpoints).await;
        assert_eq!(*ran.lock().unwrap(), vec![99, 299]);
        assert_eq!(checkpoints.written(), Some(299));
        background.close(Close::Finish).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn never_two_at_once_and_a_failure_is_not_written() {
        let (checkpoints, background) = (Checkpoints::default(), Background::default());
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        for v in 0..200u64 {
            let (now, most) = (now.clone(), most.clone());
            let write = async move {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_micros(200)).await;
                now.fetch_sub(1, Ordering::SeqCst);
                v % 2 == 0
            };
            checkpoints.start(&background, v, write.boxed());
            if v % 7 == 0 {
                tokio::task::yield_now().await;
            }
        }
        idle(&checkpoints).await;
        assert_eq!(most.load(Ordering::SeqCst), 1);
        // The last one (199) failed; the newest written is an even version.
        let written = checkpoints.written().expect("some were written");
        assert!(written % 2 == 0 && written < 199, "{written}");
        background.close(Close::Finish).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stop_or_a_panic_frees_the_slot() {
        let (checkpoints, background) = (Checkpoints::default(), Background::default());
        checkpoints.start(&background, 99, futures::future::pending().boxed());
        checkpoints.start(&background, 199, async { true }.boxed());
        assert!(checkpoints.busy());
        background.close(Close::Cancel).await;
        assert!(!checkpoints.busy(), "a cancelled checkpoint holds the slot");
        assert_eq!(checkpoints.written(), None);

        let bug = async {
            assert!(!std::hint::black_box(true), "a checkpoint bug");
            true
        };
        checkpoints.start(&background, 299, bug.boxed());
        idle(&checkpoints).await;
        checkpoints.start(&background, 399, async { true }.boxed());
        idle(&checkpoints).await;
        assert_eq!(checkpoints.written(), Some(399));
        background.close(Close::Finish).await;
    }
}
