//! The Iceberg table as other engines see it: pyiceberg and DuckDB read it,
//! pyiceberg writes it too; markers, summaries, partitions, modes, metadata.

use std::sync::Arc;
use std::time::Duration;
use weir_test_support::operators::CountByKey;

use arrow_array::{RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use serde_json::Value;
use weir_core::prelude::*;
use weir_core::source::RateSource;
use weir_iceberg::IcebergSink;
use weir_test_support::readers::{iceberg, iceberg_ids, json_ids, python, rate_amount_cents};
use weir_test_support::{assert_exactly_once, assert_whole_batches};

use crate::conformance::{event_ids, sqlite_harness, SqlHarness};

const TABLE: &str = "bronze.payments";

async fn run(
    stream: ReadStream,
    chk: &std::path::Path,
    sink: IcebergSink,
    mode: OutputMode,
    last: u64,
) -> Result<StreamingQuery> {
    let q = stream
        .write_stream()
        .query_name("payments-bronze")
        .checkpoint_location(chk)
        .output_mode(mode)
        .stop_after_batch(BatchId(last))
        .start(sink)
        .await?;
    q.await_termination().await?;
    Ok(q)
}

fn rate(rows: u64) -> ReadStream {
    read_stream(RateSource::rows_per_batch(rows))
}

fn describe(h: &SqlHarness) -> Value {
    iceberg(&["describe", &h.reader, TABLE]).expect("readers present")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pyiceberg_and_duckdb_read_every_batch_once_with_markers_and_summaries() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let dir = tempfile::tempdir().unwrap();
    let sink = h.sink_on(TABLE).await.with_partition_by(["bucket(4, account_id)"]);
    let q = run(rate(500), dir.path(), sink, OutputMode::Append, 4).await.unwrap();

    for reader in ["pyiceberg", "duckdb", "duckdb-dir"] {
        let (ids, cents) = iceberg_ids(reader, &h.reader, TABLE).unwrap();
        assert_exactly_once(&ids, 0..2500);
        assert_eq!(cents, Some(rate_amount_cents(2500)), "{reader}");
    }

    let d = describe(&h);
    let properties = &d["properties"];
    assert_eq!(properties["weir.query.payments-bronze.batch-id"], "4");
    assert_eq!(properties["weir.query.payments-bronze.query-id"], q.id().to_string());
    assert_eq!(
        d["partition_spec"],
        serde_json::json!([["account_id", "bucket[4]", "account_id_bucket"]])
    );
    let snapshots = d["snapshots"].as_array().unwrap();
    assert_eq!(snapshots.len(), 5);
    for (i, s) in snapshots.iter().enumerate() {
        assert_eq!(s["operation"], "append");
        assert_eq!(s["summary"]["weir.batch-id"], i.to_string());
        assert_eq!(s["summary"]["weir.query-name"], "payments-bronze");
        assert_eq!(s["summary"]["weir.query-id"], q.id().to_string());
        assert_eq!(s["summary"]["added-records"], "500");
        assert_eq!(s["summary"]["total-records"], ((i + 1) * 500).to_string());
    }
    // Four buckets a batch at most; every file lists its partition.
    let files = d["files"].as_i64().unwrap();
    assert!((5..=20).contains(&files), "{files} files");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pyiceberg_table_takes_weir_batches_and_the_other_way_round() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let db = h.reader.as_str();
    iceberg(&["create", db, &format!("file://{}", h.warehouse.display()), TABLE]).unwrap();
    iceberg(&["append", db, TABLE, "1000000", "10"]).unwrap();
    let chk = tempfile::tempdir().unwrap();
    run(rate(100), chk.path(), h.sink_on(TABLE).await, OutputMode::Append, 2)
        .await
        .unwrap();
    iceberg(&["append", db, TABLE, "2000000", "10"]).unwrap();
    run(rate(100), chk.path(), h.sink_on(TABLE).await, OutputMode::Append, 4)
        .await
        .unwrap();

    let ids = event_ids(&h, TABLE);
    let (ours, theirs): (Vec<i64>, Vec<i64>) = ids.into_iter().partition(|id| *id < 1_000_000);
    assert_exactly_once(&ours, 0..500);
    let mut theirs = theirs;
    theirs.sort_unstable();
    let expected: Vec<i64> = (1_000_000..1_000_010).chain(2_000_000..2_000_010).collect();
    assert_eq!(theirs, expected);
    let d = describe(&h);
    assert_eq!(d["partition_spec"], serde_json::json!([["ts", "day", "ts_day"]]));
    assert_eq!(d["properties"]["weir.query.payments-bronze.batch-id"], "4");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_mode_replaces_every_file_in_one_overwrite() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let dir = tempfile::tempdir().unwrap();
    // The whole result every batch: each id once, with its count.
    let counted = rate(100).with_operator(CountByKey::new("ids", "event_id"));
    run(counted, dir.path(), h.sink_on(TABLE).await, OutputMode::Complete, 2)
        .await
        .unwrap();
    assert_exactly_once(&event_ids(&h, TABLE), 0..300);
    let d = describe(&h);
    let operations: Vec<&str> = d["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["operation"].as_str().unwrap())
        .collect();
    assert_eq!(operations, ["overwrite", "overwrite", "overwrite"]);
    let last = d["snapshots"].as_array().unwrap().last().unwrap();
    assert_eq!(last["summary"]["deleted-records"], "200");
    assert_eq!(last["summary"]["total-records"], "300");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_does_not_fit_the_table_is_refused_by_column() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let dir = tempfile::tempdir().unwrap();
    run(
        rate(10),
        &dir.path().join("a"),
        h.sink_on(TABLE).await,
        OutputMode::Append,
        0,
    )
    .await
    .unwrap();
    let other = rate(10).map_batches(|b| {
        let schema = Schema::new(vec![
            Field::new("event_id", DataType::Int64, false),
            Field::new("amount", DataType::Utf8, false),
            Field::new("note", DataType::Utf8, true),
        ]);
        let n = b.num_rows();
        Ok(RecordBatch::try_new(
            Arc::new(schema),
            vec![
                b.column(0).clone(),
                Arc::new(StringArray::from(vec!["x"; n])),
                Arc::new(StringArray::from(vec![Some("y"); n])),
            ],
        )?)
    });
    let msg = run(
        other,
        &dir.path().join("b"),
        h.sink_on(TABLE).await,
        OutputMode::Append,
        0,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains("\"amount\" is string in the stream and decimal(18, 2) in the table"),
        "{msg}"
    );
    assert!(msg.contains("\"note\" is not in the table"), "{msg}");
    assert!(
        msg.contains("the stream lacks column \"ts\", which the table requires"),
        "{msg}"
    );
    assert_exactly_once(&event_ids(&h, TABLE), 0..10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_metadata_files_are_deleted_past_the_tables_limit() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let dir = tempfile::tempdir().unwrap();
    let sink = h
        .sink_on(TABLE)
        .await
        .with_table_property("write.metadata.previous-versions-max", "3")
        .with_table_property("write.metadata.delete-after-commit.enabled", "true");
    run(rate(10), dir.path(), sink, OutputMode::Append, 9).await.unwrap();

    let metadata_dir = h.warehouse.join("bronze/payments/metadata");
    let versions: Vec<String> = std::fs::read_dir(&metadata_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".metadata.json"))
        .collect();
    // The current version and the three before it.
    assert_eq!(versions.len(), 4, "{versions:?}");
    let hint = std::fs::read_to_string(metadata_dir.join("version-hint.text")).unwrap();
    let current = describe(&h)["metadata_location"].as_str().unwrap().to_string();
    assert!(
        current.ends_with(&format!("/metadata/{}.metadata.json", hint.trim())),
        "{current} vs {hint}"
    );
    assert_exactly_once(&event_ids(&h, TABLE), 0..100);
}

/// Five small manifests merge (`commit.manifest.min-count-to-merge`), in
/// the background: a later commit lists the merged manifest in place of
/// its inputs. Every snapshot reads as it was written, none lists twice
/// the count, and no merged manifest is left that no snapshot lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_manifests_are_merged_ahead_at_the_tables_count() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let dir = tempfile::tempdir().unwrap();
    let sink = h
        .sink_on(TABLE)
        .await
        .with_table_property("commit.manifest.min-count-to-merge", "5");
    let last = 19;
    let q = rate(10)
        .write_stream()
        .checkpoint_location(dir.path())
        // Room for each merge to finish before a later commit.
        .trigger(Trigger::processing_time(Duration::from_millis(100)))
        .stop_after_batch(BatchId(last))
        .start(sink)
        .await
        .unwrap();
    q.await_termination().await.unwrap();

    let out = iceberg(&["manifests", &h.reader, TABLE]).unwrap();
    let snapshots = out["snapshots"].as_array().unwrap();
    assert_eq!(snapshots.len(), last as usize + 1);
    let listed: Vec<Vec<String>> = snapshots
        .iter()
        .map(|s| serde_json::from_value(s["manifests"].clone()).unwrap())
        .collect();
    eprintln!(
        "manifests by snapshot: {:?}",
        listed.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let most = listed.iter().map(Vec::len).max().unwrap();
    assert!(most < 10, "a snapshot lists {most} manifests: {listed:?}");
    let ahead = |m: &String| m.contains("-merged-ahead-");
    assert!(
        listed.iter().flatten().any(ahead),
        "no merge ahead was listed: {listed:?}"
    );
    // Every merged manifest written is listed by a snapshot.
    let metadata_dir = h.warehouse.join("bronze/payments/metadata");
    for entry in std::fs::read_dir(&metadata_dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.contains("-merged-") {
            assert!(
                listed.iter().flatten().any(|m| m.ends_with(&name)),
                "{name} is listed by no snapshot"
            );
        }
    }
    // Every snapshot, before and after each merge, still reads as it was.
    for (i, snapshot) in snapshots.iter().enumerate() {
        let id = snapshot["id"].as_i64().unwrap().to_string();
        let ids = json_ids(&iceberg(&["ids-at", &h.reader, TABLE, &id]).unwrap());
        assert_exactly_once(&ids, 0..(i as i64 + 1) * 10);
    }
    let rows = (last as i64 + 1) * 10;
    for reader in ["pyiceberg", "duckdb"] {
        let out = iceberg(&["ids", reader, &h.reader, TABLE]).unwrap();
        assert_eq!(out["rows"], rows, "{reader}");
    }
}

/// The rate source with a nullable `note` column made from each event id.
fn with_note(rows: u64, nullable: bool) -> ReadStream {
    use arrow_array::cast::AsArray;
    use arrow_array::types::Int64Type;
    rate(rows).map_batches(move |b| {
        let ids = b.column(0).as_primitive::<Int64Type>();
        let notes: StringArray = ids.iter().map(|v| v.map(|v| format!("n{v}"))).collect();
        let mut fields: Vec<Field> = b.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new("note", DataType::Utf8, nullable));
        let mut columns = b.columns().to_vec();
        columns.push(Arc::new(notes));
        Ok(RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_schema_adds_new_optional_columns_in_the_batch_swap() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let dir = tempfile::tempdir().unwrap();
    let chk = dir.path().join("chk");
    run(rate(10), &chk, h.sink_on(TABLE).await, OutputMode::Append, 1)
        .await
        .unwrap();

    // Without merging, the new column is refused; a non-null one even with it.
    let msg = run(with_note(10, true), &chk, h.sink_on(TABLE).await, OutputMode::Append, 3)
        .await
        .unwrap_err()
        .to_string();
    assert!(msg.contains("column \"note\" is not in the table"), "{msg}");
    let sink = h.sink_on(TABLE).await.with_merge_schema(true);
    let msg = run(with_note(10, false), &chk, sink, OutputMode::Append, 3)
        .await
        .unwrap_err()
        .to_string();
    assert!(msg.contains("new column \"note\" is not nullable"), "{msg}");

    let sink = h.sink_on(TABLE).await.with_merge_schema(true);
    run(with_note(10, true), &chk, sink, OutputMode::Append, 3)
        .await
        .unwrap();
    let d = describe(&h);
    let schema = d["schema"].as_array().unwrap();
    assert_eq!(schema.last().unwrap(), &serde_json::json!(["note", "string", false]));
    // The column came with batch 2's snapshot: no version of its own.
    assert_eq!(d["snapshots"].as_array().unwrap().len(), 4);
    assert_exactly_once(&event_ids(&h, TABLE), 0..40);
    // The stream without the column still fits: it is optional.
    run(rate(10), &chk, h.sink_on(TABLE).await, OutputMode::Append, 4)
        .await
        .unwrap();
    assert_exactly_once(&event_ids(&h, TABLE), 0..50);
    let out = iceberg(&["ids", "duckdb", &h.reader, TABLE]).unwrap();
    assert_eq!(out["rows"], 50);
}

/// pyiceberg appends to the table between a batch's file writes and its
/// swap: the swap loses, the sink reloads, checks its marker and commits on
/// top; both writers' rows are there once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_writer_appending_mid_batch_is_rebased_over() {
    use std::sync::atomic::{AtomicBool, Ordering};
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let dir = tempfile::tempdir().unwrap();
    run(rate(10), dir.path(), h.sink_on(TABLE).await, OutputMode::Append, 1)
        .await
        .unwrap();
    let reader = h.reader.clone();
    let done = AtomicBool::new(false);
    let stream = rate(10).map_batches(move |b| {
        use arrow_array::cast::AsArray;
        use arrow_array::types::Int64Type;
        let first = b.column(0).as_primitive::<Int64Type>().iter().next().flatten();
        if first == Some(30) && !done.swap(true, Ordering::SeqCst) {
            iceberg(&["append", &reader, TABLE, "1000000", "10"]).expect("readers present");
        }
        Ok(b)
    });
    run(stream, dir.path(), h.sink_on(TABLE).await, OutputMode::Append, 5)
        .await
        .unwrap();
    let (ours, theirs): (Vec<i64>, Vec<i64>) = event_ids(&h, TABLE).into_iter().partition(|id| *id < 1_000_000);
    assert_exactly_once(&ours, 0..60);
    assert_exactly_once(&theirs, 1_000_000..1_000_010);
    let d = describe(&h);
    let appends = d["snapshots"].as_array().unwrap().len();
    assert_eq!(appends, 7, "six batches and pyiceberg's append");
    assert_eq!(d["properties"]["weir.query.payments-bronze.batch-id"], "5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_hour_and_truncate_partitions_read_back() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let dir = tempfile::tempdir().unwrap();
    let sink = h
        .sink_on(TABLE)
        .await
        .with_partition_by(["account_id", "hour(ts)", "truncate(1000, event_id)"]);
    run(rate(1500), dir.path(), sink, OutputMode::Append, 1).await.unwrap();

    let d = describe(&h);
    assert_eq!(
        d["partition_spec"],
        serde_json::json!([
            ["account_id", "identity", "account_id"],
            ["ts", "hour", "ts_hour"],
            ["event_id", "truncate[1000]", "event_id_trunc"]
        ])
    );
    for reader in ["pyiceberg", "duckdb"] {
        let (ids, cents) = iceberg_ids(reader, &h.reader, TABLE).unwrap();
        assert_exactly_once(&ids, 0..3000);
        assert_eq!(cents, Some(rate_amount_cents(3000)), "{reader}");
    }
}

/// I2: a reader sees all of a batch's files or none. pyiceberg reads the
/// table again and again while batches of several files land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_see_whole_batches_or_none() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let dir = tempfile::tempdir().unwrap();
    let rows = 150_000u64;
    let sink = h
        .sink_on(TABLE)
        .await
        .with_partition_by(["bucket(4, account_id)"])
        .with_target_file_size(64 * 1024);
    let query = rate(rows)
        .write_stream()
        .checkpoint_location(dir.path())
        .writer_parallelism(2)
        // Paced so that the reader (a process per look) looks while batches land.
        .trigger(Trigger::processing_time(std::time::Duration::from_millis(1500)))
        .stop_after_batch(BatchId(4))
        .start(sink)
        .await
        .unwrap();
    let catalog = h.catalog().await;
    let ident = weir_iceberg::parse_ident(TABLE).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    while query.is_active() {
        if weir_iceberg::Catalog::load(catalog.as_ref(), &ident)
            .await
            .unwrap()
            .is_some()
        {
            let ids = event_ids(&h, TABLE);
            seen.insert(assert_whole_batches(&ids, rows));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    query.await_termination().await.unwrap();
    assert_exactly_once(&event_ids(&h, TABLE), 0..(5 * rows) as i64);
    assert!(
        describe(&h)["files"].as_i64().unwrap() >= 20,
        "every batch spans several files"
    );
    assert!(!seen.is_empty(), "the reader never looked while the query ran");
    eprintln!("the reader saw the table at {seen:?} batches");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_queries_sharing_one_catalog_write_one_table_together() {
    if python().is_none() {
        return;
    }
    let h = sqlite_harness().await;
    let dir = tempfile::tempdir().unwrap();
    // One catalog (and its kept metadata) for both sinks: their swaps
    // conflict, and every metadata file they write must still be whole.
    let catalog = h.catalog().await;
    let run_one = |name: &'static str| {
        let sink = IcebergSink::try_new(catalog.clone(), TABLE).unwrap();
        let chk = dir.path().join(name);
        async move {
            let q = rate(50)
                .write_stream()
                .query_name(name)
                .checkpoint_location(chk)
                .stop_after_batch(BatchId(9))
                .start(sink)
                .await
                .unwrap();
            q.await_termination().await.unwrap();
        }
    };
    tokio::join!(run_one("first"), run_one("second"));

    // The rate source gives both queries ids 0..500: each id twice, once
    // per query, none lost or repeated beyond that.
    let ids = iceberg_ids("pyiceberg", &h.reader, TABLE).unwrap().0;
    let mut counts = std::collections::HashMap::new();
    for id in &ids {
        *counts.entry(*id).or_insert(0) += 1;
    }
    assert_eq!(ids.len(), 1000);
    assert!(
        (0..500).all(|id| counts.get(&id) == Some(&2)),
        "some id is not there twice"
    );
    let d = describe(&h);
    assert_eq!(d["properties"]["weir.query.first.batch-id"], "9");
    assert_eq!(d["properties"]["weir.query.second.batch-id"], "9");
    assert_eq!(d["snapshots"].as_array().unwrap().len(), 20);
}
