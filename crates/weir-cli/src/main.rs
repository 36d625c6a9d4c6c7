//! The `weir` command.
//!
//! ```text
//! weir stream --from rate --rows-per-batch 1000 --to bronze.payments --checkpoint chk/payments
//! weir tables
//! weir describe bronze.payments
//! weir history bronze.payments
//! weir checkpoint show chk/payments
//! ```
//!
//! # Guarantees
//!
//! - `weir stream` is a query of the library's, with its guarantees: each
//!   batch lands in the table once, whatever step the process dies at.
//!   Ctrl-C lets the running batch finish and starts no new one; a killed
//!   process replays its last batch exactly once on the next start.
//! - Maintenance commands (`compact`, `vacuum`, `expire`, `remove-orphans`,
//!   `rewrite-manifests`) have their jobs' guarantees: safe beside a
//!   running stream, and `--dry-run` changes nothing.
//! - Every command exits non-zero with a message on standard error when it
//!   fails; `--json` output is one JSON object per line.

mod args;
mod compact;
mod ddl;
mod files;
mod kafka;
mod show;
mod stream;

use std::process::ExitCode;

/// jemalloc returns what a peak took: with glibc's malloc, whose per-thread
/// arenas each keep their high-water mark, a stream's resident memory grew
/// by about 6 KB a commit even with the heap itself flat.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main`: two arenas instead of four per
/// core, and freed pages returned to the system after a second. A stream's
/// heap stays near 10 MB, but each arena keeps the pages its threads last
/// used (the runtime's and the blocking pool's, which local file access
/// and the Delta log replay use), so with the default arenas a stream's
/// resident memory still rose by 40% over 10,000 commits; with these, by
/// 10 to 20%, at the same speed. `_RJEM_MALLOC_CONF` in the environment is read
/// after this and overrides it.
#[used]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: MallocConf = MallocConf(c"narenas:2,dirty_decay_ms:1000,muzzy_decay_ms:0".as_ptr());

/// A C string jemalloc reads at start-up.
#[repr(transparent)]
struct MallocConf(*const std::ffi::c_char);

// SAFETY: the pointer is to a static, immutable C string literal.
unsafe impl Sync for MallocConf {}

use clap::Parser;
use weir::catalog::{lake_dir, Catalogs, Config};

use crate::args::{CheckpointCommand, Cli, Command};

/// An error of any command, shown as its message.
type Failure = Box<dyn std::error::Error + Send + Sync>;

fn catalogs(cli: &Cli) -> Result<Catalogs, Failure> {
    // A flag wins over the environment; --config and --lake together are
    // ambiguous.
    let config = match (&cli.config, &cli.lake, std::env::var_os("WEIR_CONFIG")) {
        (Some(_), Some(_), _) => {
            return Err("--config and --lake both choose the catalogs: give one".into());
        }
        (Some(file), None, _) => Config::from_file(file)?,
        (None, Some(lake), _) => Config::embedded(lake),
        (None, None, Some(file)) => Config::from_file(std::path::Path::new(&file))?,
        (None, None, None) => Config::embedded(&lake_dir(None)),
    };
    Ok(Catalogs::new(config))
}

/// An optional duration option (`7d`, `12h`, ...).
fn duration(flag: &str, value: &Option<String>) -> Result<Option<std::time::Duration>, Failure> {
    value.as_deref().map(|t| stream::parse_duration(flag, t)).transpose()
}

async fn run(cli: Cli) -> Result<(), Failure> {
    match &cli.command {
        Command::Stream(args) => stream::run(&catalogs(&cli)?, args).await,
        Command::Tables {
            namespace,
            catalog,
            json,
        } => show::tables(&catalogs(&cli)?, namespace.as_deref(), catalog.as_deref(), *json).await,
        Command::Describe { name, json } => show::describe(&catalogs(&cli)?, name, *json).await,
        Command::History { name, limit, json } => show::history(&catalogs(&cli)?, name, *limit, *json).await,
        Command::Expire {
            name,
            older_than,
            retain_last,
            dry_run,
            json,
        } => {
            let age = duration("--older-than", older_than)?;
            show::expire(&catalogs(&cli)?, name, age, *retain_last, *dry_run, *json).await
        }
        Command::RemoveOrphans {
            name,
            older_than,
            dry_run,
            json,
        } => {
            let age = duration("--older-than", older_than)?;
            show::remove_orphans(&catalogs(&cli)?, name, age, *dry_run, *json).await
        }
        Command::Compact {
            name,
            target_file_size,
            min_input_files,
            max_concurrent,
            commit_every,
            filters,
            dry_run,
            json,
        } => {
            let defaults = weir::catalog::CompactOptions::default();
            let options = weir::catalog::CompactOptions {
                target_file_size: target_file_size
                    .as_deref()
                    .map(|t| compact::parse_size("--target-file-size", t))
                    .transpose()?,
                groups_per_commit: *commit_every,
                partition: filters
                    .iter()
                    .map(|f| compact::parse_filter(f))
                    .collect::<Result<_, _>>()?,
                dry_run: *dry_run,
                min_input_files: min_input_files.unwrap_or(defaults.min_input_files),
                max_concurrent_rewrites: max_concurrent.unwrap_or(defaults.max_concurrent_rewrites),
            }
            .limited();
            compact::run(&catalogs(&cli)?, name, options, *json).await
        }
        Command::RewriteManifests { name, dry_run, json } => {
            show::rewrite_manifests(&catalogs(&cli)?, name, *dry_run, *json).await
        }
        Command::Vacuum {
            name,
            retain,
            force,
            dry_run,
            json,
        } => {
            let retention = duration("--retain", retain)?;
            show::vacuum(&catalogs(&cli)?, name, retention, *force, *dry_run, *json).await
        }
        Command::Files { command } => files::run(command).await,
        Command::Checkpoint {
            command:
                CheckpointCommand::Show {
                    dir,
                    json,
                    checkpoint_options,
                },
        } => {
            let options = args::key_values("--checkpoint-option", checkpoint_options)?;
            show::checkpoint(dir, &options, *json).await
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("weir: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weir: {e}");
            ExitCode::FAILURE
        }
    }
}
