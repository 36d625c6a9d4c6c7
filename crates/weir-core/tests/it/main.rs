//! Integration tests of weir-core.

mod memory_conformance;
