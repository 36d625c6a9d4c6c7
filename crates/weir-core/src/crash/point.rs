//! The named points of a batch's commit sequence.

use std::fmt;

/// A point in the commit sequence of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashPoint {
    /// `offsets/N` is written; nothing of the batch is read yet.
    AfterOffsetsWritten,
    /// The writers wrote their data files; the sink has not committed.
    AfterDataWritten,
    /// The operators' state and `state/_manifest/N` are written (for a
    /// query without state: the same moment as `AfterDataWritten`); the
    /// sink has not committed.
    AfterStateWritten,
    /// The sink committed; `commits/N` is not written.
    AfterSinkCommit,
    /// `commits/N` is written; the source's commit hook has not run.
    AfterCommitLog,
}

impl CrashPoint {
    /// Every crash point, in the order of the commit sequence.
    pub const ALL: [CrashPoint; 5] = [
        CrashPoint::AfterOffsetsWritten,
        CrashPoint::AfterDataWritten,
        CrashPoint::AfterStateWritten,
        CrashPoint::AfterSinkCommit,
        CrashPoint::AfterCommitLog,
    ];

    /// The point's name, as used in `WEIR_CRASH_AT`.
    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::AfterOffsetsWritten => "after_offsets_written",
            CrashPoint::AfterDataWritten => "after_data_written",
            CrashPoint::AfterStateWritten => "after_state_written",
            CrashPoint::AfterSinkCommit => "after_sink_commit",
            CrashPoint::AfterCommitLog => "after_commit_log",
        }
    }
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
