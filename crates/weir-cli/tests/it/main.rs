//! The `weir` command's integration tests, in one binary.

mod cli;
mod common;
mod compact;
mod files;
mod kafka;
mod maintenance_kills;
mod memory;
mod s3_checkpoint;
mod shared_table;
