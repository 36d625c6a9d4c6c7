//! Output modes: each honoured, or refused before anything is written.

use weir_core::{Error, OutputMode};

use super::*;
use crate::data::assert_exactly_once;

/// Update mode hands the sink each batch's changed groups (here each id
/// once, as ids never repeat), or is refused.
pub async fn update_mode_is_honoured_or_refused(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    let supported = h.sink().await.check_output_mode(OutputMode::Update).is_ok();
    let result = run_to(h, counted(&chk).output_mode(OutputMode::Update), 2).await;
    if supported {
        result.expect("update mode");
        assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..3));
    } else {
        assert!(
            matches!(
                result,
                Err(Error::UnsupportedOutputMode {
                    mode: OutputMode::Update,
                    ..
                })
            ),
            "{result:?}"
        );
        // Refused before the sink was prepared or the checkpoint written.
        assert!(!chk.has("metadata").await);
    }
}

/// Update mode with groups that change in every batch (seven groups of the
/// ids modulo 7, counted): a sink that replaces groups holds each once with
/// its latest count, one that logs changes holds each batch's change; or
/// the mode is refused.
pub async fn update_mode_replaces_or_logs_changed_groups(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    let stream = crate::operators::counted_groups(ROWS, 7);
    let writer = query_of(stream, &chk).output_mode(OutputMode::Update);
    if h.sink().await.check_output_mode(OutputMode::Update).is_err() {
        let result = run_to(h, writer, 2).await;
        assert!(matches!(result, Err(Error::UnsupportedOutputMode { .. })), "{result:?}");
        return;
    }
    run_to(h, writer, 2).await.expect("update mode");
    let ids = h.read_event_ids().await;
    if h.replaces_groups() {
        assert_exactly_once(&ids, 0..7);
    } else {
        // Every batch of 100 ids changes all seven groups.
        let expected: Vec<i64> = (0..3).flat_map(|_| 0..7).collect();
        let mut got = ids.clone();
        got.sort_unstable();
        let mut expected = expected;
        expected.sort_unstable();
        assert_eq!(got, expected);
    }
}

/// Complete mode replaces the table's rows with the whole result each
/// batch, or is refused.
pub async fn output_modes_are_honoured_or_refused(h: &dyn SinkHarness) {
    let chk = CaseCheckpoint::new(h);
    let supported = h.sink().await.check_output_mode(OutputMode::Complete).is_ok();
    let result = run_to(h, counted(&chk).output_mode(OutputMode::Complete), 2).await;
    if supported {
        result.expect("complete mode");
        // Each id once: the last batch's whole result replaced the others.
        assert_exactly_once(&h.read_event_ids().await, ids_of_batches(0..3));
    } else {
        assert!(
            matches!(
                result,
                Err(Error::UnsupportedOutputMode {
                    mode: OutputMode::Complete,
                    ..
                })
            ),
            "{result:?}"
        );
        assert!(h.read_event_ids().await.is_empty());
    }
}
