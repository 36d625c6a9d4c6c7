//! `weir files`: a file sink's output through its metadata log.

use std::collections::BTreeMap;

use weir::files::FileLog;

use crate::args::FilesCommand;
use crate::Failure;

pub async fn run(command: &FilesCommand) -> Result<(), Failure> {
    match command {
        FilesCommand::Ls { dir, json } => ls(dir, *json).await,
        FilesCommand::CompactLog { dir } => {
            let log = FileLog::open(dir, &Default::default())?;
            match log.log().compact_now().await? {
                Some(batch) => println!("{dir}: the log is compacted at batch {batch}"),
                None => println!("{dir}: the log is empty"),
            }
            Ok(())
        }
        FilesCommand::Orphans {
            dir,
            older_than,
            delete,
            json,
        } => {
            let age = crate::stream::parse_duration("--older-than", older_than)?;
            let log = FileLog::open(dir, &Default::default())?;
            let orphans = if *delete {
                log.remove_orphans(age).await?
            } else {
                log.orphans(age).await?
            };
            for o in &orphans {
                if *json {
                    println!("{}", serde_json::to_string(o)?);
                } else {
                    println!("{}  {} bytes  {} s old", o.path, o.size, o.age_secs);
                }
            }
            if !*json {
                let verb = if *delete { "deleted" } else { "found" };
                println!("{dir}: {verb} {} orphans older than {older_than}", orphans.len());
            }
            Ok(())
        }
    }
}

async fn ls(dir: &str, json: bool) -> Result<(), Failure> {
    let log = FileLog::open(dir, &Default::default())?;
    let files = log.files().await?;
    if json {
        for f in &files {
            println!("{}", serde_json::to_string(f)?);
        }
        return Ok(());
    }
    let latest = log.log().latest().await?;
    let Some(latest) = latest else {
        println!("{dir}: no metadata log (no batch committed)");
        return Ok(());
    };
    let h = &latest.header;
    println!(
        "{dir}: batch {} of query {:?} ({}) is the latest{}",
        h.batch_id,
        h.query_name,
        h.query_id,
        if latest.compact { ", a compact entry" } else { "" }
    );
    let mut by_batch: BTreeMap<u64, (usize, u64, u64)> = BTreeMap::new();
    for f in &files {
        let e = by_batch.entry(f.batch_id).or_default();
        e.0 += 1;
        e.1 += f.rows;
        e.2 += f.size;
    }
    for (batch, (n, rows, bytes)) in &by_batch {
        println!("  batch {batch:>6}: {n:>4} files, {rows:>9} rows, {bytes:>11} bytes");
    }
    let rows: u64 = files.iter().map(|f| f.rows).sum();
    println!("{} files, {rows} rows in {} batches", files.len(), by_batch.len());
    Ok(())
}
