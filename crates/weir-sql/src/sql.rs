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

    fn context() -> SessionContext {
        // One partition: a micro-batch is already in memory, and its rows
        // keep their order through a projection or a filter.
        SessionContext::new_with_config(SessionConfig::new().with_target_partitions(1))
    }

    async fn run(&self, schema: SchemaRef, input: Vec<RecordBatch>) -> Result<Vec<RecordBatch>, SqlError> {
        let plan = |source| SqlError::Plan {
            query: self.query.clone(),
            source,
        };
        let ctx = Self::context();
        let table = MemTable::try_new(schema, vec![input]).map_err(plan)?;
        ctx.register_table(INPUT, Arc::new(table)).map_err(plan)?;
        let frame = ctx.sql(&self.query).await.map_err(plan)?;
        frame.collect().await.map_err(|source| SqlError::Execute {
            query: self.query.clone(),
            source,
        })
    }
}

#[async_trait]
impl BatchTransform for Sql {
    fn output_schema(&self, input: &SchemaRef) -> Result<SchemaRef, BoxError> {
        let ctx = Self::context();
        let plan = |source| SqlError::Plan {
            query: self.query.clone(),
            source,
        };
        let table = MemTable::try_new(input.clone(), vec![vec![]]).map_err(plan)?;
        ctx.register_table(INPUT, Arc::new(table)).map_err(plan)?;
        // Planning a query over an in-memory table waits on nothing.
        let frame = futures::executor::block_on(ctx.sql(&self.query)).map_err(plan)?;
        Ok(Arc::new(frame.schema().as_arrow().clone()))
    }

    async fn transform(&self, input: Vec<RecordBatch>, _batch_id: BatchId) -> Result<Vec<RecordBatch>, BoxError> {
        let schema = match input.first() {
            Some(b) => b.schema(),
            None => return Ok(Vec::new()),
        };
        Ok(self.run(schema, input).await?)
    }
}
