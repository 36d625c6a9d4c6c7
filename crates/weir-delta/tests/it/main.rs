//! Integration tests of weir-delta.

mod compact;
mod conformance;
mod faults;
mod maintenance;
mod readers;
mod s3;
mod table;
mod unknown_outcome;
mod update;
mod writers;
