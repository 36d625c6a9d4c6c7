//! Stream-static joins: each micro-batch's rows joined with a table read
//! whole, as the table is when the batch starts.

use std::fmt;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::datasource::MemTable;
use futures::lock::Mutex;
use weir_core::operator::BatchTransform;
use weir_core::{BatchId, BoxError, Transient};

use crate::error::SqlError;
use crate::sql::{memory, planned_schema, run_query};
use crate::INPUT;

/// A table a stream joins with (a Delta or Iceberg table: see the `weir`
/// crate's `static_table`): read whole, and again whenever its version
/// changes.
#[async_trait]
pub trait StaticTable: Send + Sync + fmt::Debug {
    /// The table's columns when the query was built.
    fn schema(&self) -> SchemaRef;

    /// The table's version now (a Delta version, an Iceberg snapshot id),
    /// checked at the start of each batch.
    async fn version(&self) -> Result<Option<i64>, BoxError>;

    /// Every live row of the table now, with the version they are of.
    async fn read(&self) -> Result<(Option<i64>, Vec<RecordBatch>), BoxError>;
}

/// A version of the table and its rows.
type Cached = (Option<i64>, Arc<MemTable>);

/// A SQL query over each micro-batch's rows (`input`) and a static table
/// (under its name): `SELECT i.*, m.name FROM input i JOIN merchants m ON
/// i.merchant_id = m.id`. Each batch reads the table's version when it
/// starts and reads the rows again only when the version changed. As in
/// Spark, a batch run again after a crash sees the table as it is then.
#[derive(Clone)]
pub struct StaticJoin {
    name: String,
    table: Arc<dyn StaticTable>,
    query: String,
    /// The rows of the version last read.
    cached: Arc<Mutex<Option<Cached>>>,
}

impl fmt::Debug for StaticJoin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticJoin")
            .field("name", &self.name)
            .field("table", &self.table)
            .field("query", &self.query)
            .finish_non_exhaustive()
    }
}

/// Columns by name and type, without their metadata (readers put field ids
/// in it).
fn plain(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_metadata(Default::default()))
            .collect::<Vec<_>>(),
    ))
}

/// `batch`'s columns that the query was planned with, by name (a column
/// added to the table since is left out); a planned column that is gone,
/// changed its type or became nullable is refused.
fn planned_columns(batch: &RecordBatch, planned: &SchemaRef) -> Result<RecordBatch, String> {
    let found = plain(&batch.schema());
    let restart = "restart the query to plan it with the table's columns now";
    let columns = planned
        .fields()
        .iter()
        .map(|f| {
            let (i, now) = found
                .column_with_name(f.name())
                .ok_or_else(|| format!("its column {:?} is gone; {restart}", f.name()))?;
            if now.data_type() != f.data_type() || (now.is_nullable() && !f.is_nullable()) {
                return Err(format!(
                    "its column {:?} is now {} ({}), and was {} ({}) when the query was planned; {restart}",
                    f.name(),
                    now.data_type(),
                    if now.is_nullable() { "nullable" } else { "not null" },
                    f.data_type(),
                    if f.is_nullable() { "nullable" } else { "not null" },
                ));
            }
            Ok(batch.column(i).clone())
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(planned.clone(), columns).map_err(|e| e.to_string())
}

impl StaticJoin {
    /// `query` over `input` and `table`, which it reads as `name`.
    pub fn new(name: impl Into<String>, table: Arc<dyn StaticTable>, query: impl Into<String>) -> Self {
        StaticJoin {
            name: name.into(),
            table,
            query: query.into(),
            cached: Arc::default(),
        }
    }

    /// The table's rows as of now: those read before if the version is
    /// the same.
    async fn rows(&self) -> Result<Arc<MemTable>, BoxError> {
        // A table that did not answer may answer a restarted batch: the
        // error stays transient.
        let err = |source: BoxError| -> BoxError {
            let transient = source.downcast_ref::<Transient>().is_some();
            let error = SqlError::StaticTable {
                name: self.name.clone(),
                source,
            };
            if transient {
                weir_core::transient(error)
            } else {
                Box::new(error)
            }
        };
        let mut cached = self.cached.lock().await;
        let version = self.table.version().await.map_err(err)?;
        if let Some((v, rows)) = cached.as_ref() {
            if *v == version {
                return Ok(rows.clone());
            }
        }
        let (version, batches) = self.table.read().await.map_err(err)?;
        let schema = plain(&self.table.schema());
        let batches = batches
            .iter()
            .map(|b| planned_columns(b, &schema).map_err(|reason| err(reason.into())))
            .collect::<Result<Vec<_>, _>>()?;
        let rows = memory(&self.query, schema, batches)?;
        *cached = Some((version, rows.clone()));
        Ok(rows)
    }
}

#[async_trait]
impl BatchTransform for StaticJoin {
    fn output_schema(&self, input: &SchemaRef) -> Result<SchemaRef, BoxError> {
        let tables = [
            (INPUT, input.clone()),
            (self.name.as_str(), plain(&self.table.schema())),
        ];
        Ok(planned_schema(&self.query, &tables)?)
    }

    async fn transform(&self, input: Vec<RecordBatch>, _batch_id: BatchId) -> Result<Vec<RecordBatch>, BoxError> {
        let Some(schema) = input.first().map(|b| b.schema()) else {
            return Ok(Vec::new());
        };
        let table = self.rows().await?;
        let input = memory(&self.query, schema, input)?;
        Ok(run_query(&self.query, vec![(INPUT, input), (self.name.as_str(), table)]).await?)
    }
}
