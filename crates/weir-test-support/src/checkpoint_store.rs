//! The checkpoint store conformance suite: what the engine relies on from a
//! [`CheckpointStore`]. Each case takes `open`, which returns a new handle
//! on one checkpoint under test, as another process would open it.

use std::sync::Arc;

use bytes::Bytes;
use weir_core::checkpoint::{CheckpointStore, LeaseOwner, PutOutcome};
use weir_core::Error;

/// Opens a new handle on the checkpoint under test.
pub type Open<'a> = &'a (dyn Fn() -> Arc<dyn CheckpointStore> + Send + Sync);

/// Runs every case of the suite, each on its own paths of the checkpoint.
pub async fn check_store(open: Open<'_>) {
    files_are_created_once_and_read_back(open).await;
    concurrent_creates_have_one_winner(open).await;
    a_written_file_replaces_the_old_one_or_nothing(open).await;
    the_lease_is_exclusive_until_released(open).await;
}

/// A lease owner for run `run` of this process.
pub fn owner(run: &str) -> LeaseOwner {
    LeaseOwner::this_process(run)
}

/// Conditional creates keep the first writer; reads, listings, replacements
/// and deletes see every change at once.
pub async fn files_are_created_once_and_read_back(open: Open<'_>) {
    let store = open();
    assert_eq!(store.get("offsets/0").await.unwrap(), None);
    assert!(store.list("offsets").await.unwrap().is_empty());
    assert_eq!(
        store.put_if_absent("offsets/0", Bytes::from("a")).await.unwrap(),
        PutOutcome::Created
    );
    assert_eq!(
        open().put_if_absent("offsets/0", Bytes::from("b")).await.unwrap(),
        PutOutcome::AlreadyExists(Bytes::from("a"))
    );
    assert_eq!(open().get("offsets/0").await.unwrap(), Some(Bytes::from("a")));
    store.put_if_absent("offsets/1", Bytes::from("c")).await.unwrap();
    store.put("state/op/0/1.delta", Bytes::from("s")).await.unwrap();
    let mut listed = open().list("offsets").await.unwrap();
    listed.sort();
    assert_eq!(listed, ["0", "1"], "the log lists its entries and nothing else");
    assert_eq!(open().list("state/op/0").await.unwrap(), ["1.delta"]);
    assert!(
        open().list("state").await.unwrap().is_empty(),
        "a listing names the files directly under the directory"
    );
    store.put("offsets/1", Bytes::from("d")).await.unwrap();
    assert_eq!(open().get("offsets/1").await.unwrap(), Some(Bytes::from("d")));
    store.delete("offsets/1").await.unwrap();
    store.delete("offsets/1").await.unwrap();
    assert_eq!(open().get("offsets/1").await.unwrap(), None);
    assert_eq!(open().list("offsets").await.unwrap(), ["0"]);
}

/// Of many writers creating one file at once, exactly one creates it and
/// every other one is told what it holds.
pub async fn concurrent_creates_have_one_winner(open: Open<'_>) {
    let writers: Vec<_> = (0..8)
        .map(|i| {
            let store = open();
            tokio::spawn(async move {
                let bytes = Bytes::from(format!("writer {i}"));
                (bytes.clone(), store.put_if_absent("commits/7", bytes).await.unwrap())
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut told = Vec::new();
    for w in writers {
        match w.await.unwrap() {
            (bytes, PutOutcome::Created) => winners.push(bytes),
            (_, PutOutcome::AlreadyExists(held)) => told.push(held),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one writer creates the file");
    assert!(
        told.iter().all(|held| *held == winners[0]),
        "the others see the winner's bytes"
    );
    assert_eq!(open().get("commits/7").await.unwrap().as_ref(), Some(&winners[0]));
}

/// A file made by a writer function replaces the old one whole, also when
/// large; contents that fail leave the old file, with the failure's kind.
pub async fn a_written_file_replaces_the_old_one_or_nothing(open: Open<'_>) {
    let store = open();
    store.put("state/w/0.snapshot", Bytes::from("old")).await.unwrap();
    for size in [3 << 20, 20 << 20] {
        let big: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let expected = big.clone();
        store
            .put_written("state/w/0.snapshot", Box::new(move |out| out.write_all(&big)))
            .await
            .unwrap();
        assert!(open().get("state/w/0.snapshot").await.unwrap().unwrap() == expected);
    }
    let before = open().get("state/w/0.snapshot").await.unwrap();
    let err = store
        .put_written(
            "state/w/0.snapshot",
            Box::new(|out| {
                out.write_all(b"half")?;
                Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "bad rows"))
            }),
        )
        .await
        .unwrap_err();
    assert!(!err.retryable(), "{err}");
    assert!(open().get("state/w/0.snapshot").await.unwrap() == before);
    assert_eq!(open().list("state/w").await.unwrap(), ["0.snapshot"]);
}

/// One run at a time holds the lease; a second is refused with the holder
/// named, and takes it once the first released it.
pub async fn the_lease_is_exclusive_until_released(open: Open<'_>) {
    let first = open().acquire_lease(&owner("first")).await.unwrap();
    first.check().unwrap();
    let err = open().acquire_lease(&owner("second")).await.unwrap_err();
    assert!(
        matches!(&err, Error::CheckpointInUse { owner, .. } if owner.contains("run first")),
        "{err}"
    );
    first.release().await.unwrap();
    let second = open().acquire_lease(&owner("second")).await.unwrap();
    second.check().unwrap();
    // Dropped without a release, as when a query's task ends abruptly:
    // the next run still gets it.
    drop(second);
    let third = open().acquire_lease(&owner("third")).await.unwrap();
    third.release().await.unwrap();
}
