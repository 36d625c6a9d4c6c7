//! Shared by the process tests: a seeded generator of kill moments, the
//! kill-and-restart loop, two copies of a query run at once, and the
//! exactly-once check of a Delta table of the rate source's payments.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use weir_test_support::{assert_exactly_once, readers};

/// A small deterministic generator (a 64-bit LCG).
pub struct Lcg(pub u64);

impl Lcg {
    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// The seed from `WEIR_KILL_SEED`, or the clock; printed, so a failing run
/// can be repeated.
pub fn seeded() -> (u64, Lcg) {
    let seed = std::env::var("WEIR_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64);
    eprintln!("kill test seed {seed}");
    (seed, Lcg(seed))
}

/// Starts `command` `runs` times, SIGKILLing each run at a random moment
/// (`after_ms` plus up to `spread_ms`) unless it finished first, then runs
/// it once more to the end. Returns how many runs were killed mid-run; a
/// run that failed by itself fails the test.
pub fn kill_and_restart(
    mut command: impl FnMut() -> std::process::Command,
    runs: usize,
    after_ms: u64,
    spread_ms: u64,
) -> usize {
    let (seed, mut rng) = seeded();
    let mut killed = 0;
    for _ in 0..runs {
        let mut child = command().spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(after_ms + rng.below(spread_ms)));
        match child.try_wait().unwrap() {
            Some(status) => {
                let out = child.wait_with_output().unwrap();
                assert!(
                    status.success(),
                    "a run failed by itself: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => {
                child.kill().unwrap();
                child.wait().unwrap();
                killed += 1;
            }
        }
    }
    let last = command().output().unwrap();
    assert!(
        last.status.success(),
        "final run: {}",
        String::from_utf8_lossy(&last.stderr)
    );
    eprintln!("{killed} of {runs} runs killed (seed {seed})");
    killed
}

/// Runs two copies of one query (`a` and `b`, the same command on two
/// copies of a checkpoint) at once: exactly one must stop, saying why.
pub fn run_two_copies(a: std::process::Command, b: std::process::Command) {
    let (mut a, mut b) = (a, b);
    let (ra, rb) = (a.spawn().unwrap(), b.spawn().unwrap());
    let (oa, ob) = (ra.wait_with_output().unwrap(), rb.wait_with_output().unwrap());
    let failed: Vec<String> = [&oa, &ob]
        .iter()
        .filter(|o| !o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stderr).to_string())
        .collect();
    assert_eq!(failed.len(), 1, "exactly one copy stops: {failed:?}");
    assert!(
        failed[0].contains("another run of the same query id") || failed[0].contains("planned only up to"),
        "the loser says why: {}",
        failed[0]
    );
}

/// Checks every event id `0..n` of Delta table `table` exactly once with
/// Python deltalake and DuckDB, and the amounts' checksum.
pub fn assert_delta_exactly_once(table: &Path, n: i64) {
    for reader in ["deltalake", "duckdb"] {
        let Some((ids, cents)) = readers::event_ids_with(reader, table.to_str().unwrap()) else {
            return;
        };
        assert_exactly_once(&ids, 0..n);
        assert_eq!(cents, Some(readers::rate_amount_cents(n)), "{reader}: amount checksum");
    }
}
