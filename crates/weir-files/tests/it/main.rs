//! Integration tests of weir-files.

mod conformance;
mod log;
mod reset;
mod s3;
