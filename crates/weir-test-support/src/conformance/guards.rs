//! The checkpoint's lease (I5) and the start-up guards (I4, I4b, I6): a
//! second run, a deleted, copied or moved checkpoint, a lost table.

use weir_core::protocol::Refusal;
use weir_core::{BatchId, Error, StreamWriter, Trigger};

use super::*;
use crate::data::assert_exactly_once;

/// I5: a second query on a checkpoint in use is refused.
pub async fn second_query_on_a_checkpoint_is_refused(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    let slow = || query(&chk).trigger(Trigger::processing_time(Duration::from_secs(3600)));
    let first = slow().start_arc(h.sink().await).await.expect("first query");
    match slow().start_arc(h.sink().await).await {
        Err(Error::CheckpointInUse { location, owner }) => {
            assert!(location.contains(chk.location().trim_end_matches('/')), "{location}");
            assert!(owner.contains(&first.run_id().to_string()), "names the holder: {owner}");
        }
        other => panic!("expected CheckpointInUse, got {other:?}"),
    }
    wait_for_batch(&first).await;
    first.stop_and_wait().await.expect("stop");
    let second = slow().start_arc(h.sink().await).await.expect("free after stop");
    wait_for_batch(&second).await;
    second.stop_and_wait().await.expect("stop");
    let ids = h.read_event_ids().await;
    assert!(!ids.is_empty() && ids.len() % ROWS as usize == 0);
    assert_exactly_once(&ids, 0..ids.len() as i64);
}

/// I4b: a new checkpoint for a name with output under another query id is
/// refused; the explicit takeover continues after the old marker.
pub async fn deleted_checkpoint_is_refused_then_taken_over(h: &dyn SinkHarness) {
    let (old, new) = (CaseCheckpoint::new(h), CaseCheckpoint::new(h));
    run_to(h, query(&old), 1).await.expect("old checkpoint");
    let r = refusal(run_to(h, query(&new), 3).await);
    assert!(matches!(r, Refusal::OutputOfAnotherQuery { .. }), "{r}");
    assert!(r.to_string().contains("take_over_output"));
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..2));

    run_to(h, query(&new).take_over_output(true), 3)
        .await
        .expect("take over");
    let marker = h
        .sink()
        .await
        .marker(&name(), &[])
        .await
        .expect("marker")
        .expect("a marker");
    assert_eq!(marker.batch_id, BatchId(3), "batch ids continue after the old marker");
    // The new checkpoint read its source from the start, as documented: the
    // old rows and the new checkpoint's first two batches.
    let mut ids = h.read_event_ids().await;
    ids.sort_unstable();
    let expected: Vec<i64> = ids_of_batches(0..2).flat_map(|i| [i, i]).collect();
    assert_eq!(ids, expected);

    let r = refusal(run_to(h, query(&old), 5).await);
    assert!(
        matches!(r, Refusal::OutputOfAnotherQuery { .. }),
        "the old checkpoint is now refused: {r}"
    );
}

/// I4 (T > P): an old copy of the checkpoint is refused.
pub async fn old_checkpoint_copy_is_refused(h: &dyn SinkHarness) {
    let (chk, copy) = (CaseCheckpoint::new(h), CaseCheckpoint::new(h));
    run_to(h, query(&chk), 1).await.expect("run");
    chk.copy_to(&copy).await;
    run_to(h, query(&chk), 3).await.expect("run on");
    let r = refusal(run_to(h, query(&copy), 5).await);
    assert!(
        matches!(
            r,
            Refusal::SinkAhead {
                marker: BatchId(3),
                planned: Some(BatchId(1)),
                ..
            }
        ),
        "{r}"
    );
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..4));
}

/// I4 (T < C): a table that lost committed batches is refused. A sink whose
/// tables have ids sees a re-created table as another table (I6).
pub async fn lost_table_is_refused(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    run_to(h, query(&chk), 1).await.expect("run");
    h.recreate_table().await;
    let accepted = match refusal(run_to(h, query(&chk), 3).await) {
        Refusal::SinkBehind {
            committed: BatchId(1),
            marker: None,
            ..
        } => query(&chk).accept_lost_batches(true),
        Refusal::SinkChanged { .. } => query(&chk).allow_sink_change(true),
        other => panic!("expected SinkBehind or SinkChanged, got {other}"),
    };
    run_to(h, accepted, 3).await.expect("accepted");
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(2..4));
}

/// I6: a checkpoint started against another sink is refused; the explicit
/// change sends later batches there and is remembered.
pub async fn other_sink_is_refused(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    run_to(h, query(&chk), 0).await.expect("run");
    let on_other = |writer: StreamWriter, last: u64| async move {
        let q = writer
            .stop_after_batch(BatchId(last))
            .start_arc(h.other_sink().await)
            .await?;
        q.await_termination().await
    };
    assert!(matches!(
        refusal(on_other(query(&chk), 2).await),
        Refusal::SinkChanged { .. }
    ));
    on_other(query(&chk).allow_sink_change(true), 2)
        .await
        .expect("allowed change");
    on_other(query(&chk), 3)
        .await
        .expect("a restart on the new sink needs no option");
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..1));
}

/// Two copies of one checkpoint running at once: each batch lands once; the
/// loser stops with a clear error.
pub async fn concurrent_copies_of_a_query_write_each_batch_once(h: &dyn SinkHarness) {
    let (a, b) = (CaseCheckpoint::new(h), CaseCheckpoint::new(h));
    run_to(h, query(&a), 0).await.expect("first batch");
    a.copy_to(&b).await;
    let (ra, rb) = tokio::join!(run_to(h, query(&a), 5), run_to(h, query(&b), 5));
    let lost = |r: &Result<(), Error>| match r {
        Ok(()) => false,
        Err(Error::ConcurrentRun { .. }) => true,
        Err(Error::Refused(r)) if matches!(**r, Refusal::SinkAhead { .. }) => true,
        Err(e) => panic!("unexpected error: {e}"),
    };
    assert_eq!(
        lost(&ra) as u8 + lost(&rb) as u8,
        1,
        "exactly one copy stops: {ra:?} {rb:?}"
    );
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..6));
    // The losing copy is refused from then on, never recorded as committed.
    let loser = if lost(&ra) { &a } else { &b };
    let r = refusal(run_to(h, query(loser), 8).await);
    assert!(matches!(r, Refusal::SinkAhead { .. }), "{r}");
    assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..6));
}
