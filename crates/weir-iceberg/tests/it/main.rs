//! Integration tests of weir-iceberg.

mod compact;
mod conformance;
mod expire;
mod faults;
mod orphans;
mod rest;
mod table;
mod unknown_outcome;
mod update;
