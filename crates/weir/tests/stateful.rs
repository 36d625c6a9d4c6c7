//! Stateful queries into tables by name: deduplication across batches and
//! crashes, read back by other engines (each id once).

use weir::crash::{CrashPoint, CrashPoints};
use weir::prelude::*;
use weir_sql::StreamSqlExt;
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::{iceberg, json_ids, python, read};

const BATCHES: u64 = 10;

/// Every id twice (`event_id / 2`), the two often in different batches
/// (101 rows a batch), deduplicated.
fn deduplicated() -> ReadStream {
    read_stream(RateSource::rows_per_batch(101).with_total_rows(101 * BATCHES))
        .sql("SELECT event_id / 2 AS event_id, ts, account_id, amount FROM input")
        .drop_duplicates(["event_id"])
}

async fn run(
    catalogs: &Catalogs,
    format: TableFormat,
    chk: &std::path::Path,
    crash: Option<CrashPoint>,
) -> Result<(), weir::Error> {
    let mut writer = deduplicated()
        .write_stream()
        .query_name("dedup")
        .checkpoint_location(chk)
        .trigger(Trigger::available_now());
    if let Some(point) = crash {
        writer = writer.crash_points(CrashPoints::new().fail_at(point, Some(BatchId(3))));
    }
    let q = writer
        .to_table_in(catalogs, "silver.unique", TableOptions::new().format(format))
        .await?;
    q.await_termination().await?;
    Ok(())
}

async fn crash_then_finish(format: TableFormat, check: impl Fn(&std::path::Path, &str)) {
    for point in CrashPoint::ALL {
        let lake = tempfile::tempdir().unwrap();
        let chk = lake.path().join("chk");
        let catalogs = Catalogs::new(weir::catalog::Config::embedded(lake.path()));
        match run(&catalogs, format, &chk, Some(point)).await {
            Err(weir::Error::Query(weir_core::Error::InjectedCrash { .. })) => {}
            other => panic!("expected a crash at {point}: {other:?}"),
        }
        run(&catalogs, format, &chk, None).await.unwrap();
        check(lake.path(), point.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deduplication_into_delta_keeps_each_id_once_through_a_crash_at_every_point() {
    if python().is_none() {
        return;
    }
    crash_then_finish(TableFormat::Delta, |lake, point| {
        let table = lake.join("warehouse/silver/unique");
        let table = table.to_str().unwrap();
        for reader in ["deltalake", "duckdb"] {
            let ids = json_ids(&read(&["ids", reader, table]).expect("readers present"));
            assert_exactly_once(&ids, 0..(101 * BATCHES as i64 / 2));
            eprintln!("{reader} after a crash at {point}: {} ids once", ids.len());
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deduplication_into_iceberg_keeps_each_id_once_through_a_crash_at_every_point() {
    if python().is_none() {
        return;
    }
    crash_then_finish(TableFormat::Iceberg, |lake, point| {
        let db = lake.join("catalog.db");
        let db = db.to_str().unwrap();
        for reader in ["pyiceberg", "duckdb"] {
            let ids = json_ids(&iceberg(&["ids", reader, db, "silver.unique"]).expect("readers present"));
            assert_exactly_once(&ids, 0..(101 * BATCHES as i64 / 2));
            eprintln!("{reader} after a crash at {point}: {} ids once", ids.len());
        }
    })
    .await;
}
