//! Test support for weir: the sink conformance suite every sink runs, and
//! helpers that check rows exactly once.
//!
//! A sink crate implements [`SinkHarness`] for a fresh table and expands
//! [`sink_conformance_tests!`] in its integration tests:
//!
//! ```text
//! weir_test_support::sink_conformance_tests!(my_harness);
//! ```
//!
//! where `async fn my_harness() -> impl SinkHarness` makes a new table.
//!
//! A checkpoint store runs [`checkpoint_store::check_store`] on handles of
//! one checkpoint; [`faults::FaultyStore`] wraps an object store to fail,
//! delay, or land-then-fail its calls.
//!
//! # Guarantees
//!
//! - Every conformance test asserts on the rows the sink's table holds, as
//!   its harness reads them back: each id once, no id missing, each batch
//!   whole; none passes by skipping an assertion.
//! - [`assert_exactly_once`] fails on a duplicate and on a gap, each named
//!   ([`assert_whole_batches`] on a batch seen in part).
//! - A test whose service (S3, PostgreSQL, Kafka, the readers) is missing
//!   skips with a notice outside CI; with `CI` set, [`service`] fails it,
//!   so a CI run never passes by skipping.

pub mod checkpoint_store;
pub mod conformance;
mod data;
pub mod faults;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod kill;
pub mod memory;
pub mod operators;
pub mod proxy;
pub mod readers;

pub use conformance::{copy_dir, ObjectCheckpoints, SinkHarness};
pub use data::{assert_exactly_once, assert_whole_batches, event_ids, with_payload};

/// Whether a test that misses a service or a reader must fail rather than
/// skip: under `scripts/test.sh` (which sets `WEIR_TEST_STRICT`, having
/// installed and started everything) and wherever `CI` is set.
pub fn strict() -> bool {
    std::env::var_os("WEIR_TEST_STRICT").is_some() || std::env::var_os("CI").is_some()
}

/// A setting `scripts/test.sh` exports for a service it starts
/// (`WEIR_TEST_S3_ENDPOINT`, `WEIR_TEST_KAFKA_BOOTSTRAP`, ...). A missing
/// one is `None`, with a notice, and the test skips, except under
/// [`strict`], where it fails the test: nothing skips in the suite's run.
pub fn service(var: &str) -> Option<String> {
    let value = std::env::var(var).ok();
    assert!(
        value.is_some() || !strict(),
        "{var} is not set; scripts/test.sh starts the services and sets it"
    );
    if value.is_none() {
        eprintln!("{var} is not set; scripts/test.sh starts the services");
    }
    value
}

/// Expands to one `#[tokio::test]` per case of the conformance suite, each
/// on a fresh harness from `$harness().await`.
///
/// A sink without a marker (`keeps_marker` false: at least once) takes
/// `sink_conformance_tests!(at_least_once $harness)`: the cases that need
/// no marker (restarts, the checkpoint's own guards I5 and I6, output
/// modes), and, through a crash at every point, every row at least once
/// with only the batch in flight at a crash repeated.
#[macro_export]
macro_rules! sink_conformance_tests {
    (at_least_once $harness:ident) => {
        $crate::sink_conformance_tests!(@cases $harness;
            every_batch_once_across_restarts,
            crash_at_every_point_then_restart_is_at_least_once,
            second_query_on_a_checkpoint_is_refused,
            other_sink_is_refused,
            output_modes_are_honoured_or_refused,
            update_mode_is_honoured_or_refused,
            update_mode_replaces_or_logs_changed_groups
        );
    };
    ($harness:ident) => {
        $crate::sink_conformance_tests!(@cases $harness;
            every_batch_once_across_restarts,
            commit_is_idempotent_per_batch,
            racing_commits_of_one_batch_commit_once,
            empty_batch_commits_the_marker,
            crash_at_every_point_then_restart_is_exactly_once,
            sink_commit_without_commit_log_is_recorded_not_rerun,
            second_query_on_a_checkpoint_is_refused,
            deleted_checkpoint_is_refused_then_taken_over,
            old_checkpoint_copy_is_refused,
            lost_table_is_refused,
            other_sink_is_refused,
            concurrent_copies_of_a_query_write_each_batch_once,
            output_modes_are_honoured_or_refused,
            update_mode_is_honoured_or_refused,
            update_mode_replaces_or_logs_changed_groups
        );
    };
    (@cases $harness:ident; $($case:ident),+) => {
        mod sink_conformance {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let harness = super::$harness().await;
                    if let Some(reason) = $crate::SinkHarness::skip_reason(&harness) {
                        eprintln!("SKIPPED {}: {reason}", stringify!($case));
                        return;
                    }
                    $crate::conformance::$case(&harness).await;
                }
            )+
        }
    };
}
