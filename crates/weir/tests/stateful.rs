//! Stateful queries into tables by name, read back by other engines:
//! deduplication (each id once) and per-merchant window totals in Append
//! mode (each closed window once, with its totals), through a crash at
//! every point.

use std::collections::BTreeMap;
use std::time::Duration;
use weir::crash::{CrashPoint, CrashPoints};
use weir::prelude::*;

use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Int64Type, TimestampMicrosecondType};
use weir_sql::{col, count, sum, window, StreamSqlExt};
use weir_test_support::assert_exactly_once;
use weir_test_support::readers::{iceberg, json_ids, python, read};

const BATCHES: u64 = 10;
const TABLE: &str = "silver.out";

/// Every id twice (`event_id / 2`), the two often in different batches
/// (101 rows a batch), deduplicated.
fn deduplicated() -> ReadStream {
    read_stream(RateSource::rows_per_batch(101).with_total_rows(101 * BATCHES))
        .sql("SELECT event_id / 2 AS event_id, ts, account_id, amount FROM input")
        .drop_duplicates(["event_id"])
}

async fn run(
    stream: ReadStream,
    catalogs: &Catalogs,
    format: TableFormat,
    chk: &std::path::Path,
    crash: Option<CrashPoint>,
) -> Result<(), weir::Error> {
    let mut writer = stream
        .write_stream()
        .query_name("stateful")
        .checkpoint_location(chk)
        .trigger(Trigger::available_now());
    if let Some(point) = crash {
        writer = writer.crash_points(CrashPoints::new().fail_at(point, Some(BatchId(3))));
    }
    let q = writer
        .to_table_in(catalogs, TABLE, TableOptions::new().format(format))
        .await?;
    q.await_termination().await?;
    Ok(())
}

async fn crash_then_finish(stream: fn() -> ReadStream, format: TableFormat, check: impl Fn(&std::path::Path, &str)) {
    for point in CrashPoint::ALL {
        let lake = tempfile::tempdir().unwrap();
        let chk = lake.path().join("chk");
        let catalogs = Catalogs::new(weir::catalog::Config::embedded(lake.path()));
        match run(stream(), &catalogs, format, &chk, Some(point)).await {
            Err(weir::Error::Query(weir_core::Error::InjectedCrash { .. })) => {}
            other => panic!("expected a crash at {point}: {other:?}"),
        }
        run(stream(), &catalogs, format, &chk, None).await.unwrap();
        check(lake.path(), point.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deduplication_into_delta_keeps_each_id_once_through_a_crash_at_every_point() {
    if python().is_none() {
        return;
    }
    crash_then_finish(deduplicated, TableFormat::Delta, |lake, point| {
        let table = lake.join("warehouse/silver/out");
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
    crash_then_finish(deduplicated, TableFormat::Iceberg, |lake, point| {
        let db = lake.join("catalog.db");
        let db = db.to_str().unwrap();
        for reader in ["pyiceberg", "duckdb"] {
            let ids = json_ids(&iceberg(&["ids", reader, db, TABLE]).expect("readers present"));
            assert_exactly_once(&ids, 0..(101 * BATCHES as i64 / 2));
            eprintln!("{reader} after a crash at {point}: {} ids once", ids.len());
        }
    })
    .await;
}

/// The second query of the worked example: per-merchant totals of each
/// second of event time, a two-second watermark, Append mode.
fn merchant_totals() -> ReadStream {
    read_stream(RateSource::rows_per_batch(700).with_total_rows(700 * BATCHES))
        .sql("SELECT ts, account_id % 5 AS merchant_id, amount FROM input")
        .with_watermark("ts", Duration::from_secs(2))
        .group_by([window("ts", Duration::from_secs(1)), col("merchant_id")])
        .agg([sum("amount"), count()])
}

/// The windows the final watermark closed, with their totals, from all the
/// input at once: [window start ms, merchant, cents, count].
fn expected_totals() -> Vec<Vec<i64>> {
    let rows = RateSource::generate(0, 700 * BATCHES);
    let ts = rows.column(1).as_primitive::<TimestampMicrosecondType>();
    let accounts = rows.column(2).as_primitive::<Int64Type>();
    let amounts = rows.column(3).as_primitive::<Decimal128Type>();
    let mut groups: BTreeMap<(i64, i64), (i64, i64)> = BTreeMap::new();
    let mut latest = i64::MIN;
    for r in 0..rows.num_rows() {
        let ms = ts.value(r) / 1000;
        latest = latest.max(ms);
        let g = groups
            .entry((ms - ms.rem_euclid(1000), accounts.value(r) % 5))
            .or_default();
        g.0 += amounts.value(r) as i64;
        g.1 += 1;
    }
    let watermark = latest - 2000;
    let closed: Vec<Vec<i64>> = groups
        .into_iter()
        .filter(|((start, _), _)| start + 1000 <= watermark)
        .map(|((start, merchant), (cents, n))| vec![start, merchant, cents, n])
        .collect();
    assert!(closed.len() >= 20, "the test closes several windows: {}", closed.len());
    closed
}

fn groups(out: &serde_json::Value) -> Vec<Vec<i64>> {
    serde_json::from_value(out["groups"].clone()).expect("groups")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_totals_into_delta_hold_each_closed_window_once_through_a_crash_at_every_point() {
    if python().is_none() {
        return;
    }
    let expected = expected_totals();
    crash_then_finish(merchant_totals, TableFormat::Delta, |lake, point| {
        let table = lake.join("warehouse/silver/out");
        let table = table.to_str().unwrap();
        for reader in ["deltalake", "duckdb"] {
            let got = groups(&read(&["window-totals", reader, table]).expect("readers present"));
            assert_eq!(got, expected, "{reader} after a crash at {point}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_totals_into_iceberg_hold_each_closed_window_once_through_a_crash_at_every_point() {
    if python().is_none() {
        return;
    }
    let expected = expected_totals();
    crash_then_finish(merchant_totals, TableFormat::Iceberg, |lake, point| {
        let db = lake.join("catalog.db");
        let db = db.to_str().unwrap();
        for reader in ["pyiceberg", "duckdb"] {
            let got = groups(&iceberg(&["window-totals", reader, db, TABLE]).expect("readers present"));
            assert_eq!(got, expected, "{reader} after a crash at {point}");
        }
    })
    .await;
}
