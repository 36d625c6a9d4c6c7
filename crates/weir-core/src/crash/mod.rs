//! Named crash points in the commit sequence, armed by tests.
//!
//! A crash point fires once, either by failing the query at that point (the
//! driver stops at once, like a dead process, with no clean-up) or by
//! aborting the whole process. Child-process tests arm points with the
//! `WEIR_CRASH_AT` environment variable (`after_data_written` or
//! `after_data_written@3` for batch 3 only), which aborts the process.

use std::str::FromStr;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::ids::BatchId;

pub(crate) mod point;

use crate::sync::Recover;
pub use point::CrashPoint;

impl FromStr for CrashPoint {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        CrashPoint::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| Error::InvalidOption {
                option: "WEIR_CRASH_AT",
                reason: format!(
                    "unknown crash point {s:?}; known: {}",
                    CrashPoint::ALL.map(|p| p.name()).join(", ")
                ),
            })
    }
}

/// What an armed crash point does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashAction {
    /// The driver stops with [`Error::InjectedCrash`], doing nothing more.
    Fail,
    /// The process aborts on the spot.
    Abort,
}

#[derive(Debug, Clone, Copy)]
struct Arm {
    point: CrashPoint,
    batch: Option<BatchId>,
    action: CrashAction,
}

/// A set of armed crash points, shared by a query and the test that armed it.
#[derive(Debug, Clone, Default)]
pub struct CrashPoints {
    arms: Arc<Mutex<Vec<Arm>>>,
}

impl CrashPoints {
    /// No point armed.
    pub fn new() -> Self {
        Self::default()
    }

    /// Arms `point` to fail the query, in any batch (`None`) or one batch.
    pub fn fail_at(self, point: CrashPoint, batch: Option<BatchId>) -> Self {
        self.arm(point, batch, CrashAction::Fail)
    }

    /// Arms `point` with an action.
    pub fn arm(self, point: CrashPoint, batch: Option<BatchId>, action: CrashAction) -> Self {
        self.lock().push(Arm { point, batch, action });
        self
    }

    /// Arms the point named in `WEIR_CRASH_AT`, if set, to abort the process.
    pub fn from_env() -> Result<Self> {
        let points = CrashPoints::new();
        let Ok(spec) = std::env::var("WEIR_CRASH_AT") else {
            return Ok(points);
        };
        let (name, batch) = match spec.split_once('@') {
            Some((name, batch)) => {
                let batch = batch.parse().map_err(|_| Error::InvalidOption {
                    option: "WEIR_CRASH_AT",
                    reason: format!("batch id {batch:?} is not a number"),
                })?;
                (name, Some(BatchId(batch)))
            }
            None => (spec.as_str(), None),
        };
        Ok(points.arm(name.parse()?, batch, CrashAction::Abort))
    }

    /// These points plus the one named in `WEIR_CRASH_AT`, if set.
    pub fn with_env(self) -> Result<Self> {
        let env = Self::from_env()?;
        let arms: Vec<Arm> = env.lock().drain(..).collect();
        self.lock().extend(arms);
        Ok(self)
    }

    /// Called by the driver at each point: fires (once) if armed.
    pub fn hit(&self, point: CrashPoint, batch_id: BatchId) -> Result<()> {
        let fired = {
            let mut arms = self.lock();
            let pos = arms
                .iter()
                .position(|a| a.point == point && a.batch.is_none_or(|b| b == batch_id));
            pos.map(|i| arms.remove(i))
        };
        match fired.map(|a| a.action) {
            None => Ok(()),
            Some(CrashAction::Fail) => Err(Error::InjectedCrash { point, batch_id }),
            Some(CrashAction::Abort) => {
                tracing::warn!(%point, %batch_id, "crash point fired: aborting the process");
                std::process::abort()
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arm>> {
        // A panic while holding this lock leaves a valid Vec behind.
        self.arms.lock().recover()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_once_and_only_in_its_batch() {
        let points = CrashPoints::new().fail_at(CrashPoint::AfterDataWritten, Some(BatchId(2)));
        assert!(points.hit(CrashPoint::AfterDataWritten, BatchId(1)).is_ok());
        assert!(points.hit(CrashPoint::AfterSinkCommit, BatchId(2)).is_ok());
        assert!(matches!(
            points.hit(CrashPoint::AfterDataWritten, BatchId(2)),
            Err(Error::InjectedCrash {
                point: CrashPoint::AfterDataWritten,
                batch_id: BatchId(2)
            })
        ));
        assert!(points.hit(CrashPoint::AfterDataWritten, BatchId(2)).is_ok());
    }

    #[test]
    fn names_round_trip() {
        for p in CrashPoint::ALL {
            assert_eq!(p.name().parse::<CrashPoint>().unwrap(), p);
        }
        assert!("after_lunch".parse::<CrashPoint>().is_err());
    }
}
