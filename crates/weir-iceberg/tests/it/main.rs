//! Integration tests of weir-iceberg.

mod conformance;
mod rest;
mod table;
