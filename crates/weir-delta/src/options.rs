//! Options of the Delta sink.

use std::collections::HashMap;

/// The Parquet compression of data files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Zstandard at the given level (default: level 1).
    Zstd(i32),
    /// Snappy.
    Snappy,
}

impl Default for Compression {
    fn default() -> Self {
        Compression::Zstd(1)
    }
}

impl Compression {
    pub(crate) fn extension(self) -> &'static str {
        match self {
            Compression::Zstd(_) => "zstd",
            Compression::Snappy => "snappy",
        }
    }
}

/// How the sink writes and, if missing, creates the table.
#[derive(Debug, Clone, Default)]
pub struct DeltaSinkOptions {
    /// Partition columns for a table the sink creates (ignored for an
    /// existing table, whose own partitioning is used).
    pub partition_by: Vec<String>,
    /// Table properties for a table the sink creates (`delta.*` and others).
    pub table_properties: HashMap<String, String>,
    /// A name for a table the sink creates.
    pub table_name: Option<String>,
    /// Add the stream's new nullable columns to the table, in the same commit
    /// as the first batch that has them.
    pub merge_schema: bool,
    /// Storage options for deltalake's object store (S3 endpoint, region,
    /// credentials, ...). Credentials are never logged.
    pub storage_options: HashMap<String, String>,
    /// The size at which a data file is closed; default: the table's
    /// `delta.targetFileSize`, else 100 MiB (deltalake's default).
    pub target_file_size: Option<u64>,
    /// The Parquet compression of data files.
    pub compression: Compression,
}
