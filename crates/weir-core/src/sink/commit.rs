//! The commit half of the sequence: the one loop every table sink runs in
//! [`Sink::commit`](super::Sink::commit).
//!
//! ```text
//! for attempt in 1..=max_attempts
//!  │
//!  ├─ base ─────── the table to build on: loaded, or brought past the last
//!  │               commit; a table replaced or changed under the query ends
//!  │               the loop with the sink's error
//!  ├─ marker ───── the query's marker in that base, then decide_commit:
//!  │   └─ already committed ─┬─ by a try of this attempt ─────► Committed
//!  │                         └─ by an earlier attempt ────────► AlreadyCommitted
//!  └─ try once, conditional on the base still being current:
//!      ├─ Landed ──────────────────────────────────────────────► Committed
//!      ├─ Lost: another writer won ── (back off) ── next attempt reads it
//!      └─ Unknown(error): the next base decides ─┬─ this try's marker ► Committed
//!                                                ├─ base unchanged ──► try again
//!                                                └─ otherwise ───────► the error
//! after max_attempts tries, the table is read once more: this attempt's
//! marker ► Committed; else the last unknown try's error, or the sink's
//! error for races lost (nothing of the batch committed)
//! ```
//!
//! The marker check and the try are one atomic step because the try is
//! conditional on the base it read the marker from (a put-if-absent of the
//! next log entry, a compare-and-swap of the metadata pointer); a try that
//! loses is decided again on the winner's table, so a batch lands once.

use std::time::Duration;

use async_trait::async_trait;

use super::{BatchContext, CommitOutcome};
use crate::error::Result;
use crate::protocol::{decide_commit, CommitDecision, SinkMarker};

/// How one try of a commit ended.
#[derive(Debug)]
pub enum Tried {
    /// The commit landed at this table version (if the format has one).
    Landed { version: Option<i64> },
    /// Another writer took the base first; nothing of this try is visible.
    Lost,
    /// The try failed in a way that may hide a commit that happened (a
    /// timeout after the request was sent, a server error).
    Unknown(crate::Error),
}

/// One table format's part of the commit loop, for one batch's commit.
/// Every method reports the sink's own errors as [`crate::Error`]s, with
/// their retryable judgement.
#[async_trait]
pub trait TableCommit: Send {
    /// The table one try builds on.
    type Base: Send;

    /// The table for try `attempt` (from 1): the first may build on the
    /// table as the sink last saw it, a later one reads the table again.
    /// Refuses a table that is no longer the one the query started on.
    async fn base(&mut self, attempt: usize) -> Result<Self::Base>;

    /// The query's marker as `base` records it.
    async fn marker(&mut self, base: &Self::Base) -> Result<Option<SinkMarker>>;

    /// `base` shows the batch committed: whether by a try of this attempt
    /// (`tried`: a try was made; a lost race or an unknown outcome may have
    /// been its own commit). `Some(version)` when it was, after the sink's
    /// work for a commit of its own found this way (background compaction,
    /// expiry); otherwise the sink may clean up what its tries left.
    async fn already(&mut self, base: Self::Base, tried: bool) -> Result<Option<Option<i64>>>;

    /// After a try of unknown outcome whose marker `base` does not show:
    /// whether `base` is the table that try built on, so nothing happened
    /// and trying again is safe. By default no: the loop returns the error.
    fn unchanged(&self, _base: &Self::Base) -> bool {
        false
    }

    /// Tries the commit once, conditional on `base` still being current.
    async fn try_commit(&mut self, base: Self::Base, attempt: usize) -> Result<Tried>;

    /// Whether to wait a little before try `attempt + 1` after losing try
    /// `attempt`, so a crowd of racing writers spreads out.
    fn backs_off(&self, attempt: usize) -> bool {
        attempt > 3
    }

    /// The error when every one of `attempts` tries lost a race.
    fn too_many_conflicts(&self, attempts: usize) -> crate::Error;
}

/// Runs the commit loop of the batch `ctx` on `table`, at most
/// `max_attempts` tries.
pub async fn commit_batch<T: TableCommit>(
    table: &mut T,
    ctx: &BatchContext,
    max_attempts: usize,
) -> Result<CommitOutcome> {
    let mut tried = false;
    let mut unknown: Option<crate::Error> = None;
    // One pass more than tries: the last only reads how the last try ended.
    for attempt in 1..=max_attempts + 1 {
        let base = match table.base(attempt).await {
            Ok(base) => base,
            // The table cannot tell what the try did: its error says more.
            Err(e) => return Err(unknown.unwrap_or(e)),
        };
        let found = table.marker(&base).await?;
        if let CommitDecision::AlreadyCommitted(m) = decide_commit(found, ctx.commit_facts())? {
            if let Some(version) = table.already(base, tried).await? {
                tracing::info!(attempt, "the batch's commit was this attempt's own try");
                return Ok(CommitOutcome::Committed { version });
            }
            return match unknown {
                Some(e) => Err(e),
                None => Ok(CommitOutcome::AlreadyCommitted(m)),
            };
        }
        if attempt > max_attempts {
            break;
        }
        if let Some(e) = unknown.take() {
            if !table.unchanged(&base) {
                return Err(e);
            }
            tracing::info!(attempt, error = %e, "the try failed before it happened; trying again");
        }
        tried = true;
        match table.try_commit(base, attempt).await? {
            Tried::Landed { version } => return Ok(CommitOutcome::Committed { version }),
            Tried::Lost => {
                tracing::debug!(attempt, "lost a commit race; reading the winner");
                if table.backs_off(attempt) {
                    backoff(ctx, attempt).await;
                }
            }
            Tried::Unknown(e) => {
                tracing::info!(attempt, error = %e, "a try ended with an unknown outcome; reading the table");
                unknown = Some(e);
            }
        }
    }
    // A last try of unknown outcome that the table does not show is
    // reported as what it is.
    Err(unknown.unwrap_or_else(|| table.too_many_conflicts(max_attempts)))
}

/// A short wait, growing with the attempt and jittered by the attempt id,
/// so racing writers spread out.
async fn backoff(ctx: &BatchContext, attempt: usize) {
    let jitter = u64::from(ctx.attempt_id.as_u128() as u16 % 20);
    tokio::time::sleep(Duration::from_millis((attempt as u64 * 5).min(200) + jitter)).await;
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Arc;

    use arrow_schema::Schema;
    use uuid::Uuid;

    use super::*;
    use crate::ids::{BatchId, QueryId, QueryName, RunId};
    use crate::sink::OutputMode;

    /// What the table does with one try.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        /// The try lands.
        Land,
        /// Another writer commits first.
        Lose,
        /// The try's answer is lost: it `landed` or not; another writer
        /// `moved` the table meanwhile or not.
        Unknown { landed: bool, moved: bool },
    }

    /// A table of versions with one marker, and the steps of its tries.
    struct Fake {
        ctx: BatchContext,
        steps: VecDeque<Step>,
        version: u64,
        marker: Option<SinkMarker>,
        /// The marker was set by a try of this attempt.
        ours: bool,
        unknown_on: Option<u64>,
        tries: usize,
    }

    impl Fake {
        fn new(steps: &[Step]) -> Self {
            Fake {
                ctx: BatchContext {
                    query_id: QueryId::new(),
                    query_name: QueryName::new("q").unwrap(),
                    run_id: RunId::new(),
                    batch_id: BatchId(7),
                    attempt_id: Uuid::new_v4(),
                    output_mode: OutputMode::Append,
                    schema: Arc::new(Schema::empty()),
                    taken_over: None,
                },
                steps: steps.iter().copied().collect(),
                version: 1,
                marker: None,
                ours: false,
                unknown_on: None,
                tries: 0,
            }
        }

        fn land(&mut self) {
            self.version += 1;
            self.ours = true;
            self.marker = Some(SinkMarker {
                query_id: self.ctx.query_id,
                batch_id: self.ctx.batch_id,
            });
        }

        async fn run(&mut self, max: usize) -> Result<CommitOutcome> {
            let ctx = self.ctx.clone();
            commit_batch(self, &ctx, max).await
        }
    }

    #[async_trait]
    impl TableCommit for Fake {
        type Base = u64;

        async fn base(&mut self, _attempt: usize) -> Result<u64> {
            Ok(self.version)
        }

        async fn marker(&mut self, _base: &u64) -> Result<Option<SinkMarker>> {
            Ok(self.marker)
        }

        async fn already(&mut self, base: u64, tried: bool) -> Result<Option<Option<i64>>> {
            Ok((tried && self.ours).then_some(Some(base as i64)))
        }

        fn unchanged(&self, base: &u64) -> bool {
            self.unknown_on == Some(*base)
        }

        async fn try_commit(&mut self, base: u64, _attempt: usize) -> Result<Tried> {
            assert_eq!(base, self.version, "a try builds on the current table");
            self.tries += 1;
            match self.steps.pop_front().expect("a step for every try") {
                Step::Land => {
                    self.land();
                    Ok(Tried::Landed {
                        version: Some(self.version as i64),
                    })
                }
                Step::Lose => {
                    self.version += 1;
                    Ok(Tried::Lost)
                }
                Step::Unknown { landed, moved } => {
                    self.unknown_on = Some(base);
                    if moved {
                        self.version += 1;
                    }
                    if landed {
                        self.land();
                    }
                    Ok(Tried::Unknown(crate::Error::sink(
                        "t",
                        None,
                        true,
                        "the answer was lost",
                    )))
                }
            }
        }

        fn too_many_conflicts(&self, attempts: usize) -> crate::Error {
            crate::Error::sink("t", None, true, format!("{attempts} races lost"))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn lost_races_read_the_winner_and_try_again() {
        let mut table = Fake::new(&[Step::Lose, Step::Lose, Step::Land]);
        let outcome = table.run(100).await.unwrap();
        assert!(
            matches!(outcome, CommitOutcome::Committed { version: Some(4) }),
            "{outcome:?}"
        );
        assert_eq!(table.tries, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_the_table_holds_is_not_tried() {
        let mut table = Fake::new(&[]);
        table.land();
        table.ours = false;
        let outcome = table.run(100).await.unwrap();
        assert!(matches!(outcome, CommitOutcome::AlreadyCommitted(m) if m.batch_id == BatchId(7)));
        assert_eq!(table.tries, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unknown_outcome_is_decided_by_the_table() {
        // It landed: the table shows this attempt's marker.
        let mut table = Fake::new(&[Step::Unknown {
            landed: true,
            moved: false,
        }]);
        let outcome = table.run(100).await.unwrap();
        assert!(
            matches!(outcome, CommitOutcome::Committed { version: Some(2) }),
            "{outcome:?}"
        );
        assert_eq!(table.tries, 1);

        // It did not, and the table is the one it built on: tried again.
        let mut table = Fake::new(&[
            Step::Unknown {
                landed: false,
                moved: false,
            },
            Step::Land,
        ]);
        let outcome = table.run(100).await.unwrap();
        assert!(
            matches!(outcome, CommitOutcome::Committed { version: Some(2) }),
            "{outcome:?}"
        );
        assert_eq!(table.tries, 2);

        // Another writer moved the table: the try cannot be told apart
        // from one still on its way, so its error is returned.
        let mut table = Fake::new(&[Step::Unknown {
            landed: false,
            moved: true,
        }]);
        let err = table.run(100).await.unwrap_err();
        assert!(err.to_string().contains("the answer was lost"), "{err}");
        assert!(err.retryable());
        assert_eq!(table.tries, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_tries_outcome_is_read_from_the_table() {
        // The last of three tries is lost, but it was this attempt's commit.
        let mut table = Fake::new(&[
            Step::Lose,
            Step::Lose,
            Step::Unknown {
                landed: true,
                moved: false,
            },
        ]);
        let outcome = table.run(3).await.unwrap();
        assert!(
            matches!(outcome, CommitOutcome::Committed { version: Some(4) }),
            "{outcome:?}"
        );
        assert_eq!(table.tries, 3);

        // It did not land: its error, not a lost race.
        let mut table = Fake::new(&[
            Step::Lose,
            Step::Unknown {
                landed: false,
                moved: false,
            },
        ]);
        let err = table.run(2).await.unwrap_err();
        assert!(err.to_string().contains("the answer was lost"), "{err}");
        assert_eq!(table.tries, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn every_race_lost_ends_with_the_sinks_error() {
        let mut table = Fake::new(&[Step::Lose; 5]);
        let err = table.run(5).await.unwrap_err();
        assert!(err.to_string().contains("5 races lost"), "{err}");
        assert_eq!(table.tries, 5);
        assert!(table.marker.is_none(), "nothing was committed");
    }
}
