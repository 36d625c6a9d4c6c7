//! One `foreach_batch` query writes each batch to three tables through
//! idempotent table writers: a Delta table by path (append), an Iceberg
//! table by name merged by key, and a Delta table by name overwritten by
//! each batch. The function fails between its writes twice; the replayed
//! batches skip the tables that already hold them, and other engines read
//! every table exactly once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use weir::catalog::{Catalogs, TableFormat, TableOptions};
use weir::delta::DeltaSink;
use weir::prelude::*;
use weir::sink::{TableWriter, WriteOutcome};
use weir::ToTable;
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::{iceberg, json_ids, python, read};

const ROWS: u64 = 101;
const BATCHES: u64 = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_query_fans_out_to_three_tables_each_exactly_once_through_failures() {
    if python().is_none() {
        return;
    }
    let lake = tempfile::tempdir().unwrap();
    let chk = lake.path().join("chk");
    let catalogs = Catalogs::new(weir::catalog::Config::embedded(lake.path()));
    let bronze_path = lake.path().join("bronze");
    let bronze = TableWriter::new(
        DeltaSink::try_new(bronze_path.to_str().unwrap()).unwrap(),
        "fanout-bronze",
    )
    .unwrap();
    let iceberg_table = TableOptions::new().format(TableFormat::Iceberg);
    let accounts = weir::table_writer(&catalogs, "silver.accounts", iceberg_table, "fanout-accounts")
        .await
        .unwrap()
        .merge_on(["account_id"]);
    let delta_table = TableOptions::new().format(TableFormat::Delta);
    let latest = weir::table_writer(&catalogs, "silver.latest", delta_table, "fanout-latest")
        .await
        .unwrap()
        .overwrite();
    // Batch 4 fails after its bronze write, batch 7 after its accounts
    // write: each once.
    let failed: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let skipped: Arc<Mutex<Vec<(&'static str, u64)>>> = Arc::default();
    let mut failures = 0;
    loop {
        let (bronze, accounts, latest) = (bronze.clone(), accounts.clone(), latest.clone());
        let (failed, skipped) = (failed.clone(), skipped.clone());
        let q = read_stream(RateSource::rows_per_batch(ROWS).with_total_rows(ROWS * BATCHES))
            .write_stream()
            .query_name("fanout")
            .checkpoint_location(&chk)
            .trigger(Trigger::available_now())
            .foreach_batch(move |rows, batch| {
                let (bronze, accounts, latest) = (bronze.clone(), accounts.clone(), latest.clone());
                let (failed, skipped) = (failed.clone(), skipped.clone());
                async move {
                    let note = |table: &'static str, outcome: WriteOutcome| {
                        if let WriteOutcome::Skipped { committed } = outcome {
                            assert_eq!(committed, batch, "{table} holds exactly the replayed batch");
                            skipped.lock().unwrap().push((table, batch.0));
                        }
                    };
                    note("bronze", bronze.write(rows.clone(), batch).await?);
                    if batch.0 == 4 && failed.lock().unwrap().insert(4) {
                        return Err("a failure after the bronze write".into());
                    }
                    note("accounts", accounts.write(rows.clone(), batch).await?);
                    if batch.0 == 7 && failed.lock().unwrap().insert(7) {
                        return Err("a failure after the accounts write".into());
                    }
                    note("latest", latest.write(rows, batch).await?);
                    Ok(())
                }
            })
            .await
            .unwrap();
        match q.await_termination().await {
            Ok(()) => break,
            Err(e) => {
                assert!(e.to_string().contains("a failure after"), "{e}");
                failures += 1;
                assert!(failures <= 2, "only the two injected failures: {e}");
            }
        }
    }
    assert_eq!(failures, 2);
    assert_eq!(
        *skipped.lock().unwrap(),
        [("bronze", 4), ("bronze", 7), ("accounts", 7)],
        "a replayed batch skips exactly the tables that hold it"
    );
    for writer in [&bronze, &accounts, &latest] {
        assert_eq!(writer.last_version().await.unwrap(), Some(BatchId(BATCHES - 1)));
        writer.close().await.unwrap();
    }

    let all = (ROWS * BATCHES) as i64;
    let db = lake.path().join("catalog.db");
    let db = db.to_str().unwrap();
    let latest_path = lake.path().join("warehouse/silver/latest");
    for reader in ["deltalake", "duckdb"] {
        // Every id once.
        let ids = json_ids(&read(&["ids", reader, bronze_path.to_str().unwrap()]).expect("readers present"));
        assert_exactly_once(&ids, 0..all);
        // Only the last batch.
        let ids = json_ids(&read(&["ids", reader, latest_path.to_str().unwrap()]).expect("readers present"));
        assert_exactly_once(&ids, all - ROWS as i64..all);
    }
    for reader in ["pyiceberg", "duckdb"] {
        // One row per account (`event_id % 1000`), the latest: the ids past
        // 1,000 replaced accounts 0 to 9.
        let ids = json_ids(&iceberg(&["ids", reader, db, "silver.accounts"]).expect("readers present"));
        assert_exactly_once(&ids, all - 1000..all);
    }
}

/// A writer whose application id is the name a streaming query writes
/// under in the same table is refused, in both formats: its versions would
/// be taken for the query's batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_under_a_streaming_querys_name_is_refused_in_both_formats() {
    if python().is_none() {
        return;
    }
    for format in [TableFormat::Delta, TableFormat::Iceberg] {
        let lake = tempfile::tempdir().unwrap();
        let catalogs = Catalogs::new(weir::catalog::Config::embedded(lake.path()));
        let options = TableOptions::new().format(format);
        let q = read_stream(RateSource::rows_per_batch(ROWS).with_total_rows(2 * ROWS))
            .write_stream()
            .query_name("payments")
            .checkpoint_location(lake.path().join("chk"))
            .trigger(Trigger::available_now())
            .to_table_in(&catalogs, "bronze.payments", options.clone())
            .await
            .unwrap();
        q.await_termination().await.unwrap();
        let writer = weir::table_writer(&catalogs, "bronze.payments", options, "payments")
            .await
            .unwrap();
        let rows = vec![RateSource::generate(1000, 1010)];
        let err = writer.write(rows, BatchId(5)).await.unwrap_err();
        assert!(err.to_string().contains("payments"), "{format:?}: {err}");
        let ids = match format {
            TableFormat::Delta => {
                let table = lake.path().join("warehouse/bronze/payments");
                json_ids(&read(&["ids", "duckdb", table.to_str().unwrap()]).expect("readers present"))
            }
            _ => {
                let db = lake.path().join("catalog.db");
                json_ids(
                    &iceberg(&["ids", "duckdb", db.to_str().unwrap(), "bronze.payments"]).expect("readers present"),
                )
            }
        };
        assert_exactly_once(&ids, 0..2 * ROWS as i64);
    }
}
