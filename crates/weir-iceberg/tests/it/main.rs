//! Integration tests of weir-iceberg.

mod conformance;
mod table;
