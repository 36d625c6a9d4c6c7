//! The command line of the `*-stream` examples, and the query they run:
//! the deterministic rate source into one sink until the checkpoint holds
//! `--total-batches` batches (counting earlier runs), so a run that is
//! killed and restarted ends at the same batch.

use weir_core::prelude::*;

/// Every option of the stream examples; each binary says which it needs.
#[derive(Debug, Default)]
pub struct Options {
    pub catalog: String,
    pub warehouse: String,
    pub table: String,
    pub checkpoint: String,
    pub query_name: String,
    pub rows_per_batch: u64,
    pub total_batches: u64,
    pub partition_by: Vec<String>,
}

impl Options {
    /// Parses the process's arguments; `required` names the flags that must
    /// be given, `usage` is printed otherwise.
    pub fn parse(default_name: &str, required: &[&str], usage: &str) -> std::result::Result<Self, String> {
        let mut o = Options {
            query_name: default_name.into(),
            rows_per_batch: 1000,
            total_batches: 10,
            ..Options::default()
        };
        let mut given = Vec::new();
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let mut value = || args.next().ok_or(format!("{flag} needs a value"));
            match flag.as_str() {
                "--catalog" => o.catalog = value()?,
                "--warehouse" => o.warehouse = value()?,
                "--table" => o.table = value()?,
                "--checkpoint" => o.checkpoint = value()?,
                "--query-name" => o.query_name = value()?,
                "--rows-per-batch" => o.rows_per_batch = value()?.parse().map_err(|e| format!("{flag}: {e}"))?,
                "--total-batches" => o.total_batches = value()?.parse().map_err(|e| format!("{flag}: {e}"))?,
                "--partition-by" => o.partition_by.push(value()?),
                other => return Err(format!("unknown option {other}\n{usage}")),
            }
            given.push(flag);
        }
        if let Some(missing) = required.iter().find(|r| !given.iter().any(|g| g == *r)) {
            return Err(format!("{missing} is required\n{usage}"));
        }
        Ok(o)
    }
}

/// Sets up logging, parses the options and runs `query` with them; exits
/// with 2 on bad options and 1 on a failed query.
pub async fn main_with<F, Fut>(default_name: &str, required: &[&str], usage: &str, query: F)
where
    F: FnOnce(Options) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let options = match Options::parse(default_name, required, usage) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = query(options).await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Runs the rate source into `sink` as the options say, to the end.
pub async fn run(o: Options, sink: impl Sink + 'static) -> Result<()> {
    let query = read_stream(RateSource::rows_per_batch(o.rows_per_batch))
        .write_stream()
        .query_name(o.query_name)
        .checkpoint_location(o.checkpoint)
        .stop_after_batch(BatchId(o.total_batches.max(1) - 1))
        .start(sink)
        .await?;
    query.await_termination().await
}
