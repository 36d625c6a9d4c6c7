//! Integration tests of weir-core.

mod checkpoint;
mod checkpoint_store;
mod common;
mod file_source;
mod memory_conformance;
mod progress;
mod sinks;
mod stateful;
mod table_writer;
mod triggers;
