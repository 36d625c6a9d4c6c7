//! The error type of weir-iceberg.

use weir_core::BatchId;

/// What can go wrong in the Iceberg sink and its catalogs. Every variant
/// names the table or catalog; none carries a credential.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IcebergSinkError {
    /// The catalog failed: its database could not be reached or queried,
    /// or its server gave no answer, an error, or an answer weir cannot
    /// use. `source` is the catalog's own error (weir-catalog's `RestError`
    /// or the database's), and the catalog judged whether trying again may
    /// succeed.
    #[error("Iceberg catalog {catalog:?}: {operation}: {source}")]
    Catalog {
        catalog: String,
        operation: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
        retryable: bool,
    },

    /// A catalog setting is missing or malformed.
    #[error("Iceberg catalog {catalog:?}: {reason}")]
    Config { catalog: String, reason: String },

    /// A table or namespace name is not valid.
    #[error("invalid Iceberg table name {name:?}: {reason}")]
    Name { name: String, reason: String },

    /// iceberg failed to read or write metadata or data files.
    #[error("Iceberg table {table}: {context}: {source}")]
    Iceberg {
        table: String,
        context: String,
        #[source]
        source: Box<iceberg::Error>,
    },

    /// The table is not in the catalog.
    #[error("Iceberg table {table} does not exist in catalog {catalog:?} (was it dropped?)")]
    NoSuchTable { catalog: String, table: String },

    /// The stream's rows do not fit the table's schema.
    #[error("Iceberg table {table}: the stream's schema does not match the table's: {differences}. Nothing was written; enable schema merging to add new optional columns, or write to another table")]
    SchemaMismatch { table: String, differences: String },

    /// The table uses something the sink does not write.
    #[error("Iceberg table {table} uses {feature}, which weir's Iceberg sink does not write; nothing was written")]
    Unsupported { table: String, feature: String },

    /// Update mode on rows that do not say which group they replace.
    #[error("Iceberg table {table}: Update mode replaces each group's row by the group's key (an aggregation's window start and grouping columns), and the rows reaching the sink have none: the query does not aggregate, or a step after the aggregation dropped or renamed a key column. Keep those columns, or use Append or Complete. Nothing was written")]
    NoUpdateKey { table: String },

    /// A data file that Update mode rewrites cannot be read as the table's
    /// rows.
    #[error("Iceberg table {table}: data file {file} cannot be read as the table's rows ({reason}); Update mode must rewrite it, so nothing of the batch was committed")]
    UnreadableFile {
        table: String,
        file: String,
        reason: String,
    },

    /// Writing Update mode's rewrite of a data file failed.
    #[error("Iceberg table {table}: writing the rewrite of the files holding the batch's groups failed: {source}. Nothing of the batch was committed")]
    RewriteFailed {
        table: String,
        #[source]
        source: Box<weir_core::Error>,
    },

    /// Update mode: the batch holds two rows of one group, so the table
    /// would hold both.
    #[error("Iceberg table {table}: the batch has {rows} rows but {groups} groups by the key columns {columns:?}; in Update mode each group's row replaces the table's, so a step after the aggregation must not change the key columns' values. Nothing of the batch was committed")]
    DuplicateGroup {
        table: String,
        columns: Vec<String>,
        rows: usize,
        groups: usize,
    },

    /// Other writers kept winning the metadata swap.
    #[error("Iceberg table {table}: batch {batch_id} lost {attempts} metadata swaps in a row to other writers; nothing of it was committed and a restart retries it")]
    TooManyConflicts {
        table: String,
        batch_id: BatchId,
        attempts: usize,
    },

    /// A maintenance job kept losing the metadata swap to other writers.
    #[error("Iceberg table {table}: {operation} lost {attempts} metadata swaps in a row to other writers; nothing was changed, run it again")]
    Busy {
        table: String,
        operation: String,
        attempts: usize,
    },

    /// A compaction stopped before committing some of its groups.
    #[error("Iceberg table {table}: compaction stopped: {reason}. Groups it committed before stay and rows are never changed by it; run it again")]
    CompactionStopped { table: String, reason: String },

    /// The table was dropped and created again (a new table uuid).
    #[error("Iceberg table {table} was replaced while the query ran (table uuid {expected} is now {found}); nothing of the batch was committed. Restart the query: its start-up guards decide whether the new table may be written")]
    TableReplaced {
        table: String,
        expected: String,
        found: String,
    },

    /// Another writer changed the table in a way the batch's files do not fit.
    #[error("Iceberg table {table}: another writer changed it while the query ran: {change}. Nothing of the batch was committed; a restart writes it again with the table's new layout")]
    TableChanged { table: String, change: String },

    /// The catalog refused the commit outright (not a conflict): nothing
    /// was committed.
    #[error("Iceberg catalog {catalog:?} refused the commit to {table}: {reason}. Nothing was committed")]
    CommitRefused {
        catalog: String,
        table: String,
        reason: String,
    },

    /// A table property a job reads does not parse.
    #[error("Iceberg table {table}: table property {key}={value:?} is not a whole number; nothing was changed, fix the property or pass the setting explicitly")]
    InvalidProperty { table: String, key: String, value: String },

    /// The sink was used before the driver prepared it.
    #[error("Iceberg table {table}: the sink was used before prepare; start it through a streaming query")]
    NotPrepared { table: String },

    /// A sink's expiry policy expires nothing on this table, for `reason`;
    /// the query goes on.
    #[error("Iceberg table {table}: the expiry policy expires nothing: {reason}; nothing was removed or deleted")]
    PolicyExpiry {
        table: String,
        #[source]
        reason: PolicyExpiryRefusal,
    },
}

/// Why a sink's expiry policy leaves a table's snapshots alone.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyExpiryRefusal {
    /// `gc.enabled=false`: its files may belong to other tables.
    #[error("gc.enabled=false (its files may belong to other tables)")]
    GcDisabled,
    /// Format version 1 metadata, whose refs the policy does not read (it
    /// reads them from the metadata in memory); `ExpireSnapshots` reads
    /// them from the metadata file.
    #[error("its metadata is of format version 1, whose branches and tags the policy cannot see; expire it with ExpireSnapshots (weir expire)")]
    FormatV1,
    /// The refs could not be read from the metadata.
    #[error("its refs cannot be read from its metadata")]
    Refs(#[source] serde_json::Error),
}

impl IcebergSinkError {
    /// Whether trying again may succeed.
    pub fn retryable(&self) -> bool {
        match self {
            IcebergSinkError::TooManyConflicts { .. } | IcebergSinkError::Busy { .. } => true,
            IcebergSinkError::Catalog { retryable, .. } => *retryable,
            IcebergSinkError::Iceberg { source, .. } => iceberg_retryable(source),
            IcebergSinkError::RewriteFailed { source, .. } => source.retryable(),
            _ => false,
        }
    }

    pub(crate) fn into_core(self, batch_id: Option<BatchId>) -> weir_core::Error {
        let retryable = self.retryable();
        weir_core::Error::sink("iceberg", batch_id, retryable, self)
    }
}

/// Whether an iceberg error, or one it wraps, may pass on a retry:
/// iceberg's Parquet writer wraps the file IO's error (and its judgement)
/// in one of its own that is never retryable.
fn iceberg_retryable(e: &iceberg::Error) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(e) = next {
        if e.downcast_ref::<iceberg::Error>()
            .is_some_and(iceberg::Error::retryable)
        {
            return true;
        }
        next = e.source();
    }
    false
}

impl From<IcebergSinkError> for weir_core::Error {
    fn from(e: IcebergSinkError) -> Self {
        e.into_core(None)
    }
}
