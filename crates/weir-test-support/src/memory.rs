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

/// Reads `weir stream --progress json`'s lines from `child`'s piped standard
/// output until it closes, and samples the process's resident memory after
/// every `every` commits, calling `each` with each sample as it is taken.
pub fn sample_stream(child: &mut Child, every: u64, mut each: impl FnMut(MemorySample)) {
    let pid = child.id();
    let stdout = child.stdout.take().expect("the stream's standard output is piped");
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("the stream's output is readable");
        let progress: serde_json::Value = serde_json::from_str(&line).expect("one JSON progress object a line");
        let commits = progress["batch_id"].as_u64().expect("a batch id") + 1;
        if commits.is_multiple_of(every) {
            each(MemorySample {
                commits,
                resident: resident_bytes(pid),
            });
        }
    }
}
