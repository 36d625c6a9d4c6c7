//! An [`ObjectStore`] that misbehaves on purpose: calls that fail, calls
//! that land and then report a failure (a timeout after the request went
//! out), calls that are slow, and a partition that fails every call, each
//! chosen by a test or drawn at a fixed rate from a seed.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore, PutMode,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use weir_core::sync::Recover;

/// What the store does to one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fails without doing anything.
    Fail,
    /// Does what was asked, then reports a failure (for a read or a
    /// listing, the same as [`Fault::Fail`]).
    LandThenFail,
    /// Does what was asked, then does it once more and reports the second
    /// answer, as a client does that retries a request whose answer was
    /// lost (for a conditional put the retry is refused, though the first
    /// landed; for a read or a listing, the same as no fault).
    LandThenRetry,
    /// Waits, then does what was asked.
    Delay(Duration),
}

#[derive(Debug, Default)]
struct Plan {
    /// Faults for the next puts (and reads) of paths containing a string,
    /// in order.
    next_puts: VecDeque<(String, Fault)>,
    next_gets: VecDeque<(String, Fault)>,
    /// Conditional puts overwrite, as a store without them does.
    unconditional: bool,
    partitioned: bool,
    /// Random faults, when asked for.
    random: Option<Chance>,
    /// Random faults for puts only.
    puts_only: bool,
    /// Random faults for deletes, when asked for: the other random faults
    /// let deletes pass.
    deletes: Option<Chance>,
    injected: u64,
    failed_deletes: u64,
}

impl Plan {
    fn draw(&mut self, call: Call<'_>) -> Option<Fault> {
        if self.partitioned {
            return Some(Fault::Fail);
        }
        let queued = match call {
            Call::Put(path) => Some((&mut self.next_puts, path)),
            Call::Get(path) => Some((&mut self.next_gets, path)),
            Call::Other => None,
        };
        if let Some((queue, path)) = queued {
            let at = queue.iter().position(|(part, _)| path.as_ref().contains(part.as_str()));
            if let Some(at) = at {
                return queue.remove(at).map(|(_, f)| f);
            }
        }
        if self.puts_only && !matches!(call, Call::Put(_)) {
            return None;
        }
        self.random.as_mut()?.draw()
    }
}

/// Faults drawn at a fixed rate from a seed: the same seed gives the same
/// sequence. Half of them are [`Fault::Fail`], half [`Fault::LandThenFail`].
#[derive(Debug, Clone)]
pub struct Chance {
    rate: f64,
    state: u64,
}

impl Chance {
    /// A fault with probability `rate` per draw.
    pub fn new(rate: f64, seed: u64) -> Chance {
        Chance { rate, state: seed }
    }

    /// The next draw: a fault, or none.
    pub fn draw(&mut self) -> Option<Fault> {
        // splitmix64: deterministic for a seed, good enough for a test.
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let unit = (z >> 11) as f64 / (1u64 << 53) as f64;
        if unit >= self.rate {
            return None;
        }
        Some(if (z & 1) == 0 { Fault::Fail } else { Fault::LandThenFail })
    }
}

/// The kind of call a fault is drawn for.
#[derive(Clone, Copy)]
enum Call<'a> {
    Put(&'a Path),
    Get(&'a Path),
    Other,
}

/// An [`ObjectStore`] wrapper that injects faults into puts, reads,
/// listings and deletes of the store it wraps.
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    plan: Arc<Mutex<Plan>>,
}

impl fmt::Debug for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultyStore")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

/// The error a fault reports: transient, as a reset connection is.
pub fn injected_error() -> object_store::Error {
    object_store::Error::Generic {
        store: "faulty",
        source: "injected fault: connection reset".into(),
    }
}

impl FaultyStore {
    /// `inner`, with no faults until some are asked for.
    pub fn new(inner: Arc<dyn ObjectStore>) -> Arc<Self> {
        Arc::new(FaultyStore {
            inner,
            plan: Arc::default(),
        })
    }

    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.plan.lock().recover()
    }

    /// The next put of a path containing `part` meets `fault`.
    pub fn next_put(&self, part: &str, fault: Fault) {
        self.plan().next_puts.push_back((part.to_string(), fault));
    }

    /// The next read of a path containing `part` meets `fault`.
    pub fn next_get(&self, part: &str, fault: Fault) {
        self.plan().next_gets.push_back((part.to_string(), fault));
    }

    /// While `on`, conditional puts overwrite whatever is there, as on a
    /// store that ignores if-none-match and if-match.
    pub fn ignore_conditional_puts(&self, on: bool) {
        self.plan().unconditional = on;
    }

    /// While `on`, every call fails.
    pub fn partition(&self, on: bool) {
        self.plan().partitioned = on;
    }

    /// From now on, each call but a delete ([`FaultyStore::random_deletes`])
    /// fails with probability `rate` (half of the failed puts land first),
    /// drawn from `seed`; a rate of 0 stops it.
    pub fn random(&self, rate: f64, seed: u64) {
        let mut plan = self.plan();
        plan.random = (rate > 0.0).then(|| Chance::new(rate, seed));
        plan.puts_only = false;
    }

    /// As [`FaultyStore::random`], for puts alone: writes whose outcome is
    /// unknown, while reads pass.
    pub fn random_puts(&self, rate: f64, seed: u64) {
        self.random(rate, seed);
        self.plan().puts_only = true;
    }

    /// From now on, each object a delete names fails to go with
    /// probability `rate`, drawn from `seed`; a rate of 0 stops it.
    pub fn random_deletes(&self, rate: f64, seed: u64) {
        self.plan().deletes = (rate > 0.0).then(|| Chance::new(rate, seed));
    }

    /// How many of the objects deletes named failed to go, so far.
    pub fn failed_deletes(&self) -> u64 {
        self.plan().failed_deletes
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> u64 {
        self.plan().injected
    }

    async fn fault(&self, call: Call<'_>) -> Option<Fault> {
        let fault = {
            let mut plan = self.plan();
            let fault = plan.draw(call);
            if fault.is_some() {
                plan.injected += 1;
            }
            fault
        };
        match fault {
            Some(Fault::Delay(d)) => {
                tokio::time::sleep(d).await;
                None
            }
            other => other,
        }
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let opts = if self.plan().unconditional {
            PutOptions {
                mode: PutMode::Overwrite,
                ..opts
            }
        } else {
            opts
        };
        match self.fault(Call::Put(location)).await {
            None => self.inner.put_opts(location, payload, opts).await,
            Some(Fault::LandThenFail) => {
                self.inner.put_opts(location, payload, opts).await?;
                Err(injected_error())
            }
            Some(Fault::LandThenRetry) => {
                self.inner.put_opts(location, payload.clone(), opts.clone()).await?;
                self.inner.put_opts(location, payload, opts).await
            }
            Some(_) => Err(injected_error()),
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        match self.fault(Call::Other).await {
            None => self.inner.put_multipart_opts(location, opts).await,
            Some(_) => Err(injected_error()),
        }
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        match self.fault(Call::Get(location)).await {
            None | Some(Fault::LandThenRetry) => self.inner.get_opts(location, options).await,
            Some(_) => Err(injected_error()),
        }
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let failing = self.plan().partitioned;
        if failing {
            return futures::stream::once(async { Err(injected_error()) }).boxed();
        }
        if self.plan().deletes.is_none() {
            return self.inner.delete_stream(locations);
        }
        // Each object drawn for on its own, as a store's batch delete may
        // fail for some of its objects.
        let (inner, plan) = (self.inner.clone(), self.plan.clone());
        locations
            .flat_map(move |location| {
                let fault = location.is_ok() && {
                    let mut plan = plan.lock().recover();
                    let fault = plan.deletes.as_mut().and_then(Chance::draw).is_some();
                    plan.injected += u64::from(fault);
                    plan.failed_deletes += u64::from(fault);
                    fault
                };
                if fault {
                    futures::stream::once(async { Err(injected_error()) }).boxed()
                } else {
                    inner.delete_stream(futures::stream::once(async move { location }).boxed())
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        match self.fault(Call::Other).await {
            None => self.inner.list_with_delimiter(prefix).await,
            Some(_) => Err(injected_error()),
        }
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        match self.fault(Call::Other).await {
            None => self.inner.copy_opts(from, to, options).await,
            Some(_) => Err(injected_error()),
        }
    }
}
