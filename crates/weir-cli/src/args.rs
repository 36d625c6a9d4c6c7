//! The command line.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// weir: exactly-once streaming into Delta Lake and Apache Iceberg tables.
///
/// Tables are named `catalog.namespace.table` or `namespace.table` (in the
/// default catalog). Catalogs come from the file `--config` or `WEIR_CONFIG`
/// names; with none, catalog `lake` is SQLite under `--lake` (or
/// `WEIR_LAKE`, default `./weir-lake`) and new tables are Delta.
#[derive(Debug, Parser)]
#[command(name = "weir", version, about, long_about)]
pub struct Cli {
    /// A TOML file of catalogs (default: `WEIR_CONFIG`, unless `--lake` is given).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The embedded default's directory (default: `WEIR_LAKE`, else `./weir-lake`).
    #[arg(long, global = true, value_name = "DIR")]
    pub lake: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Streams a source into a table, exactly once, until stopped.
    Stream(Box<StreamArgs>),
    /// Lists the tables of a catalog or namespace.
    Tables {
        /// `namespace` of the default catalog, or `catalog.namespace`.
        namespace: Option<String>,
        /// The catalog (default: the default catalog).
        #[arg(long)]
        catalog: Option<String>,
        /// One JSON object per table.
        #[arg(long)]
        json: bool,
    },
    /// Shows a table: format, location, version, files, bytes, and each
    /// streaming query's last committed batch.
    Describe {
        /// The table.
        name: String,
        /// As one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Shows a table's commits (Delta) or snapshots (Iceberg), newest first.
    History {
        /// The table.
        name: String,
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// One JSON object per commit.
        #[arg(long)]
        json: bool,
    },
    /// Expires an Iceberg table's old snapshots and deletes the files only
    /// they referenced; streaming markers stay.
    Expire {
        /// The table.
        name: String,
        /// Only snapshots older than this, e.g. `7d`, `12h`, `0s` for any age
        /// (default: the table's `history.expire.max-snapshot-age-ms`, else 5d).
        #[arg(long, value_name = "AGE")]
        older_than: Option<String>,
        /// The newest N snapshots of each branch stay (default: the table's
        /// `history.expire.min-snapshots-to-keep`, else 1; a branch's own
        /// retention settings take precedence).
        #[arg(long, value_name = "N")]
        retain_last: Option<usize>,
        /// Print the plan; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// As one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Merges an Iceberg table's small manifests into few, in a snapshot
    /// that changes no row.
    RewriteManifests {
        /// The table.
        name: String,
        /// Count the small manifests; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// As one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Deletes an Iceberg table's files that nothing references (left by
    /// failed writes), if older than a threshold.
    RemoveOrphans {
        /// The table.
        name: String,
        /// Only files older than this (at least 1h; default 3d), so that no
        /// file of a commit in flight is taken for an orphan.
        #[arg(long, value_name = "AGE")]
        older_than: Option<String>,
        /// List the orphans; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// As one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Rewrites a table's small files into files of the target size, in
    /// commits that change no row (safe beside running streams).
    Compact {
        /// The table.
        name: String,
        /// The size of the files written, e.g. 128MiB (default: the table's
        /// target file size). Files under 3/4 of it are compacted.
        #[arg(long, value_name = "SIZE")]
        target_file_size: Option<String>,
        /// The fewest files a group must have to be rewritten (default 2).
        #[arg(long, value_name = "N")]
        min_input_files: Option<usize>,
        /// How many groups are rewritten at once (default: up to 4).
        #[arg(long, value_name = "N")]
        max_concurrent: Option<usize>,
        /// Commit every N groups instead of once at the end.
        #[arg(long, value_name = "N")]
        commit_every: Option<usize>,
        /// Only partitions with this value, `column=value` (Iceberg: a
        /// partition field, e.g. `ts_day=2024-05-01`); repeat for more.
        #[arg(long = "where", value_name = "COLUMN=VALUE")]
        filters: Vec<String>,
        /// Print the plan; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// As one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Deletes a Delta table's files that no version within the retention
    /// needs, and files of failed writes older than it.
    Vacuum {
        /// The table.
        name: String,
        /// Keep what versions younger than this need (default 7d).
        #[arg(long, value_name = "AGE")]
        retain: Option<String>,
        /// Accept a retention shorter than the table's
        /// `delta.deletedFileRetentionDuration`.
        #[arg(long)]
        force: bool,
        /// List the files; delete nothing.
        #[arg(long)]
        dry_run: bool,
        /// As one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Inspects a checkpoint.
    Checkpoint {
        #[command(subcommand)]
        command: CheckpointCommand,
    },
    /// Inspects the output directory of a file sink through its metadata log.
    Files {
        #[command(subcommand)]
        command: FilesCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum FilesCommand {
    /// The files the log lists, by batch, and the log's latest entry.
    Ls {
        /// The output directory (or `s3://` prefix).
        dir: String,
        /// One JSON object per file.
        #[arg(long)]
        json: bool,
    },
    /// Rewrites the log's latest batch as a compact entry, so readers read
    /// one entry; older entries it makes redundant go.
    CompactLog {
        /// The output directory.
        dir: String,
    },
    /// Files no log entry lists (killed attempts', or past the retention),
    /// older than a grace period; `--delete` removes them.
    Orphans {
        /// The output directory.
        dir: String,
        /// Only files older than this (default 1h; at least 1m to delete).
        #[arg(long, value_name = "AGE", default_value = "1h")]
        older_than: String,
        /// Delete them.
        #[arg(long)]
        delete: bool,
        /// As one JSON object per file.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum CheckpointCommand {
    /// Query id and name, sink, last planned and committed batch, offsets.
    Show {
        /// The checkpoint directory, or its `s3://` (`gs://`, `az://`) URL.
        dir: PathBuf,
        /// As one JSON object.
        #[arg(long)]
        json: bool,
        /// An option of the checkpoint's object store, as `KEY=VALUE`
        /// (as for `weir stream`); repeatable.
        #[arg(long = "checkpoint-option", value_name = "KEY=VALUE")]
        checkpoint_options: Vec<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum From {
    /// Deterministic rows (`event_id`, `ts`, `account_id`, `amount`, ...).
    Rate,
    /// New files of a directory, each read once.
    Files,
    /// Records of Kafka topics, replayed exactly from the checkpoint.
    Kafka,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ValueFormatArg {
    /// The raw `key` and `value` bytes with the Kafka columns.
    Raw,
    /// Each value one JSON object, parsed into --schema (DDL).
    Json,
    /// Each value one Avro datum of --schema (an Avro record schema).
    Avro,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FileFormatArg {
    Json,
    Csv,
    Parquet,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    Delta,
    Iceberg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Progress {
    /// One line of text per batch.
    Text,
    /// One JSON object per line per batch.
    Json,
    /// Nothing.
    None,
}

#[derive(Debug, Args)]
#[group(skip)]
#[command(group(clap::ArgGroup::new("compaction").multiple(true).args(["compact_every", "compact_after_files"])))]
pub struct StreamArgs {
    /// The source.
    #[arg(long, value_enum)]
    pub from: From,
    /// The table.
    #[arg(long, value_name = "NAME")]
    pub to: String,
    /// The checkpoint directory, or a URL of object storage (`s3://`,
    /// `gs://`, `az://`) configured from the environment (`AWS_ENDPOINT`,
    /// ...): keep it to resume exactly once.
    #[arg(long, value_name = "DIR")]
    pub checkpoint: PathBuf,
    /// An option of the checkpoint's object store, as `KEY=VALUE` (named
    /// as object_store names them: `aws_endpoint`, `aws_allow_http`, ...;
    /// or the lease's `lease_ttl_ms`, `lease_renew_ms`,
    /// `lease_clock_skew_ms`); repeatable, overriding the environment.
    #[arg(long = "checkpoint-option", value_name = "KEY=VALUE")]
    pub checkpoint_options: Vec<String>,
    /// The query's name (default: the table's full name).
    #[arg(long)]
    pub query_name: Option<String>,
    /// The format of a new table (default: the catalog's).
    #[arg(long, value_enum)]
    pub format: Option<FormatArg>,
    /// A partition column of a new table (Iceberg also takes transforms
    /// such as `day(ts)`); repeat for more.
    #[arg(long, value_name = "COL")]
    pub partition_by: Vec<String>,
    /// Time between batch starts, e.g. `500ms`, `10s`, `1m` (default: back
    /// to back).
    #[arg(long, value_name = "DURATION")]
    pub trigger_interval: Option<String>,
    /// Stops once the checkpoint holds N committed batches (batch ids
    /// 0..N), counting earlier runs: a killed and restarted run ends with
    /// exactly N batches.
    #[arg(long, value_name = "N")]
    pub max_batches: Option<u64>,
    /// Takes over the output of the query name when its old checkpoint was
    /// lost: batch ids continue after the table's marker, and the sources
    /// are read from where this checkpoint stands.
    #[arg(long)]
    pub take_over_output: bool,
    /// Compact small files in the background once the query has made N
    /// commits since the last compaction began (either format; the
    /// compaction's commits change no row).
    #[arg(long, value_name = "N")]
    pub compact_every: Option<u64>,
    /// Compact small files in the background once the query has written N
    /// data files since the last compaction began (with --compact-every:
    /// whichever comes first).
    #[arg(long, value_name = "N")]
    pub compact_after_files: Option<u64>,
    /// With --compact-every or --compact-after-files: the fewest small
    /// files of a partition worth a rewrite.
    #[arg(long, value_name = "N", default_value_t = 10, requires = "compaction")]
    pub compact_min_files: usize,
    /// Iceberg: expire old snapshots in the query's own commit once it has
    /// made N commits since the last expiry (their files are deleted in the
    /// background), keeping the newest
    /// --expire-retain of any age. Without it, every 100 commits the
    /// snapshots beyond the newest 100 expire, unless the table's
    /// history.expire.* properties keep more.
    #[arg(long, value_name = "N", conflicts_with = "keep_every_snapshot")]
    pub expire_every: Option<u64>,
    /// Iceberg, with --expire-every: the snapshots kept.
    #[arg(long, value_name = "N", default_value_t = 100)]
    pub expire_retain: usize,
    /// Iceberg: expire no snapshot (each commit grows slower with the
    /// table's history; expire them with another job).
    #[arg(long)]
    pub keep_every_snapshot: bool,
    /// Per-batch progress on standard output.
    #[arg(long, value_enum, default_value_t = Progress::Text)]
    pub progress: Progress,
    /// Rate source: rows per batch.
    #[arg(long, default_value_t = 1000)]
    pub rows_per_batch: u64,
    /// Rate source: rows per second (a batch takes what has come since).
    #[arg(long)]
    pub rows_per_second: Option<u64>,
    /// Files source: the directory.
    #[arg(long, value_name = "DIR")]
    pub path: Option<PathBuf>,
    /// Files source: the files' format.
    #[arg(long, value_enum)]
    pub file_format: Option<FileFormatArg>,
    /// Files source: at most this many new files per batch.
    #[arg(long)]
    pub max_files_per_batch: Option<usize>,
    /// Processes what is available at the start (in batches of the
    /// source's limits), then stops.
    #[arg(long, conflicts_with = "trigger_interval")]
    pub available_now: bool,
    #[command(flatten)]
    pub kafka: KafkaArgs,
}

/// `--from kafka`.
#[derive(Debug, Args)]
pub struct KafkaArgs {
    /// Kafka source: the brokers to start from, `host:port,...`.
    #[arg(long, value_name = "HOSTS")]
    pub bootstrap_servers: Option<String>,
    /// Kafka source: a topic to read; repeat or separate with commas.
    #[arg(long, value_name = "TOPIC", value_delimiter = ',')]
    pub topic: Vec<String>,
    /// Kafka source: read every topic whose whole name matches this regex.
    #[arg(long, value_name = "REGEX", conflicts_with = "topic")]
    pub topic_pattern: Option<String>,
    /// Kafka source, a new checkpoint: `earliest`, `latest` (default) or
    /// offsets as JSON, `{"topic":{"0":42,"1":-2}}` (-2 earliest, -1 latest).
    #[arg(long, value_name = "WHERE")]
    pub starting_offsets: Option<String>,
    /// Kafka source, a new checkpoint: the first record at or after this
    /// time, milliseconds since the epoch.
    #[arg(long, value_name = "MS", conflicts_with = "starting_offsets")]
    pub starting_timestamp: Option<i64>,
    /// Kafka source: at most this many records per batch, shared by lag.
    #[arg(long, value_name = "N")]
    pub max_offsets_per_trigger: Option<u64>,
    /// Kafka source: how values become columns.
    #[arg(long, value_enum, default_value_t = ValueFormatArg::Raw)]
    pub value_format: ValueFormatArg,
    /// Kafka source, --value-format json: a file with the values' columns
    /// in DDL, e.g. `id BIGINT NOT NULL, amount DOUBLE, ts TIMESTAMP`;
    /// --value-format avro: a file with the Avro record schema.
    #[arg(long, value_name = "FILE")]
    pub schema: Option<PathBuf>,
    /// Kafka source, --value-format avro: how each value is framed,
    /// `confluent:ID` (the schema registry's wire format with the schema's
    /// id), `single-object` or `bare`.
    #[arg(long, value_name = "FRAMING", default_value = "bare")]
    pub avro_framing: String,
    /// Kafka source, --value-format json or avro: Kafka columns kept after the
    /// parsed ones, e.g. `partition,offset,timestamp`.
    #[arg(long, value_name = "COLS", value_delimiter = ',')]
    pub keep_kafka_columns: Vec<String>,
    /// Kafka source, --value-format json or avro: a value that does not parse lands
    /// in this binary column (its other columns null) instead of failing
    /// the batch.
    #[arg(long, value_name = "COLUMN")]
    pub dead_letter_column: Option<String>,
    /// Kafka source: skip records that are gone before they were read
    /// (retention, a deleted topic), reporting them, instead of stopping.
    #[arg(long)]
    pub accept_data_loss: bool,
    /// Kafka source: after each batch, commit its end offsets to this
    /// consumer group for lag monitors (never read back).
    #[arg(long, value_name = "GROUP")]
    pub commit_offsets_to_group: Option<String>,
    /// Kafka source: a librdkafka client setting, `key=value`
    /// (`security.protocol=SASL_SSL`, `sasl.mechanism=SCRAM-SHA-512`, ...);
    /// repeat for more.
    #[arg(long = "kafka-option", value_name = "KEY=VALUE")]
    pub kafka_options: Vec<String>,
}

/// `KEY=VALUE` options (of `--checkpoint-option`) as pairs.
pub fn key_values(flag: &str, options: &[String]) -> Result<std::collections::HashMap<String, String>, String> {
    options
        .iter()
        .map(|option| {
            option
                .split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| format!("{flag} {option:?} is not KEY=VALUE"))
        })
        .collect()
}
