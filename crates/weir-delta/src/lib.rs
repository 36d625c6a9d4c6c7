//! weir-delta
