//! A streaming process's resident memory, sampled as its batches land, for
//! tests and benchmarks that a long run stays flat (Linux: `/proc`).

use std::io::{BufRead, BufReader};
use std::process::Child;

/// The resident set of process `pid` in bytes (`VmRSS`).
pub fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("a Linux /proc");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .expect("VmRSS in /proc/<pid>/status")
}

/// One sample of a stream: the commits it had made and its resident bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySample {
    /// Batches committed when the sample was taken.
    pub commits: u64,
    /// The process's resident set then.
    pub resident: u64,
}

/// Reads a stream's progress lines from `child`'s piped standard output
/// until it closes, and samples the process's resident memory after every
/// `every` commits, calling `each` with each sample as it is taken. A
/// progress line is `weir stream --progress json`'s JSON object or an
/// example's `batch N: ...`; other lines are passed over.
pub fn sample_stream(child: &mut Child, every: u64, mut each: impl FnMut(MemorySample)) {
    let pid = child.id();
    let stdout = child.stdout.take().expect("the stream's standard output is piped");
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("the stream's output is readable");
        let Some(commits) = commits_after(&line) else { continue };
        if commits.is_multiple_of(every) {
            each(MemorySample {
                commits,
                resident: resident_bytes(pid),
            });
        }
    }
}

/// The commits made once the batch a progress line reports is in.
fn commits_after(line: &str) -> Option<u64> {
    let batch = if line.starts_with('{') {
        let progress: serde_json::Value = serde_json::from_str(line).expect("a JSON progress object");
        progress["batch_id"].as_u64().expect("a batch id")
    } else {
        line.strip_prefix("batch ")?.split(':').next()?.trim().parse().ok()?
    };
    Some(batch + 1)
}

#[cfg(test)]
mod tests {
    use super::commits_after;

    #[test]
    fn progress_lines_of_both_kinds_give_the_commits_made() {
        assert_eq!(commits_after(r#"{"batch_id":99,"input_rows":100}"#), Some(100));
        assert_eq!(commits_after("batch  999:     100 rows in     2.1 ms"), Some(1000));
        assert_eq!(commits_after("streaming up to batch 9 into out"), None);
        assert_eq!(commits_after("read back 100 payments"), None);
    }
}
