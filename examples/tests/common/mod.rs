//! Shared by the process tests: a seeded generator of kill moments.

use std::time::{SystemTime, UNIX_EPOCH};

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
