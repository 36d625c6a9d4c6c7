//! Per-partition positions, as `offsets/N` records them, and the pure
//! decisions made over them: where a batch ends under a limit, what a batch
//! must read.

use std::collections::BTreeMap;

use weir_core::source::Offset;

/// One partition of one topic.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    /// The topic's name.
    pub topic: String,
    /// The partition's number.
    pub partition: i32,
}

impl std::fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// A position in every partition a query reads: for each, the first offset
/// NOT yet read. In `offsets/N` it is `{"topic": {"0": 42, "1": 17}}`, as
/// Spark writes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionOffsets(BTreeMap<String, BTreeMap<i32, i64>>);

impl PartitionOffsets {
    /// No partitions.
    pub fn new() -> Self {
        Self::default()
    }

    /// The offset of one partition, if it is known.
    pub fn get(&self, topic: &str, partition: i32) -> Option<i64> {
        self.0.get(topic)?.get(&partition).copied()
    }

    /// Sets the offset of one partition.
    pub fn insert(&mut self, topic: &str, partition: i32, offset: i64) {
        self.0.entry(topic.to_string()).or_default().insert(partition, offset);
    }

    /// Every partition with its offset, in topic then partition order.
    pub fn iter(&self) -> impl Iterator<Item = (TopicPartition, i64)> + '_ {
        self.0.iter().flat_map(|(topic, parts)| {
            parts.iter().map(move |(p, o)| {
                (
                    TopicPartition {
                        topic: topic.clone(),
                        partition: *p,
                    },
                    *o,
                )
            })
        })
    }

    /// How many partitions are known.
    pub fn len(&self) -> usize {
        self.0.values().map(BTreeMap::len).sum()
    }

    /// Whether no partition is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads the form `offsets/N` holds. `None` if it is not that form.
    pub fn from_json(value: &serde_json::Value) -> Option<Self> {
        let topics = value.as_object()?;
        let mut out = PartitionOffsets::new();
        for (topic, parts) in topics {
            for (p, o) in parts.as_object()? {
                out.insert(topic, p.parse().ok()?, o.as_i64()?);
            }
        }
        Some(out)
    }

    /// The form `offsets/N` holds.
    pub fn to_json(&self) -> serde_json::Value {
        let topics = self.0.iter().map(|(topic, parts)| {
            let parts = parts
                .iter()
                .map(|(p, o)| (p.to_string(), serde_json::Value::from(*o)))
                .collect::<serde_json::Map<_, _>>();
            (topic.clone(), serde_json::Value::Object(parts))
        });
        serde_json::Value::Object(topics.collect())
    }

    /// As a source offset.
    pub fn to_offset(&self) -> Offset {
        Offset(self.to_json())
    }
}

/// One partition's part of a batch: offsets `from..until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRange {
    /// The partition.
    pub tp: TopicPartition,
    /// The first offset of the batch.
    pub from: i64,
    /// The first offset after the batch.
    pub until: i64,
}

/// The ranges a batch from `start` to `end` reads, empty ones left out. A
/// partition `end` has and `start` lacks was found after `start` was
/// planned, so the batch reads it from its beginning (offset 0).
pub fn ranges(start: &PartitionOffsets, end: &PartitionOffsets) -> Vec<PartitionRange> {
    end.iter()
        .filter_map(|(tp, until)| {
            let from = start.get(&tp.topic, tp.partition).unwrap_or(0);
            (from < until).then_some(PartitionRange { tp, from, until })
        })
        .collect()
}

/// The end of the next batch when at most `max` offsets may be read: each
/// partition gets a share of `max` in proportion to how far it is behind
/// `latest` (largest remainders first, so the shares add up to exactly
/// `max`), never past `latest`. Partitions `start` lacks count from 0.
pub fn limit(start: &PartitionOffsets, latest: &PartitionOffsets, max: u64) -> PartitionOffsets {
    let lags: Vec<(TopicPartition, i64, u64)> = latest
        .iter()
        .map(|(tp, end)| {
            let from = start.get(&tp.topic, tp.partition).unwrap_or(0).min(end);
            (tp, from, (end - from) as u64)
        })
        .collect();
    let total: u128 = lags.iter().map(|(_, _, lag)| *lag as u128).sum();
    if total <= max as u128 {
        return latest.clone();
    }
    let mut shares: Vec<(u64, u128)> = lags
        .iter()
        .map(|(_, _, lag)| {
            let exact = *lag as u128 * max as u128;
            ((exact / total) as u64, exact % total)
        })
        .collect();
    let mut left = max - shares.iter().map(|(s, _)| s).sum::<u64>();
    let mut order: Vec<usize> = (0..shares.len()).collect();
    // Largest remainder first; ties go to the partition listed first.
    order.sort_by(|a, b| shares[*b].1.cmp(&shares[*a].1).then(a.cmp(b)));
    for i in order {
        if left == 0 {
            break;
        }
        if shares[i].0 < lags[i].2 {
            shares[i].0 += 1;
            left -= 1;
        }
    }
    let mut out = PartitionOffsets::new();
    for ((tp, from, _), (share, _)) in lags.iter().zip(shares) {
        out.insert(&tp.topic, tp.partition, from + share as i64);
    }
    out
}

/// The offsets read between `start` and `end` in all partitions.
pub fn total(start: &PartitionOffsets, end: &PartitionOffsets) -> u64 {
    ranges(start, end).iter().map(|r| (r.until - r.from) as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn offsets(v: serde_json::Value) -> PartitionOffsets {
        PartitionOffsets::from_json(&v).expect("valid offsets")
    }

    #[test]
    fn the_json_form_is_sparks() {
        let o = offsets(json!({"t": {"0": 42, "10": 7, "2": 17}}));
        assert_eq!(o.get("t", 10), Some(7));
        assert_eq!(o.to_json(), json!({"t": {"0": 42, "2": 17, "10": 7}}));
        assert_eq!(o.len(), 3);
        assert!(PartitionOffsets::from_json(&json!({"t": {"x": 1}})).is_none());
        assert!(PartitionOffsets::from_json(&json!({"t": {"0": "1"}})).is_none());
        assert!(PartitionOffsets::from_json(&json!([1])).is_none());
    }

    #[test]
    fn a_new_partition_is_read_from_its_beginning_and_empty_ranges_are_left_out() {
        let start = offsets(json!({"t": {"0": 5, "1": 9}}));
        let end = offsets(json!({"t": {"0": 8, "1": 9, "2": 3}}));
        let r = ranges(&start, &end);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].tp.partition, r[0].from, r[0].until), (0, 5, 8));
        assert_eq!((r[1].tp.partition, r[1].from, r[1].until), (2, 0, 3));
        assert_eq!(total(&start, &end), 6);
    }

    #[test]
    fn a_limit_is_shared_in_proportion_to_lag_and_adds_up_exactly() {
        let start = offsets(json!({"t": {"0": 0, "1": 0, "2": 0}}));
        let latest = offsets(json!({"t": {"0": 900, "1": 90, "2": 10}}));
        let end = limit(&start, &latest, 100);
        assert_eq!(end, offsets(json!({"t": {"0": 90, "1": 9, "2": 1}})));
        assert_eq!(total(&start, &end), 100);

        // Remainders: 1000 * 1/3 each; one partition gets the extra offset.
        let latest = offsets(json!({"t": {"0": 1000, "1": 1000, "2": 1000}}));
        let end = limit(&start, &latest, 1000);
        assert_eq!(total(&start, &end), 1000);
        assert_eq!(end.get("t", 0), Some(334));

        // Under the limit: everything.
        assert_eq!(limit(&start, &latest, 10_000), latest);
    }

    #[test]
    fn a_limit_never_goes_past_the_latest_offsets() {
        let start = offsets(json!({"t": {"0": 10, "1": 0}}));
        let latest = offsets(json!({"t": {"0": 11, "1": 1_000_000}}));
        for max in [1, 2, 3, 7, 999, 1_000_000] {
            let end = limit(&start, &latest, max);
            assert_eq!(total(&start, &end), max, "max {max}");
            for (tp, o) in end.iter() {
                assert!(o <= latest.get(&tp.topic, tp.partition).unwrap());
                assert!(o >= start.get(&tp.topic, tp.partition).unwrap());
            }
        }
    }
}
