//! # weir-sql: SQL and stateful operators for weir's streams
//!
//! Transformations that see a whole micro-batch, on DataFusion, and the
//! stateful operators whose state weir-core keeps in the query's
//! checkpoint. Bring them in with [`StreamSqlExt`]:
//!
//! ```
//! use std::time::Duration;
//! use weir_core::prelude::*;
//! use weir_sql::StreamSqlExt;
//!
//! let risky = read_stream(RateSource::rows_per_batch(1000))
//!     .sql("SELECT event_id, ts, amount FROM input WHERE amount > 50")
//!     .with_watermark("ts", Duration::from_secs(600))
//!     .drop_duplicates_within_watermark(["event_id"]);
//! assert_eq!(risky.schema().unwrap().fields().len(), 3);
//! ```
//!
//! ## Guarantees
//!
//! - **SQL over a micro-batch** ([`StreamSqlExt::sql`], `filter`, `select`,
//!   `with_column`) sees all of the batch's rows as the table `input`, is
//!   planned when the query starts (a query that does not fit the
//!   stream's columns fails then, before anything is read), and keeps
//!   nothing between batches.
//! - **Aggregation** ([`StreamSqlExt::group_by`], [`Aggregation`]) keeps a
//!   partial row per group in the state (in Append mode, each batch's
//!   partial rows per window, merged when the window closes). Append
//!   emits each window once, when the watermark has passed its end, with
//!   its final values; Update emits the groups a batch changed; Complete
//!   every group. Sessions ([`session_window`]) keep a row per open
//!   session, merged with the sessions a batch's events reach; Append
//!   emits each session once the watermark passed its end, and Update is
//!   refused at start (a session that merges into another would leave its
//!   row behind). A replayed batch starts from the state of the batch
//!   before it, so the output is that of a run without the crash. A
//!   batch of many rows is aggregated on every core, split by a hash of
//!   its group columns; each group's rows stay together in input order, so
//!   its values (a floating-point sum too) are those of one partition
//!   (for sessions, up to the order of a key's events at the same
//!   millisecond).
//! - **Deduplication** ([`DropDuplicates`]) passes each key's first row
//!   once, across batches and restarts: its keys are state that weir-core
//!   writes to the checkpoint before the sink commits and restores to the
//!   batch before a replayed one, so a replay drops exactly what the first
//!   attempt dropped.
//! - **Stream-static joins** ([`StreamSqlExt::join_static`],
//!   [`StaticJoin`]) read the static table whole at a batch's start, and
//!   again only when its version changed; a batch run again after a crash
//!   sees the table as it is then, as in Spark.
//! - **JSON** ([`FromJson`], [`StreamSqlExt::from_json`]) parses a text
//!   column by a schema on each record batch; a malformed value fails the
//!   batch (nothing of it committed) unless parsing is permissive, which
//!   makes it null.
//! - Operators follow Spark Structured Streaming's output-mode rules,
//!   checked at start by weir-core.

mod aggregate;
mod bins;
mod dedup;
mod error;
mod json;
mod parts;
mod session;
mod sql;
mod static_join;
mod window;

pub use aggregate::{
    avg, col, count, count_distinct, count_of, max, min, session_window, sliding_window, sum, window, Aggregate,
    Aggregation, GroupKey,
};
pub use dedup::DropDuplicates;
pub use error::SqlError;
pub use json::FromJson;
pub use session::SessionWindow;
pub use sql::{Sql, INPUT};
pub use static_join::{StaticJoin, StaticTable};
pub use window::Window;

use weir_core::ReadStream;

/// SQL and stateful operators on a [`ReadStream`].
pub trait StreamSqlExt: Sized {
    /// Runs `query` over the rows of each micro-batch, which it reads as
    /// the table `input`.
    fn sql(self, query: impl Into<String>) -> ReadStream;

    /// Runs `query` over each micro-batch's rows (`input`) and the static
    /// `table`, which it reads as `name`: a stream-static join. Each batch
    /// sees the table as it is when the batch starts (see [`StaticJoin`]).
    fn join_static(self, name: &str, table: std::sync::Arc<dyn StaticTable>, query: impl Into<String>) -> ReadStream;

    /// Keeps the rows for which the SQL expression `predicate` is true.
    fn filter(self, predicate: &str) -> ReadStream {
        self.sql(format!("SELECT * FROM {INPUT} WHERE {predicate}"))
    }

    /// The given SQL expressions as the columns (`"amount * 2 AS double"`).
    fn select<I, S>(self, columns: I) -> ReadStream
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let list: Vec<String> = columns.into_iter().map(|c| c.as_ref().to_string()).collect();
        self.sql(format!("SELECT {} FROM {INPUT}", list.join(", ")))
    }

    /// Adds the column `name` computed by the SQL expression `expression`,
    /// last; or replaces the column of that name, in its place.
    fn with_column(self, name: &str, expression: &str) -> ReadStream;

    /// Replaces the string column `column` with the struct of `schema`'s
    /// fields its JSON objects hold (Spark's `from_json`); malformed values
    /// fail the batch. See [`FromJson`] for the other choices.
    // Spark's name, which users look for.
    #[allow(clippy::wrong_self_convention)]
    fn from_json(self, column: &str, schema: arrow_schema::SchemaRef) -> ReadStream {
        self.parse_json(FromJson::new(column, schema))
    }

    /// Parses JSON text as `parser` says, on each record batch.
    fn parse_json(self, parser: FromJson) -> ReadStream;

    /// Drops rows whose `keys` equal those of an earlier row (see
    /// [`DropDuplicates`]).
    fn drop_duplicates<I, S>(self, keys: I) -> ReadStream
    where
        I: IntoIterator<Item = S>,
        S: Into<String>;

    /// Drops duplicates of `keys` while the watermark lets them arrive (see
    /// [`DropDuplicates::within_watermark`]); needs `with_watermark` first.
    fn drop_duplicates_within_watermark<I, S>(self, keys: I) -> ReadStream
    where
        I: IntoIterator<Item = S>,
        S: Into<String>;

    /// Groups the rows by `keys` (columns, and at most one [`window`] or
    /// [`session_window`]);
    /// [`Grouped::agg`] says what to compute per group.
    fn group_by<I, K>(self, keys: I) -> Grouped
    where
        I: IntoIterator<Item = K>,
        K: Into<GroupKey>;
}

/// A stream grouped by keys, waiting for its aggregates.
#[derive(Debug)]
#[must_use = "a grouping does nothing until agg says what to compute"]
pub struct Grouped {
    stream: ReadStream,
    keys: Vec<GroupKey>,
}

impl Grouped {
    /// The stream of each group's `aggregates` (a stateful
    /// [`Aggregation`]): in Update mode the groups each batch changed, in
    /// Complete mode every group, in Append mode each window once the
    /// watermark closed it.
    pub fn agg(self, aggregates: impl IntoIterator<Item = Aggregate>) -> ReadStream {
        self.stream
            .with_operator(Aggregation::new(self.keys, aggregates.into_iter().collect()))
    }
}

/// `name` as a quoted SQL identifier.
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl StreamSqlExt for ReadStream {
    fn sql(self, query: impl Into<String>) -> ReadStream {
        self.with_batch_transform(Sql::new(query))
    }

    fn join_static(self, name: &str, table: std::sync::Arc<dyn StaticTable>, query: impl Into<String>) -> ReadStream {
        self.with_batch_transform(StaticJoin::new(name, table, query))
    }

    fn with_column(self, name: &str, expression: &str) -> ReadStream {
        let schema = self.schema().ok();
        let replaces = schema.as_ref().is_some_and(|s| s.index_of(name).is_ok());
        let new = format!("{expression} AS {}", quoted(name));
        let list = if replaces {
            // The new column takes the old one's place.
            let columns: Vec<String> = schema
                .iter()
                .flat_map(|s| s.fields().iter())
                .map(|f| {
                    if f.name() == name {
                        new.clone()
                    } else {
                        quoted(f.name())
                    }
                })
                .collect();
            columns.join(", ")
        } else {
            format!("*, {new}")
        };
        self.sql(format!("SELECT {list} FROM {INPUT}"))
    }

    fn parse_json(self, parser: FromJson) -> ReadStream {
        self.map_batches(move |batch| Ok(parser.apply(&batch)?))
    }

    fn drop_duplicates<I, S>(self, keys: I) -> ReadStream
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.with_operator(DropDuplicates::new(keys))
    }

    fn drop_duplicates_within_watermark<I, S>(self, keys: I) -> ReadStream
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.with_operator(DropDuplicates::within_watermark(keys))
    }

    fn group_by<I, K>(self, keys: I) -> Grouped
    where
        I: IntoIterator<Item = K>,
        K: Into<GroupKey>,
    {
        Grouped {
            stream: self,
            keys: keys.into_iter().map(Into::into).collect(),
        }
    }
}
