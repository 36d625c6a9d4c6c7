//! Prints each batch as a table on standard output.

use std::io::Write;

use arrow_cast::pretty::pretty_format_batches;
use async_trait::async_trait;

use super::staging::Staging;
use super::{BatchContext, CommitMessage, CommitOutcome, DataWriter, OutputMode, Sink};
use crate::error::{Error, Result};
use crate::protocol::SinkIdentity;

/// Prints each batch's rows (up to a limit) to standard output, the way a
/// developer watches a query. Not durable: a replayed batch is printed again.
#[derive(Debug, Clone)]
pub struct ConsoleSink {
    max_rows: usize,
    staging: Staging,
}

impl ConsoleSink {
    /// Prints at most 20 rows per batch.
    pub fn new() -> Self {
        ConsoleSink {
            max_rows: 20,
            staging: Staging::default(),
        }
    }

    /// Prints at most `rows` rows per batch.
    pub fn with_max_rows(mut self, rows: usize) -> Self {
        self.max_rows = rows;
        self
    }
}

impl Default for ConsoleSink {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Sink for ConsoleSink {
    fn identity(&self) -> SinkIdentity {
        SinkIdentity::new("console", "stdout")
    }

    fn check_output_mode(&self, _mode: OutputMode) -> std::result::Result<(), super::ModeRefusal> {
        Ok(())
    }

    fn keeps_marker(&self) -> bool {
        false
    }

    fn create_writer(&self, _batch: &BatchContext, partition_id: usize) -> Result<Box<dyn DataWriter>> {
        Ok(self.staging.writer(partition_id))
    }

    async fn commit(&self, batch: &BatchContext, messages: Vec<CommitMessage>) -> Result<CommitOutcome> {
        let rows = self.staging.take("console", &messages)?;
        let total: usize = rows.iter().map(|b| b.num_rows()).sum();
        let mut shown = Vec::new();
        let mut left = self.max_rows;
        for b in rows {
            if left == 0 {
                break;
            }
            let take = left.min(b.num_rows());
            shown.push(b.slice(0, take));
            left -= take;
        }
        let table = pretty_format_batches(&shown).map_err(|e| Error::arrow("console sink", e))?;
        let mut out = std::io::stdout().lock();
        let note = if total > self.max_rows {
            format!(" (first {} of {total} rows)", self.max_rows)
        } else {
            String::new()
        };
        writeln!(out, "-------------------------------------------\nBatch: {}{note}\n-------------------------------------------\n{table}", batch.batch_id)
            .map_err(|e| Error::sink("console", Some(batch.batch_id), true, e))?;
        Ok(CommitOutcome::Committed { version: None })
    }

    async fn abort(&self, _batch: &BatchContext, messages: Vec<CommitMessage>) -> Result<()> {
        self.staging.discard(&messages);
        Ok(())
    }
}
