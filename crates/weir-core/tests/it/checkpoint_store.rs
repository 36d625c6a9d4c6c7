//! Checkpoint stores: the conformance suite on a local directory and on
//! object storage, unknown outcomes settled by reading back, and the object
//! store lease (lapses, takeovers, fencing).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use weir_core::checkpoint::{
    CheckpointStore, LeaseLoss, LeaseOwner, LeaseTiming, LocalStore, ObjectStoreCheckpoint, PutOutcome,
};
use weir_core::Error;
use weir_test_support::checkpoint_store::{check_store, owner};
use weir_test_support::faults::{Fault, FaultyStore};

/// Short enough for tests, with room for a loaded machine: a holder must
/// miss renewals for 5 s before its lease lapses.
fn timing() -> LeaseTiming {
    LeaseTiming {
        ttl: Duration::from_secs(6),
        renew_every: Duration::from_millis(500),
        clock_skew: Duration::from_secs(1),
    }
}

fn on(store: Arc<dyn ObjectStore>) -> Arc<dyn CheckpointStore> {
    Arc::new(
        ObjectStoreCheckpoint::new(store, Path::from("chk/q"), "memory://chk/q")
            .with_lease_timing(timing())
            .unwrap(),
    )
}

async fn lease_json(store: &dyn CheckpointStore) -> serde_json::Value {
    serde_json::from_slice(&store.get("lease").await.unwrap().expect("a lease")).unwrap()
}

#[tokio::test]
async fn a_local_directory_passes_the_store_suite() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    check_store(&move || Arc::new(LocalStore::open(&root).unwrap()) as Arc<dyn CheckpointStore>).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_storage_passes_the_store_suite() {
    let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    check_store(&move || on(memory.clone())).await;
}

/// Every create and every lease put lands and then reports a failure: the
/// store settles each by reading back, and the suite still passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_storage_passes_the_store_suite_when_every_create_reports_a_failure() {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    for _ in 0..200 {
        faulty.next_put("offsets/", Fault::LandThenFail);
        faulty.next_put("commits/", Fault::LandThenFail);
        faulty.next_put("lease", Fault::LandThenFail);
    }
    let store: Arc<dyn ObjectStore> = faulty.clone();
    check_store(&move || on(store.clone())).await;
    assert!(faulty.injected() > 10, "faults were injected: {}", faulty.injected());
}

#[tokio::test]
async fn a_create_that_did_not_land_fails_retryably_and_leaves_nothing() {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    let store = on(faulty.clone());
    faulty.next_put("offsets/3", Fault::Fail);
    let err = store.put_if_absent("offsets/3", Bytes::from("a")).await.unwrap_err();
    assert!(err.retryable(), "{err}");
    assert_eq!(store.get("offsets/3").await.unwrap(), None);
    assert_eq!(
        store.put_if_absent("offsets/3", Bytes::from("a")).await.unwrap(),
        PutOutcome::Created
    );
    faulty.next_put("offsets/3", Fault::Fail);
    assert_eq!(
        store.put_if_absent("offsets/3", Bytes::from("b")).await.unwrap(),
        PutOutcome::AlreadyExists(Bytes::from("a")),
        "a create that lost is told so, whatever the store reported"
    );
}

/// The holder cannot reach the store (a partition or a paused process):
/// its lease lapses, the next run takes it with a higher epoch, and from
/// then on the old run writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_lease_passes_on_and_the_old_run_writes_nothing() {
    let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faulty = FaultyStore::new(memory.clone());
    let old = on(faulty.clone());
    let old_lease = old.acquire_lease(&owner("old")).await.unwrap();
    old.put_if_absent("offsets/0", Bytes::from("old")).await.unwrap();
    faulty.partition(true);

    let new = on(memory.clone());
    let new_lease = new.acquire_lease(&owner("new")).await.unwrap();
    let lease = lease_json(new.as_ref()).await;
    assert_eq!(lease["epoch"], 2, "{lease}");
    assert_eq!(lease["owner"]["run_id"], "new", "{lease}");

    faulty.partition(false);
    for write in [
        old.put_if_absent("offsets/1", Bytes::from("old")).await,
        old.put("state/a/0/1.delta", Bytes::from("old"))
            .await
            .map(|_| PutOutcome::Created),
        old.delete("offsets/0").await.map(|_| PutOutcome::Created),
    ] {
        match write {
            Err(Error::LeaseLost { epoch: 1, loss, .. }) => assert!(matches!(loss, LeaseLoss::NotRenewed { .. })),
            other => panic!("the old run wrote: {other:?}"),
        }
    }
    assert!(old_lease.check().is_err());
    assert_eq!(new.get("offsets/1").await.unwrap(), None);
    assert_eq!(new.get("offsets/0").await.unwrap(), Some(Bytes::from("old")));
    new.put_if_absent("offsets/1", Bytes::from("new")).await.unwrap();
    new_lease.check().unwrap();
    new_lease.release().await.unwrap();
    assert_eq!(lease_json(new.as_ref()).await["released"], true);
}

/// Another run took the lease over (as after this run was paused past its
/// expiry): the holder learns it at its next renewal and stops writing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_lease_was_taken_over_stops_writing() {
    let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let holder = on(memory.clone());
    let lease = holder.acquire_lease(&owner("paused")).await.unwrap();
    let mut taken = lease_json(holder.as_ref()).await;
    taken["epoch"] = 2.into();
    taken["owner"]["run_id"] = "successor".into();
    memory
        .put(&Path::from("chk/q/lease"), serde_json::to_vec(&taken).unwrap().into())
        .await
        .unwrap();

    let mut waited = 0;
    while lease.check().is_ok() {
        assert!(waited < 200, "the holder never noticed the takeover");
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    let err = holder.put_if_absent("offsets/9", Bytes::from("x")).await.unwrap_err();
    assert!(
        matches!(&err, Error::LeaseLost { loss: LeaseLoss::TakenOver { epoch: 2, owner }, .. } if owner.contains("successor")),
        "{err}"
    );
    assert!(!err.retryable(), "{err}");
    assert_eq!(holder.get("offsets/9").await.unwrap(), None);
    lease.release().await.unwrap();
    assert_eq!(
        lease_json(holder.as_ref()).await["owner"]["run_id"],
        "successor",
        "a lease taken over is not released by its old holder"
    );
}

/// Renewals whose outcome is unknown (landed or not) keep the lease: each is
/// settled by reading the lease back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_of_unknown_outcome_keep_the_lease() {
    let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faulty = FaultyStore::new(memory.clone());
    let holder = on(faulty.clone());
    let lease = holder.acquire_lease(&owner("holder")).await.unwrap();
    for fault in [
        Fault::LandThenFail,
        Fault::Fail,
        Fault::LandThenFail,
        Fault::LandThenFail,
    ] {
        faulty.next_put("lease", fault);
    }
    let renewals = |v: serde_json::Value| v["renewal"].as_u64().unwrap();
    let mut waited = 0;
    while renewals(lease_json(on(memory.clone()).as_ref()).await) < 7 {
        assert!(waited < 200, "the lease was not renewed");
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += 1;
    }
    lease.check().unwrap();
    holder.put_if_absent("offsets/0", Bytes::from("x")).await.unwrap();
    let err = on(memory.clone()).acquire_lease(&owner("other")).await.unwrap_err();
    assert!(matches!(err, Error::CheckpointInUse { .. }), "{err}");
}

/// A holder that ran on this host and whose process is gone (killed) is
/// replaced at once, not after its lease's hour.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_process_is_gone_is_replaced_at_once() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let gone = child.id();
    child.wait().unwrap();
    let memory: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dead = LeaseOwner {
        pid: gone,
        ..owner("killed")
    };
    let record = serde_json::json!({
        "owner": dead,
        "epoch": 4,
        "renewal": 0,
        "ttl_ms": 3_600_000,
        "expires_at_ms": chrono::Utc::now().timestamp_millis() + 3_600_000,
        "released": false,
    });
    memory
        .put(&Path::from("chk/q/lease"), serde_json::to_vec(&record).unwrap().into())
        .await
        .unwrap();
    let store = on(memory.clone());
    let lease = tokio::time::timeout(Duration::from_secs(60), store.acquire_lease(&owner("restarted")))
        .await
        .expect("the lease of a process that is gone is taken without waiting for its expiry")
        .unwrap();
    assert_eq!(lease_json(store.as_ref()).await["epoch"], 5);
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_lease_that_cannot_be_kept_is_refused_by_name() {
    let bad = LeaseTiming {
        ttl: Duration::from_secs(10),
        renew_every: Duration::from_secs(5),
        clock_skew: Duration::from_secs(2),
    };
    let err = ObjectStoreCheckpoint::new(Arc::new(InMemory::new()), Path::from("c"), "memory://c")
        .with_lease_timing(bad)
        .unwrap_err();
    assert!(err.to_string().contains("renew at least twice"), "{err}");
}

/// A write still under way when its run's lease lapses is cut off, and
/// never lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_under_way_when_the_lease_lapses_is_cut_off() {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    let holder = on(faulty.clone());
    let lease = holder.acquire_lease(&owner("slow")).await.unwrap();
    for _ in 0..100 {
        faulty.next_put("lease", Fault::Fail);
    }
    faulty.next_put("state/slow", Fault::Delay(Duration::from_secs(60)));
    let err = holder.put("state/slow", Bytes::from("late")).await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::LeaseLost {
                loss: LeaseLoss::NotRenewed { .. },
                ..
            }
        ),
        "{err}"
    );
    assert!(err.retryable(), "a restart may succeed: {err}");
    assert!(lease.check().is_err());
    assert_eq!(on(faulty.clone()).get("state/slow").await.unwrap(), None);
}

/// A handle whose lease was released takes a new one, and writes under it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_takes_a_lease_again_after_releasing_one() {
    let store = on(Arc::new(InMemory::new()));
    let first = store.acquire_lease(&owner("first")).await.unwrap();
    first.release().await.unwrap();
    let err = store.put("state/a", Bytes::from("x")).await.unwrap_err();
    assert!(
        matches!(
            &err,
            Error::LeaseLost {
                loss: LeaseLoss::Released,
                ..
            }
        ),
        "{err}"
    );
    let second = store.acquire_lease(&owner("second")).await.unwrap();
    store.put("state/a", Bytes::from("y")).await.unwrap();
    assert_eq!(lease_json(store.as_ref()).await["epoch"], 2);
    second.release().await.unwrap();
}

/// The probe's first create lands, its answer is lost, and the client's
/// retry is refused because the object exists: the probe knows the name
/// is its own and passes, so a dropped connection does not stop a query.
#[tokio::test]
async fn the_probe_passes_when_its_first_create_is_retried_after_landing() {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    faulty.next_put("_probe-", Fault::LandThenRetry);
    let store = on(faulty.clone());
    let lease = store.acquire_lease(&owner("any")).await.unwrap();
    assert_eq!(faulty.injected(), 1, "the fault met the probe");
    assert_eq!(lease_json(store.as_ref()).await["epoch"], 1);
    assert_eq!(
        store.list("").await.unwrap(),
        vec!["lease".to_string()],
        "the probe is gone"
    );
    lease.release().await.unwrap();
}

/// A store that ignores conditional puts would let two writers define one
/// batch: taking the lease refuses it, and writes nothing.
#[tokio::test]
async fn a_store_without_conditional_puts_is_refused() {
    let faulty = FaultyStore::new(Arc::new(InMemory::new()));
    faulty.ignore_conditional_puts(true);
    let store = on(faulty.clone());
    let err = store.acquire_lease(&owner("any")).await.unwrap_err();
    assert!(err.to_string().contains("conditional puts"), "{err}");
    assert_eq!(store.get("lease").await.unwrap(), None);
    assert!(store.list("").await.unwrap().is_empty(), "the probe is gone");
}
