//! Update's and Complete's state: one merged partial row per group.

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use weir_core::state::KeyedState;
use weir_core::{BoxError, OutputMode};

use super::plan::conform;
use super::{Aggregation, BatchIn, Emitted};
use crate::error::SqlError;

impl Aggregation {
    /// A batch in Update or Complete mode: the batch's groups are folded
    /// into the state's merged groups; Update emits the groups it changed
    /// (and forgets windows the watermark closed), Complete every group.
    pub(super) async fn process_merged(&self, state: &mut KeyedState, batch: BatchIn<'_>) -> Emitted {
        // Append keeps bins (append.rs); the keyed state serves Update and
        // Complete.
        if batch.ctx.output_mode == OutputMode::Append {
            return Err(SqlError::InvalidAggregation {
                operator: self.name.clone(),
                reason: "Append mode needs a watermark on the event-time column of the window".into(),
            }
            .into());
        }
        let mut merged: Option<RecordBatch> = None;
        if batch.input.iter().any(|b| b.num_rows() > 0) {
            merged = Some(
                self.fold(state, batch.input, &batch.ctx.input_schema, batch.partial_schema)
                    .await?,
            );
        }
        let mut output = Vec::new();
        match batch.ctx.output_mode {
            OutputMode::Complete => {
                // Complete keeps and emits every group.
                let all = state.sorted()?.with_schema(batch.partial_schema.clone())?;
                output.push(self.finish(&all, &batch.ctx.input_schema, batch.output_schema)?);
            }
            _ => {
                if let Some(rows) = &merged {
                    output.push(self.finish(rows, &batch.ctx.input_schema, batch.output_schema)?);
                }
                // Update emitted a closed window's last change: a window the
                // watermark closed (on its own column) is forgotten.
                let closes = self
                    .window
                    .as_ref()
                    .is_some_and(|w| batch.ctx.event_time_column.as_deref() == Some(&w.column));
                if let (Some(wm), true) = (batch.ctx.watermark_ms, closes) {
                    self.take_closed(state, wm)?;
                }
            }
        }
        output.retain(|b| b.num_rows() > 0);
        Ok(output)
    }

    /// Folds `input` into the state's partial rows; returns the groups it
    /// changed, with their new partial rows.
    async fn fold(
        &self,
        state: &mut KeyedState,
        input: Vec<RecordBatch>,
        input_schema: &Schema,
        partial_schema: &SchemaRef,
    ) -> Result<RecordBatch, BoxError> {
        let nkeys = self.key_names().len();
        let batch = self.partial_rows(input, input_schema, partial_schema).await?;
        let keys = state.encode_keys(&batch.columns()[..nkeys])?;
        // Groups new to the state take the batch's partial row as it is;
        // only the groups the state holds are merged with their old rows.
        let (held, new): (Vec<usize>, Vec<usize>) =
            (0..batch.num_rows()).partition(|&i| state.contains_key(keys.row(i).data()));
        let (rows, keys) = if held.is_empty() {
            (batch, keys)
        } else {
            let held_keys: Vec<&[u8]> = held.iter().map(|&i| keys.row(i).data()).collect();
            let old = state.batch_of(&held_keys)?.with_schema(partial_schema.clone())?;
            let take = |rows: &[usize]| {
                let indices = arrow_array::UInt32Array::from_iter_values(rows.iter().map(|&i| i as u32));
                arrow_select::take::take_record_batch(&batch, &indices)
            };
            let merged = self
                .aggregate(&self.merge_sql(), partial_schema.clone(), vec![old, take(&held)?])
                .await?;
            let rows = conform(partial_schema, &[take(&new)?, conform(partial_schema, &merged)?])?;
            let keys = state.encode_keys(&rows.columns()[..nkeys])?;
            (rows, keys)
        };
        if let Some(values) = state.encode_values(&rows.columns()[nkeys..])? {
            for (k, v) in keys.iter().zip(values.iter()) {
                state.put(k.data(), v);
            }
        }
        Ok(rows)
    }
}
