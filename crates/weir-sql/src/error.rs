//! The errors of weir-sql.

use datafusion::error::DataFusionError;

/// What can go wrong in SQL over a micro-batch or in an operator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqlError {
    /// The query does not plan against the stream's columns (a typo, a
    /// missing column, a function DataFusion does not know). Found when the
    /// query starts, before anything is read or written.
    #[error("the SQL query {query:?} does not fit the stream's rows: {source}")]
    Plan {
        /// The query.
        query: String,
        /// DataFusion's reason.
        #[source]
        source: DataFusionError,
    },
    /// The query failed on a batch's rows (a cast that fails on a value).
    /// The batch was not committed; a replay reads the same rows and fails
    /// the same way until the query is changed.
    #[error("the SQL query {query:?} failed on the rows of the batch: {source}. Nothing of the batch was committed; a restart reads the same rows, so change the query (a TRY_CAST, a filter) before restarting")]
    Execute {
        /// The query.
        query: String,
        /// DataFusion's reason.
        #[source]
        source: DataFusionError,
    },
    /// A column the operator needs is not in its input.
    #[error("{operator}: no column {column:?} in its input; the columns are {available:?}")]
    MissingColumn {
        /// The operator.
        operator: String,
        /// The column asked for.
        column: String,
        /// The input's columns.
        available: Vec<String>,
    },
    /// An aggregation that cannot run as written (its windows, its
    /// aggregates); found when the query starts.
    #[error("{operator}: {reason}")]
    InvalidAggregation {
        /// The operator.
        operator: String,
        /// What is wrong.
        reason: String,
    },
    /// A deduplication or aggregation was given no key column.
    #[error("{operator}: name at least one key column")]
    NoKeys {
        /// The operator.
        operator: String,
    },
    /// The column `from_json` parses holds no text.
    #[error("from_json: column {column:?} is {data_type}, not text")]
    NotText {
        /// The column.
        column: String,
        /// Its type.
        data_type: arrow_schema::DataType,
    },
    /// A value `from_json` parses is not one JSON object of the schema's
    /// types. The batch was not committed; a replay reads the same value.
    #[error("from_json: row {row} of column {column:?} is not a JSON object of the schema ({reason}); it begins {excerpt:?}. Nothing of the batch was committed; a restart reads the same rows, so make the parsing permissive (malformed values become null) or fix the source")]
    MalformedJson {
        /// The column.
        column: String,
        /// The row within the record batch.
        row: usize,
        /// The parser's reason.
        reason: String,
        /// The value's first characters.
        excerpt: String,
    },
    /// A step would give two columns one name.
    #[error("{operator}: the output would have two columns named {column:?}")]
    DuplicateColumn {
        /// The step.
        operator: String,
        /// The name.
        column: String,
    },
    /// The static table of a join could not be read, or changed its
    /// columns.
    #[error("the table {name:?} the stream joins with: {source}. Nothing of the batch was committed")]
    StaticTable {
        /// The table's name in the query.
        name: String,
        /// Why.
        #[source]
        source: weir_core::BoxError,
    },
    /// A part of an aggregation run on another core was cancelled (the
    /// runtime is shutting down). The batch was not committed; running it
    /// again computes it whole.
    #[error("the SQL query {query:?} was cancelled on one of its parts (the runtime is shutting down). Nothing of the batch was committed; a restart runs it again")]
    Cancelled {
        /// The query.
        query: String,
    },
    /// An Arrow operation failed.
    #[error("{context}: {source}")]
    Arrow {
        /// What was being done.
        context: String,
        /// Arrow's reason.
        #[source]
        source: arrow_schema::ArrowError,
    },
}

impl SqlError {
    /// Whether running the batch again may succeed: when the static table
    /// of a join did not answer and its reader judged that passing
    /// ([`weir_core::Transient`]), or when a part of the batch was
    /// cancelled. A query that fails on a batch's rows fails the same way
    /// on a replay, which reads the same rows.
    pub fn retryable(&self) -> bool {
        match self {
            SqlError::StaticTable { source, .. } => source.downcast_ref::<weir_core::Transient>().is_some(),
            SqlError::Cancelled { .. } => true,
            _ => false,
        }
    }

    /// This error for the engine, marked [`weir_core::Transient`] when
    /// running the batch again may succeed, so the engine's judgement is
    /// [`SqlError::retryable`]'s.
    pub(crate) fn boxed(self) -> weir_core::BoxError {
        if self.retryable() {
            weir_core::transient(self)
        } else {
            Box::new(self)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_static_table_that_did_not_answer_and_a_cancelled_part_are_retryable() {
        let table = |source: weir_core::BoxError| SqlError::StaticTable {
            name: "merchants".into(),
            source,
        };
        assert!(table(weir_core::transient(std::io::Error::other("timed out"))).retryable());
        assert!(!table("its column \"id\" is gone".into()).retryable());
        let plan = SqlError::Plan {
            query: "SELECT".into(),
            source: DataFusionError::Plan("no".into()),
        };
        assert!(!plan.retryable());
        let cancelled = SqlError::Cancelled { query: "SELECT".into() };
        assert!(cancelled.retryable());
        assert!(cancelled.boxed().downcast_ref::<weir_core::Transient>().is_some());
        assert!(plan.boxed().downcast_ref::<weir_core::Transient>().is_none());
    }
}
