//! What the source asks the cluster, outside reading records: which
//! partitions exist, where each begins and ends, which offset a time maps to.
//! Every call blocks; the source runs them on tokio's blocking threads.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::consumer::Consumer as _;
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
/// exist is left out (the caller decides whether that is an error).
pub(crate) fn partitions(
    client: &Consumer,
    topics: &Topics,
    timeout: Duration,
) -> Result<BTreeMap<String, Vec<i32>>, KafkaError> {
    let metadata = client
        .fetch_metadata(None, timeout)
        .map_err(|e| KafkaError::client("reading the cluster's topics", e))?;
    let mut out = BTreeMap::new();
    for topic in metadata.topics() {
        let name = topic.name();
        let wanted = match topics {
            Topics::Subscribe(names) => names.iter().any(|n| n == name),
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

/// The first offset a partition still has and the offset after its last
/// readable record (for a read_committed client, the last stable offset).
pub(crate) fn watermarks(client: &Consumer, tp: &TopicPartition, timeout: Duration) -> Result<(i64, i64), KafkaError> {
    client
        .fetch_watermarks(&tp.topic, tp.partition, timeout)
        .map_err(|e| KafkaError::client(format!("reading where {tp} begins and ends"), e))
}

/// The end of each partition, as [`watermarks`] gives it.
pub(crate) fn latest(
    client: &Consumer,
    parts: &BTreeMap<String, Vec<i32>>,
    timeout: Duration,
) -> Result<PartitionOffsets, KafkaError> {
    let mut out = PartitionOffsets::new();
    for (topic, ids) in parts {
        for id in ids {
            let tp = TopicPartition {
                topic: topic.clone(),
                partition: *id,
            };
            out.insert(topic, *id, watermarks(client, &tp, timeout)?.1);
        }
    }
    Ok(out)
}

/// The beginning of each partition.
pub(crate) fn earliest(
    client: &Consumer,
    parts: &BTreeMap<String, Vec<i32>>,
    timeout: Duration,
) -> Result<PartitionOffsets, KafkaError> {
    let mut out = PartitionOffsets::new();
    for (topic, ids) in parts {
        for id in ids {
            let tp = TopicPartition {
                topic: topic.clone(),
                partition: *id,
            };
            out.insert(topic, *id, watermarks(client, &tp, timeout)?.0);
        }
    }
    Ok(out)
}

/// For each partition, the first offset whose record's time is at or after
/// `ms` (milliseconds since the epoch), or the partition's end if none is.
pub(crate) fn offsets_for_time(
    client: &Consumer,
    parts: &BTreeMap<String, Vec<i32>>,
    ms: i64,
    timeout: Duration,
) -> Result<PartitionOffsets, KafkaError> {
    let mut tpl = TopicPartitionList::new();
    for (topic, ids) in parts {
        for id in ids {
            tpl.add_partition_offset(topic, *id, KOffset::Offset(ms))
                .map_err(|e| KafkaError::client("asking for offsets by time", e))?;
        }
    }
    let found = client
        .offsets_for_times(tpl, timeout)
        .map_err(|e| KafkaError::client(format!("asking for the offsets of time {ms} ms"), e))?;
    let ends = latest(client, parts, timeout)?;
    let mut out = PartitionOffsets::new();
    for elem in found.elements() {
        let offset = match elem.offset() {
            KOffset::Offset(o) => o,
            _ => ends.get(elem.topic(), elem.partition()).unwrap_or(0),
        };
        out.insert(elem.topic(), elem.partition(), offset);
    }
    Ok(out)
}
