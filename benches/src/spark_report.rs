//! The plots of the head-to-head with Spark (`benches/benches/spark.rs`),
//! drawn from its results: latency against batch number, throughput,
//! compaction, start and memory, each side a colour.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::svg;

const FORMATS: [(&str, &str); 2] = [("delta", "Delta"), ("iceberg", "Iceberg")];
const SIDES: [&str; 2] = ["weir", "Spark"];

fn number(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

fn series(v: &Value) -> Vec<f64> {
    v.as_array().map(|a| a.iter().map(number).collect()).unwrap_or_default()
}

/// Writes a plot of each workload `results` holds into `dir`; returns the
/// files written.
pub fn write_plots(results: &Value, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    let mut put = |name: &str, svg: String| -> std::io::Result<()> {
        let path = dir.join(name);
        std::fs::write(&path, svg)?;
        written.push(path);
        Ok(())
    };
    for (key, shown) in FORMATS {
        for (workload, what) in [
            ("300x1000", "300 batches of 1,000 rows"),
            ("1000x100", "1,000 batches of 100 rows"),
        ] {
            let r = &results[format!("{key}_{workload}")];
            if r.is_null() {
                continue;
            }
            let (weir, spark) = (series(&r["weir"]["per_batch_ms"]), series(&r["spark"]["per_batch_ms"]));
            let mut lines: Vec<(&str, &[f64])> = vec![("weir", &weir)];
            if !spark.is_empty() {
                lines.push(("Spark", &spark));
            }
            let title = format!("{shown}: ms per batch, {what}, triggers back to back");
            put(
                &format!("latency-{workload}-{key}.svg"),
                svg::lines(&title, "batch", "ms per batch (log)", true, &lines),
            )?;
        }
    }
    // One bar group per format, weir's bar and Spark's.
    let grouped = |workload: &str, figure: &str, scale: f64| -> Vec<(&'static str, Vec<f64>)> {
        FORMATS
            .iter()
            .filter(|(key, _)| !results[format!("{key}_{workload}")].is_null())
            .map(|(key, shown)| {
                let r = &results[format!("{key}_{workload}")];
                (
                    *shown,
                    vec![number(&r["weir"][figure]) * scale, number(&r["spark"][figure]) * scale],
                )
            })
            .collect()
    };
    let charts = [
        (
            "throughput.svg",
            "one batch of 10M rows: rows per second",
            "rows/s",
            "one_batch",
            "rows_per_s",
            false,
        ),
        (
            "kafka.svg",
            "Kafka to table, 5M JSON records: records per second, start to end",
            "records/s",
            "kafka",
            "records_per_s",
            false,
        ),
        (
            "compaction.svg",
            "compaction of 1,000 small files: seconds",
            "s (log)",
            "compaction",
            "seconds",
            true,
        ),
        (
            "cold-start.svg",
            "process start to the first batch on a table of 10,000 commits",
            "s (log)",
            "cold_start",
            "first_batch_s",
            true,
        ),
    ];
    for (name, title, unit, workload, figure, log) in charts {
        let groups = grouped(workload, figure, 1.0);
        if !groups.is_empty() {
            put(name, svg::bars(title, unit, log, &SIDES, &groups))?;
        }
    }
    let mut memory = Vec::new();
    // The memory plot's groups: 300 batches of 1,000 rows, one batch of
    // 10M rows, and Kafka to table, named short enough to fit side by side.
    for (workload, what) in [("300x1000", "300x1k"), ("one_batch", "10M"), ("kafka", "Kafka")] {
        for (label, values) in grouped(workload, "peak_mib", 1.0) {
            memory.push((format!("{label} {what}"), values));
        }
    }
    if !memory.is_empty() {
        let groups: Vec<(&str, Vec<f64>)> = memory.iter().map(|(l, v)| (l.as_str(), v.clone())).collect();
        put(
            "memory.svg",
            svg::bars("peak resident memory, MiB", "MiB (log)", true, &SIDES, &groups),
        )?;
    }
    Ok(written)
}
