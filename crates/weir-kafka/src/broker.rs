//! What the source asks the cluster, outside reading records: which
//! partitions exist, where each begins and ends, which offset a time maps to.
//! Every call blocks; the source runs them on tokio's blocking threads.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::Consumer as _;
use rdkafka::metadata::Metadata;
use rdkafka::{Offset as KOffset, TopicPartitionList};
use regex::Regex;

use crate::context::Consumer;
use crate::error::KafkaError;
use crate::offsets::{PartitionOffsets, TopicPartition};

/// Which partitions a source reads.
#[derive(Debug, Clone)]
pub enum Topics {
    /// Every partition of these topics, including partitions added later.
    Subscribe(Vec<String>),
    /// Every partition of every topic whose whole name matches (the regex
    /// is anchored at both ends), including topics created later.
    Pattern(Regex),
    /// Exactly these partitions.
    Assign(Vec<TopicPartition>),
}

impl Topics {
    /// The form recorded in the checkpoint, compared on restart.
    pub(crate) fn describe(&self) -> String {
        match self {
            Topics::Subscribe(t) => format!("kafka subscribe {}", t.join(",")),
            Topics::Pattern(r) => format!("kafka subscribe_pattern {}", r.as_str()),
            Topics::Assign(tps) => {
                let names: Vec<String> = tps.iter().map(ToString::to_string).collect();
                format!("kafka assign {}", names.join(","))
            }
        }
    }
}

/// The partitions there are now, by topic. A subscribed topic that does not
/// exist is left out (the caller decides whether that is an error). Named
/// topics are asked for by name; only a pattern needs every topic's.
pub(crate) fn partitions(
    client: &Consumer,
    topics: &Topics,
    timeout: Duration,
) -> Result<BTreeMap<String, Vec<i32>>, KafkaError> {
    let named: Vec<&str> = match topics {
        Topics::Subscribe(names) => names.iter().map(String::as_str).collect(),
        Topics::Assign(tps) => {
            let mut names: Vec<&str> = tps.iter().map(|tp| tp.topic.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            names
        }
        Topics::Pattern(_) => vec![],
    };
    let mut found = Vec::new();
    if named.is_empty() {
        found.push(fetch(client, None, timeout)?);
    }
    for name in named {
        found.push(fetch(client, Some(name), timeout)?);
    }
    let mut out = BTreeMap::new();
    for topic in found.iter().flat_map(|m| m.topics()) {
        let name = topic.name();
        let wanted = match topics {
            Topics::Subscribe(_) => true,
            Topics::Pattern(re) => !name.starts_with("__") && re.is_match(name),
            Topics::Assign(tps) => tps.iter().any(|tp| tp.topic == name),
        };
        if !wanted || topic.error().is_some() {
            continue;
        }
        let mut ids: Vec<i32> = topic.partitions().iter().map(|p| p.id()).collect();
        if let Topics::Assign(tps) = topics {
            ids.retain(|id| tps.iter().any(|tp| tp.topic == name && tp.partition == *id));
        }
        ids.sort_unstable();
        out.insert(name.to_string(), ids);
    }
    Ok(out)
}

fn fetch(client: &Consumer, topic: Option<&str>, timeout: Duration) -> Result<Metadata, KafkaError> {
    client
        .fetch_metadata(topic, timeout)
        .map_err(|e| KafkaError::client("reading the cluster's topics", e))
}

/// The first offset a partition still has and the offset after its last
/// readable record (for a read_committed client, the last stable offset).
pub(crate) fn watermarks(client: &Consumer, tp: &TopicPartition, timeout: Duration) -> Result<(i64, i64), KafkaError> {
    client
        .fetch_watermarks(&tp.topic, tp.partition, timeout)
        .map_err(|e| KafkaError::client(format!("reading where {tp} begins and ends"), e))
}

/// Which offset of each partition [`offsets`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum At {
    /// The first offset it still has.
    Earliest,
    /// The offset after its last readable record (for a read_committed
    /// client, the last stable offset).
    Latest,
    /// The first offset whose record's time is at or after this many
    /// milliseconds since the epoch, or the partition's end if none is.
    Time(i64),
}

/// The offsets `at` of every partition of `parts`, in one request per
/// leader (the partitions' watermarks take two per partition).
pub(crate) fn offsets(
    client: &Consumer,
    parts: &BTreeMap<String, Vec<i32>>,
    at: At,
    timeout: Duration,
) -> Result<PartitionOffsets, KafkaError> {
    let asked = match at {
        At::Earliest => KOffset::Beginning,
        At::Latest => KOffset::End,
        At::Time(ms) => KOffset::Offset(ms),
    };
    let mut tpl = TopicPartitionList::new();
    for (topic, ids) in parts {
        for id in ids {
            tpl.add_partition_offset(topic, *id, asked)
                .map_err(|e| KafkaError::client("asking for offsets", e))?;
        }
    }
    if tpl.count() == 0 {
        return Ok(PartitionOffsets::new());
    }
    let found = client
        .offsets_for_times(tpl, timeout)
        .map_err(|e| KafkaError::client(format!("asking for the {at:?} offsets"), e))?;
    let mut out = PartitionOffsets::new();
    let mut past_the_end = BTreeMap::new();
    for elem in found.elements() {
        let tp = || TopicPartition {
            topic: elem.topic().to_string(),
            partition: elem.partition(),
        };
        elem.error()
            .map_err(|e| KafkaError::client(format!("asking for the {at:?} offset of {}", tp()), e))?;
        match elem.offset() {
            KOffset::Offset(o) => out.insert(elem.topic(), elem.partition(), o),
            // No record at or after the time.
            _ => past_the_end
                .entry(elem.topic().to_string())
                .or_insert_with(Vec::new)
                .push(elem.partition()),
        }
    }
    if !past_the_end.is_empty() {
        for (tp, o) in offsets(client, &past_the_end, At::Latest, timeout)?.iter() {
            out.insert(&tp.topic, tp.partition, o);
        }
    }
    Ok(out)
}
