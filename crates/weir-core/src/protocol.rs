//! Protocol decisions as pure functions over facts read from storage.
//!
//! Two questions decide whether a query may go on without losing or
//! repeating a row:
//!
//! - at start: [`decide_start`] compares the checkpoint (last planned batch
//!   `P`, last recorded commit `C`, recorded sink) with the sink's marker `T`
//!   for the query name (invariants I4, I4b, I6 of the design);
//! - at commit: [`decide_commit`] compares the marker the sink reads on the
//!   very snapshot it is about to commit on with the batch being committed.
//!
//! Neither does I/O, so both are tested exhaustively.

// A refusal is returned once per start, never on a hot path.
#![allow(clippy::result_large_err)]

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{BatchId, QueryId, QueryName};

/// What a sink is: recorded in the checkpoint so that a query cannot be
/// pointed at another table by mistake (invariant I6).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SinkIdentity {
    /// The kind of sink: `memory`, `console`, `delta`, `iceberg`, ...
    pub format: String,
    /// Where the sink writes: a table location, a directory, a name.
    pub location: String,
    /// A unique id of the table, where the format has one (Iceberg's table
    /// uuid, Delta's metadata id). Two tables at the same location with
    /// different ids are different tables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_id: Option<String>,
}

impl SinkIdentity {
    /// An identity without a table id.
    pub fn new(format: impl Into<String>, location: impl Into<String>) -> Self {
        SinkIdentity {
            format: format.into(),
            location: location.into(),
            table_id: None,
        }
    }

    /// Whether `other` names the same sink. A missing table id on either side
    /// matches any id, so a table created by the first batch still matches.
    pub fn same_sink(&self, other: &SinkIdentity) -> bool {
        let ids_agree = match (&self.table_id, &other.table_id) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        };
        self.format == other.format && self.location == other.location && ids_agree
    }
}

impl fmt::Display for SinkIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} sink at {}", self.format, self.location)?;
        if let Some(id) = &self.table_id {
            write!(f, " (table id {id})")?;
        }
        Ok(())
    }
}

/// A sink's record of the last batch committed under a query name, stored in
/// the same atomic commit as the batch's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SinkMarker {
    /// The query id that made the commit.
    pub query_id: QueryId,
    /// The batch it committed.
    pub batch_id: BatchId,
}

impl fmt::Display for SinkMarker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "batch {} of query id {}", self.batch_id, self.query_id)
    }
}

/// Explicit choices that let a query start where a guard would refuse. Each
/// accepts a specific, documented risk; none is on by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overrides {
    /// The query name already has output in the sink under another query id
    /// (its old checkpoint was deleted or replaced). Take that output over:
    /// this checkpoint continues with the batch after the sink's marker, and
    /// reads its sources from where this checkpoint stands.
    pub take_over_output: bool,
    /// The checkpoint was created for another sink. Write to this one from
    /// the next batch on; earlier batches stay in the old sink only.
    pub allow_sink_change: bool,
    /// The sink lost batches the checkpoint recorded as committed (a restored
    /// or replaced table). Go on from the checkpoint: those batches stay lost.
    pub accept_lost_batches: bool,
    /// The sink holds batches the checkpoint never planned (the checkpoint is
    /// an old copy). Go on with the batch after the sink's marker, reading from
    /// where this checkpoint stands: rows of the unplanned batches may repeat.
    pub resume_after_sink_marker: bool,
}

/// Everything [`decide_start`] needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartFacts {
    /// The query's id (new for a new checkpoint).
    pub query_id: QueryId,
    /// The query's name.
    pub query_name: QueryName,
    /// Where the checkpoint is, for messages.
    pub checkpoint: String,
    /// The last batch in the offset log (`offsets/P`).
    pub last_planned: Option<BatchId>,
    /// The last batch in the commit log (`commits/C`).
    pub last_committed: Option<BatchId>,
    /// The sink the checkpoint was created for (None for a new checkpoint).
    pub recorded_sink: Option<SinkIdentity>,
    /// The sink the query is started with.
    pub current_sink: SinkIdentity,
    /// The marker of another query id this checkpoint took over earlier.
    pub taken_over: Option<SinkMarker>,
    /// The first batch this checkpoint wrote (or will write) to its recorded
    /// sink, after a sink change or a takeover: batches before it are not
    /// expected in the sink.
    pub sink_since: Option<BatchId>,
    /// The sink's marker for the query name.
    pub marker: Option<SinkMarker>,
    /// The sources the checkpoint was created for (empty for a new one).
    pub recorded_sources: Vec<String>,
    /// The sources the query is started with.
    pub current_sources: Vec<String>,
}

/// How a query starts, decided by [`decide_start`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartPlan {
    /// A planned batch that was not recorded as committed and that the sink
    /// does not hold: run it again with its logged offsets.
    pub replay: Option<BatchId>,
    /// A planned batch the sink already holds: record it as committed
    /// without running it.
    pub record_only: Option<BatchId>,
    /// The id of the first newly planned batch.
    pub next_batch: BatchId,
    /// A marker of another query id that this start takes over; the
    /// checkpoint records it, and [`decide_commit`] accepts it once.
    pub take_over: Option<SinkMarker>,
    /// Set when this start changes the sink or takes over output: the first
    /// batch the sink receives from this checkpoint, to be recorded.
    pub sink_since: Option<BatchId>,
}

impl StartPlan {
    /// The first batch this run executes: the one to replay, else the one
    /// after the batch recorded without running, else the first new one.
    /// Its operators start from the state after the batch planned before it.
    pub fn first_batch(&self) -> BatchId {
        match (self.replay, self.record_only) {
            (Some(b), _) => b,
            (None, Some(b)) => b.next(),
            (None, None) => self.next_batch,
        }
    }
}

/// A guard's refusal: what was found, why going on would lose or repeat rows,
/// and the explicit option that accepts the risk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// I6: the checkpoint belongs to another sink.
    #[error("checkpoint {checkpoint} was created for the {recorded}, but the query was started with the {current}. Writing here would split the query's output across two sinks. Use a new checkpoint for this sink, or set allow_sink_change to send batches from now on to the new sink")]
    SinkChanged {
        checkpoint: String,
        recorded: SinkIdentity,
        current: SinkIdentity,
    },

    /// I4b: the name has output under another query id.
    #[error("query {name:?} already has output in the {sink}: {other}, but checkpoint {checkpoint} has query id {query_id}. The query's old checkpoint was probably deleted or replaced. Restore the old checkpoint to go on exactly once; or write to a new output path or table; or set take_over_output to continue the batch ids after batch {} with this checkpoint, which reads its sources from where this checkpoint stands (from their start for a new checkpoint), so rows the old checkpoint already wrote are written again unless the sources no longer hold them", other.batch_id)]
    OutputOfAnotherQuery {
        name: QueryName,
        sink: SinkIdentity,
        checkpoint: String,
        query_id: QueryId,
        other: SinkMarker,
    },

    /// I4 (T > P): the sink is ahead of the checkpoint.
    #[error("the {sink} holds batch {marker} of query {name:?}, but checkpoint {checkpoint} planned only up to {}. The checkpoint is probably an old copy; going on would skip or repeat rows. Restore the newest checkpoint, or set resume_after_sink_marker to continue after batch {marker} (rows of the unplanned batches may repeat)", planned.map(|b| format!("batch {b}")).unwrap_or_else(|| "no batch".into()))]
    SinkAhead {
        name: QueryName,
        sink: SinkIdentity,
        checkpoint: String,
        marker: BatchId,
        planned: Option<BatchId>,
    },

    /// I4 for a [`crate::sink::TableWriter`]: the table holds a later
    /// version of the application id than the one written.
    #[error("the {sink} holds version {committed} of application id {app_id:?}, later than version {version} written now: the versions went back (a foreach_batch query restarted on a new checkpoint, or another writer uses the id). Nothing was written. Use a new application id, or build the writer with skip_older_versions() to skip every version the table is past, as Delta's txnVersion does")]
    VersionBehind {
        app_id: QueryName,
        sink: SinkIdentity,
        version: BatchId,
        committed: BatchId,
    },

    /// I4 (T < C): the sink is behind the checkpoint.
    #[error("checkpoint {checkpoint} recorded batch {committed} of query {name:?} as committed, but the {sink} holds {}. The table was probably restored or replaced; the missing batches are lost from it. Restore the table, or set accept_lost_batches to go on without them", marker.map(|b| format!("only up to batch {b}")).unwrap_or_else(|| "no batch of it".into()))]
    SinkBehind {
        name: QueryName,
        sink: SinkIdentity,
        checkpoint: String,
        committed: BatchId,
        marker: Option<BatchId>,
    },

    /// The query reads other sources than the checkpoint was made for.
    #[error("checkpoint {checkpoint} was created for the sources {recorded:?}, but the query reads {current:?}. Its offsets mean nothing for other sources; use a new checkpoint for the new sources")]
    SourcesChanged {
        checkpoint: String,
        recorded: Vec<String>,
        current: Vec<String>,
    },

    /// The checkpoint's logs contradict each other.
    #[error("checkpoint {checkpoint} is inconsistent: {reason}; restore it from a backup or start a new checkpoint")]
    InconsistentCheckpoint { checkpoint: String, reason: String },

    /// At commit: another query id wrote the name's marker meanwhile.
    #[error("query {name:?} (query id {query_id}) cannot commit batch {batch_id}: the sink's marker for the name is now {other}. Another checkpoint of the same query name is running; stop one of them")]
    MarkerTakenByAnotherQuery {
        name: QueryName,
        query_id: QueryId,
        batch_id: BatchId,
        other: SinkMarker,
    },
}

/// Decides how a query starts, or refuses with the reason.
pub fn decide_start(facts: &StartFacts, overrides: &Overrides) -> Result<StartPlan, Refusal> {
    if !facts.recorded_sources.is_empty() && facts.recorded_sources != facts.current_sources {
        return Err(Refusal::SourcesChanged {
            checkpoint: facts.checkpoint.clone(),
            recorded: facts.recorded_sources.clone(),
            current: facts.current_sources.clone(),
        });
    }
    let sink_changed = match &facts.recorded_sink {
        Some(recorded) if !recorded.same_sink(&facts.current_sink) => {
            if !overrides.allow_sink_change {
                return Err(Refusal::SinkChanged {
                    checkpoint: facts.checkpoint.clone(),
                    recorded: recorded.clone(),
                    current: facts.current_sink.clone(),
                });
            }
            true
        }
        _ => false,
    };
    check_logs(facts)?;

    let (own_marker, take_over) = match facts.marker {
        Some(m) if m.query_id == facts.query_id => (Some(m.batch_id), None),
        // A takeover recorded earlier whose first commit has not happened yet.
        Some(m) if facts.taken_over == Some(m) => (None, None),
        Some(other) if overrides.take_over_output => (None, Some(other)),
        Some(other) => {
            return Err(Refusal::OutputOfAnotherQuery {
                name: facts.query_name.clone(),
                sink: facts.current_sink.clone(),
                checkpoint: facts.checkpoint.clone(),
                query_id: facts.query_id,
                other,
            })
        }
        None => (None, None),
    };
    let planned = facts.last_planned;
    let committed = facts.last_committed;
    let in_flight = match (planned, committed) {
        (Some(p), Some(c)) if p > c => Some(p),
        (Some(p), None) => Some(p),
        _ => None,
    };
    // Batch ids continue after any marker taken over, now or earlier.
    let after_taken = take_over
        .or(facts.taken_over)
        .map(|m| m.batch_id.next())
        .unwrap_or(BatchId(0));
    let next_after = |last: Option<BatchId>| last.map(BatchId::next).unwrap_or(BatchId(0)).max(after_taken);

    if take_over.is_some() && in_flight.is_some() {
        // The in-flight batch would have to be renumbered after the marker;
        // finishing it first keeps the offsets log contiguous.
        return Err(Refusal::InconsistentCheckpoint {
            checkpoint: facts.checkpoint.clone(),
            reason: "take_over_output needs a checkpoint with no batch in flight; start it once without the option so the in-flight batch is finished, or use a new checkpoint".into(),
        });
    }
    if sink_changed && in_flight.is_some() {
        // The old sink may already hold the batch in flight; replaying it
        // into the new sink would put its rows in both.
        return Err(Refusal::InconsistentCheckpoint {
            checkpoint: facts.checkpoint.clone(),
            reason: "allow_sink_change needs a checkpoint with no batch in flight; start it once against the old sink so the in-flight batch is finished, or use a new checkpoint".into(),
        });
    }
    if let (Some(taken), Some(p)) = (facts.taken_over, in_flight) {
        if p <= taken.batch_id {
            return Err(Refusal::InconsistentCheckpoint {
                checkpoint: facts.checkpoint.clone(),
                reason: format!(
                    "offsets/{p} is in flight, but the checkpoint took over output up to batch {}",
                    taken.batch_id
                ),
            });
        }
    }
    // Commits made before the sink changed or was taken over (now or at an
    // earlier start) are not expected in the sink.
    let moves_sink = sink_changed || take_over.is_some();
    let floor = if moves_sink {
        Some(next_after(planned))
    } else {
        facts.sink_since
    };
    let committed_here = committed.filter(|c| floor.is_none_or(|since| *c >= since));

    let plan = match own_marker {
        Some(t) if planned.is_none_or(|p| t > p) => {
            if !overrides.resume_after_sink_marker {
                return Err(Refusal::SinkAhead {
                    name: facts.query_name.clone(),
                    sink: facts.current_sink.clone(),
                    checkpoint: facts.checkpoint.clone(),
                    marker: t,
                    planned,
                });
            }
            Ok(StartPlan {
                replay: None,
                record_only: None,
                next_batch: t.next().max(next_after(planned)),
                take_over: None,
                sink_since: None,
            })
        }
        t if committed_here.is_some() && t < committed_here && !sink_changed && !overrides.accept_lost_batches => {
            Err(Refusal::SinkBehind {
                name: facts.query_name.clone(),
                sink: facts.current_sink.clone(),
                checkpoint: facts.checkpoint.clone(),
                committed: committed_here.unwrap_or(BatchId(0)),
                marker: t,
            })
        }
        t => {
            let (replay, record_only) = match in_flight {
                Some(p) if t >= Some(p) => (None, Some(p)),
                Some(p) => (Some(p), None),
                None => (None, None),
            };
            Ok(StartPlan {
                replay,
                record_only,
                next_batch: next_after(planned),
                take_over,
                sink_since: None,
            })
        }
    }?;
    // The sink receives batches from this checkpoint starting here.
    let sink_since = moves_sink.then_some(plan.next_batch);
    Ok(StartPlan { sink_since, ..plan })
}

/// The driver plans batch N+1 only after recording N, so at most the last
/// planned batch is in flight. Batch ids may jump (after a takeover or
/// `resume_after_sink_marker`), so a gap between C and P is not an error.
fn check_logs(facts: &StartFacts) -> Result<(), Refusal> {
    let inconsistent = |reason: String| Refusal::InconsistentCheckpoint {
        checkpoint: facts.checkpoint.clone(),
        reason,
    };
    match (facts.last_planned, facts.last_committed) {
        (None, Some(c)) => Err(inconsistent(format!("commits/{c} exists but the offset log is empty"))),
        (Some(p), Some(c)) if c > p => Err(inconsistent(format!(
            "commits/{c} is ahead of the last planned batch offsets/{p}"
        ))),
        _ => Ok(()),
    }
}

/// What a sink must do with a batch, decided by [`decide_commit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitDecision {
    /// Commit the batch with a marker for it.
    Commit,
    /// The sink already holds this batch (or a later one) of this query id:
    /// commit nothing.
    AlreadyCommitted(SinkMarker),
}

/// What [`decide_commit`] needs to know about the batch being committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitFacts<'a> {
    /// The query name whose marker is read.
    pub query_name: &'a QueryName,
    /// The committing query's id.
    pub query_id: QueryId,
    /// The batch being committed.
    pub batch_id: BatchId,
    /// The marker of another query id this query took over, if any.
    pub taken_over: Option<SinkMarker>,
}

/// Decides, on the snapshot a sink is about to commit on, whether the batch
/// is new. A sink must call this with the marker read from that snapshot and
/// make the commit conditional on the snapshot still being current, so the
/// check and the commit are one atomic step.
pub fn decide_commit(marker: Option<SinkMarker>, facts: CommitFacts<'_>) -> Result<CommitDecision, Refusal> {
    match marker {
        None => Ok(CommitDecision::Commit),
        Some(m) if m.query_id == facts.query_id => {
            if m.batch_id >= facts.batch_id {
                Ok(CommitDecision::AlreadyCommitted(m))
            } else {
                Ok(CommitDecision::Commit)
            }
        }
        Some(m) if facts.taken_over == Some(m) => Ok(CommitDecision::Commit),
        Some(other) => Err(Refusal::MarkerTakenByAnotherQuery {
            name: facts.query_name.clone(),
            query_id: facts.query_id,
            batch_id: facts.batch_id,
            other,
        }),
    }
}

#[cfg(test)]
mod tests;
