//! Integration tests of weir-delta.

mod conformance;
mod readers;
mod table;
