//! `KafkaSource`: its options and how it plans a batch.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_schema::SchemaRef;
use async_trait::async_trait;
use bytes::Bytes;
use regex::Regex;
use serde::{Deserialize, Serialize};
use weir_core::checkpoint::PutOutcome;
use weir_core::source::{BatchStream, Offset, ReadLimit, Source, SourceContext};

use crate::broker::{self, At, Topics};
use crate::config::ClientSettings;
use crate::context::{Consumer, Context};
use crate::decode::{ValueColumns, ValueDecoder};
use crate::error::KafkaError;
use crate::offsets::{self, PartitionOffsets, TopicPartition};
use crate::read::{self, ReadPlan, Reader};
use weir_core::sync::Recover;

/// Where a new query begins reading.
#[derive(Debug, Clone, PartialEq)]
pub enum StartingOffsets {
    /// The first offset each partition still has.
    Earliest,
    /// The end of each partition when the query first starts (the default,
    /// as in Spark): only records produced after that are read.
    Latest,
    /// These offsets, one for every partition read (`-2` earliest, `-1`
    /// latest), in the form `{"topic": {"0": 42}}`.
    Specific(PartitionOffsets),
    /// For each partition, the first record whose time is at or after this
    /// many milliseconds since the epoch (the partition's end if none is).
    Timestamp(i64),
}

/// Whether records of open or aborted transactions are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsolationLevel {
    /// Only records of committed transactions, up to the last stable offset
    /// (the default).
    ReadCommitted,
    /// Every record, aborted transactions included.
    ReadUncommitted,
}

/// A replayable Kafka source. Its offset is the position in every partition
/// it reads (`{"topic": {"0": 42, "1": 17}}` in `offsets/N`, the first
/// offset not in the batch), so a replayed batch reads exactly the records
/// it read the first time, whatever any consumer group says. Records are
/// `key`, `value`, `topic`, `partition`, `offset`, `timestamp`,
/// `timestamp_type` and, with [`KafkaSource::include_headers`], `headers`
/// (see [`crate::schema`]).
///
/// ```no_run
/// # use weir_kafka::{KafkaSource, StartingOffsets};
/// let source = KafkaSource::subscribe("127.0.0.1:9092", ["payments"])
///     .starting_offsets(StartingOffsets::Earliest)
///     .max_offsets_per_trigger(100_000);
/// ```
#[derive(Debug, Clone)]
pub struct KafkaSource {
    name: String,
    settings: ClientSettings,
    topics: Topics,
    starting: StartingOffsets,
    max_offsets: Option<u64>,
    min_offsets: Option<u64>,
    max_trigger_delay: Duration,
    fail_on_data_loss: bool,
    headers: bool,
    values: Option<Arc<ValueDecoder>>,
    isolation: IsolationLevel,
    poll_timeout: Duration,
    request_timeout: Duration,
    group: Option<String>,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    client: Option<Arc<Consumer>>,
    committer: Option<Arc<Consumer>>,
    reader: Option<Arc<Mutex<Reader>>>,
    initial: Option<PartitionOffsets>,
    available_now: Option<PartitionOffsets>,
    last_trigger: Option<Instant>,
    /// What the last few reads measured, by their end offset.
    metrics: VecDeque<(Offset, serde_json::Value)>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("connected", &self.client.is_some())
            .field("initial", &self.initial)
            .field("available_now", &self.available_now)
            .finish_non_exhaustive()
    }
}

/// The starting offsets resolved on a query's first start, kept in the
/// source's directory of the checkpoint.
#[derive(Debug, Serialize, Deserialize)]
struct InitialOffsets {
    version: u32,
    offsets: serde_json::Value,
}

const INITIAL: &str = "initial";
const METRICS_KEPT: usize = 8;

impl KafkaSource {
    fn new(bootstrap_servers: &str, topics: Topics) -> Self {
        KafkaSource {
            name: "kafka".into(),
            settings: ClientSettings::new(bootstrap_servers),
            topics,
            starting: StartingOffsets::Latest,
            max_offsets: None,
            min_offsets: None,
            max_trigger_delay: Duration::from_secs(15 * 60),
            fail_on_data_loss: true,
            headers: false,
            values: None,
            isolation: IsolationLevel::ReadCommitted,
            poll_timeout: Duration::from_secs(120),
            request_timeout: Duration::from_secs(30),
            group: None,
            state: Arc::default(),
        }
    }

    /// Reads every partition of `topics`, partitions added later included.
    pub fn subscribe<I, S>(bootstrap_servers: &str, topics: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::new(
            bootstrap_servers,
            Topics::Subscribe(topics.into_iter().map(Into::into).collect()),
        )
    }

    /// Reads every topic whose whole name matches `pattern`, topics created
    /// later included (internal topics, named `__...`, never).
    pub fn subscribe_pattern(bootstrap_servers: &str, pattern: &str) -> Result<Self, KafkaError> {
        let regex = Regex::new(&format!("^(?:{pattern})$")).map_err(|e| KafkaError::InvalidOption {
            option: "subscribe_pattern",
            reason: e.to_string(),
        })?;
        Ok(Self::new(bootstrap_servers, Topics::Pattern(regex)))
    }

    /// Reads exactly these partitions, given as `(topic, partition)`.
    pub fn assign<I, S>(bootstrap_servers: &str, partitions: I) -> Self
    where
        I: IntoIterator<Item = (S, i32)>,
        S: Into<String>,
    {
        let tps = partitions
            .into_iter()
            .map(|(topic, partition)| TopicPartition {
                topic: topic.into(),
                partition,
            })
            .collect();
        Self::new(bootstrap_servers, Topics::Assign(tps))
    }

    /// The source's name in `offsets/N` (default `kafka`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// A client setting passed to librdkafka (`security.protocol`,
    /// `sasl.mechanism`, `sasl.username`, `sasl.password`, `ssl.ca.location`,
    /// `fetch.max.bytes`, ...). Secrets never appear in logs or `Debug`.
    /// Settings the source relies on (`isolation.level`, offset handling)
    /// are its own and cannot be changed this way.
    pub fn option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.settings.set(key, value);
        self
    }

    /// Where a new query begins (default [`StartingOffsets::Latest`]). It is
    /// resolved once, on the query's first start, and kept in the checkpoint.
    pub fn starting_offsets(mut self, starting: StartingOffsets) -> Self {
        self.starting = starting;
        self
    }

    /// Reads at most this many offsets per batch, shared among partitions in
    /// proportion to how far each is behind. `Trigger::once` ignores it.
    pub fn max_offsets_per_trigger(mut self, max: u64) -> Self {
        self.max_offsets = Some(max);
        self
    }

    /// Waits for at least this many new offsets before planning a batch, but
    /// no longer than [`KafkaSource::max_trigger_delay`] after the last one.
    pub fn min_offsets_per_trigger(mut self, min: u64) -> Self {
        self.min_offsets = Some(min);
        self
    }

    /// The longest a batch waits for `min_offsets_per_trigger` (default 15
    /// minutes, as in Spark).
    pub fn max_trigger_delay(mut self, delay: Duration) -> Self {
        self.max_trigger_delay = delay;
        self
    }

    /// Whether records that are gone before the query read them (retention,
    /// a deleted topic) stop the query (the default) or are skipped and
    /// reported in the batch's progress under `sources[].metrics.lost`.
    pub fn fail_on_data_loss(mut self, fail: bool) -> Self {
        self.fail_on_data_loss = fail;
        self
    }

    /// Adds the `headers` column (before [`KafkaSource::value_columns`], if
    /// that keeps it).
    pub fn include_headers(mut self, include: bool) -> Self {
        self.headers = include;
        self
    }

    /// Parses each record's value (JSON or Avro) into typed columns instead
    /// of the raw `key` and `value` (see [`ValueColumns`]). Fails if a kept
    /// column is not a Kafka column or a name is taken twice.
    pub fn value_columns(mut self, values: ValueColumns) -> Result<Self, KafkaError> {
        let decoder = ValueDecoder::new(&values, &crate::schema(self.headers))?;
        self.values = Some(Arc::new(decoder));
        Ok(self)
    }

    /// Which records of transactional producers are read (default
    /// [`IsolationLevel::ReadCommitted`]).
    pub fn isolation_level(mut self, level: IsolationLevel) -> Self {
        self.isolation = level;
        self
    }

    /// How long a read waits for a partition that gives nothing before the
    /// batch fails, retryably (default 120 s, as Spark's `pollTimeoutMs`).
    pub fn poll_timeout(mut self, timeout: Duration) -> Self {
        self.poll_timeout = timeout;
        self
    }

    /// After each batch is recorded as committed, commits its end offsets
    /// to this consumer group, so lag monitors see the query's progress.
    /// They are never read back: the checkpoint alone says where a batch
    /// starts. A failed group commit is logged and changes nothing.
    pub fn commit_offsets_to_group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// How long a request to the cluster (metadata, offsets) may take
    /// before it fails, retryably (default 30 s).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// A consumer on the source's settings, with `defaults` where the user
    /// set nothing and `group` as its group if given.
    fn connect(&self, defaults: &[(&str, &str)], group: Option<&str>) -> Result<Consumer, KafkaError> {
        let isolation = match self.isolation {
            IsolationLevel::ReadCommitted => "read_committed",
            IsolationLevel::ReadUncommitted => "read_uncommitted",
        };
        // librdkafka assigns partitions only to a consumer with a group id.
        // The source never joins the group (it assigns, never subscribes)
        // and never commits to it but with `commit_offsets_to_group`: its
        // offsets are in the checkpoint.
        let mut defaults = defaults.to_vec();
        defaults.push(("group.id", "weir"));
        let mut overrides = vec![
            ("isolation.level", isolation),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("auto.offset.reset", "error"),
            ("enable.partition.eof", "true"),
        ];
        if let Some(group) = group {
            overrides.push(("group.id", group));
        }
        let config = self.settings.client_config(&defaults, &overrides);
        let servers = self.settings.bootstrap_servers();
        config
            .create_with_context(Context::new(servers))
            .map_err(|e| KafkaError::client(format!("connecting to {servers}"), e))
    }

    /// The client that asks for metadata and offsets, made on first use.
    fn client(&self) -> Result<Arc<Consumer>, KafkaError> {
        let mut state = self.state.lock().recover();
        cached(&mut state.client, || Ok(Arc::new(self.connect(&[], None)?)))
    }

    /// The consumer that reads records, made on first use.
    fn reader(&self) -> Result<Arc<Mutex<Reader>>, KafkaError> {
        let mut state = self.state.lock().recover();
        // What the reader fetches ahead, per partition, is what a query
        // holds beyond its batch: librdkafka's defaults (100,000 records a
        // partition, some 400 bytes each with its bookkeeping) would make
        // it follow the partition count rather than the batch.
        // A partition whose queue is full is fetched again after
        // `fetch.queue.backoff.ms`: librdkafka's 1 s would leave the reader
        // idle most of a large batch.
        let defaults = [
            ("queued.max.messages.kbytes", "16384"),
            ("queued.min.messages", "10000"),
            ("fetch.queue.backoff.ms", "10"),
        ];
        cached(&mut state.reader, || {
            Ok(Arc::new(Mutex::new(Reader::new(self.connect(&defaults, None)?))))
        })
    }

    /// The consumer of `group` that batches' offsets are committed to.
    fn committer(&self, group: &str) -> Result<Arc<Consumer>, KafkaError> {
        let mut state = self.state.lock().recover();
        cached(&mut state.committer, || Ok(Arc::new(self.connect(&[], Some(group))?)))
    }

    /// Runs `f` with the metadata client on a blocking thread.
    async fn blocking<T, F>(&self, f: F) -> Result<T, KafkaError>
    where
        T: Send + 'static,
        F: FnOnce(&Consumer, &Topics, Duration) -> Result<T, KafkaError> + Send + 'static,
    {
        let client = self.client()?;
        let topics = self.topics.clone();
        let timeout = self.request_timeout;
        tokio::task::spawn_blocking(move || {
            crate::context::serve(&client);
            f(&client, &topics, timeout).map_err(|e| crate::context::explained(&client, e))
        })
        .await
        .map_err(|e| KafkaError::Stopped(e.to_string()))?
    }

    /// The partitions there are now; a subscribed or assigned topic that is
    /// missing is an error unless `allow_missing`.
    async fn partitions(&self, allow_missing: bool) -> Result<BTreeMap<String, Vec<i32>>, KafkaError> {
        let parts = self.blocking(broker::partitions).await?;
        if !allow_missing {
            let named: Vec<&str> = match &self.topics {
                Topics::Subscribe(t) => t.iter().map(String::as_str).collect(),
                Topics::Assign(tps) => tps.iter().map(|tp| tp.topic.as_str()).collect(),
                Topics::Pattern(_) => vec![],
            };
            if let Some(missing) = named.into_iter().find(|t| !parts.contains_key(*t)) {
                return Err(KafkaError::UnknownTopic { topic: missing.into() });
            }
            if let Topics::Assign(tps) = &self.topics {
                if let Some(tp) = tps
                    .iter()
                    .find(|tp| !parts.get(&tp.topic).is_some_and(|ids| ids.contains(&tp.partition)))
                {
                    return Err(KafkaError::UnknownPartition { tp: tp.clone() });
                }
            }
        }
        Ok(parts)
    }

    /// Resolves where a new query starts.
    async fn resolve_start(&self) -> Result<PartitionOffsets, KafkaError> {
        let parts = self.partitions(false).await?;
        let at = match self.starting.clone() {
            StartingOffsets::Earliest => At::Earliest,
            StartingOffsets::Latest => At::Latest,
            StartingOffsets::Timestamp(ms) => At::Time(ms),
            StartingOffsets::Specific(given) => {
                for (tp, _) in given.iter() {
                    if !parts.get(&tp.topic).is_some_and(|ids| ids.contains(&tp.partition)) {
                        return Err(KafkaError::UnknownPartition { tp });
                    }
                }
                let missing: Vec<String> = parts
                    .iter()
                    .flat_map(|(t, ids)| ids.iter().map(move |p| (t, *p)))
                    .filter(|(t, p)| given.get(t, *p).is_none())
                    .map(|(t, p)| format!("{t}-{p}"))
                    .collect();
                if !missing.is_empty() {
                    return Err(KafkaError::InvalidOption {
                        option: "starting_offsets",
                        reason: format!(
                            "specific offsets must name every partition read; missing {}",
                            missing.join(", ")
                        ),
                    });
                }
                let (low, high) = self
                    .blocking(move |c, _, d| {
                        Ok((
                            broker::offsets(c, &parts, At::Earliest, d)?,
                            broker::offsets(c, &parts, At::Latest, d)?,
                        ))
                    })
                    .await?;
                let mut out = PartitionOffsets::new();
                for (tp, o) in given.iter() {
                    let resolved = match o {
                        -2 => low.get(&tp.topic, tp.partition).unwrap_or(0),
                        -1 => high.get(&tp.topic, tp.partition).unwrap_or(0),
                        o if o >= 0 => o,
                        o => {
                            return Err(KafkaError::InvalidOption {
                                option: "starting_offsets",
                                reason: format!("{tp}: {o} is neither an offset nor -2 (earliest) or -1 (latest)"),
                            })
                        }
                    };
                    out.insert(&tp.topic, tp.partition, resolved);
                }
                return Ok(out);
            }
        };
        self.blocking(move |c, _, d| broker::offsets(c, &parts, at, d)).await
    }

    fn initial(&self) -> PartitionOffsets {
        self.state.lock().recover().initial.clone().unwrap_or_default()
    }

    fn parse(&self, offset: Option<&Offset>) -> Result<PartitionOffsets, KafkaError> {
        match offset {
            None => Ok(self.initial()),
            Some(o) => {
                PartitionOffsets::from_json(&o.0).ok_or_else(|| KafkaError::NotAnOffset { offset: o.to_string() })
            }
        }
    }

    async fn plan(&self, start: Option<&Offset>, limit: ReadLimit) -> Result<Option<Offset>, KafkaError> {
        let base = self.parse(start)?;
        // A named topic was checked on the first start; one missing now was
        // deleted, which the partitions it leaves behind show.
        let parts = self.partitions(true).await?;
        // Partitions known before that are gone now: their topic was deleted.
        let mut gone: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for (tp, _) in base.iter() {
            if !parts.get(&tp.topic).is_some_and(|ids| ids.contains(&tp.partition)) {
                gone.entry(tp.topic).or_default().push(tp.partition);
            }
        }
        if let Some((topic, partitions)) = gone.into_iter().next() {
            if self.fail_on_data_loss {
                return Err(KafkaError::TopicDeleted { topic, partitions });
            }
            tracing::warn!(
                topic,
                ?partitions,
                "a topic the query read was deleted; going on without it"
            );
        }
        let latest = self
            .blocking(move |c, _, d| broker::offsets(c, &parts, At::Latest, d))
            .await?;
        let mut end = PartitionOffsets::new();
        let cap = self.state.lock().recover().available_now.clone();
        for (tp, high) in latest.iter() {
            let from = base.get(&tp.topic, tp.partition);
            let mut until = match &cap {
                // Found after available_now fixed its end: not this run's.
                Some(cap) => match cap.get(&tp.topic, tp.partition) {
                    Some(c) => high.min(c),
                    None => from.unwrap_or(0),
                },
                None => high,
            };
            if let Some(from) = from {
                if until < from {
                    // The partition ends before what was read: it was
                    // recreated. Reading goes on from its new beginning.
                    if self.fail_on_data_loss {
                        return Err(KafkaError::DataLoss {
                            tp,
                            from: high,
                            until: from,
                            reason: format!("the partition now ends at {high}, before offset {from} the query already read (the topic was recreated)"),
                        });
                    }
                    tracing::warn!(%tp, from, high, "partition ends before what was read; it was recreated; reading it from its beginning");
                    until = 0;
                }
            }
            end.insert(&tp.topic, tp.partition, until);
        }
        let available = offsets::total(&base, &end);
        if available == 0 {
            return Ok(start.cloned());
        }
        if limit == ReadLimit::Default {
            let last = self.state.lock().recover().last_trigger;
            if let (Some(min), Some(last)) = (self.min_offsets, last) {
                if available < min && last.elapsed() < self.max_trigger_delay {
                    return Ok(start.cloned());
                }
            }
            if let Some(max) = self.max_offsets {
                end = offsets::limit(&base, &end, max);
            }
        }
        // Partitions dropped by a rewind to 0 keep their place in `end`.
        self.state.lock().recover().last_trigger = Some(Instant::now());
        Ok(Some(end.to_offset()))
    }

    async fn read_range(&self, start: Option<&Offset>, end: &Offset) -> Result<BatchStream, KafkaError> {
        let base = self.parse(start)?;
        let end_offsets = self.parse(Some(end))?;
        let ranges = offsets::ranges(&base, &end_offsets);
        let positions = end_offsets
            .iter()
            .map(|(tp, until)| {
                let from = base.get(&tp.topic, tp.partition).unwrap_or(0);
                (tp, from.min(until))
            })
            .collect();
        let plan = ReadPlan {
            client: self.client()?,
            ranges,
            positions,
            schema: crate::schema(self.headers),
            headers: self.headers,
            values: self.values.clone(),
            fail_on_data_loss: self.fail_on_data_loss,
            poll_timeout: self.poll_timeout,
            request_timeout: self.request_timeout,
        };
        let reader = self.reader()?;
        let state = self.state.clone();
        let end = end.clone();
        Ok(read::spawn(reader, plan, move |metrics| {
            let mut state = state.lock().recover();
            state.metrics.retain(|(o, _)| *o != end);
            state.metrics.push_back((end.clone(), metrics));
            while state.metrics.len() > METRICS_KEPT {
                state.metrics.pop_front();
            }
        }))
    }
}

#[async_trait]
impl Source for KafkaSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> String {
        self.topics.describe()
    }

    fn schema(&self) -> SchemaRef {
        match &self.values {
            Some(values) => values.schema(),
            None => crate::schema(self.headers),
        }
    }

    async fn open(&self, ctx: &SourceContext) -> weir_core::Result<()> {
        let path = format!("{}/{INITIAL}", ctx.dir);
        let recorded = match ctx.store.get(&path).await? {
            Some(bytes) => bytes,
            None => {
                let offsets = self.resolve_start().await?;
                let entry = InitialOffsets {
                    version: 1,
                    offsets: offsets.to_json(),
                };
                let bytes = Bytes::from(serde_json::to_vec(&entry).expect("offsets serialise"));
                match ctx.store.put_if_absent(&path, bytes.clone()).await? {
                    PutOutcome::Created => bytes,
                    PutOutcome::AlreadyExists(existing) => existing,
                }
            }
        };
        let corrupt = |reason: String| weir_core::Error::CorruptCheckpoint {
            location: ctx.store.location().to_string(),
            path: path.clone(),
            reason,
        };
        let entry: InitialOffsets = serde_json::from_slice(&recorded).map_err(|e| corrupt(e.to_string()))?;
        let offsets = PartitionOffsets::from_json(&entry.offsets).ok_or_else(|| corrupt("not Kafka offsets".into()))?;
        tracing::info!(source = %self.name, initial = %entry.offsets, "Kafka source starts from its recorded initial offsets");
        self.state.lock().recover().initial = Some(offsets);
        Ok(())
    }

    async fn latest_offset(&self, start: Option<&Offset>, limit: ReadLimit) -> weir_core::Result<Option<Offset>> {
        Ok(self.plan(start, limit).await?)
    }

    async fn prepare_for_available_now(&self) -> weir_core::Result<()> {
        let parts = self.partitions(true).await?;
        let latest = self
            .blocking(move |c, _, d| broker::offsets(c, &parts, At::Latest, d))
            .await?;
        self.state.lock().recover().available_now = Some(latest);
        Ok(())
    }

    async fn read(&self, start: Option<&Offset>, end: &Offset) -> weir_core::Result<BatchStream> {
        Ok(self.read_range(start, end).await?)
    }

    async fn commit(&self, end: &Offset) -> weir_core::Result<()> {
        let Some(group) = self.group.clone() else { return Ok(()) };
        let offsets = self.parse(Some(end))?;
        let committed = match self.committer(&group) {
            Ok(committer) => tokio::task::spawn_blocking(move || commit_to_group(&committer, &offsets))
                .await
                .unwrap_or_else(|e| Err(KafkaError::Stopped(e.to_string()))),
            Err(e) => Err(e),
        };
        if let Err(e) = committed {
            tracing::warn!(group, error = %e, "committing offsets to the consumer group failed; the query goes on");
        }
        Ok(())
    }

    fn metrics(&self, end: &Offset) -> Option<serde_json::Value> {
        let state = self.state.lock().recover();
        state.metrics.iter().find(|(o, _)| o == end).map(|(_, m)| m.clone())
    }
}

/// What `slot` holds, made by `make` if it holds nothing yet.
fn cached<T: Clone>(slot: &mut Option<T>, make: impl FnOnce() -> Result<T, KafkaError>) -> Result<T, KafkaError> {
    if let Some(v) = slot {
        return Ok(v.clone());
    }
    let v = make()?;
    *slot = Some(v.clone());
    Ok(v)
}

/// Commits `offsets` to the committer's group.
fn commit_to_group(committer: &Consumer, offsets: &PartitionOffsets) -> Result<(), KafkaError> {
    let mut tpl = rdkafka::TopicPartitionList::new();
    for (tp, o) in offsets.iter() {
        tpl.add_partition_offset(&tp.topic, tp.partition, rdkafka::Offset::Offset(o))
            .map_err(|e| KafkaError::client("committing offsets to the group", e))?;
    }
    let result = rdkafka::consumer::Consumer::commit(committer, &tpl, rdkafka::consumer::CommitMode::Sync);
    crate::context::serve(committer);
    result.map_err(|e| KafkaError::client("committing offsets to the group", e))
}
