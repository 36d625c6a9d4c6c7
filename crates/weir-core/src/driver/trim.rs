//! Trimming the checkpoint's logs to the retained batches beside the
//! batches, not on their path: deleting the entries that fell out of the
//! retained window costs a request each on object storage (two a batch),
//! and nothing ever reads them.

use futures::FutureExt;
use tokio::task::JoinHandle;

use crate::checkpoint::Checkpoint;
use crate::error::Result;
use crate::ids::BatchId;

/// The log entries of batches before `due_before` go, one trim at a time.
pub(super) struct LogTrim {
    checkpoint: Checkpoint,
    retain: u64,
    /// Entries before this are gone; `None` until the start's purge.
    done_before: Option<u64>,
    /// Entries before this are due to go.
    due_before: u64,
    /// The trim under way, returning where the logs now begin.
    running: Option<JoinHandle<Result<u64>>>,
}

impl LogTrim {
    pub(super) fn new(checkpoint: Checkpoint, retain: u64) -> Self {
        LogTrim {
            checkpoint,
            retain,
            done_before: None,
            due_before: 0,
            running: None,
        }
    }

    /// Trims the logs whole, listing them (at the query's start: a crash
    /// may have left anything behind); returns the first batch kept
    /// (`None`: nothing was committed).
    pub(super) async fn purge(&mut self) -> Result<Option<BatchId>> {
        self.finish().await?;
        let kept = self.checkpoint.purge(self.retain).await?;
        let kept_from = kept.map_or(0, |b| b.0);
        self.done_before = Some(kept_from);
        self.due_before = self.due_before.max(kept_from);
        Ok(kept)
    }

    /// `batch` was recorded: the entries before the newest `retain` are
    /// due, and a trim starts unless one is under way (the next record
    /// catches up what it leaves). A trim that failed fails this record,
    /// as a delete on the record's own path did.
    pub(super) fn recorded(&mut self, batch: BatchId) -> Result<()> {
        self.due_before = self.due_before.max((batch.0 + 1).saturating_sub(self.retain));
        if let Some(ended) = self.running.as_mut().and_then(|r| r.now_or_never()) {
            self.running = None;
            self.done_before = Some(joined(self.checkpoint.location(), ended)?);
        }
        let Some(from) = self.done_before else { return Ok(()) };
        if self.running.is_none() && from < self.due_before {
            let (checkpoint, to) = (self.checkpoint.clone(), self.due_before);
            self.running = Some(tokio::spawn(trim(checkpoint, from, to)));
        }
        Ok(())
    }

    /// Waits for the trim under way, then trims what is still due (at the
    /// query's end, when it ended well).
    pub(super) async fn finish(&mut self) -> Result<()> {
        if let Some(running) = self.running.take() {
            self.done_before = Some(joined(self.checkpoint.location(), running.await)?);
        }
        if let Some(from) = self.done_before.filter(|from| *from < self.due_before) {
            self.done_before = Some(trim(self.checkpoint.clone(), from, self.due_before).await?);
        }
        Ok(())
    }

    /// Stops the trim under way (a query that failed or lost its lease:
    /// the next start's purge deletes what is left).
    pub(super) fn abort(&mut self) {
        if let Some(running) = self.running.take() {
            running.abort();
        }
    }
}

impl Drop for LogTrim {
    /// No trim outlives the run, nor so its lease.
    fn drop(&mut self) {
        self.abort();
    }
}

/// The result of a trim task of the checkpoint at `location`: its own, or
/// a panic's.
fn joined(location: &str, ended: std::result::Result<Result<u64>, tokio::task::JoinError>) -> Result<u64> {
    ended.unwrap_or_else(|e| {
        Err(crate::Error::CheckpointIo {
            location: location.to_string(),
            path: "offsets/, commits/".into(),
            source: std::io::Error::other(format!("the trim of old log entries ended early: {e}")),
        })
    })
}

/// Deletes the entries of batches `from..to` from both logs; returns `to`.
async fn trim(checkpoint: Checkpoint, from: u64, to: u64) -> Result<u64> {
    for batch in (from..to).map(BatchId) {
        // Both at once: on object storage each is a request.
        futures::try_join!(checkpoint.offsets().remove(batch), checkpoint.commits().remove(batch))?;
    }
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes entries `ids` into both logs of the checkpoint at `dir`.
    fn logs_with(dir: &std::path::Path, ids: std::ops::RangeInclusive<u64>) {
        for log in ["offsets", "commits"] {
            std::fs::create_dir_all(dir.join(log)).unwrap();
            for id in ids.clone() {
                std::fs::write(dir.join(log).join(id.to_string()), "{}").unwrap();
            }
        }
    }

    fn entries(dir: &std::path::Path, log: &str) -> Vec<u64> {
        let mut ids: Vec<u64> = std::fs::read_dir(dir.join(log))
            .unwrap()
            .filter_map(|e| e.unwrap().file_name().to_str()?.parse().ok())
            .collect();
        ids.sort();
        ids
    }

    /// Records made while a trim runs are caught up by a later one, and the
    /// query's end leaves exactly the retained entries.
    #[tokio::test(flavor = "current_thread")]
    async fn trims_catch_up_and_end_at_the_retained_batches() {
        let dir = tempfile::tempdir().unwrap();
        logs_with(dir.path(), 0..=20);
        let mut trim = LogTrim::new(Checkpoint::open_local(dir.path()).unwrap(), 5);
        trim.recorded(BatchId(12)).unwrap();
        assert!(trim.running.is_none(), "nothing is trimmed before the start's purge");
        assert_eq!(trim.purge().await.unwrap(), Some(BatchId(16)));
        assert_eq!(entries(dir.path(), "commits"), (16..=20).collect::<Vec<_>>());
        for id in 21..=40 {
            logs_with(dir.path(), id..=id);
            // No await between records: every trim after the first waits.
            trim.recorded(BatchId(id)).unwrap();
        }
        trim.finish().await.unwrap();
        assert_eq!(entries(dir.path(), "offsets"), (36..=40).collect::<Vec<_>>());
        assert_eq!(entries(dir.path(), "commits"), (36..=40).collect::<Vec<_>>());
    }

    /// A trim that fails fails the next record (the query stops, as when
    /// the deletes were on the record's path), and a later one retries.
    #[tokio::test(flavor = "current_thread")]
    async fn a_failed_trim_fails_the_next_record() {
        let dir = tempfile::tempdir().unwrap();
        logs_with(dir.path(), 0..=3);
        let mut trim = LogTrim::new(Checkpoint::open_local(dir.path()).unwrap(), 2);
        trim.purge().await.unwrap();
        // An entry that cannot be deleted: a directory in its place.
        std::fs::remove_file(dir.path().join("commits/2")).unwrap();
        std::fs::create_dir_all(dir.path().join("commits/2/x")).unwrap();
        trim.recorded(BatchId(4)).unwrap();
        let running = trim.running.as_ref().unwrap();
        while !running.is_finished() {
            tokio::task::yield_now().await;
        }
        assert!(trim.recorded(BatchId(5)).is_err(), "the failure stops the query");
        std::fs::remove_dir_all(dir.path().join("commits/2")).unwrap();
        trim.recorded(BatchId(5)).unwrap();
        trim.finish().await.unwrap();
        assert!(entries(dir.path(), "offsets").is_empty());
        assert!(entries(dir.path(), "commits").is_empty());
    }

    /// A trim stopped (a failed run, a dropped driver) deletes nothing more:
    /// no delete outlives the run's lease.
    #[tokio::test(flavor = "current_thread")]
    async fn an_aborted_trim_deletes_nothing_more() {
        let dir = tempfile::tempdir().unwrap();
        logs_with(dir.path(), 0..=9);
        let mut trim = LogTrim::new(Checkpoint::open_local(dir.path()).unwrap(), 10);
        trim.purge().await.unwrap();
        logs_with(dir.path(), 10..=14);
        // Not yet run: the current thread has not yielded since.
        trim.recorded(BatchId(14)).unwrap();
        assert!(trim.running.is_some(), "batches 0..5 are due");
        drop(trim);
        // Time enough for a trim that kept running to delete them.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert_eq!(entries(dir.path(), "offsets"), (0..=14).collect::<Vec<_>>());
        assert_eq!(entries(dir.path(), "commits"), (0..=14).collect::<Vec<_>>());
    }
}
