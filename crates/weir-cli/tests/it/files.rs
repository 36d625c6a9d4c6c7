//! `weir files`, run as a process on a file sink's output.

use std::path::Path;

use crate::common::*;
use weir_core::prelude::*;
use weir_files::FileSink;

/// Writes batches 0..=`last` of 10 rows into `out` through the file sink,
/// compacting the log every 4 batches.
fn write(out: &Path, chk: &Path, last: u64) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        read_stream(RateSource::rows_per_batch(10))
            .write_stream()
            .query_name("files")
            .checkpoint_location(chk)
            .stop_after_batch(BatchId(last))
            .start(
                FileSink::try_new(out.to_str().unwrap())
                    .unwrap()
                    .with_log_compact_interval(4),
            )
            .await
            .unwrap()
            .await_termination()
            .await
            .unwrap();
    });
}

#[test]
fn ls_compact_log_and_orphans_show_the_output_through_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    write(&out, &dir.path().join("chk"), 5);
    let d = out.to_str().unwrap();

    let text = ok(dir.path(), &["files", "ls", d]);
    assert!(text.contains("batch 5 of query \"files\""), "{text}");
    assert!(text.contains("rows in 6 batches"), "{text}");
    let listed = json_lines(&ok(dir.path(), &["files", "ls", d, "--json"]));
    let rows: u64 = listed.iter().map(|f| f["rows"].as_u64().unwrap()).sum();
    assert_eq!(rows, 60);

    let text = ok(dir.path(), &["files", "compact-log", d]);
    assert!(text.contains("compacted at batch 5"), "{text}");
    assert!(out.join("_weir_metadata/5.compact").exists());
    assert_eq!(
        json_lines(&ok(dir.path(), &["files", "ls", d, "--json"])).len(),
        listed.len()
    );

    std::fs::write(
        out.join("part-00001-stray-attempt-p000-000.zstd.parquet"),
        b"a failed attempt's file",
    )
    .unwrap();
    let found = json_lines(&ok(
        dir.path(),
        &["files", "orphans", d, "--older-than", "0s", "--json"],
    ));
    assert_eq!(found.len(), 1);
    assert_eq!(found[0]["path"], "part-00001-stray-attempt-p000-000.zstd.parquet");
    let e = failure(dir.path(), &["files", "orphans", d, "--older-than", "0s", "--delete"]);
    assert!(e.contains("younger than a minute"), "{e}");
    assert!(out.join("part-00001-stray-attempt-p000-000.zstd.parquet").exists());

    let e = failure(dir.path(), &["files", "ls", "s3:/nope"]);
    assert!(
        e.contains("invalid output location") && e.contains("no such directory"),
        "{e}"
    );
}
