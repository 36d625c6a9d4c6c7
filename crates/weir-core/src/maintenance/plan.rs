//! The compaction plan both table formats share: which live files are
//! small, and how they are packed into groups, each rewritten as one file.

use std::collections::BTreeMap;

use super::CompactOptions;

/// A live data file a compaction may take as input.
#[derive(Debug, Clone)]
pub struct PlanFile<K, F> {
    /// The partition it belongs to; files of different keys never share a
    /// group (Iceberg: spec id and values, Delta: the partition values).
    pub key: K,
    /// Its partition values by name, which the options' partition filter
    /// is matched against.
    pub values: BTreeMap<String, Option<String>>,
    /// Its size in bytes (`u64::MAX` when unknown: never an input).
    pub size: u64,
    /// The format's own description of the file.
    pub file: F,
}

/// Groups of small files: a file under three quarters of `target` whose
/// partition matches every condition of `options.partition` is an input.
/// Inputs are packed, per partition key and in the order given, into groups
/// of at most `target` bytes (a group takes one file even if it alone is
/// larger, which no input is); a group with fewer than
/// `options.min_input_files` files is left out. Groups come ordered by key,
/// then as packed.
pub fn plan_groups<K: Ord + Clone, F>(
    files: impl IntoIterator<Item = PlanFile<K, F>>,
    options: &CompactOptions,
    target: u64,
) -> Vec<(K, Vec<F>)> {
    let small = target.saturating_mul(3) / 4;
    let mut by_partition: BTreeMap<K, Vec<(u64, F)>> = BTreeMap::new();
    for f in files {
        let selected = options
            .partition
            .iter()
            .all(|(name, value)| f.values.get(name).is_some_and(|v| v == value));
        if selected && f.size < small {
            by_partition.entry(f.key).or_default().push((f.size, f.file));
        }
    }
    let mut groups = Vec::new();
    for (key, files) in by_partition {
        let mut group: Vec<F> = Vec::new();
        let mut bytes = 0u64;
        for (size, file) in files {
            if !group.is_empty() && bytes + size > target {
                groups.push((key.clone(), std::mem::take(&mut group)));
                bytes = 0;
            }
            bytes += size;
            group.push(file);
        }
        groups.push((key, group));
    }
    groups.retain(|(_, g)| g.len() >= options.min_input_files);
    groups
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Files as (partition, day value, size); the file is its index.
    fn plan(files: &[(u8, u8, u64)], options: &CompactOptions, target: u64) -> Vec<(u8, Vec<usize>)> {
        let files = files.iter().enumerate().map(|(i, &(key, day, size))| PlanFile {
            key,
            values: BTreeMap::from([("day".to_string(), Some(day.to_string()))]),
            size,
            file: i,
        });
        plan_groups(files, options, target)
    }

    #[test]
    fn small_files_are_packed_per_partition_in_order() {
        let options = CompactOptions::default();
        // Target 100: inputs are under 75 bytes.
        let files = [(0, 1, 40), (1, 1, 10), (0, 1, 40), (0, 1, 80), (0, 1, 30), (1, 1, 10)];
        let groups = plan(&files, &options, 100);
        assert_eq!(groups, vec![(0, vec![0, 2]), (1, vec![1, 5])]);
    }

    #[test]
    fn the_partition_filter_and_the_smallest_group_are_honoured() {
        let mut options = CompactOptions::default();
        options.partition.insert("day".into(), Some("2".into()));
        let files = [(0, 1, 10), (0, 1, 10), (1, 2, 10), (1, 2, 10), (1, 2, 10)];
        assert_eq!(plan(&files, &options, 100), vec![(1, vec![2, 3, 4])]);
        options.min_input_files = 4;
        assert!(plan(&files, &options, 100).is_empty());
    }

    proptest! {
        #[test]
        fn every_group_is_small_files_of_one_partition_within_the_target(
            files in proptest::collection::vec((0u8..3, 0u8..2, 0u64..200), 0..60),
            target in 1u64..300,
            min_input_files in 2usize..4,
            filter in proptest::option::of(0u8..2),
        ) {
            let mut options = CompactOptions { min_input_files, ..CompactOptions::default() };
            if let Some(day) = filter {
                options.partition.insert("day".into(), Some(day.to_string()));
            }
            let groups = plan(&files, &options, target);
            let mut seen = std::collections::HashSet::new();
            let mut last_key = None;
            for (key, group) in &groups {
                prop_assert!(last_key <= Some(*key), "groups come ordered by key");
                last_key = Some(*key);
                prop_assert!(group.len() >= min_input_files);
                let bytes: u64 = group.iter().map(|&i| files[i].2).sum();
                prop_assert!(bytes <= target, "a group of {bytes} bytes over the target {target}");
                prop_assert!(group.windows(2).all(|w| w[0] < w[1]), "files keep their order");
                for &i in group {
                    let (k, day, size) = files[i];
                    prop_assert_eq!(k, *key);
                    prop_assert!(size < target * 3 / 4, "file {} is not small", i);
                    prop_assert!(filter.is_none_or(|d| d == day), "the filter holds");
                    prop_assert!(seen.insert(i), "file {} in two groups", i);
                }
            }
            // Only a partition's last group, or groups too small, are left
            // out: a partition with enough small bytes is compacted.
            for key in 0u8..3 {
                let eligible: Vec<usize> = (0..files.len())
                    .filter(|&i| files[i].0 == key && files[i].2 < target.saturating_mul(3) / 4)
                    .filter(|&i| filter.is_none_or(|d| d == files[i].1))
                    .collect();
                let planned = groups.iter().filter(|(k, _)| *k == key).map(|(_, g)| g.len()).sum::<usize>();
                prop_assert!(planned <= eligible.len());
                if eligible.len() >= min_input_files && eligible.iter().map(|&i| files[i].2).sum::<u64>() <= target {
                    prop_assert_eq!(planned, eligible.len(), "all of them fit one group");
                }
            }
        }
    }
}
