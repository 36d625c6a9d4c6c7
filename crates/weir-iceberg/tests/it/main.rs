//! Integration tests of weir-iceberg.

mod conformance;
mod expire;
mod rest;
mod table;
