//! Killing a process at spread-out moments, as a crash would.

use std::process::{Command, Stdio};
use std::time::Duration;

/// Starts `command`'s process (its output discarded) and kills it (SIGKILL)
/// after a pause drawn from a fixed pseudo-random sequence in `pause`, again
/// and again until it has been killed `kills` times while running; a run
/// that ends by itself must have succeeded. Returns how many runs ended by
/// themselves. The sequence is the same on every run, so a failure repeats.
pub fn kill_repeatedly(mut command: impl FnMut() -> Command, kills: u32, pause: std::ops::Range<u64>) -> u32 {
    let (mut killed, mut ended, mut seed) = (0, 0, 0x2545_f491_u64);
    while killed < kills {
        let mut child = command()
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the process starts");
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let ms = pause.start + (seed >> 33) % (pause.end - pause.start).max(1);
        std::thread::sleep(Duration::from_millis(ms));
        if child.try_wait().expect("the process").is_none() {
            child.kill().expect("kill");
            killed += 1;
        } else {
            ended += 1;
        }
        let status = child.wait().expect("the process");
        assert!(
            status.code().is_none() || status.success(),
            "the process failed: {status}"
        );
    }
    ended
}
