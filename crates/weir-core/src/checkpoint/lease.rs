//! The lease of a checkpoint on object storage (invariant I5): an object
//! holding its owner, an epoch and an expiry, taken and renewed by
//! conditional puts, and a fence that refuses this run's writes once the
//! lease may have passed to another run.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, UpdateVersion};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::lease_loss::LeaseLoss;
use super::store::{Lease, LeaseOwner};
use crate::error::{Error, Result};
use crate::maintenance::AbortOnDrop;
use crate::sync::Recover;

/// How long a lease on object storage lasts and how it is kept.
///
/// The holder renews every `renew_every` (each attempt cut off after as
/// long) and stops writing once `ttl - clock_skew` has passed since it sent
/// its last successful renewal, by its monotonic clock and by its wall clock
/// (which also runs while the machine is suspended). Another run takes the
/// lease over only when it has seen the same lease unchanged for `ttl +
/// clock_skew` (by its own clock), when the lease's recorded expiry is more
/// than `clock_skew` behind its wall clock, or at once when the holder's
/// process is known to be gone (same boot, same process id namespace, no
/// process with its id and start time). So the old holder has stopped before
/// a new one starts, provided that the machines' wall clocks differ by less
/// than `clock_skew`, and that no request of the old holder takes longer
/// than `clock_skew` to reach the store after its lease was checked.
///
/// The renewals run as a task on the query's Tokio runtime: a runtime so
/// busy that the task waits longer than `ttl - clock_skew` loses the lease
/// (the query then stops, and a restart resumes it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// How long a lease holds without being renewed.
    pub ttl: Duration,
    /// How often the holder renews it.
    pub renew_every: Duration,
    /// The largest clock difference (and request delay) allowed for.
    pub clock_skew: Duration,
}

impl Default for LeaseTiming {
    /// A 30 s lease renewed every 10 s, allowing 5 s of clock skew: a
    /// killed holder's lease passes on after 35 s at most (at once when it
    /// ran on the same host and its process is gone).
    fn default() -> Self {
        LeaseTiming {
            ttl: Duration::from_secs(30),
            renew_every: Duration::from_secs(10),
            clock_skew: Duration::from_secs(5),
        }
    }
}

impl LeaseTiming {
    /// Why this timing cannot keep a lease, if so: the holder must get at
    /// least two renewals in before its lease lapses.
    pub fn problem(&self) -> Option<String> {
        let window = self.ttl.saturating_sub(self.clock_skew);
        if self.renew_every.is_zero() || self.renew_every * 2 > window {
            return Some(format!(
                "a lease renewed every {:?} lapses before its second renewal (ttl {:?} less clock skew {:?}); renew at least twice per ttl less clock skew",
                self.renew_every, self.ttl, self.clock_skew
            ));
        }
        None
    }

    /// How often a run waiting for a lease looks at it again.
    fn poll(&self) -> Duration {
        (self.renew_every / 2).min(Duration::from_secs(1))
    }
}

/// The lease object's contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct LeaseRecord {
    owner: LeaseOwner,
    /// One more than the epoch of the lease it replaced.
    epoch: u64,
    /// How often this holder renewed it, so each renewal's bytes differ.
    renewal: u64,
    ttl_ms: u64,
    /// The holder's wall clock at the renewal, plus the ttl (Unix ms).
    expires_at_ms: i64,
    released: bool,
}

impl LeaseRecord {
    fn new(owner: &LeaseOwner, epoch: u64, timing: &LeaseTiming) -> Self {
        LeaseRecord {
            owner: owner.clone(),
            epoch,
            renewal: 0,
            ttl_ms: millis(timing.ttl),
            expires_at_ms: 0,
            released: false,
        }
        .stamped(timing)
    }

    fn stamped(mut self, timing: &LeaseTiming) -> Self {
        self.expires_at_ms = chrono::Utc::now().timestamp_millis() + millis(timing.ttl) as i64;
        self
    }

    fn bytes(&self) -> Bytes {
        Bytes::from(serde_json::to_vec_pretty(self).expect("a lease serialises"))
    }

    fn expires_at(&self) -> String {
        chrono::DateTime::from_timestamp_millis(self.expires_at_ms)
            .map(|t| t.to_rfc3339())
            .unwrap_or_else(|| self.expires_at_ms.to_string())
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whether the holder's process is known to be gone: it ran on this
/// machine since its boot, in this process id namespace, and no process with
/// its id and start time runs (see [`super::ProcessIdentity::is_gone`]).
/// Its lease can then be taken at once: a dead process writes nothing more
/// (a request it sent before dying that lands late rewrites only what a
/// replay rewrites the same: see the module's docs).
fn holder_is_gone(owner: &LeaseOwner) -> bool {
    owner.process.as_ref().is_some_and(|p| p.is_gone(owner.pid))
}

/// Whether this run may write to the checkpoint.
#[derive(Debug, Default)]
pub(super) struct Fence(Mutex<FenceState>);

#[derive(Debug, Default)]
enum FenceState {
    /// No lease was taken through this fence (inspection and tools).
    #[default]
    Open,
    Held {
        epoch: u64,
        /// By this process's monotonic clock, and by the wall clock (Unix
        /// ms; it also runs while the machine is suspended).
        valid_until: Instant,
        valid_until_ms: i64,
        ttl: Duration,
    },
    Lost {
        epoch: u64,
        loss: LeaseLoss,
    },
}

impl Fence {
    /// Until when a write may go on (`None`: no lease is involved), or
    /// the epoch and the reason the lease is gone.
    pub(super) fn check(&self) -> std::result::Result<Option<Instant>, (u64, LeaseLoss)> {
        let mut state = self.0.lock().recover();
        match &*state {
            FenceState::Open => Ok(None),
            FenceState::Held {
                valid_until,
                valid_until_ms,
                ..
            } if Instant::now() < *valid_until && chrono::Utc::now().timestamp_millis() < *valid_until_ms => {
                Ok(Some(*valid_until))
            }
            FenceState::Held { epoch, ttl, .. } => {
                let (epoch, loss) = (*epoch, LeaseLoss::NotRenewed { ttl: *ttl });
                *state = FenceState::Lost {
                    epoch,
                    loss: loss.clone(),
                };
                Err((epoch, loss))
            }
            FenceState::Lost { epoch, loss } => Err((*epoch, loss.clone())),
        }
    }

    fn hold(&self, epoch: u64, valid_until: Instant, valid_until_ms: i64, ttl: Duration) {
        *self.0.lock().recover() = FenceState::Held {
            epoch,
            valid_until,
            valid_until_ms,
            ttl,
        };
    }

    /// Moves the deadlines of a held lease (a lapsed one stays lost).
    fn extend(&self, until: Instant, until_ms: i64) {
        if self.check().is_ok() {
            if let FenceState::Held {
                valid_until,
                valid_until_ms,
                ..
            } = &mut *self.0.lock().recover()
            {
                *valid_until = until;
                *valid_until_ms = until_ms;
            }
        }
    }

    fn lose(&self, loss: LeaseLoss) {
        let mut state = self.0.lock().recover();
        if let FenceState::Held { epoch, .. } = &*state {
            *state = FenceState::Lost { epoch: *epoch, loss };
        }
    }
}

/// The lease object of one checkpoint.
#[derive(Debug, Clone)]
pub(super) struct LeaseObject {
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) path: Path,
    pub(super) location: String,
    pub(super) timing: LeaseTiming,
}

/// What a conditional put of the lease did.
enum Swap {
    /// It landed; the lease object now has this version.
    Done(UpdateVersion),
    /// It conflicted with an earlier put of this run's (one whose outcome
    /// was unknown, which landed after all): the lease is still this
    /// run's, as that put left it.
    Ours(LeaseRecord, UpdateVersion),
    /// The store reported a conflict but the lease is unchanged (a
    /// conflict between concurrent conditional requests): try again.
    Unchanged,
    /// Another run's put came first.
    Lost,
}

impl LeaseObject {
    fn err(&self, source: object_store::Error) -> Error {
        Error::CheckpointStore {
            location: self.location.clone(),
            path: self.path.to_string(),
            source,
        }
    }

    async fn read(&self) -> Result<Option<(LeaseRecord, UpdateVersion)>> {
        let got = match self.store.get(&self.path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.err(e)),
        };
        let version = UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        let bytes = got.bytes().await.map_err(|e| self.err(e))?;
        let record = serde_json::from_slice(&bytes).map_err(|e| Error::CorruptCheckpoint {
            location: self.location.clone(),
            path: self.path.to_string(),
            reason: format!("the lease is not a weir lease ({e}); if no query runs on this checkpoint, delete it"),
        })?;
        Ok(Some((record, version)))
    }

    /// Puts `record` if the lease is still as `expected` says (absent for
    /// `None`). A put whose outcome is unknown, or that conflicted, is
    /// settled by reading the lease back: by its bytes, and by whose it is.
    async fn swap(&self, record: &LeaseRecord, expected: Option<&UpdateVersion>) -> Result<Swap> {
        let mode = match expected {
            None => PutMode::Create,
            Some(v) => PutMode::Update(v.clone()),
        };
        let put = self
            .store
            .put_opts(&self.path, record.bytes().into(), PutOptions::from(mode))
            .await;
        let unknown = match put {
            Ok(done) => {
                return Ok(Swap::Done(UpdateVersion {
                    e_tag: done.e_tag,
                    version: done.version,
                }))
            }
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => None,
            Err(e) => Some(e),
        };
        let now = self.read().await?;
        let unchanged = match (&now, expected) {
            (None, None) => true,
            (Some((_, version)), Some(expected)) => version == expected,
            _ => false,
        };
        match (now, unknown) {
            (Some((now, version)), _) if now == *record => Ok(Swap::Done(version)),
            (_, Some(e)) if unchanged => Err(self.err(e)),
            _ if unchanged => Ok(Swap::Unchanged),
            (Some((now, version)), _)
                if now.owner.run_id == record.owner.run_id && now.epoch == record.epoch && !now.released =>
            {
                Ok(Swap::Ours(now, version))
            }
            _ => Ok(Swap::Lost),
        }
    }

    /// Fails unless the store honours conditional puts: a second create of
    /// one object, and an update on an ETag it does not have, must fail.
    /// Without them two writers could both define a batch.
    pub(super) async fn probe(&self, dir: &Path) -> Result<()> {
        let probe: Path = dir
            .parts()
            .chain(Path::from(format!("_probe-{}", uuid::Uuid::new_v4())).parts())
            .collect();
        let create = || {
            self.store
                .put_opts(&probe, Bytes::from_static(b"probe").into(), PutMode::Create.into())
        };
        let err = |source| Error::CheckpointStore {
            location: self.location.clone(),
            path: probe.to_string(),
            source,
        };
        match create().await {
            // The name is new, so it exists only if this very create
            // landed and its answer was lost: the client retried it.
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => {}
            Err(e) => return Err(err(e)),
        }
        let second = create().await;
        let bogus = UpdateVersion {
            e_tag: Some("\"weir-probe-no-such-etag\"".into()),
            version: None,
        };
        let update = self
            .store
            .put_opts(
                &probe,
                Bytes::from_static(b"probe").into(),
                PutMode::Update(bogus).into(),
            )
            .await;
        let _ = self.store.delete(&probe).await;
        let ignored = match (second, update) {
            (Err(object_store::Error::AlreadyExists { .. }), Err(object_store::Error::Precondition { .. })) => {
                return Ok(())
            }
            (Err(object_store::Error::NotImplemented { .. }), _)
            | (_, Err(object_store::Error::NotImplemented { .. })) => "does not implement conditional puts",
            (Ok(_), _) => "let a second create of one object through",
            (_, Ok(_)) => "let an update on an ETag the object does not have through",
            (Err(object_store::Error::AlreadyExists { .. }), Err(e)) | (Err(e), _) => return Err(err(e)),
        };
        Err(Error::InvalidOption {
            option: "checkpoint_location",
            reason: format!(
                "the store of {} {ignored}: weir needs conditional puts (if-none-match and if-match) to keep a checkpoint exactly once; nothing was written",
                self.location
            ),
        })
    }

    /// Takes the lease for `owner`, waiting while a holder that may be
    /// alive has it, and refusing once the holder shows it is alive.
    pub(super) async fn acquire(&self, owner: &LeaseOwner, fence: Arc<Fence>) -> Result<Box<dyn Lease>> {
        // The lease as first seen held by another run, and since when.
        let mut watched: Option<(UpdateVersion, Instant)> = None;
        loop {
            let (epoch, expected) = match self.read().await? {
                None => (1, None),
                Some((held, version)) => {
                    let unchanged_for = watched
                        .as_ref()
                        .filter(|(seen, _)| *seen == version)
                        .map(|(_, since)| since.elapsed());
                    let skew = millis(self.timing.clock_skew) as i64;
                    let lapsed = chrono::Utc::now().timestamp_millis() > held.expires_at_ms + skew
                        || unchanged_for
                            .is_some_and(|d| d >= Duration::from_millis(held.ttl_ms) + self.timing.clock_skew);
                    if held.released || lapsed || holder_is_gone(&held.owner) {
                        (held.epoch + 1, Some(version))
                    } else if watched.is_some() && unchanged_for.is_none() {
                        // Renewed while we watched: the holder is alive.
                        return Err(Error::CheckpointInUse {
                            location: self.location.clone(),
                            owner: format!(
                                "{}, lease epoch {}, renewed until {}",
                                held.owner,
                                held.epoch,
                                held.expires_at()
                            ),
                        });
                    } else {
                        if watched.is_none() {
                            tracing::info!(location = %self.location, holder = %held.owner, expires = %held.expires_at(), "the checkpoint's lease is held; waiting to see whether its holder renews it");
                            watched = Some((version, Instant::now()));
                        }
                        tokio::time::sleep(self.timing.poll()).await;
                        continue;
                    }
                }
            };
            let record = LeaseRecord::new(owner, epoch, &self.timing);
            let sent = Instant::now();
            match self.swap(&record, expected.as_ref()).await? {
                Swap::Done(version) => {
                    if epoch > 1 {
                        tracing::info!(location = %self.location, epoch, "took over the checkpoint's lease");
                    }
                    fence.hold(
                        epoch,
                        sent + self.valid_for(),
                        self.valid_until_ms(&record),
                        self.timing.ttl,
                    );
                    let keeper = tokio::spawn(self.clone().keep(record.clone(), version, sent, fence.clone()));
                    return Ok(Box::new(ObjectLease {
                        object: self.clone(),
                        record,
                        fence,
                        keeper: AbortOnDrop(keeper),
                        released: false,
                    }));
                }
                Swap::Unchanged => tokio::time::sleep(self.timing.poll()).await,
                // Another run changed it first (or an earlier attempt of
                // ours landed late, which then lapses): look again.
                Swap::Lost | Swap::Ours(..) => watched = None,
            }
        }
    }

    /// How long after sending a renewal the holder may go on writing.
    fn valid_for(&self) -> Duration {
        self.timing.ttl.saturating_sub(self.timing.clock_skew)
    }

    /// Until when (by the wall clock) the holder of `record` may write.
    fn valid_until_ms(&self, record: &LeaseRecord) -> i64 {
        record.expires_at_ms - millis(self.timing.clock_skew) as i64
    }

    /// Marks the lease `record` took as released, unless another run
    /// holds it now.
    async fn release(&self, record: &LeaseRecord) -> Result<()> {
        // A renewal that landed after the keeper stopped moves the ETag:
        // look again.
        for _ in 0..5 {
            match self.read().await? {
                Some((now, version))
                    if now.owner.run_id == record.owner.run_id && now.epoch == record.epoch && !now.released =>
                {
                    let released = LeaseRecord { released: true, ..now };
                    match self.swap(&released, Some(&version)).await? {
                        Swap::Done(_) | Swap::Lost => return Ok(()),
                        Swap::Ours(..) | Swap::Unchanged => {}
                    }
                }
                _ => return Ok(()),
            }
        }
        Ok(())
    }

    /// Renews the lease every `renew_every` from the last renewal sent,
    /// each renewal cut off after `renew_every`, until it is lost or
    /// released.
    async fn keep(self, mut record: LeaseRecord, mut version: UpdateVersion, mut sent: Instant, fence: Arc<Fence>) {
        let mut next = sent + self.timing.renew_every;
        loop {
            tokio::time::sleep_until(next).await;
            if let Err((epoch, loss)) = fence.check() {
                tracing::error!(location = %self.location, epoch, %loss, "the checkpoint's lease is gone: this run writes nothing more");
                return;
            }
            let renewal = LeaseRecord {
                renewal: record.renewal + 1,
                ..record.clone()
            }
            .stamped(&self.timing);
            sent = Instant::now();
            let swapped = tokio::time::timeout(self.timing.renew_every, self.swap(&renewal, Some(&version))).await;
            next = match swapped {
                Ok(Ok(Swap::Done(v))) => {
                    fence.extend(sent + self.valid_for(), self.valid_until_ms(&renewal));
                    (record, version) = (renewal, v);
                    sent + self.timing.renew_every
                }
                // An earlier renewal landed late: go on from it (without
                // counting on it for longer than before).
                Ok(Ok(Swap::Ours(now, v))) => {
                    (record, version) = (now, v);
                    Instant::now() + self.timing.poll()
                }
                Ok(Ok(Swap::Unchanged)) => Instant::now() + self.timing.poll(),
                Ok(Ok(Swap::Lost)) => {
                    let loss = match self.read().await {
                        Ok(Some((now, _))) => LeaseLoss::TakenOver {
                            owner: now.owner.to_string(),
                            epoch: now.epoch,
                        },
                        _ => LeaseLoss::TakenOver {
                            owner: "another run".into(),
                            epoch: record.epoch + 1,
                        },
                    };
                    tracing::error!(location = %self.location, %loss, "the checkpoint's lease was taken over: this run writes nothing more");
                    fence.lose(loss);
                    return;
                }
                Ok(Err(e)) => {
                    tracing::warn!(location = %self.location, error = %e, "could not renew the checkpoint's lease; trying again");
                    Instant::now() + self.timing.poll()
                }
                Err(_) => {
                    tracing::warn!(location = %self.location, "renewing the checkpoint's lease took too long; trying again");
                    Instant::now() + self.timing.poll()
                }
            };
        }
    }
}

/// A lease on object storage, renewed in the background while held.
#[derive(Debug)]
struct ObjectLease {
    object: LeaseObject,
    record: LeaseRecord,
    fence: Arc<Fence>,
    keeper: AbortOnDrop<()>,
    released: bool,
}

#[async_trait]
impl Lease for ObjectLease {
    fn check(&self) -> Result<()> {
        self.fence
            .check()
            .map(|_| ())
            .map_err(|(epoch, loss)| Error::LeaseLost {
                location: self.object.location.clone(),
                path: "the sink commit".into(),
                epoch,
                loss,
            })
    }

    async fn release(mut self: Box<Self>) -> Result<()> {
        self.fence.lose(LeaseLoss::Released);
        self.keeper.0.abort();
        // Stopped before the release reads the lease.
        let _ = (&mut self.keeper.0).await;
        self.released = true;
        self.object.release(&self.record).await
    }
}

impl Drop for ObjectLease {
    /// Stops the renewals; unless released already, releases the lease in
    /// the background where a runtime is at hand (else it lapses).
    fn drop(&mut self) {
        self.fence.lose(LeaseLoss::Released);
        if self.released {
            return;
        }
        self.keeper.0.abort();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (object, record) = (self.object.clone(), self.record.clone());
            runtime.spawn(async move {
                if let Err(e) = object.release(&record).await {
                    tracing::warn!(error = %e, "could not release the checkpoint's lease; it lapses instead");
                }
            });
        }
    }
}
