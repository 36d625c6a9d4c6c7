//! # weir-core: the exactly-once micro-batch engine
//!
//! weir-core runs streaming queries as a sequence of micro-batches. It owns
//! the checkpoint, the sources, the sink traits and the driver; table formats
//! live in other crates (`weir-delta`, `weir-iceberg`), so this crate builds
//! without them.
//!
//! ## Guarantees
//!
//! For every batch N the driver runs one fixed sequence: plan the batch's
//! offsets and write them to `offsets/N` (after which batch N is defined
//! forever), read and transform the rows, let the sink's writers write them
//! invisibly, make one atomic sink commit that carries the query's marker
//! `(query name, query id, batch N)`, and only then write `commits/N`.
//!
//! - **Exactly once (I1, I2)** with a sink that keeps a marker (memory, and
//!   the Delta and Iceberg sinks): whatever step the process dies at, a
//!   restart replays the logged batch with the same offsets, and the sink's
//!   commit, which checks the marker on the snapshot it commits on, adds it
//!   once. A reader sees all of a batch or none of it.
//! - **Batch ids never go backwards (I4)**: on start, the checkpoint (last
//!   planned `P`, last committed `C`) and the sink's marker `T` must satisfy
//!   `C <= T <= P`; anything else is refused with an error that says what
//!   happened and which explicit option accepts the risk
//!   ([`protocol::Overrides`]).
//! - **A deleted checkpoint is caught (I4b)**: a new checkpoint whose query
//!   name has output under another query id is refused.
//! - **One running query per checkpoint (I5)**: an exclusive lease, released
//!   when its holder dies. On object storage the lease has an epoch and an
//!   expiry; a run stops writing to the checkpoint (and committing) once its
//!   lease may have passed to another run ([`checkpoint::LeaseTiming`] says
//!   what timing that assumes).
//! - **One sink per checkpoint (I6)**: the sink's identity is recorded and
//!   checked.
//!
//! Sinks without a durable marker (console, foreach, foreach_batch) get each
//! batch at least once: a batch in flight at a crash is replayed.
//!
//! ## Example
//!
//! ```no_run
//! use std::time::Duration;
//! use weir_core::prelude::*;
//!
//! # async fn run() -> weir_core::Result<()> {
//! let table = MemorySink::new("payments");
//! let query = read_stream(RateSource::rows_per_second(1000))
//!     .write_stream()
//!     .query_name("payments-bronze")
//!     .checkpoint_location("chk/payments-bronze")
//!     .trigger(Trigger::processing_time(Duration::from_secs(1)))
//!     .start(table.clone())
//!     .await?;
//! tokio::time::sleep(Duration::from_secs(5)).await;
//! query.stop_and_wait().await?;
//! println!("{} rows", table.row_count());
//! # Ok(())
//! # }
//! ```

pub mod checkpoint;
pub mod crash;
mod driver;
mod error;
pub mod ids;
pub mod maintenance;
pub mod operator;
pub mod partition;
pub mod progress;
pub mod protocol;
pub mod sink;
pub mod source;
pub mod state;
pub mod sync;
pub mod watermark;

pub use driver::{read_stream, ReadStream, StreamWriter, StreamingQuery, Trigger};
pub use error::{permanent_io_kind, store_error_may_pass, transient, BoxError, Error, Result, Transient};
pub use ids::{BatchId, QueryId, QueryName, RunId};
pub use sink::OutputMode;

/// The names most applications need.
pub mod prelude {
    pub use crate::driver::{read_stream, ReadStream, StreamWriter, StreamingQuery, Trigger};
    pub use crate::error::{BoxError, Error, Result};
    pub use crate::ids::{BatchId, QueryId, QueryName};
    pub use crate::progress::QueryProgress;
    pub use crate::sink::{
        ConsoleSink, ForeachBatchSink, ForeachSink, ForeachWriter, MemorySink, OutputMode, Row, Sink,
    };
    pub use crate::source::{FileFormat, FileSource, MemoryStream, RateSource, Source};
}
