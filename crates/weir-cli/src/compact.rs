//! `weir compact`: small files into target-size files, with a progress bar
//! on a terminal and a summary.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};

use weir::catalog::{Catalogs, CompactOptions, CompactProgress, CompactSummary};

use crate::Failure;
use weir::sync::Recover;

/// `128MiB`, `1GiB`, `512m`, `64k`, `1000000`: a size in bytes.
pub fn parse_size(flag: &str, text: &str) -> Result<u64, Failure> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => u32::MAX,
    };
    match digits.parse::<u64>() {
        Ok(n) if n > 0 && shift != u32::MAX => n
            .checked_shl(shift)
            .filter(|v| v >> shift == n)
            .ok_or_else(|| format!("{flag} {text:?} is too large").into()),
        _ => Err(format!("{flag} {text:?} is not a size; write e.g. 128MiB, 512m or 1GiB").into()),
    }
}

/// `column=value` (`column=null` for null).
pub fn parse_filter(text: &str) -> Result<(String, Option<String>), Failure> {
    match text.split_once('=') {
        Some((c, v)) if !c.is_empty() => Ok((c.to_string(), (v != "null").then(|| v.to_string()))),
        _ => Err(format!("--where {text:?} is not column=value (use column=null for null)").into()),
    }
}

/// Bytes for people: `1.5 GiB`.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// The progress bar's state, drawn on standard error.
#[derive(Default)]
struct Bar {
    total: u64,
    done: u64,
    groups: usize,
    rewritten: usize,
}

impl Bar {
    fn draw(&self) {
        const WIDTH: usize = 30;
        let filled = if self.total == 0 {
            WIDTH
        } else {
            (self.done.min(self.total) as f64 / self.total as f64 * WIDTH as f64) as usize
        };
        let mut err = std::io::stderr();
        let _ = write!(
            err,
            "\r[{}{}] {}/{} groups, {} of {}",
            "#".repeat(filled),
            ".".repeat(WIDTH - filled),
            self.rewritten,
            self.groups,
            size(self.done),
            size(self.total)
        );
        let _ = err.flush();
    }
}

pub async fn run(catalogs: &Catalogs, name: &str, options: CompactOptions, json: bool) -> Result<(), Failure> {
    let draw = !json && std::io::stderr().is_terminal();
    let bar = Arc::new(Mutex::new(Bar::default()));
    let shared = bar.clone();
    let summary = catalogs
        .table(name)
        .compact()
        .with_options(options)
        .with_progress(move |p| {
            if !draw {
                return;
            }
            let mut bar = shared.lock().recover();
            match p {
                CompactProgress::Planned { groups, bytes, .. } => {
                    bar.groups = groups;
                    bar.total = bytes;
                }
                CompactProgress::Rewritten { bytes, .. } => {
                    bar.rewritten += 1;
                    bar.done += bytes;
                }
                _ => {}
            }
            bar.draw();
        })
        .await;
    if draw {
        eprintln!();
    }
    let summary = summary?;
    if json {
        println!("{}", serde_json::to_string(&summary)?);
        return Ok(());
    }
    print_summary(&summary);
    Ok(())
}

fn print_summary(summary: &CompactSummary) {
    let s = &summary.report;
    let target = s.target_file_size;
    if s.dry_run {
        println!(
            "{} ({}): would rewrite {} groups, {} files, {} (target {} files)",
            summary.name,
            summary.format.as_str(),
            s.groups.len(),
            s.groups.iter().map(|g| g.files.len()).sum::<usize>(),
            size(s.groups.iter().map(|g| g.bytes).sum()),
            size(target)
        );
        for g in &s.groups {
            let partition: Vec<String> = g
                .partition
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_deref().unwrap_or("null")))
                .collect();
            let out = g.bytes.div_ceil(target.max(1));
            println!(
                "  {}: {} files, {} -> about {out} file{}",
                if partition.is_empty() {
                    "(table)".to_string()
                } else {
                    partition.join("/")
                },
                g.files.len(),
                size(g.bytes),
                if out == 1 { "" } else { "s" }
            );
        }
        return;
    }
    println!(
        "{} ({}): compacted in {:.1} s",
        summary.name,
        summary.format.as_str(),
        s.duration.as_secs_f64()
    );
    println!(
        "  groups:  {} rewritten, {} dropped (another writer removed an input)",
        s.groups.len() - s.groups_dropped,
        s.groups_dropped
    );
    println!(
        "  files:   {} -> {} (removed {}, added {})",
        s.files_before, summary.files_after, s.files_removed, s.files_added
    );
    println!("  bytes:   {} -> {}", size(s.bytes_before), size(summary.bytes_after));
    println!("  rows rewritten: {}", s.rows);
    let commits: Vec<String> = s.commits.iter().map(i64::to_string).collect();
    println!(
        "  commits: {}",
        if commits.is_empty() {
            "none".into()
        } else {
            commits.join(", ")
        }
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("-s", "128MiB").unwrap(), 128 << 20);
        assert_eq!(parse_size("-s", "512m").unwrap(), 512 << 20);
        assert_eq!(parse_size("-s", "1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("-s", "4096").unwrap(), 4096);
        for bad in ["", "0", "12x", "MiB", "99999999999999999999g"] {
            assert!(parse_size("-s", bad).is_err(), "{bad:?}");
        }
        assert_eq!(size(1536), "1.5 KiB");
    }

    #[test]
    fn filters_name_a_column_and_a_value() {
        assert_eq!(parse_filter("zone=eu").unwrap(), ("zone".into(), Some("eu".into())));
        assert_eq!(parse_filter("zone=null").unwrap(), ("zone".into(), None));
        assert!(parse_filter("=eu").is_err() && parse_filter("zone").is_err());
    }
}
