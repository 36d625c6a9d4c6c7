//! A batch's progress record: the clock of its phases, and the record built
//! from what the batch did once it is recorded, which the driver hands to
//! the log, the listeners and the query's handle.

use std::time::{Duration, Instant};

use chrono::Utc;

use super::batch::Written;
use crate::checkpoint::OffsetEntry;
use crate::ids::{QueryId, QueryName, RunId};
use crate::progress::{PhaseDurations, QueryProgress, SinkProgress, SourceProgress, StateProgress};
use crate::source::{Offset, Source};

/// The time each phase of one batch took, lap by lap.
pub(super) struct BatchClock {
    /// When the batch's run began (after its plan).
    started: Instant,
    /// The end of the last phase measured.
    lap: Instant,
    /// The time between the start of the previous batch and this one's.
    since_previous: Option<Duration>,
    plan: Duration,
    read: Duration,
    write: Duration,
    state: Duration,
    commit: Duration,
    record: Duration,
}

impl BatchClock {
    /// Starts a batch's clock; `plan` is what planning it took, and
    /// `previous_start` the start of the batch before, which becomes this
    /// one's.
    pub(super) fn start(plan: Duration, previous_start: &mut Option<Instant>) -> Self {
        let now = Instant::now();
        BatchClock {
            started: now,
            lap: now,
            since_previous: previous_start.replace(now).map(|t| t.elapsed()),
            plan,
            read: Duration::ZERO,
            write: Duration::ZERO,
            state: Duration::ZERO,
            commit: Duration::ZERO,
            record: Duration::ZERO,
        }
    }

    fn lap(&mut self) -> Duration {
        let now = Instant::now();
        let took = now - self.lap;
        self.lap = now;
        took
    }

    /// The write phase ended; `read` of it was spent waiting on the source.
    pub(super) fn wrote(&mut self, read: Duration) {
        self.read = read;
        self.write = self.lap().saturating_sub(read);
    }

    /// The operators' state is written.
    pub(super) fn state_written(&mut self) {
        self.state = self.lap();
    }

    /// The sink committed.
    pub(super) fn committed(&mut self) {
        self.commit = self.lap();
    }

    /// `commits/N` is written.
    pub(super) fn recorded(&mut self) {
        self.record = self.lap();
    }

    fn total(&self) -> Duration {
        self.plan + (self.lap - self.started)
    }

    fn durations(&self) -> PhaseDurations {
        PhaseDurations {
            plan: ms(self.plan),
            read: ms(self.read),
            write: ms(self.write),
            state: ms(self.state),
            commit: ms(self.commit),
            record: ms(self.record),
            total: ms(self.total()),
        }
    }
}

/// What a recorded batch did, for its progress record.
pub(super) struct BatchDone<'a> {
    pub entry: &'a OffsetEntry,
    pub start: Option<Offset>,
    pub end: Offset,
    pub replayed: bool,
    pub written: &'a Written,
    /// The sink's version after the commit.
    pub version: Option<i64>,
    pub clock: BatchClock,
}

/// The query a batch ran in, as its progress record names it.
pub(super) struct RanIn<'a> {
    pub query_id: QueryId,
    pub query_name: &'a QueryName,
    pub run_id: RunId,
    pub source: &'a dyn Source,
    /// The sink, as its identity describes it.
    pub sink: &'a str,
    pub state: Vec<StateProgress>,
}

impl BatchDone<'_> {
    /// The batch's progress record.
    pub(super) fn progress(self, query: RanIn<'_>) -> QueryProgress {
        let BatchDone {
            entry,
            start,
            end,
            replayed,
            written,
            version,
            clock,
        } = self;
        let per_sec = |d: Duration| match d.is_zero() {
            true => 0.0,
            false => written.input_rows as f64 / d.as_secs_f64(),
        };
        QueryProgress {
            query_id: query.query_id,
            query_name: query.query_name.clone(),
            run_id: query.run_id,
            batch_id: entry.batch_id,
            timestamp: chrono::DateTime::from_timestamp_millis(entry.timestamp_ms).unwrap_or_else(Utc::now),
            replayed,
            input_rows: written.input_rows,
            output_rows: written.output_rows,
            input_rows_per_second: clock.since_previous.map(per_sec).unwrap_or(0.0),
            processed_rows_per_second: per_sec(clock.total()),
            partitions: written.partitions,
            durations_ms: clock.durations(),
            sources: vec![SourceProgress {
                source: query.source.name().to_string(),
                metrics: query.source.metrics(&end),
                start_offset: start,
                end_offset: end,
            }],
            sink: SinkProgress {
                description: query.sink.to_string(),
                version,
            },
            watermark: (entry.watermark_ms != 0)
                .then(|| chrono::DateTime::from_timestamp_millis(entry.watermark_ms))
                .flatten(),
            late_rows: written.late_rows,
            state: query.state,
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
