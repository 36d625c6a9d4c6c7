//! SQL over each micro-batch, on DataFusion.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use datafusion::datasource::MemTable;
use datafusion::execution::context::SessionContext;
use datafusion::prelude::SessionConfig;
use weir_core::operator::BatchTransform;
use weir_core::{BatchId, BoxError};

use crate::error::SqlError;

/// The name of a micro-batch's rows in the SQL.
pub const INPUT: &str = "input";

/// A SQL query over the rows of each micro-batch, which it sees as the
/// table `input`: `SELECT merchant_id, amount FROM input WHERE risk_score >
/// 0.9`. Stateless: each batch's result depends on that batch alone. For
/// state across batches use the operators (`drop_duplicates`, `group_by`).
#[derive(Debug, Clone)]
pub struct Sql {
    query: String,
}

impl Sql {
    /// The query `query` over `input`.
    pub fn new(query: impl Into<String>) -> Self {
        Sql { query: query.into() }
    }
}

/// A DataFusion session for one query. One partition: a micro-batch is
/// already in memory, and its rows keep their order through a projection
/// or a filter. An aggregation of many rows splits them into parts itself
/// (see `parts`), each group whole in one part.
fn session() -> SessionContext {
    SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1))
}

fn plan_error(query: &str) -> impl Fn(datafusion::error::DataFusionError) -> SqlError + '_ {
    move |source| SqlError::Plan {
        query: query.to_string(),
        source,
    }
}

/// An in-memory table of `rows`, for `query`'s errors.
pub(crate) fn memory(query: &str, schema: SchemaRef, rows: Vec<RecordBatch>) -> Result<Arc<MemTable>, SqlError> {
    Ok(Arc::new(
        MemTable::try_new(schema, vec![rows]).map_err(plan_error(query))?,
    ))
}

/// The columns of `query` over (empty) tables of these names and columns.
pub(crate) fn planned_schema(query: &str, tables: &[(&str, SchemaRef)]) -> Result<SchemaRef, SqlError> {
    let ctx = session();
    for (name, schema) in tables {
        ctx.register_table(*name, memory(query, schema.clone(), Vec::new())?)
            .map_err(plan_error(query))?;
    }
    // Planning over in-memory tables waits on nothing.
    let frame = futures::executor::block_on(ctx.sql(query)).map_err(plan_error(query))?;
    Ok(Arc::new(frame.schema().as_arrow().clone()))
}

/// Runs `query` over these in-memory tables.
pub(crate) async fn run_query(query: &str, tables: Vec<(&str, Arc<MemTable>)>) -> Result<Vec<RecordBatch>, SqlError> {
    let ctx = session();
    for (name, table) in tables {
        ctx.register_table(name, table).map_err(plan_error(query))?;
    }
    let frame = ctx.sql(query).await.map_err(plan_error(query))?;
    frame.collect().await.map_err(|source| SqlError::Execute {
        query: query.to_string(),
        source,
    })
}

/// Runs `query` over `rows` of `schema` as the table `input`.
pub(crate) async fn run_on_input(
    query: &str,
    schema: SchemaRef,
    rows: Vec<RecordBatch>,
) -> Result<Vec<RecordBatch>, SqlError> {
    run_query(query, vec![(INPUT, memory(query, schema, rows)?)]).await
}

#[async_trait]
impl BatchTransform for Sql {
    fn output_schema(&self, input: &SchemaRef) -> Result<SchemaRef, BoxError> {
        Ok(planned_schema(&self.query, &[(INPUT, input.clone())])?)
    }

    async fn transform(&self, input: Vec<RecordBatch>, _batch_id: BatchId) -> Result<Vec<RecordBatch>, BoxError> {
        let schema = match input.first() {
            Some(b) => b.schema(),
            None => return Ok(Vec::new()),
        };
        Ok(run_on_input(&self.query, schema, input).await?)
    }
}
