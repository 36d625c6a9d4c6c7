//! How a table is created when a stream writes to a name that has none.

use std::collections::BTreeMap;

use crate::format::TableFormat;

/// Options of `to_table` and [`crate::Catalogs::sink`]: the format and
/// layout of a table created from the stream's schema, and how the stream
/// writes it.
#[derive(Debug, Clone, Default)]
pub struct TableOptions {
    /// The format (default: the catalog's). An existing table of another
    /// format is an error, not a second table.
    pub format: Option<TableFormat>,
    /// Partition columns of a new table (Iceberg also takes transforms:
    /// `day(ts)`, `bucket(16, id)`, ...).
    pub partition_by: Vec<String>,
    /// Table properties of a new table.
    pub properties: BTreeMap<String, String>,
    /// Add the stream's new nullable columns to the table.
    pub merge_schema: bool,
    /// The size at which data files are closed.
    pub target_file_size: Option<u64>,
    /// Snapshot expiry the sink runs in the background (Iceberg only).
    pub snapshot_expiry: SnapshotExpiry,
    /// Compaction the sink runs in the background (either format).
    pub compaction: Option<weir_core::sink::CompactionPolicy>,
}

impl TableOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// The table's format.
    pub fn format(mut self, format: TableFormat) -> Self {
        self.format = Some(format);
        self
    }

    /// Partition columns (or Iceberg transforms) of a new table.
    pub fn partition_by<S: Into<String>>(mut self, columns: impl IntoIterator<Item = S>) -> Self {
        self.partition_by = columns.into_iter().map(Into::into).collect();
        self
    }

    /// A table property of a new table.
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(key.into(), value.into());
        self
    }

    /// Whether new nullable columns join the table.
    pub fn merge_schema(mut self, merge: bool) -> Self {
        self.merge_schema = merge;
        self
    }

    /// The size at which data files are closed.
    pub fn target_file_size(mut self, bytes: u64) -> Self {
        self.target_file_size = Some(bytes);
        self
    }

    /// Snapshot expiry as the query commits (an Iceberg table's sink only;
    /// see [`weir_iceberg::ExpiryPolicy`]), in place of the default,
    /// [`weir_iceberg::ExpiryPolicy::STREAMING`].
    pub fn snapshot_expiry(mut self, policy: weir_iceberg::ExpiryPolicy) -> Self {
        self.snapshot_expiry = SnapshotExpiry::Policy(policy);
        self
    }

    /// Keeps every snapshot of an Iceberg table: no expiry runs with the
    /// query (run [`weir_iceberg::ExpireSnapshots`] yourself). Each commit
    /// then grows slower with the table's history.
    pub fn keep_every_snapshot(mut self) -> Self {
        self.snapshot_expiry = SnapshotExpiry::Off;
        self
    }

    /// Compaction as the query commits (see
    /// [`weir_core::sink::CompactionPolicy`]).
    pub fn compaction(mut self, policy: weir_core::sink::CompactionPolicy) -> Self {
        self.compaction = Some(policy);
        self
    }
}

/// Which snapshot expiry an Iceberg table's sink runs as the query commits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SnapshotExpiry {
    /// [`weir_iceberg::ExpiryPolicy::STREAMING`] for an Iceberg table;
    /// nothing for a Delta table (whose old files go with vacuum).
    #[default]
    Default,
    /// None: every snapshot stays.
    Off,
    /// This policy; a Delta table refuses it.
    Policy(weir_iceberg::ExpiryPolicy),
}

impl SnapshotExpiry {
    /// The policy an Iceberg table's sink runs.
    pub fn iceberg_policy(&self) -> Option<weir_iceberg::ExpiryPolicy> {
        match self {
            SnapshotExpiry::Default => Some(weir_iceberg::ExpiryPolicy::STREAMING),
            SnapshotExpiry::Off => None,
            SnapshotExpiry::Policy(policy) => Some(*policy),
        }
    }
}
