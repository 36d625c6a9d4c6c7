//! Session aggregation: a batch's sessions merged with the open sessions
//! of their groups.

use weir_core::state::KeyedState;
use weir_core::OutputMode;

use super::plan::conform;
use super::{Aggregation, BatchIn, Emitted};
use crate::session;

impl Aggregation {
    /// A batch of a session aggregation: the batch's sessions are merged
    /// with the open sessions of their groups, then Append mode emits (and
    /// forgets) the sessions the watermark ended and Complete mode every
    /// session.
    pub(super) async fn process_sessions(&self, state: &mut KeyedState, batch: BatchIn<'_>) -> Emitted {
        let n = self.key_names().len();
        if batch.input.iter().any(|b| b.num_rows() > 0) {
            let rows = self
                .partial_rows(batch.input, &batch.ctx.input_schema, batch.partial_schema)
                .await?;
            let rows = match session::take_sessions_of(state, &rows, self.keys.len())? {
                Some(held) => {
                    let held = held.with_schema(batch.partial_schema.clone())?;
                    let merged = self
                        .aggregate(&self.merge_sql(), batch.partial_schema.clone(), vec![held, rows])
                        .await?;
                    conform(batch.partial_schema, &merged)?
                }
                None => rows,
            };
            let keys = state.encode_keys(&rows.columns()[..n])?;
            if let Some(values) = state.encode_values(&rows.columns()[n..])? {
                for (k, v) in keys.iter().zip(values.iter()) {
                    state.put(k.data(), v);
                }
            }
        }
        let done = match (batch.ctx.output_mode, batch.ctx.watermark_ms) {
            (OutputMode::Complete, _) => state.sorted()?,
            (_, Some(watermark)) => session::take_ended(state, watermark)?,
            (_, None) => return Ok(Vec::new()),
        };
        let done = done.with_schema(batch.partial_schema.clone())?;
        let mut output = vec![self.finish(&done, &batch.ctx.input_schema, batch.output_schema)?];
        output.retain(|b| b.num_rows() > 0);
        Ok(output)
    }
}
