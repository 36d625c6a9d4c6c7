//! When batches run.

use std::time::Duration;

/// When a query plans its next batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A batch every interval (right away if the previous one took longer);
    /// no batch when there is no new data. A zero interval runs batches
    /// back to back, polling idle sources every 100 ms.
    ProcessingTime(Duration),
    /// One batch with everything available, then stop.
    Once,
    /// Everything available at start, in as many batches as the sources'
    /// limits make, then stop.
    AvailableNow,
}

impl Trigger {
    /// A batch every `interval`.
    pub fn processing_time(interval: Duration) -> Self {
        Trigger::ProcessingTime(interval)
    }

    /// One batch, then stop.
    pub fn once() -> Self {
        Trigger::Once
    }

    /// Everything available now, then stop.
    pub fn available_now() -> Self {
        Trigger::AvailableNow
    }
}

impl Default for Trigger {
    fn default() -> Self {
        Trigger::ProcessingTime(Duration::ZERO)
    }
}
