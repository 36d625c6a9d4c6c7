//! Stateful queries into tables by name, read back by other engines:
//! deduplication (each id once) and per-merchant window totals over
//! events that arrive out of order, some too late, in Append mode (each
//! closed window once, with the totals of its rows on time) and in Update
//! mode (each window once, with its latest totals), through a crash at
//! every point.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use weir::crash::{CrashPoint, CrashPoints};
use weir::prelude::*;

use arrow_array::cast::AsArray;
use arrow_array::types::{Decimal128Type, Int64Type, TimestampMicrosecondType};
use arrow_array::{RecordBatch, TimestampMicrosecondArray};
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
    mode: OutputMode,
) -> Result<(), weir::Error> {
    let mut writer = stream
        .write_stream()
        .output_mode(mode)
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
    crash_then_finish_in(OutputMode::Append, stream, format, check).await
}

async fn crash_then_finish_in(
    mode: OutputMode,
    stream: fn() -> ReadStream,
    format: TableFormat,
    check: impl Fn(&std::path::Path, &str),
) {
    for point in CrashPoint::ALL {
        let lake = tempfile::tempdir().unwrap();
        let chk = lake.path().join("chk");
        let catalogs = Catalogs::new(weir::catalog::Config::embedded(lake.path()));
        match run(stream(), &catalogs, format, &chk, Some(point), mode).await {
            Err(weir::Error::Query(weir_core::Error::InjectedCrash { .. })) => {}
            other => panic!("expected a crash at {point}: {other:?}"),
        }
        run(stream(), &catalogs, format, &chk, None, mode).await.unwrap();
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

/// How far back event `id`'s time is moved: 0 to 2.7 s in steps of 0.3 s,
/// so events arrive out of order within and across batches (700 rows are
/// 0.7 s of event time), and those moved back furthest fall behind the
/// two-second watermark.
fn delay_ms(id: i64) -> i64 {
    (id % 10) * 300
}

/// The rate source's rows with each event time moved back by
/// [`delay_ms`].
fn out_of_order(b: RecordBatch) -> std::result::Result<RecordBatch, BoxError> {
    let ids = b.column(0).as_primitive::<Int64Type>();
    let ts = b.column(1).as_primitive::<TimestampMicrosecondType>();
    let moved = TimestampMicrosecondArray::from_iter_values(
        ids.values()
            .iter()
            .zip(ts.values().iter())
            .map(|(id, t)| t - delay_ms(*id) * 1000),
    )
    .with_timezone_opt(ts.timezone());
    let mut columns = b.columns().to_vec();
    columns[1] = Arc::new(moved);
    Ok(RecordBatch::try_new(b.schema(), columns)?)
}

/// The second query of the worked example: per-merchant totals of each
/// second of event time, a two-second watermark, Append mode, over events
/// that arrive out of order, some too late.
fn merchant_totals() -> ReadStream {
    read_stream(RateSource::rows_per_batch(700).with_total_rows(700 * BATCHES))
        .map_batches(out_of_order)
        .sql("SELECT ts, account_id % 5 AS merchant_id, amount FROM input")
        .with_watermark("ts", Duration::from_secs(2))
        .group_by([window("ts", Duration::from_secs(1)), col("merchant_id")])
        .agg([sum("amount"), count()])
}

/// The windows the final watermark closed (all windows when `closed_only`
/// is false), with their totals, from all the input at once: [window start
/// ms, merchant, cents, count]. A batch drops the rows at or behind its
/// watermark: the latest event time of the batches before it, less two
/// seconds.
fn expected_totals(closed_only: bool) -> Vec<Vec<i64>> {
    let rows = RateSource::generate(0, 700 * BATCHES);
    let ids = rows.column(0).as_primitive::<Int64Type>();
    let ts = rows.column(1).as_primitive::<TimestampMicrosecondType>();
    let accounts = rows.column(2).as_primitive::<Int64Type>();
    let amounts = rows.column(3).as_primitive::<Decimal128Type>();
    let mut groups: BTreeMap<(i64, i64), (i64, i64)> = BTreeMap::new();
    let (mut latest, mut watermark, mut late, mut earlier) = (None::<i64>, 0, 0, 0);
    for batch in 0..BATCHES as usize {
        if let Some(latest) = latest {
            watermark = i64::max(watermark, latest - 2000);
        }
        for r in batch * 700..(batch + 1) * 700 {
            let ms = ts.value(r) / 1000 - delay_ms(ids.value(r));
            if latest.is_some_and(|l| ms < l) {
                earlier += 1;
            }
            latest = Some(latest.map_or(ms, |l| l.max(ms)));
            if watermark != 0 && ms <= watermark {
                late += 1;
                continue;
            }
            let g = groups
                .entry((ms - ms.rem_euclid(1000), accounts.value(r) % 5))
                .or_default();
            g.0 += amounts.value(r) as i64;
            g.1 += 1;
        }
    }
    assert!(
        late > 100 && earlier > 1000,
        "the input is out of order ({earlier} rows), some of it late ({late})"
    );
    let watermark = latest.expect("rows") - 2000;
    let closed: Vec<Vec<i64>> = groups
        .into_iter()
        .filter(|((start, _), _)| !closed_only || start + 1000 <= watermark)
        .map(|((start, merchant), (cents, n))| vec![start, merchant, cents, n])
        .collect();
    assert!(closed.len() >= 20, "the test closes several windows: {}", closed.len());
    closed
}

/// How many actions of `kind` a Delta table's log holds.
fn log_actions(table: &std::path::Path, kind: &str) -> usize {
    let prefix = format!("{{\"{kind}\"");
    let log = std::fs::read_dir(table.join("_delta_log")).expect("a Delta log");
    log.map(|e| e.expect("log entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| std::fs::read_to_string(p).expect("read a log entry"))
        .map(|text| text.lines().filter(|l| l.starts_with(&prefix)).count())
        .sum()
}

fn groups(out: &serde_json::Value) -> Vec<Vec<i64>> {
    serde_json::from_value(out["groups"].clone()).expect("groups")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_totals_into_delta_hold_each_closed_window_once_through_a_crash_at_every_point() {
    if python().is_none() {
        return;
    }
    let expected = expected_totals(true);
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
    let expected = expected_totals(true);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_totals_in_update_mode_into_delta_hold_each_window_once_with_its_latest_totals() {
    if python().is_none() {
        return;
    }
    let expected = expected_totals(false);
    crash_then_finish_in(
        OutputMode::Update,
        merchant_totals,
        TableFormat::Delta,
        |lake, point| {
            let table = lake.join("warehouse/silver/out");
            let table = table.to_str().unwrap();
            for reader in ["deltalake", "duckdb"] {
                let got = groups(&read(&["window-totals", reader, table]).expect("readers present"));
                assert_eq!(got, expected, "{reader} after a crash at {point}");
            }
            // Windows span batches (700 rows are 0.7 s of event time), so later
            // batches replaced rows of earlier ones: the log removes files.
            let removes = log_actions(&lake.join("warehouse/silver/out"), "remove");
            assert!(removes >= BATCHES as usize / 2, "{removes} files replaced");
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_totals_in_update_mode_into_iceberg_hold_each_window_once_with_its_latest_totals() {
    if python().is_none() {
        return;
    }
    let expected = expected_totals(false);
    crash_then_finish_in(
        OutputMode::Update,
        merchant_totals,
        TableFormat::Iceberg,
        |lake, point| {
            let db = lake.join("catalog.db");
            let db = db.to_str().unwrap();
            for reader in ["pyiceberg", "duckdb"] {
                let got = groups(&iceberg(&["window-totals", reader, db, TABLE]).expect("readers present"));
                assert_eq!(got, expected, "{reader} after a crash at {point}");
            }
            // Windows span batches, so later batches replaced rows of earlier
            // ones: overwrite snapshots deleted files.
            let described = iceberg(&["describe", db, TABLE]).expect("readers present");
            let overwrites = described["snapshots"]
                .as_array()
                .expect("snapshots")
                .iter()
                .filter(|s| {
                    s["operation"] == "overwrite"
                        && s["summary"]["deleted-data-files"].as_str().is_some_and(|n| n != "0")
                })
                .count();
            assert!(
                overwrites >= BATCHES as usize / 2,
                "{overwrites} snapshots replaced files: {described}"
            );
        },
    )
    .await;
}
