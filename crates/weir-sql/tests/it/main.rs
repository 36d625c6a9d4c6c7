//! weir-sql end to end through weir-core's driver into exactly-once memory
//! tables.

mod aggregate;
mod distinct;
mod session;
mod sql;
mod static_join;
