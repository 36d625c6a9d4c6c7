//! Integration tests of weir-iceberg.

mod conformance;
mod expire;
mod orphans;
mod rest;
mod table;
