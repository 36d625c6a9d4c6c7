//! The command line the lake examples share (`--lake`, `--batches`,
//! `--total-batches`, `--rows-per-batch`, `--quiet`), and how many batches
//! a run goes to.

use std::path::{Path, PathBuf};

use weir_core::checkpoint::Checkpoint;
use weir_core::{BatchId, BoxError};

/// The options of one run.
#[derive(Debug)]
pub struct LakeOptions {
    /// The lake's root (`--lake`, else `WEIR_LAKE`, else `./weir-lake`).
    pub lake: PathBuf,
    /// Batches to add to what earlier runs did.
    pub batches: u64,
    /// Batches in total, counting earlier runs (wins over `batches`).
    pub total_batches: Option<u64>,
    /// Rows of each batch.
    pub rows_per_batch: u64,
    /// No progress lines.
    pub quiet: bool,
}

impl LakeOptions {
    /// Logs warnings to standard error, then parses the process's
    /// arguments; `program` names it in the usage.
    pub fn init(program: &str, batches: u64, rows_per_batch: u64) -> Result<Self, BoxError> {
        tracing_subscriber::fmt()
            .with_env_filter("warn")
            .with_writer(std::io::stderr)
            .init();
        Self::parse(program, batches, rows_per_batch).map_err(Into::into)
    }

    /// Parses the process's arguments; `program` names it in the usage.
    pub fn parse(program: &str, batches: u64, rows_per_batch: u64) -> Result<Self, String> {
        let lake = std::env::var_os("WEIR_LAKE").map_or_else(|| PathBuf::from("weir-lake"), PathBuf::from);
        let mut o = LakeOptions {
            lake,
            batches,
            total_batches: None,
            rows_per_batch,
            quiet: false,
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let mut value = || args.next().ok_or(format!("{flag} needs a value"));
            let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
            match flag.as_str() {
                "--lake" => o.lake = PathBuf::from(value()?),
                "--batches" => o.batches = number(value()?)?,
                "--rows-per-batch" => o.rows_per_batch = number(value()?)?,
                "--total-batches" => o.total_batches = Some(number(value()?)?),
                "--quiet" => o.quiet = true,
                "-h" | "--help" => {
                    return Err(format!(
                        "usage: {program} [--lake DIR] [--batches N | --total-batches N] [--rows-per-batch R] [--quiet]"
                    ))
                }
                other => return Err(format!("unknown option {other}; see --help")),
            }
        }
        Ok(o)
    }

    /// The last batch a query with checkpoint `dir` runs to this time:
    /// `total_batches - 1`, so a killed and restarted run ends at the same
    /// batch, or `batches` after what the checkpoint holds.
    pub async fn last_batch(&self, dir: &Path) -> Result<BatchId, BoxError> {
        if let Some(total) = self.total_batches {
            return Ok(BatchId(total.max(1) - 1));
        }
        let before = Checkpoint::open_local(dir)?.status().await?.last_committed;
        Ok(BatchId(before.map_or(0, |b| b.0 + 1) + self.batches.max(1) - 1))
    }
}
