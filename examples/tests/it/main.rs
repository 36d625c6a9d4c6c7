//! The examples' integration tests, in one binary: the programs run as
//! users run them, killed and restarted, and their tables read back by
//! independent readers.

mod common;
mod delta;
mod iceberg;
mod kafka_payments;
mod kill;
mod merchant_totals;
mod payments;
