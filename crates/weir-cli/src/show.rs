//! `weir tables`, `describe`, `history` and `checkpoint show`.

use std::collections::HashMap;
use std::path::Path;

use weir::catalog::Catalogs;
use weir::checkpoint::Checkpoint;

use crate::Failure;

fn json_line(value: &impl serde::Serialize) -> Result<(), Failure> {
    println!("{}", serde_json::to_string(value)?);
    Ok(())
}

fn time(ms: Option<i64>) -> String {
    ms.and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f").to_string())
        .unwrap_or_else(|| "-".into())
}

pub async fn tables(
    catalogs: &Catalogs,
    namespace: Option<&str>,
    catalog: Option<&str>,
    json: bool,
) -> Result<(), Failure> {
    // `catalog.namespace` when the first part names a catalog.
    let (catalog, namespace) = match (catalog, namespace) {
        (None, Some(ns)) => match ns.split_once('.') {
            Some((c, rest)) if catalogs.config().catalog(c).is_some() => (Some(c), Some(rest)),
            _ => (None, Some(ns)),
        },
        other => other,
    };
    let tables = catalogs.list(catalog, namespace).await?;
    for t in &tables {
        if json {
            json_line(&serde_json::json!({
                "name": t.name.to_string(),
                "format": t.format,
                "location": t.location,
            }))?;
        } else {
            println!("{:<40} {:<8} {}", t.name.to_string(), t.format.as_str(), t.location);
        }
    }
    if tables.is_empty() && !json {
        eprintln!("no tables");
    }
    Ok(())
}

pub async fn describe(catalogs: &Catalogs, name: &str, json: bool) -> Result<(), Failure> {
    let d = catalogs.describe(name).await?;
    if json {
        return json_line(&d);
    }
    println!("table     {}", d.name);
    println!("format    {}", d.format);
    println!("location  {}", d.location);
    if !d.exists {
        println!("state     registered; created by the first batch of a query");
        return Ok(());
    }
    let version = d.version.map_or("-".to_string(), |v| v.to_string());
    println!(
        "{:<9} {version}",
        if d.format.as_str() == "delta" {
            "version"
        } else {
            "snapshot"
        }
    );
    println!("files     {}", d.files);
    println!("bytes     {}", d.bytes);
    if let Some(rows) = d.rows {
        println!("rows      {rows}");
    }
    if !d.partition_by.is_empty() {
        println!("partition {}", d.partition_by.join(", "));
    }
    for q in &d.queries {
        println!(
            "query     {} at batch {} (query id {})",
            q.query_name,
            q.batch_id,
            q.query_id.as_deref().unwrap_or("unknown")
        );
    }
    Ok(())
}

pub async fn history(catalogs: &Catalogs, name: &str, limit: usize, json: bool) -> Result<(), Failure> {
    for entry in catalogs.history(name, limit).await? {
        if json {
            json_line(&entry)?;
            continue;
        }
        let by = match (&entry.query_name, entry.batch_id) {
            (Some(q), Some(b)) => format!("{q} batch {b}"),
            _ => String::new(),
        };
        println!(
            "{:<20} {:<23} {:<18} {by}",
            entry.version.map_or("-".to_string(), |v| v.to_string()),
            time(entry.timestamp_ms),
            entry.operation.as_deref().unwrap_or("-"),
        );
    }
    Ok(())
}

/// The status of the checkpoint at `location` (a directory or an object
/// store URL, configured from the environment).
pub async fn checkpoint(location: &Path, options: &HashMap<String, String>, json: bool) -> Result<(), Failure> {
    let url = location
        .to_str()
        .filter(|l| l.contains("://") && !l.starts_with("file://"));
    if url.is_none() && !location.is_dir() {
        return Err(format!("no checkpoint at {}", location.display()).into());
    }
    let shown = location.to_string_lossy();
    let status = Checkpoint::open(&shown, options)?.status().await?;
    if url.is_some() && status.metadata.is_none() && status.last_planned.is_none() {
        return Err(format!("no checkpoint at {shown}").into());
    }
    if json {
        return json_line(&status);
    }
    println!("checkpoint      {}", status.location);
    match &status.metadata {
        Some(m) => {
            println!("query           {} (id {})", m.query_name, m.query_id);
            println!("created         {}", m.created_at);
            println!("sink            {}", serde_json::to_string(&m.sink)?);
            for s in &m.sources {
                println!("source          {s}");
            }
        }
        None => println!("query           never started"),
    }
    let batch = |b: Option<weir::BatchId>| b.map_or("-".to_string(), |b| b.0.to_string());
    println!("last planned    {}", batch(status.last_planned));
    println!("last committed  {}", batch(status.last_committed));
    if let Some(offsets) = &status.latest_offsets {
        for s in &offsets.sources {
            println!("offset          {} = {}", s.source, serde_json::to_string(&s.offset)?);
        }
    }
    Ok(())
}

pub async fn expire(
    catalogs: &Catalogs,
    name: &str,
    older_than: Option<std::time::Duration>,
    retain_last: Option<usize>,
    dry_run: bool,
    json: bool,
) -> Result<(), Failure> {
    let started = std::time::Instant::now();
    let mut job = catalogs.table(name).expire_snapshots().with_dry_run(dry_run);
    if let Some(age) = older_than {
        job = job.with_older_than(age);
    }
    if let Some(n) = retain_last {
        job = job.with_retain_last(n);
    }
    let report = job.await?;
    if json {
        return json_line(&report);
    }
    let verb = if dry_run { "would expire" } else { "expired" };
    let deleted = if dry_run { "to delete" } else { "deleted" };
    println!(
        "{verb} {} snapshots of {name} ({} kept)",
        report.expired.len(),
        report.retained
    );
    println!(
        "files {deleted}: {} manifest lists, {} manifests, {} data files ({} bytes)",
        report.manifest_lists.len(),
        report.manifests.len(),
        report.data_files.len(),
        report.data_bytes
    );
    if !report.failed.is_empty() {
        println!(
            "could not delete {} files (now orphans; see the log)",
            report.failed.len()
        );
    }
    println!("took {:.0} ms", started.elapsed().as_secs_f64() * 1000.0);
    Ok(())
}

pub async fn remove_orphans(
    catalogs: &Catalogs,
    name: &str,
    older_than: Option<std::time::Duration>,
    dry_run: bool,
    json: bool,
) -> Result<(), Failure> {
    let started = std::time::Instant::now();
    let mut job = catalogs.table(name).remove_orphan_files().with_dry_run(dry_run);
    if let Some(age) = older_than {
        job = job.with_older_than(age);
    }
    let report = job.await?;
    if json {
        return json_line(&report);
    }
    let verb = if dry_run { "would delete" } else { "deleted" };
    println!(
        "{name}: {} files listed; {verb} {} orphans ({} bytes)",
        report.listed,
        report.orphans.len(),
        report.bytes
    );
    for file in &report.orphans {
        println!("  {file}");
    }
    if !report.failed.is_empty() {
        println!("could not delete {} files (see the log)", report.failed.len());
    }
    println!("took {:.0} ms", started.elapsed().as_secs_f64() * 1000.0);
    Ok(())
}

pub async fn vacuum(
    catalogs: &Catalogs,
    name: &str,
    retention: Option<std::time::Duration>,
    force: bool,
    dry_run: bool,
    json: bool,
) -> Result<(), Failure> {
    let started = std::time::Instant::now();
    let mut job = catalogs.table(name).vacuum().with_force(force).with_dry_run(dry_run);
    if let Some(retention) = retention {
        job = job.with_retention(retention);
    }
    let report = job.await?;
    if json {
        return json_line(&report);
    }
    let verb = if dry_run { "would delete" } else { "deleted" };
    println!("{name}: {verb} {} files", report.files.len());
    for file in &report.files {
        println!("  {file}");
    }
    println!("took {:.0} ms", started.elapsed().as_secs_f64() * 1000.0);
    Ok(())
}

pub async fn rewrite_manifests(catalogs: &Catalogs, name: &str, dry_run: bool, json: bool) -> Result<(), Failure> {
    let report = catalogs.table(name).rewrite_manifests().with_dry_run(dry_run).await?;
    if json {
        return json_line(&report);
    }
    let verb = if dry_run { "would merge" } else { "merged" };
    match report.snapshot_id {
        Some(id) => println!(
            "{name}: {verb} {} small manifests: {} -> {} manifests (snapshot {id})",
            report.small_manifests, report.manifests_before, report.manifests_after
        ),
        None if dry_run && report.small_manifests >= 2 => println!(
            "{name}: {verb} up to {} small manifests of {}",
            report.small_manifests, report.manifests_before
        ),
        None => println!("{name}: nothing to merge ({} manifests)", report.manifests_before),
    }
    println!("took {:.0} ms", report.duration.as_secs_f64() * 1000.0);
    Ok(())
}
