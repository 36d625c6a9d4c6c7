use proptest::prelude::*;

use super::*;

fn sink(loc: &str) -> SinkIdentity {
    SinkIdentity::new("memory", loc)
}

fn facts(planned: Option<u64>, committed: Option<u64>, marker: Option<u64>) -> StartFacts {
    let query_id = QueryId(uuid::Uuid::from_u128(1));
    StartFacts {
        query_id,
        query_name: QueryName::new("q").unwrap(),
        checkpoint: "chk".into(),
        last_planned: planned.map(BatchId),
        last_committed: committed.map(BatchId),
        recorded_sink: Some(sink("t")),
        current_sink: sink("t"),
        taken_over: None,
        sink_since: None,
        marker: marker.map(|b| SinkMarker {
            query_id,
            batch_id: BatchId(b),
        }),
        recorded_sources: vec!["rate".into()],
        current_sources: vec!["rate".into()],
    }
}

fn other_marker(batch: u64) -> SinkMarker {
    SinkMarker {
        query_id: QueryId(uuid::Uuid::from_u128(2)),
        batch_id: BatchId(batch),
    }
}

/// The first batch id the sink will receive after the plan is carried out.
fn first_new_batch(plan: &StartPlan) -> BatchId {
    plan.replay.unwrap_or(plan.next_batch)
}

#[test]
fn the_first_batch_run_is_the_replay_else_the_one_after_the_recorded_else_the_next() {
    let plan = |replay: Option<u64>, record_only: Option<u64>, next: u64| StartPlan {
        replay: replay.map(BatchId),
        record_only: record_only.map(BatchId),
        next_batch: BatchId(next),
        take_over: None,
        sink_since: None,
    };
    assert_eq!(plan(Some(4), None, 5).first_batch(), BatchId(4));
    assert_eq!(plan(None, Some(4), 5).first_batch(), BatchId(5));
    assert_eq!(plan(None, None, 7).first_batch(), BatchId(7));
}

const SMALL: [Option<u64>; 6] = [None, Some(0), Some(1), Some(2), Some(3), Some(4)];

#[test]
fn every_consistent_state_resumes_right_after_the_marker() {
    // Exhaustive over small logs: without overrides, a start is allowed
    // exactly when C <= T <= P, and the sink then receives the batch in
    // flight if it lacks it, else the next one; with contiguous batch ids
    // that is T+1: nothing repeated, nothing skipped (I1, I4).
    for p in SMALL {
        for c in SMALL {
            for t in SMALL {
                let f = facts(p, c, t);
                let logs_ok = match (p, c) {
                    (None, Some(_)) => false,
                    (Some(p), Some(c)) => c <= p,
                    _ => true,
                };
                let result = decide_start(&f, &Overrides::default());
                if !logs_ok {
                    assert!(
                        matches!(result, Err(Refusal::InconsistentCheckpoint { .. })),
                        "{p:?} {c:?} {t:?}"
                    );
                    continue;
                }
                let normal = c <= t && t <= p;
                match result {
                    Ok(plan) => {
                        assert!(normal, "started with P={p:?} C={c:?} T={t:?}: {plan:?}");
                        let in_flight = p.filter(|p| c.is_none_or(|c| *p > c));
                        let expected = match in_flight {
                            Some(p) if t < Some(p) => p,
                            _ => p.map(|p| p + 1).unwrap_or(0),
                        };
                        let state = format!("P={p:?} C={c:?} T={t:?} {plan:?}");
                        assert_eq!(first_new_batch(&plan), BatchId(expected), "{state}");
                        assert!(t.is_none_or(|t| expected > t), "{state}");
                        let contiguous = p.is_none_or(|p| p <= c.map(|c| c + 1).unwrap_or(0));
                        if contiguous {
                            assert_eq!(expected, t.map(|t| t + 1).unwrap_or(0), "{state}");
                        }
                        assert_eq!(plan.next_batch, p.map(|p| BatchId(p + 1)).unwrap_or(BatchId(0)));
                        if let Some(r) = plan.record_only {
                            assert_eq!(Some(r.0), t, "record-only must be the batch the sink holds");
                        }
                    }
                    Err(Refusal::SinkAhead { .. }) => assert!(t > p, "{p:?} {c:?} {t:?}"),
                    Err(Refusal::SinkBehind { .. }) => assert!(t < c, "{p:?} {c:?} {t:?}"),
                    Err(other) => panic!("unexpected refusal {other}"),
                }
            }
        }
    }
}

#[test]
fn new_checkpoint_with_output_of_another_query_is_refused() {
    let mut f = facts(None, None, None);
    f.recorded_sink = None;
    f.marker = Some(other_marker(7));
    let err = decide_start(&f, &Overrides::default()).unwrap_err();
    assert!(matches!(err, Refusal::OutputOfAnotherQuery { .. }));
    let msg = err.to_string();
    assert!(msg.contains("take_over_output") && msg.contains("batch 7"), "{msg}");
}

#[test]
fn take_over_continues_after_the_marker_and_is_remembered() {
    let mut f = facts(None, None, None);
    f.marker = Some(other_marker(7));
    let over = Overrides {
        take_over_output: true,
        ..Default::default()
    };
    let plan = decide_start(&f, &over).unwrap();
    assert_eq!(plan.take_over, Some(other_marker(7)));
    assert_eq!(plan.next_batch, BatchId(8));

    // Restarted after planning batch 8 but before committing it: the
    // recorded takeover is honoured without the option.
    f.taken_over = Some(other_marker(7));
    f.last_planned = Some(BatchId(8));
    let plan = decide_start(&f, &Overrides::default()).unwrap();
    assert_eq!(
        (plan.replay, plan.next_batch, plan.take_over),
        (Some(BatchId(8)), BatchId(9), None)
    );

    // Restarted before planning anything: still after the marker.
    f.last_planned = None;
    let plan = decide_start(&f, &Overrides::default()).unwrap();
    assert_eq!(plan.next_batch, BatchId(8));
}

#[test]
fn take_over_with_a_batch_in_flight_is_refused() {
    let mut f = facts(Some(3), Some(2), None);
    f.marker = Some(other_marker(7));
    let over = Overrides {
        take_over_output: true,
        ..Default::default()
    };
    assert!(matches!(
        decide_start(&f, &over),
        Err(Refusal::InconsistentCheckpoint { .. })
    ));
}

#[test]
fn another_sink_is_refused_unless_allowed() {
    let mut f = facts(Some(3), Some(3), Some(3));
    f.current_sink = sink("elsewhere");
    f.marker = None;
    let err = decide_start(&f, &Overrides::default()).unwrap_err();
    assert!(matches!(err, Refusal::SinkChanged { .. }));
    assert!(err.to_string().contains("allow_sink_change"));
    let plan = decide_start(
        &f,
        &Overrides {
            allow_sink_change: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!((plan.replay, plan.next_batch), (None, BatchId(4)));
}

#[test]
fn a_sink_change_is_remembered_across_a_restart_before_its_first_commit() {
    // Changed at start with C=3: the new sink gets batches from 4 on.
    let mut f = facts(Some(3), Some(3), None);
    f.current_sink = sink("new");
    let plan = decide_start(
        &f,
        &Overrides {
            allow_sink_change: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!((plan.next_batch, plan.sink_since), (BatchId(4), Some(BatchId(4))));

    // Restarted before batch 4 committed, without the option: the recorded
    // sink is the new one and batches before 4 are not expected in it.
    f.recorded_sink = Some(sink("new"));
    f.sink_since = Some(BatchId(4));
    let plan = decide_start(&f, &Overrides::default()).unwrap();
    assert_eq!(plan.next_batch, BatchId(4));
    f.last_planned = Some(BatchId(4));
    let plan = decide_start(&f, &Overrides::default()).unwrap();
    assert_eq!(plan.replay, Some(BatchId(4)));

    // Once the new sink holds batch 4, losing it is caught again.
    f.last_committed = Some(BatchId(4));
    assert!(matches!(
        decide_start(&f, &Overrides::default()),
        Err(Refusal::SinkBehind { .. })
    ));
}

#[test]
fn a_sink_change_with_a_batch_in_flight_is_refused() {
    let mut f = facts(Some(4), Some(3), None);
    f.current_sink = sink("new");
    let err = decide_start(
        &f,
        &Overrides {
            allow_sink_change: true,
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("no batch in flight"), "{err}");
}

#[test]
fn take_over_on_a_used_checkpoint_is_not_taken_for_a_lost_table() {
    let mut f = facts(Some(3), Some(3), None);
    f.marker = Some(other_marker(9));
    let plan = decide_start(
        &f,
        &Overrides {
            take_over_output: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!((plan.next_batch, plan.sink_since), (BatchId(10), Some(BatchId(10))));
}

#[test]
fn other_sources_are_refused() {
    let mut f = facts(Some(3), Some(3), Some(3));
    f.current_sources = vec!["files JsonLines in /in".into()];
    assert!(matches!(
        decide_start(&f, &Overrides::default()),
        Err(Refusal::SourcesChanged { .. })
    ));
    f.recorded_sources.clear();
    assert!(
        decide_start(&f, &Overrides::default()).is_ok(),
        "a checkpoint that recorded no sources takes any"
    );
}

#[test]
fn sink_identity_with_table_ids() {
    let mut a = sink("t");
    let mut b = sink("t");
    assert!(a.same_sink(&b));
    a.table_id = Some("1".into());
    assert!(a.same_sink(&b), "a missing id matches");
    b.table_id = Some("2".into());
    assert!(!a.same_sink(&b), "different table ids are different tables");
}

#[test]
fn overrides_accept_their_risk_only() {
    let ahead = facts(Some(2), Some(2), Some(5));
    let plan = decide_start(
        &ahead,
        &Overrides {
            resume_after_sink_marker: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!((plan.replay, plan.next_batch), (None, BatchId(6)));
    assert!(decide_start(
        &ahead,
        &Overrides {
            accept_lost_batches: true,
            ..Default::default()
        }
    )
    .is_err());

    let behind = facts(Some(5), Some(5), Some(2));
    let plan = decide_start(
        &behind,
        &Overrides {
            accept_lost_batches: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!((plan.replay, plan.next_batch), (None, BatchId(6)));
    assert!(decide_start(
        &behind,
        &Overrides {
            resume_after_sink_marker: true,
            ..Default::default()
        }
    )
    .is_err());
}

#[test]
fn commit_decisions() {
    let name = QueryName::new("q").unwrap();
    let me = QueryId(uuid::Uuid::from_u128(1));
    let facts = |batch: u64, taken_over| CommitFacts {
        query_name: &name,
        query_id: me,
        batch_id: BatchId(batch),
        taken_over,
    };
    let mine = |b: u64| {
        Some(SinkMarker {
            query_id: me,
            batch_id: BatchId(b),
        })
    };
    assert_eq!(decide_commit(None, facts(0, None)), Ok(CommitDecision::Commit));
    assert_eq!(decide_commit(mine(4), facts(5, None)), Ok(CommitDecision::Commit));
    assert_eq!(
        decide_commit(mine(5), facts(5, None)),
        Ok(CommitDecision::AlreadyCommitted(mine(5).unwrap()))
    );
    assert_eq!(
        decide_commit(mine(9), facts(5, None)),
        Ok(CommitDecision::AlreadyCommitted(mine(9).unwrap()))
    );
    assert_eq!(
        decide_commit(Some(other_marker(7)), facts(8, Some(other_marker(7)))),
        Ok(CommitDecision::Commit)
    );
    assert!(matches!(
        decide_commit(Some(other_marker(8)), facts(8, Some(other_marker(7)))),
        Err(Refusal::MarkerTakenByAnotherQuery { .. })
    ));
}

fn opt_batch() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![Just(None), (0u64..1_000_000).prop_map(Some)]
}

proptest! {
    /// With any overrides, recorded takeover, sink change and floor, a plan
    /// never makes the sink receive a batch id at or below a marker of this
    /// query (I4: batch ids never go backwards), never replays into a changed
    /// sink, and never both replays and records a batch.
    #[test]
    fn batch_ids_never_go_backwards(
        p in opt_batch(), c in opt_batch(), t in opt_batch(),
        other in proptest::option::of(0u64..1_000_000),
        recorded_takeover in any::<bool>(), moved in any::<bool>(),
        since in opt_batch(),
        take_over in any::<bool>(), resume in any::<bool>(), accept in any::<bool>(), allow in any::<bool>(),
    ) {
        let mut f = facts(p, c, t);
        if let Some(o) = other {
            f.marker = Some(other_marker(o));
            if recorded_takeover {
                f.taken_over = f.marker;
            }
        }
        if moved {
            f.current_sink = sink("elsewhere");
        }
        f.sink_since = since.map(BatchId);
        let over = Overrides { take_over_output: take_over, resume_after_sink_marker: resume, accept_lost_batches: accept, allow_sink_change: allow };
        if let Ok(plan) = decide_start(&f, &over) {
            let first = first_new_batch(&plan);
            if let Some(m) = f.marker {
                prop_assert!(first > m.batch_id, "first {first} marker {m}");
                prop_assert!(plan.first_batch() > m.batch_id, "the first batch run is one the sink lacks");
            }
            prop_assert!(plan.next_batch > p.map(BatchId).unwrap_or(BatchId(0)) || p.is_none());
            prop_assert!(plan.replay.is_none() || plan.record_only.is_none());
            if moved {
                prop_assert!(allow, "a sink change needs the option");
                prop_assert!(plan.replay.is_none() && plan.record_only.is_none(), "nothing in flight goes to a new sink");
                prop_assert_eq!(plan.sink_since, Some(plan.next_batch));
            }
            if let Some(since) = plan.sink_since {
                prop_assert_eq!(since, plan.next_batch, "the floor is the first batch the sink receives");
            }
        }
    }

    /// Commit is idempotent: a batch at or below this query's marker is never
    /// committed again, and one above it always is.
    #[test]
    fn commit_is_idempotent(t in 0u64..1000, n in 0u64..1000) {
        let name = QueryName::new("q").unwrap();
        let me = QueryId(uuid::Uuid::from_u128(1));
        let marker = SinkMarker { query_id: me, batch_id: BatchId(t) };
        let d = decide_commit(Some(marker), CommitFacts { query_name: &name, query_id: me, batch_id: BatchId(n), taken_over: None }).unwrap();
        prop_assert_eq!(d == CommitDecision::Commit, n > t);
    }
}
