//! `weir stream`: a source into a table by name.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow_schema::SchemaRef;
use weir::catalog::{Catalogs, TableFormat, TableOptions};
use weir::prelude::*;

use crate::args::{FileFormatArg, FormatArg, From, Progress, StreamArgs};
use crate::Failure;

pub async fn run(catalogs: &Catalogs, args: &StreamArgs) -> Result<(), Failure> {
    let source: Box<dyn FnOnce() -> ReadStream> = match args.from {
        From::Rate => {
            let rate = match args.rows_per_second {
                Some(r) => RateSource::rows_per_second(r).with_rows_per_batch(args.rows_per_batch),
                None => RateSource::rows_per_batch(args.rows_per_batch),
            };
            Box::new(move || read_stream(rate))
        }
        From::Files => {
            let dir = args.path.clone().ok_or("--from files needs --path DIR")?;
            let format = args
                .file_format
                .ok_or("--from files needs --file-format json|csv|parquet")?;
            let schema = infer_schema(&dir, format)?;
            let format = match format {
                FileFormatArg::Json => FileFormat::JsonLines,
                FileFormatArg::Csv => FileFormat::Csv,
                FileFormatArg::Parquet => FileFormat::Parquet,
            };
            let mut files = FileSource::new(dir, format, schema);
            if let Some(n) = args.max_files_per_batch {
                files = files.with_max_files_per_trigger(n);
            }
            Box::new(move || read_stream(files))
        }
        From::Kafka => {
            let kafka = crate::kafka::source(&args.kafka)?;
            Box::new(move || read_stream(kafka))
        }
    };
    let options = crate::args::key_values("--checkpoint-option", &args.checkpoint_options)?;
    let mut writer = source()
        .write_stream()
        .checkpoint_location(&args.checkpoint)
        .checkpoint_options(options);
    if let Some(name) = &args.query_name {
        writer = writer.query_name(name);
    }
    if args.take_over_output {
        writer = writer.take_over_output(true);
    }
    if let Some(interval) = &args.trigger_interval {
        writer = writer.trigger(Trigger::processing_time(parse_duration(
            "--trigger-interval",
            interval,
        )?));
    }
    if args.available_now {
        writer = writer.trigger(Trigger::available_now());
    }
    if let Some(n) = args.max_batches {
        if args.take_over_output {
            // Taken-over batch ids continue after the old query's marker, so
            // a count from 0 would stop at once or never.
            return Err(
                "--max-batches counts batch ids from 0 and cannot be used with --take-over-output, \
                        whose batch ids continue after the old query's; run the takeover without it"
                    .into(),
            );
        }
        if n == 0 {
            return Err("--max-batches must be at least 1".into());
        }
        writer = writer.stop_after_batch(BatchId(n - 1));
    }
    match args.progress {
        Progress::Json => {
            writer = writer.on_progress(|p| {
                if let Ok(line) = serde_json::to_string(p) {
                    println!("{line}");
                }
            })
        }
        Progress::Text => {
            writer = writer.on_progress(|p| {
                println!(
                    "batch {:>6}  {:>9} rows  {:>8.1} ms  (plan {:.1}, write {:.1}, commit {:.1}){}",
                    p.batch_id.0,
                    p.input_rows,
                    p.durations_ms.total,
                    p.durations_ms.plan,
                    p.durations_ms.write,
                    p.durations_ms.commit,
                    if p.replayed { "  replayed" } else { "" }
                )
            })
        }
        Progress::None => {}
    }
    let mut options = TableOptions::new().partition_by(args.partition_by.iter().cloned());
    if let Some(format) = args.format {
        options = options.format(match format {
            FormatArg::Delta => TableFormat::Delta,
            FormatArg::Iceberg => TableFormat::Iceberg,
        });
    }
    if args.keep_every_snapshot {
        options = options.keep_every_snapshot();
    }
    if let Some(every) = args.expire_every {
        options = options.snapshot_expiry(weir::iceberg::ExpiryPolicy {
            every_commits: every.max(1),
            retain_last: args.expire_retain.max(1),
            older_than: None,
            table_properties_first: false,
        });
    }
    if args.compact_every.is_some() || args.compact_after_files.is_some() {
        let mut policy = match args.compact_every {
            Some(every) => weir::sink::CompactionPolicy::every(every, args.compact_min_files),
            None => weir::sink::CompactionPolicy::after_files(u64::MAX, args.compact_min_files),
        };
        policy.after_files = args.compact_after_files.map(|n| n.max(1));
        options = options.compaction(policy);
    }
    let query = Arc::new(writer.to_table_in(catalogs, &args.to, options).await?);
    // Ctrl-C: the running batch finishes (or, if the process is killed,
    // is replayed exactly once on the next start); no new one starts.
    let stopper = query.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("weir: stopping after the current batch");
            stopper.stop();
        }
    });
    query.await_termination().await?;
    Ok(())
}

/// `500ms`, `10s`, `2m`, `1h`, `7d`; `flag` names the option in errors.
pub(crate) fn parse_duration(flag: &str, text: &str) -> Result<Duration, Failure> {
    let bad = || format!("{flag} {text:?}: use a number with ms, s, m, h or d, e.g. 500ms, 10s or 7d");
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let seconds = |per: u64| n.checked_mul(per).map(Duration::from_secs).ok_or_else(bad);
    Ok(match unit {
        "ms" => Duration::from_millis(n),
        "s" => seconds(1)?,
        "m" => seconds(60)?,
        "h" => seconds(3600)?,
        "d" => seconds(86_400)?,
        _ => return Err(bad().into()),
    })
}

/// The schema of the directory's first file (by name).
fn infer_schema(dir: &Path, format: FileFormatArg) -> Result<SchemaRef, Failure> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("--path {}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .collect();
    files.sort();
    let first = files.first().ok_or_else(|| {
        format!(
            "{} has no files yet: the schema is read from the first file, so add one and start again",
            dir.display()
        )
    })?;
    let open = || File::open(first).map_err(|e| format!("{}: {e}", first.display()));
    let schema = match format {
        FileFormatArg::Json => {
            let reader = std::io::BufReader::new(open()?);
            arrow_json::reader::infer_json_schema(reader, Some(1000))?.0
        }
        FileFormatArg::Csv => {
            arrow_csv::reader::Format::default()
                .with_header(true)
                .infer_schema(open()?, Some(1000))?
                .0
        }
        FileFormatArg::Parquet => {
            let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(open()?)?;
            builder.schema().as_ref().clone()
        }
    };
    Ok(Arc::new(schema))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        let parse = |t: &str| parse_duration("--x", t);
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse("7d").unwrap(), Duration::from_secs(7 * 86_400));
        for bad in ["10", "s", "1.5s", "10 s", "-1s", "3w"] {
            assert!(parse(bad).unwrap_err().to_string().contains("--x"), "{bad}");
        }
    }
}
