use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{ArrayRef, Int64Array, StringArray};
use arrow_schema::{DataType, Field, Schema};
use proptest::prelude::*;

use super::keyed::{sort_by_bytes, REMOVED_BEFORE};
use super::*;
use crate::checkpoint::LocalStore;

fn schema() -> StateSchema {
    StateSchema::new(
        Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8, true),
        ])),
        Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)])),
    )
}

fn put(state: &mut KeyedState, k: i64, v: i64) {
    let key: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![k])),
        Arc::new(StringArray::from(vec![Some(format!("key {k}"))])),
    ];
    let keys = state.encode_keys(&key).unwrap();
    let values = state
        .encode_values(&[Arc::new(Int64Array::from(vec![v])) as ArrayRef])
        .unwrap()
        .unwrap();
    state.put(keys.row(0).as_ref(), values.value(0));
}

fn remove(state: &mut KeyedState, k: i64) {
    let key: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![k])),
        Arc::new(StringArray::from(vec![Some(format!("key {k}"))])),
    ];
    let keys = state.encode_keys(&key).unwrap();
    state.remove(keys.row(0).as_ref());
}

/// The state as a map from key to value, read through the public API.
fn contents(state: &KeyedState) -> BTreeMap<i64, i64> {
    let entries: Vec<(&[u8], &[u8])> = state.iter().collect();
    let keys = state.decode_keys(entries.iter().map(|e| e.0)).unwrap();
    let values = state.decode_values(entries.iter().map(|e| e.1)).unwrap();
    let k = keys[0].as_primitive::<Int64Type>();
    let v = values[0].as_primitive::<Int64Type>();
    (0..entries.len()).map(|i| (k.value(i), v.value(i))).collect()
}

/// Operator `op`'s state as `manifest` names it, read back.
async fn restored(store: &StateStore, manifest: &StateManifest) -> KeyedState {
    let mut back = KeyedState::new(schema()).unwrap();
    store
        .restore(manifest.operator("op").unwrap(), &mut back)
        .await
        .unwrap();
    back
}

/// Makes the snapshots `manifest` is due, as the task beside the batches
/// does.
async fn snapshots_due(store: &StateStore, manifest: &StateManifest) -> Vec<Snapshot> {
    let mut made = Vec::new();
    for files in store.due(manifest) {
        let empty = KeyedState::new(schema()).unwrap();
        made.push(store.snapshot(manifest.batch_id, files, empty).await.unwrap());
    }
    made
}

fn store(dir: &std::path::Path, every: usize) -> StateStore {
    // Files of many record batches (one row each, or a few) are read as
    // their rows in order, the removed range once.
    let chunk = if every.is_multiple_of(2) { 64 } else { 2048 };
    StateStore::new(Arc::new(LocalStore::open(dir).unwrap()), every).with_chunk_bytes(chunk)
}

#[tokio::test]
async fn a_state_comes_back_from_its_deltas_and_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 3);
    let mut state = KeyedState::new(schema()).unwrap();
    let mut manifest: Option<StateManifest> = None;
    let mut ready = Vec::new();
    for batch in 0..7u64 {
        put(&mut state, batch as i64, batch as i64 * 10);
        put(&mut state, 100, batch as i64);
        if batch % 2 == 1 {
            remove(&mut state, batch as i64 - 1);
        }
        let m = store
            .write(
                BatchId(batch),
                manifest.as_ref(),
                &mut [("op", &mut state)],
                Some(batch as i64),
                &ready,
            )
            .await
            .unwrap();
        ready = snapshots_due(&store, &m).await;
        manifest = Some(m);
    }
    let m = manifest.unwrap();
    // Three deltas make a snapshot due: made after 2 and 5, each named by
    // the next batch's manifest.
    assert_eq!(m.operator("op").unwrap().files, vec!["5.snapshot", "6.delta"]);
    let back = restored(&store, &m).await;
    assert_eq!(contents(&back), contents(&state));
    assert_eq!(back.bytes(), state.bytes());
    assert_eq!(back.changed(), 0);

    // Purging keeps what the kept manifests name.
    store.purge_before(BatchId(6)).await.unwrap();
    assert_eq!(store.manifest_ids().await.unwrap(), vec![BatchId(6)]);
    let mut files = std::fs::read_dir(dir.path().join("state/op/0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect::<Vec<_>>();
    files.sort();
    assert_eq!(files, vec!["5.snapshot", "6.delta"]);
    let mut again = KeyedState::new(schema()).unwrap();
    store.restore(m.operator("op").unwrap(), &mut again).await.unwrap();
    assert_eq!(contents(&again), contents(&state));
}

fn files_in(dir: &std::path::Path) -> Vec<String> {
    let mut files = std::fs::read_dir(dir.join("state/op/0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect::<Vec<_>>();
    files.sort();
    files
}

#[tokio::test]
async fn a_snapshot_no_manifest_names_yet_outlives_a_purge_and_an_older_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 2);
    let mut state = KeyedState::new(schema()).unwrap();
    let mut previous: Option<StateManifest> = None;
    let mut write = async |batch: u64, ready: Vec<Snapshot>| {
        put(&mut state, batch as i64, 1);
        let m = store
            .write(
                BatchId(batch),
                previous.as_ref(),
                &mut [("op", &mut state)],
                None,
                &ready,
            )
            .await
            .unwrap();
        previous = Some(m.clone());
        m
    };
    let first = write(0, vec![]).await;
    // An orphan: a snapshot after batch 0 that no manifest will name.
    store
        .snapshot(
            BatchId(0),
            first.operator("op").unwrap(),
            KeyedState::new(schema()).unwrap(),
        )
        .await
        .unwrap();
    let second = write(1, vec![]).await;
    let made = snapshots_due(&store, &second).await;
    assert_eq!(made.len(), 1, "two deltas make a snapshot due");
    write(2, vec![]).await;
    store.purge_before(BatchId(2)).await.unwrap();
    // No manifest names a snapshot: both may yet be named.
    assert_eq!(
        files_in(dir.path()),
        ["0.delta", "0.snapshot", "1.delta", "1.snapshot", "2.delta"]
    );

    let last = write(3, made).await;
    assert_eq!(last.operator("op").unwrap().files, ["1.snapshot", "2.delta", "3.delta"]);
    store.purge_before(BatchId(3)).await.unwrap();
    assert_eq!(files_in(dir.path()), ["1.snapshot", "2.delta", "3.delta"]);
    let back = restored(&store, &last).await;
    assert_eq!(contents(&back), contents(&state));
}

#[tokio::test]
async fn a_snapshot_is_due_once_the_deltas_hold_half_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 2);
    let mut state = KeyedState::new(schema()).unwrap();
    for k in 0..100 {
        put(&mut state, k, 0);
    }
    let mut m = store
        .write(BatchId(0), None, &mut [("op", &mut state)], None, &[])
        .await
        .unwrap();
    // The first delta holds the whole state: due at the second delta.
    let mut due_at = Vec::new();
    for batch in 1..=60u64 {
        put(&mut state, batch as i64, batch as i64);
        let ready = snapshots_due(&store, &m).await;
        if !ready.is_empty() {
            due_at.push(batch - 1);
        }
        m = store
            .write(BatchId(batch), Some(&m), &mut [("op", &mut state)], None, &ready)
            .await
            .unwrap();
    }
    // After the snapshot of batch 1, one changed key a batch: 50 deltas
    // hold half of the 100 keys.
    assert_eq!(due_at, [1, 51]);
    assert_eq!(m.operator("op").unwrap().chained_rows, 9);
    let back = restored(&store, &m).await;
    assert_eq!(contents(&back), contents(&state));
}

#[tokio::test]
async fn a_missing_or_foreign_state_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path(), 10);
    let mut state = KeyedState::new(schema()).unwrap();
    put(&mut state, 1, 1);
    let m = store
        .write(BatchId(0), None, &mut [("op", &mut state)], None, &[])
        .await
        .unwrap();
    // Another operator's schema cannot read it.
    let other = StateSchema::new(
        Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, false)])),
        Arc::new(Schema::new(Vec::<Field>::new())),
    );
    let err = store
        .restore(m.operator("op").unwrap(), &mut KeyedState::new(other).unwrap())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("use a new checkpoint"), "{err}");
    std::fs::remove_file(dir.path().join("state/op/0/0.delta")).unwrap();
    let err = store
        .restore(m.operator("op").unwrap(), &mut KeyedState::new(schema()).unwrap())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("is missing"), "{err}");
}

#[test]
fn a_state_without_value_columns_keeps_keys() {
    let schema = StateSchema::new(
        Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, false)])),
        Arc::new(Schema::new(Vec::<Field>::new())),
    );
    let mut state = KeyedState::new(schema).unwrap();
    let keys = state
        .encode_keys(&[Arc::new(StringArray::from(vec!["a", "b", "a"])) as ArrayRef])
        .unwrap();
    for k in keys.iter() {
        state.put(k.as_ref(), &[]);
    }
    assert_eq!(state.len(), 2);
    let changes = state.take_changes().unwrap().unwrap();
    assert_eq!(changes.num_rows(), 2);
    let mut back = KeyedState::new(state.schema().clone()).unwrap();
    back.apply(&changes).unwrap();
    assert_eq!(back.len(), 2);
}

#[derive(Debug, Clone)]
enum Op {
    Put(i64, i64),
    Remove(i64),
    /// Removes every key below this one (`take_before`).
    TakeBefore(i64),
}

fn ops() -> impl Strategy<Value = Vec<Vec<Op>>> {
    let op = prop_oneof![
        4 => (-10i64..10, any::<i64>()).prop_map(|(k, v)| Op::Put(k, v)),
        2 => (-10i64..10).prop_map(Op::Remove),
        1 => (-10i64..10).prop_map(Op::TakeBefore),
    ];
    prop::collection::vec(prop::collection::vec(op, 0..8), 1..15)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever the changes and however often snapshots are taken, the
    /// state restored from the manifest of any batch is the state after it.
    #[test]
    fn restoring_any_version_gives_that_version(batches in ops(), every in 1usize..5, lag in 0usize..3) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let store = store(dir.path(), every);
            let mut state = KeyedState::new(schema()).unwrap();
            let mut model: BTreeMap<i64, i64> = BTreeMap::new();
            let mut versions = Vec::new();
            let mut manifest: Option<StateManifest> = None;
            let mut made: Option<(usize, Vec<Snapshot>)> = None;
            for (n, batch) in batches.iter().enumerate() {
                for op in batch {
                    match *op {
                        Op::Put(k, v) => {
                            put(&mut state, k, v);
                            model.insert(k, v);
                        }
                        Op::Remove(k) => {
                            remove(&mut state, k);
                            model.remove(&k);
                        }
                        Op::TakeBefore(k) => {
                            let bound = state
                                .key_prefix(&[Arc::new(Int64Array::from(vec![k])) as ArrayRef])
                                .unwrap();
                            let taken = state.take_before(bound.row(0).as_ref()).unwrap();
                            let below: Vec<i64> = model.range(..k).map(|(k, _)| *k).collect();
                            let got: Vec<i64> = taken.column(0).as_primitive::<Int64Type>().values().to_vec();
                            prop_assert_eq!(got, below);
                            model.retain(|m, _| *m >= k);
                        }
                    }
                }
                // A snapshot made after one batch is named by a later
                // one's manifest, `lag` batches on.
                let ready: Vec<Snapshot> = match &made {
                    Some((at, _)) if n >= at + lag => made.take().unwrap().1,
                    _ => Vec::new(),
                };
                let m = store
                    .write(BatchId(n as u64), manifest.as_ref(), &mut [("op", &mut state)], None, &ready)
                    .await
                    .unwrap();
                if made.is_none() {
                    let due = snapshots_due(&store, &m).await;
                    if !due.is_empty() {
                        made = Some((n + 1, due));
                    }
                }
                versions.push((m.clone(), model.clone()));
                manifest = Some(m);
            }
            for (m, want) in versions {
                let back = restored(&store, &m).await;
                prop_assert_eq!(contents(&back), want);
                prop_assert_eq!(back.bytes() as u64, m.operator("op").unwrap().bytes);
            }
            Ok(())
        })?;
    }
}

#[test]
fn keys_before_a_prefix_are_those_whose_first_column_is_below_it() {
    // Keys (start, name): every key with a start below 20, whatever its
    // name, and no other.
    let key = Arc::new(Schema::new(vec![
        Field::new("start", DataType::Int64, false),
        Field::new("name", DataType::Utf8, true),
    ]));
    let value = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, false)]));
    let mut state = KeyedState::new(StateSchema::new(key, value)).unwrap();
    let starts: ArrayRef = Arc::new(Int64Array::from(vec![-5, 10, 19, 20, 20, 21]));
    let names: ArrayRef = Arc::new(StringArray::from(vec![
        Some("z"),
        Some("a"),
        None,
        None,
        Some(""),
        Some("a"),
    ]));
    let keys = state.encode_keys(&[starts, names]).unwrap();
    let values = state
        .encode_values(&[Arc::new(Int64Array::from(vec![1; 6])) as ArrayRef])
        .unwrap()
        .unwrap();
    for (k, v) in keys.iter().zip(values.iter()) {
        state.put(k.data(), v);
    }
    let bound = state
        .key_prefix(&[Arc::new(Int64Array::from(vec![20])) as ArrayRef])
        .unwrap();
    let below = state.take_before(bound.row(0).as_ref()).unwrap();
    // Sorted by key: a null name sorts first.
    let found: Vec<i64> = below.column(0).as_primitive::<Int64Type>().values().to_vec();
    assert_eq!(found, [-5, 10, 19]);
    assert_eq!(below.column(1).as_string::<i32>().value(0), "z");
    let left = contents_by_start(&state);
    assert_eq!(left, [20, 20, 21]);
    assert_eq!(
        state.bytes(),
        state.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
    );
    // The next delta holds the range and no row for the removed keys.
    let changes = state.take_changes().unwrap().unwrap();
    assert!(changes.schema().metadata().contains_key(REMOVED_BEFORE));
    assert_eq!(changes.num_rows(), 6 - 3, "only the keys still present");
}

fn contents_by_start(state: &KeyedState) -> Vec<i64> {
    let keys: Vec<&[u8]> = state.iter().map(|(k, _)| k).collect();
    let mut starts: Vec<i64> = state.decode_keys(keys).unwrap()[0]
        .as_primitive::<Int64Type>()
        .values()
        .to_vec();
    starts.sort_unstable();
    starts
}

#[test]
fn a_delta_with_an_unknown_weir_entry_is_refused() {
    let mut state = KeyedState::new(schema()).unwrap();
    put(&mut state, 1, 1);
    let changes = state.take_changes().unwrap().unwrap();
    let metadata = [("weir.future_thing".to_string(), "1".to_string())].into();
    let schema = Arc::new(changes.schema().as_ref().clone().with_metadata(metadata));
    let changes = changes.with_schema(schema).unwrap();
    let err = KeyedState::new(state.schema().clone())
        .unwrap()
        .apply(&changes)
        .unwrap_err();
    assert!(err.to_string().contains("newer weir"), "{err}");
}

#[test]
fn keys_sort_by_their_bytes_past_the_inline_prefix() {
    let mut keys: Vec<Vec<u8>> = vec![
        vec![1; 30],
        vec![1; 24],
        vec![1],
        vec![],
        [vec![1; 24], vec![0]].concat(),
        [vec![1; 24], vec![2]].concat(),
        vec![0; 24],
        vec![0; 25],
        vec![2],
    ];
    let mut want = keys.clone();
    want.sort();
    sort_by_bytes(&mut keys, |k| k);
    assert_eq!(keys, want);
}

#[test]
fn a_value_prefix_compares_as_the_leading_value_does() {
    let mut state = KeyedState::new(schema()).unwrap();
    for (k, v) in [(1, -7), (2, 0), (3, 5), (4, 6), (5, i64::MIN)] {
        put(&mut state, k, v);
    }
    let bound = state
        .value_prefix(&[Arc::new(Int64Array::from(vec![5])) as ArrayRef])
        .unwrap();
    let bound = bound.row(0);
    let mut at_most: Vec<i64> = state
        .iter()
        .filter(|(_, v)| v[..bound.as_ref().len()] <= *bound.as_ref())
        .map(|(_, v)| {
            state.decode_values([v]).unwrap()[0]
                .as_primitive::<Int64Type>()
                .value(0)
        })
        .collect();
    at_most.sort_unstable();
    assert_eq!(at_most, [i64::MIN, -7, 0, 5]);
    assert!(state.value_prefix(&[]).is_err());
}

/// A state whose value is one binary column holds the bytes as they are,
/// and its deltas (with a removed key, whose value is null) restore it.
#[test]
fn a_binary_value_is_held_as_its_bytes_and_restored_from_deltas() {
    let schema = StateSchema::new(
        Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)])),
        Arc::new(Schema::new(vec![Field::new("blob", DataType::LargeBinary, false)])),
    );
    let mut state = KeyedState::new(schema.clone()).unwrap();
    let keys = state
        .encode_keys(&[Arc::new(Int64Array::from(vec![1, 2, 3])) as ArrayRef])
        .unwrap();
    let blobs: Vec<&[u8]> = vec![b"one", b"", b"three"];
    let values = state
        .encode_values(&[Arc::new(arrow_array::LargeBinaryArray::from_iter_values(&blobs)) as ArrayRef])
        .unwrap()
        .unwrap();
    for (k, v) in keys.iter().zip(values.iter()) {
        state.put(k.data(), v);
    }
    assert_eq!(state.get(keys.row(2).data()), Some(&b"three"[..]));
    let mut restored = KeyedState::new(schema.clone()).unwrap();
    restored.apply(&state.take_changes().unwrap().unwrap()).unwrap();
    state.remove(keys.row(0).data());
    restored.apply(&state.take_changes().unwrap().unwrap()).unwrap();
    assert_eq!(restored.len(), 2);
    assert_eq!(restored.get(keys.row(1).data()), Some(&b""[..]));
    assert_eq!(restored.get(keys.row(2).data()), Some(&b"three"[..]));
    assert_eq!(restored.bytes(), state.bytes());
    // A null blob, or a column of another type, is refused.
    let null = arrow_array::LargeBinaryArray::from(vec![None::<&[u8]>]);
    assert!(state.encode_values(&[Arc::new(null) as ArrayRef]).is_err());
    assert!(state
        .encode_values(&[Arc::new(Int64Array::from(vec![1])) as ArrayRef])
        .is_err());
}
