//! Kafka for weir: [`KafkaSource`], a replayable source whose offsets live in
//! the query's checkpoint, and [`KafkaSink`], at least once or exactly once.
//!
//! # Guarantees
//!
//! Of the source:
//!
//! - **Exact replay.** A batch's range is the per-partition offsets in
//!   `offsets/N` (`{"topic": {"0": 42}}`, the first offset not in the batch),
//!   written before the batch is read. A replayed batch reads exactly that
//!   range, whatever any consumer group says; no group is needed.
//! - **Committed records only.** By default the source reads with
//!   `isolation.level=read_committed`: records of aborted transactions and
//!   transaction markers never reach a table, and a range still ends at its
//!   planned offsets.
//! - **No silent loss.** Records a batch must read that are gone from the
//!   broker (retention, a deleted topic, a recreated partition) stop the
//!   query with an error naming the topic, the partition and the range,
//!   unless `fail_on_data_loss(false)`, which skips them and reports each
//!   skipped range in the batch's progress (`sources[].metrics.lost`).
//! - **A fixed start.** Where a new query begins (`starting_offsets`) is
//!   resolved once, on its first start, and kept in the checkpoint, so a crash
//!   before the first batch changes nothing.
//! - Partitions added while the query runs are read from their beginning.
//! - Memory follows the batch, not the topic: records are handed on in
//!   chunks of at most 8,192 rows or 8 MiB, and the reader fetches ahead at
//!   most 10,000 records per partition (`queued.min.messages`) and 16 MiB
//!   (`queued.max.messages.kbytes`), fetching a full partition again after
//!   10 ms (`fetch.queue.backoff.ms`). Its assignment is kept from batch to
//!   batch, each partition on a queue of its own, so what it fetched ahead
//!   is read by the next batch, not fetched again.
//!
//! Of the sink:
//!
//! - **At least once** by default, as Spark's Kafka sink: rows of the batch
//!   running at a crash are written again when it is replayed, and only
//!   those. The producer is idempotent, so its retries add no duplicates.
//! - **Exactly once** with [`Guarantee::ExactlyOnce`], for consumers that
//!   read with `isolation.level=read_committed`: each batch is one Kafka
//!   transaction holding its records and a marker (query id, batch id) in
//!   the marker topic. On start the producer takes the query's
//!   transactional id (`weir-<query name>`), which aborts what an earlier run
//!   left open and fences any older producer still running; the last
//!   committed marker then tells which batches are in, so a replayed batch
//!   that committed is skipped. Consumers reading uncommitted records see
//!   those of aborted attempts too.
//!
//! # Example
//!
//! A topic mirrored into another exactly once, for read_committed
//! consumers: the source's `key` and `value` columns become the records
//! (each in the partition of the same number, from the source's
//! `partition` column), and each batch is one transaction.
//!
//! ```no_run
//! use weir_core::prelude::*;
//! use weir_kafka::{KafkaSink, KafkaSource, StartingOffsets};
//!
//! # async fn run() -> Result<(), BoxError> {
//! let servers = "127.0.0.1:9092";
//! let payments = KafkaSource::subscribe(servers, ["payments"]).starting_offsets(StartingOffsets::Earliest);
//! let query = read_stream(payments)
//!     .write_stream()
//!     .query_name("payments-mirror") // the transactional id is weir-payments-mirror
//!     .checkpoint_location("chk/payments-mirror")
//!     .start(KafkaSink::new(servers).topic("payments-mirror").exactly_once())
//!     .await?;
//! query.await_termination().await?;
//! # Ok(())
//! # }
//! ```

mod broker;
mod columns;
mod config;
mod context;
mod decode;
mod error;
mod formats;
mod marker;
pub mod offsets;
mod read;
mod sink;
mod source;

pub use broker::Topics;
pub use columns::{schema, CREATE_TIME, LOG_APPEND_TIME};
pub use config::ClientSettings;
pub use decode::{AvroFraming, OnBadRecord, ValueColumns};
pub use error::KafkaError;
pub use offsets::{PartitionOffsets, TopicPartition};
pub use sink::{Guarantee, KafkaSink, DEFAULT_MARKER_TOPIC};
pub use source::{IsolationLevel, KafkaSource, StartingOffsets};
