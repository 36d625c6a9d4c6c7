//! Why a run lost its checkpoint's lease (a leaf: the engine's error type
//! holds it).

use std::fmt;
use std::time::Duration;

/// Why a run no longer holds its checkpoint's lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseLoss {
    /// Another run took the lease over after it had lapsed.
    TakenOver { owner: String, epoch: u64 },
    /// The lease could not be renewed in time (the store was unreachable,
    /// or the process was paused).
    NotRenewed { ttl: Duration },
    /// The run released it: its query stopped.
    Released,
}

impl LeaseLoss {
    /// Whether restarting the query may succeed: after a lapse, yes; when
    /// another run holds the checkpoint, not while it runs.
    pub fn retryable(&self) -> bool {
        matches!(self, LeaseLoss::NotRenewed { .. })
    }
}

impl fmt::Display for LeaseLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseLoss::TakenOver { owner, epoch } => {
                write!(f, "was taken over by {owner} with epoch {epoch}; stop one of the two")
            }
            LeaseLoss::NotRenewed { ttl } => write!(
                f,
                "could not be renewed within its {ttl:?} (the store was unreachable or the process paused)"
            ),
            LeaseLoss::Released => write!(f, "was released when the query stopped"),
        }
    }
}
