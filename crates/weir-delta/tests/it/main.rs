//! Integration tests of weir-delta.

mod conformance;
mod readers;
mod s3;
mod table;
mod writers;
