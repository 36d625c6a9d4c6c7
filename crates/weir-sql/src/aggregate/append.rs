//! Append mode's state: bins of partial rows per window and batch (see
//! `bins`), which the watermark closes.

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use weir_core::state::KeyedState;
use weir_core::{BoxError, OutputMode};

use super::plan::conform;
use super::{Aggregation, BatchIn, Emitted};
use crate::bins;

impl Aggregation {
    /// A batch of a windowed aggregation in Append mode: the batch's
    /// partial rows go into its bins, crowded windows' bins are merged,
    /// and the windows the watermark closed are taken out, merged and
    /// emitted.
    pub(super) async fn process_binned(&self, state: &mut KeyedState, batch: BatchIn<'_>) -> Emitted {
        if batch.input.iter().any(|b| b.num_rows() > 0) {
            let rows = self
                .partial_rows(batch.input, &batch.ctx.input_schema, batch.partial_schema)
                .await?;
            let starts = bins::put(state, &rows, batch.ctx.batch_id)?;
            self.merge_crowded(state, &starts, batch.ctx.batch_id, batch.partial_schema)
                .await?;
        }
        let mut output = Vec::new();
        if let Some(taken) = batch
            .ctx
            .watermark_ms
            .map(|wm| self.take_closed(state, wm))
            .transpose()?
            .flatten()
        {
            let closed = self.merge_bins(&taken, batch.partial_schema).await?;
            output.push(self.finish(&closed, &batch.ctx.input_schema, batch.output_schema)?);
        }
        output.retain(|b| b.num_rows() > 0);
        Ok(output)
    }

    /// Whether the state is kept in bins (see `bins`): in Append mode,
    /// where the watermark closes the windows.
    pub(super) fn binned(&self, mode: OutputMode, event_time: Option<&str>) -> bool {
        mode == OutputMode::Append
            && self
                .window
                .as_ref()
                .is_some_and(|w| event_time == Some(w.column.as_str()))
    }

    /// The final partial rows of closed windows taken from bins: a window
    /// one batch saw is final as it is; the partial rows of the windows
    /// several batches saw are merged, in one aggregation (the window's
    /// start is a group column).
    async fn merge_bins(&self, taken: &RecordBatch, partial_schema: &SchemaRef) -> Result<RecordBatch, BoxError> {
        let (mut rows, mut several) = (Vec::new(), Vec::new());
        for window in bins::windows(taken, partial_schema)? {
            if window.bins == 1 {
                rows.extend(window.rows);
            } else {
                several.extend(window.rows);
            }
        }
        if !several.is_empty() {
            let merged = self
                .aggregate(&self.merge_sql(), partial_schema.clone(), several)
                .await?;
            rows.push(conform(partial_schema, &merged)?);
        }
        Ok(arrow_select::concat::concat_batches(partial_schema, &rows)?)
    }

    /// Merges the bins of each window of `starts` (those batch `batch` added
    /// to) that holds too many into one bin of the batch, so a window keeps
    /// a bounded number of batches' rows.
    async fn merge_crowded(
        &self,
        state: &mut KeyedState,
        starts: &[i64],
        batch: weir_core::BatchId,
        partial_schema: &SchemaRef,
    ) -> Result<(), BoxError> {
        for keys in bins::crowded(state, starts)? {
            let keys: Vec<&[u8]> = keys.iter().map(|k| &**k).collect();
            let taken = state.batch_of(&keys)?;
            for key in &keys {
                state.remove(key);
            }
            let merged = self.merge_bins(&taken, partial_schema).await?;
            bins::put(state, &merged, batch)?;
        }
        Ok(())
    }
}
