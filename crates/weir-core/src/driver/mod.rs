//! The driver of streaming queries: the builder, the batch loop, triggers,
//! and the query handle.

mod batch;
mod handle;
mod options;
mod progress;
mod run;
mod start;
mod stateful;
mod stream;
mod trigger;
mod trim;
mod writer;

pub use handle::StreamingQuery;
pub use options::StreamWriter;
pub use stream::{read_stream, ReadStream};
pub use trigger::Trigger;
