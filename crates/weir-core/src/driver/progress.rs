//! A batch's progress record: the clock of its phases, and the record the
//! driver builds from it once the batch is recorded, for the log, the
//! listeners and the query's handle.

use std::time::{Duration, Instant};

use chrono::Utc;

use super::batch::Written;
use super::run::Driver;
use crate::checkpoint::OffsetEntry;
use crate::progress::{PhaseDurations, QueryProgress, SinkProgress, SourceProgress};
use crate::source::Offset;

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

impl Driver {
    /// Builds the batch's progress record and hands it to the log, the
    /// listeners and the query's handle.
    pub(super) fn report(&self, done: BatchDone<'_>) {
        let BatchDone {
            entry,
            start,
            end,
            replayed,
            written,
            version,
            clock,
        } = done;
        let per_sec = |d: Duration| match d.is_zero() {
            true => 0.0,
            false => written.input_rows as f64 / d.as_secs_f64(),
        };
        let source = &self.stream.source;
        let progress = QueryProgress {
            query_id: self.query_id,
            query_name: self.query_name.clone(),
            run_id: self.run_id,
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
                source: source.name().to_string(),
                metrics: source.metrics(&end),
                start_offset: start,
                end_offset: end,
            }],
            sink: SinkProgress {
                description: self.sink_description.clone(),
                version,
            },
            watermark: (entry.watermark_ms != 0)
                .then(|| chrono::DateTime::from_timestamp_millis(entry.watermark_ms))
                .flatten(),
            late_rows: written.late_rows,
            state: self.stateful.as_ref().map(|s| s.progress()).unwrap_or_default(),
        };
        progress.emit();
        for listener in &self.listeners {
            listener(&progress);
        }
        self.shared.push_progress(progress);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
