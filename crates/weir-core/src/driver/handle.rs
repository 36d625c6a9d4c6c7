//! The handle of a running query.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::error::{Error, Result};
use crate::ids::{QueryId, QueryName, RunId};
use crate::progress::QueryProgress;
use crate::sync::Recover;

/// How many progress events a handle keeps (as Spark does).
const RECENT_PROGRESS: usize = 100;

#[derive(Debug, Default)]
pub(crate) struct QueryShared {
    progress: Mutex<VecDeque<QueryProgress>>,
    error: Mutex<Option<String>>,
}

impl QueryShared {
    pub(crate) fn set_error(&self, error: &crate::Error) {
        *self.error.lock().recover() = Some(error.to_string());
    }

    pub(crate) fn push_progress(&self, p: QueryProgress) {
        let mut recent = self.progress.lock().recover();
        if recent.len() == RECENT_PROGRESS {
            recent.pop_front();
        }
        recent.push_back(p);
    }
}

#[derive(Debug)]
enum Termination {
    Running(JoinHandle<Result<()>>),
    /// The message of the error the query ended with, and whether it was
    /// retryable (the error itself went to the first caller).
    Finished {
        error: Option<(String, bool)>,
    },
}

/// A running streaming query. Dropping the handle does not stop the query;
/// call [`StreamingQuery::stop`].
#[derive(Debug)]
pub struct StreamingQuery {
    id: QueryId,
    name: QueryName,
    run_id: RunId,
    stop: watch::Sender<bool>,
    shared: Arc<QueryShared>,
    termination: tokio::sync::Mutex<Termination>,
}

impl StreamingQuery {
    pub(crate) fn new(
        id: QueryId,
        name: QueryName,
        run_id: RunId,
        stop: watch::Sender<bool>,
        shared: Arc<QueryShared>,
        task: JoinHandle<Result<()>>,
    ) -> Self {
        StreamingQuery {
            id,
            name,
            run_id,
            stop,
            shared,
            termination: tokio::sync::Mutex::new(Termination::Running(task)),
        }
    }

    /// The query's id (stable across runs).
    pub fn id(&self) -> QueryId {
        self.id
    }

    /// The query's name.
    pub fn name(&self) -> &QueryName {
        &self.name
    }

    /// This run's id.
    pub fn run_id(&self) -> RunId {
        self.run_id
    }

    /// Asks the query to stop: a running batch finishes, no new one starts,
    /// and the sink's background work (compaction, expiry) is cancelled,
    /// even while the sink waits for it after the query's last batch.
    /// Returns at once; await [`StreamingQuery::await_termination`] to wait.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Waits until the query ends (stopped, trigger done, or failed) and
    /// its sink is closed: a query that ran to its end (`once`,
    /// `available_now`, its last batch) waits for the sink's running
    /// background work, such as a compaction, to finish. The first call
    /// returns the query's own error ([`Error::QueryAborted`] if its task
    /// panicked); later calls return [`Error::QueryFailed`] with its message
    /// and retryable judgement.
    pub async fn await_termination(&self) -> Result<()> {
        let mut termination = self.termination.lock().await;
        match &mut *termination {
            Termination::Finished { error: None } => Ok(()),
            Termination::Finished {
                error: Some((message, retryable)),
            } => Err(Error::QueryFailed {
                query_name: self.name.clone(),
                message: message.clone(),
                retryable: *retryable,
            }),
            Termination::Running(task) => {
                let result = match task.await {
                    Ok(result) => result,
                    Err(join) => Err(Error::QueryAborted {
                        query_name: self.name.clone(),
                        source: join,
                    }),
                };
                *termination = Termination::Finished {
                    error: result.as_ref().err().map(|e| (e.to_string(), e.retryable())),
                };
                result
            }
        }
    }

    /// Stops the query and waits for it to end.
    pub async fn stop_and_wait(&self) -> Result<()> {
        self.stop();
        self.await_termination().await
    }

    /// Whether the query is still running.
    pub fn is_active(&self) -> bool {
        match self.termination.try_lock() {
            Ok(t) => matches!(&*t, Termination::Running(task) if !task.is_finished()),
            // Someone is awaiting termination: it is still running.
            Err(_) => true,
        }
    }

    /// The error that stopped the query, if it failed (available as soon as
    /// it stopped, without awaiting termination).
    pub fn exception(&self) -> Option<String> {
        self.shared.error.lock().recover().clone()
    }

    /// The progress of the most recent batch.
    pub fn last_progress(&self) -> Option<QueryProgress> {
        self.shared.progress.lock().recover().back().cloned()
    }

    /// The progress of up to the last 100 batches, oldest first.
    pub fn recent_progress(&self) -> Vec<QueryProgress> {
        self.shared.progress.lock().recover().iter().cloned().collect()
    }
}
