//! Spark, the reference implementation of both formats (Delta Lake on
//! Spark, Iceberg's Spark runtime through the JDBC catalog), reads every
//! kind of table weir writes, beside DuckDB, ClickHouse (chdb) and the
//! format's Python reader: each reader sees every id once and the same
//! amounts. One Spark reads all the tables (one JVM for the file).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{
    Array, ArrayRef, BooleanArray, Date32Array, Decimal128Array, Int32Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use weir::prelude::*;
use weir_test_support::operators::counted_groups;
use weir_test_support::readers::{iceberg, python, read, wrong_rows, Spark};

/// Rows a batch; every table but the compacted ones (five batches) and
/// those of many commits (twelve) takes three batches.
const ROWS: u64 = 100;

/// Partition values of every kind the Delta protocol escapes: `:`, `%`,
/// space, `/`, `=`, non-ASCII, the empty string (null, as in Spark) and
/// null.
const ZONES: [Option<&str>; 8] = [
    Some("10:00 utc"),
    Some("50%"),
    Some("a/b"),
    Some("k=v"),
    Some("zürich"),
    Some(""),
    None,
    Some("plain"),
];

/// A table in the matrix: how Spark reads it, how the other readers do,
/// and the ids it holds.
struct Case {
    name: &'static str,
    spark: serde_json::Value,
    others: Vec<(&'static str, Vec<String>)>,
    ids: Range<i64>,
}

type Map = fn(RecordBatch) -> std::result::Result<RecordBatch, BoxError>;

fn with_columns(b: RecordBatch, added: Vec<(&str, ArrayRef)>) -> std::result::Result<RecordBatch, BoxError> {
    let mut fields = b.schema().fields().to_vec();
    let mut columns = b.columns().to_vec();
    for (name, column) in added {
        fields.push(Arc::new(arrow_schema::Field::new(
            name,
            column.data_type().clone(),
            true,
        )));
        columns.push(column);
    }
    Ok(RecordBatch::try_new(
        Arc::new(arrow_schema::Schema::new(fields)),
        columns,
    )?)
}

fn event_ids(b: &RecordBatch) -> Vec<i64> {
    use arrow_array::cast::AsArray;
    b.column(0)
        .as_primitive::<arrow_array::types::Int64Type>()
        .values()
        .to_vec()
}

/// The rate source with a `zone` column cycling through [`ZONES`].
fn with_zones(b: RecordBatch) -> std::result::Result<RecordBatch, BoxError> {
    let zones: StringArray = event_ids(&b).iter().map(|i| ZONES[*i as usize % ZONES.len()]).collect();
    with_columns(b, vec![("zone", Arc::new(zones))])
}

/// The rate source with a date, a boolean and an integer column.
fn with_kinds(b: RecordBatch) -> std::result::Result<RecordBatch, BoxError> {
    let ids = event_ids(&b);
    let days: Date32Array = ids.iter().map(|i| Some(20_000 + (*i as i32 / 70))).collect();
    let flags: BooleanArray = ids.iter().map(|i| Some(i % 2 == 0)).collect();
    let small: Int32Array = ids.iter().map(|i| Some((i % 3) as i32 - 1)).collect();
    with_columns(
        b,
        vec![
            ("day", Arc::new(days)),
            ("flag", Arc::new(flags)),
            ("small", Arc::new(small)),
        ],
    )
}

/// The rate source with a `note` column.
fn with_note(b: RecordBatch) -> std::result::Result<RecordBatch, BoxError> {
    let notes: StringArray = event_ids(&b).iter().map(|i| Some(format!("note {i}"))).collect();
    with_columns(b, vec![("note", Arc::new(notes))])
}

/// The rate source with an instant, a timestamp without a zone and a
/// decimal, each with a few values.
fn with_times(b: RecordBatch) -> std::result::Result<RecordBatch, BoxError> {
    let ids = event_ids(&b);
    let base = 1_767_225_600_000_000_i64;
    let at = TimestampMicrosecondArray::from_iter_values(ids.iter().map(|i| base + i / 70 * 60_000_000_123))
        .with_timezone("UTC");
    let local = TimestampMicrosecondArray::from_iter_values(ids.iter().map(|i| base + (i % 2) * 3_600_000_000));
    // Non-negative: Python deltalake turns a negative decimal partition
    // value into a string it cannot parse (`-0.25` as `0.-25`), in tables
    // it writes itself too.
    let price = Decimal128Array::from_iter_values(ids.iter().map(|i| i128::from(i % 3) * 125 + 5))
        .with_precision_and_scale(10, 2)?;
    with_columns(
        b,
        vec![
            ("at", Arc::new(at)),
            ("local", Arc::new(local)),
            ("price", Arc::new(price)),
        ],
    )
}

fn same(b: RecordBatch) -> std::result::Result<RecordBatch, BoxError> {
    Ok(b)
}

async fn write(catalogs: &Catalogs, chk: &std::path::Path, name: &str, options: TableOptions, map: Map, batches: u64) {
    let q = read_stream(RateSource::rows_per_batch(ROWS))
        .map_batches(map)
        .write_stream()
        .checkpoint_location(chk.join(name))
        .stop_after_batch(BatchId(batches - 1))
        .to_table_in(catalogs, name, options)
        .await
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    q.await_termination()
        .await
        .unwrap_or_else(|e| panic!("run {name}: {e}"));
}

fn delta(partition_by: &[&str]) -> TableOptions {
    TableOptions::new()
        .format(TableFormat::Delta)
        .partition_by(partition_by.iter().copied())
}

fn iceberg_options(partition_by: &[&str]) -> TableOptions {
    TableOptions::new()
        .format(TableFormat::Iceberg)
        .partition_by(partition_by.iter().copied())
}

/// A Delta table read by every reader, as of `version` (time travel) if
/// given.
fn delta_case(name: &'static str, dir: &str, version: Option<i64>, ids: Range<i64>) -> Case {
    let mut read = serde_json::json!({"op": "read", "format": "delta", "table": dir});
    if let Some(v) = version {
        read["version"] = v.into();
    }
    let others = ["deltalake", "duckdb", "clickhouse"]
        .map(|r| {
            let mut args = vec!["ids".to_string(), r.into(), dir.into()];
            args.extend(version.map(|v| v.to_string()));
            (r, args)
        })
        .to_vec();
    Case {
        name,
        spark: read,
        others,
        ids,
    }
}

/// An Iceberg table read by every reader, as of `snapshot` (time travel)
/// if given.
fn iceberg_case(name: &'static str, db: &str, table: &str, snapshot: Option<i64>, ids: Range<i64>) -> Case {
    let mut read = serde_json::json!({"op": "read", "format": "iceberg", "catalog": db, "table": table});
    if let Some(s) = snapshot {
        read["snapshot"] = s.into();
    }
    let others = ["pyiceberg", "duckdb", "clickhouse"]
        .map(|r| {
            let mut args = vec!["ids".to_string(), r.into(), db.into(), table.into()];
            args.extend(snapshot.map(|s| s.to_string()));
            (r, args)
        })
        .to_vec();
    Case {
        name,
        spark: read,
        others,
        ids,
    }
}

/// The latest snapshot of an Iceberg table.
fn current_snapshot(db: &str, table: &str) -> i64 {
    let d = iceberg(&["describe", db, table]).expect("readers present");
    let snapshots = d["snapshots"].as_array().expect("snapshots");
    snapshots.last().expect("a snapshot")["id"].as_i64().expect("an id")
}

/// The newest version of a Delta table.
fn delta_version(dir: &str) -> i64 {
    read(&["describe", dir]).expect("readers present")["version"]
        .as_i64()
        .expect("a version")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spark_duckdb_clickhouse_and_the_python_readers_read_every_table_weir_writes() {
    if python().is_none() {
        return;
    }
    let lake = tempfile::tempdir().unwrap();
    let chk = tempfile::tempdir().unwrap();
    let catalogs = Catalogs::new(weir::catalog::Config::embedded(lake.path()));
    let dir = |name: &str| {
        lake.path()
            .join("warehouse")
            .join(name.replace('.', "/"))
            .to_str()
            .unwrap()
            .to_string()
    };
    let db = lake.path().join("catalog.db").to_str().unwrap().to_string();
    let all = 0..3 * ROWS as i64;
    let mut cases = Vec::new();

    // Delta: plain, partitioned by every kind of value, compacted (and
    // read as of before), vacuumed, with a log checkpoint.
    write(&catalogs, chk.path(), "bronze.plain", delta(&[]), same, 3).await;
    cases.push(delta_case("delta plain", &dir("bronze.plain"), None, all.clone()));
    write(&catalogs, chk.path(), "bronze.zones", delta(&["zone"]), with_zones, 3).await;
    cases.push(delta_case(
        "delta by escaped strings",
        &dir("bronze.zones"),
        None,
        all.clone(),
    ));
    write(
        &catalogs,
        chk.path(),
        "bronze.kinds",
        delta(&["day", "flag", "small"]),
        with_kinds,
        3,
    )
    .await;
    cases.push(delta_case(
        "delta by date, boolean, int",
        &dir("bronze.kinds"),
        None,
        all.clone(),
    ));
    write(
        &catalogs,
        chk.path(),
        "bronze.times",
        delta(&["at", "local", "price"]),
        with_times,
        3,
    )
    .await;
    cases.push(delta_case(
        "delta by timestamp, timestamp_ntz, decimal",
        &dir("bronze.times"),
        None,
        all.clone(),
    ));
    for name in ["bronze.compacted", "bronze.vacuumed"] {
        write(&catalogs, chk.path(), name, delta(&["zone"]), with_zones, 5).await;
    }
    let before = delta_version(&dir("bronze.compacted"));
    catalogs.table("bronze.compacted").compact().await.unwrap();
    assert!(delta_version(&dir("bronze.compacted")) > before, "compaction committed");
    cases.push(delta_case("delta compacted", &dir("bronze.compacted"), None, 0..500));
    cases.push(delta_case(
        "delta as of before compaction",
        &dir("bronze.compacted"),
        Some(before),
        0..500,
    ));
    catalogs.table("bronze.vacuumed").compact().await.unwrap();
    catalogs
        .table("bronze.vacuumed")
        .vacuum()
        .with_retention(Duration::ZERO)
        .with_force(true)
        .await
        .unwrap();
    cases.push(delta_case("delta vacuumed", &dir("bronze.vacuumed"), None, 0..500));
    // Version 0 creates the table, 1..=12 are the batches: the sink's
    // background checkpoints are of versions 4 and 9, and the query waits
    // for the last as it stops. Readers start from the newest.
    let options = delta(&[]).property("delta.checkpointInterval", "5");
    write(&catalogs, chk.path(), "bronze.checkpointed", options, same, 12).await;
    let log = std::path::Path::new(&dir("bronze.checkpointed")).join("_delta_log");
    let last = std::fs::read(log.join("_last_checkpoint")).expect("_last_checkpoint");
    let last: serde_json::Value = serde_json::from_slice(&last).unwrap();
    assert_eq!(last["version"], 9, "{last}");
    assert!(log.join("00000000000000000009.checkpoint.parquet").exists());
    cases.push(delta_case(
        "delta with a log checkpoint",
        &dir("bronze.checkpointed"),
        None,
        0..1200,
    ));

    // Both formats: Complete mode (the whole result each batch: 7 groups
    // counted, ids 0..7), and a query whose schema grows when it restarts
    // for its third batch, merged into the table.
    for (format, name) in [
        (TableFormat::Delta, "bronze.complete"),
        (TableFormat::Iceberg, "silver.complete"),
    ] {
        let q = counted_groups(50, 7)
            .write_stream()
            .output_mode(OutputMode::Complete)
            .checkpoint_location(chk.path().join(name))
            .stop_after_batch(BatchId(2))
            .to_table_in(&catalogs, name, TableOptions::new().format(format))
            .await
            .unwrap();
        q.await_termination().await.unwrap();
    }
    cases.push(delta_case(
        "delta after Complete mode",
        &dir("bronze.complete"),
        None,
        0..7,
    ));
    cases.push(iceberg_case(
        "iceberg after Complete mode",
        &db,
        "silver.complete",
        None,
        0..7,
    ));
    for (name, options) in [
        ("bronze.merged", delta(&[]).merge_schema(true)),
        ("silver.merged", iceberg_options(&[]).merge_schema(true)),
    ] {
        write(&catalogs, chk.path(), name, options.clone(), same, 2).await;
        // The query restarted with a column more: its third batch adds it.
        write(&catalogs, chk.path(), name, options, with_note, 3).await;
    }
    cases.push(delta_case(
        "delta after schema merging",
        &dir("bronze.merged"),
        None,
        all.clone(),
    ));
    cases.push(iceberg_case(
        "iceberg after schema merging",
        &db,
        "silver.merged",
        None,
        all.clone(),
    ));

    // Iceberg: plain, partitioned by every transform, compacted (and read
    // as of before), expired, with merged manifests.
    let specs: [(&'static str, &str, &[&str]); 5] = [
        ("iceberg plain", "silver.plain", &[]),
        (
            "iceberg by bucket, day",
            "silver.bucket_day",
            &["bucket(4, account_id)", "day(ts)"],
        ),
        (
            "iceberg by truncate, hour",
            "silver.truncate_hour",
            &["truncate(100, event_id)", "hour(ts)"],
        ),
        ("iceberg by month", "silver.month", &["month(ts)"]),
        ("iceberg by year, identity", "silver.year", &["year(ts)", "account_id"]),
    ];
    for (case, name, partition_by) in specs {
        write(&catalogs, chk.path(), name, iceberg_options(partition_by), same, 3).await;
        cases.push(iceberg_case(case, &db, name, None, all.clone()));
    }
    for name in ["silver.compacted", "silver.expired"] {
        write(
            &catalogs,
            chk.path(),
            name,
            iceberg_options(&["bucket(2, account_id)"]),
            same,
            5,
        )
        .await;
    }
    let before = current_snapshot(&db, "silver.compacted");
    catalogs.table("silver.compacted").compact().await.unwrap();
    assert_ne!(
        current_snapshot(&db, "silver.compacted"),
        before,
        "compaction committed"
    );
    cases.push(iceberg_case("iceberg compacted", &db, "silver.compacted", None, 0..500));
    cases.push(iceberg_case(
        "iceberg as of before compaction",
        &db,
        "silver.compacted",
        Some(before),
        0..500,
    ));
    catalogs.table("silver.expired").compact().await.unwrap();
    catalogs
        .table("silver.expired")
        .expire_snapshots()
        .with_retain_last(1)
        .with_older_than(Duration::ZERO)
        .await
        .unwrap();
    cases.push(iceberg_case("iceberg expired", &db, "silver.expired", None, 0..500));
    // Twelve appends, one manifest each, merged once three are small: in
    // the background, or in the commit once six wait. Either way the
    // current snapshot lists a merged manifest and fewer than twelve.
    let options = iceberg_options(&[]).property("commit.manifest.min-count-to-merge", "3");
    write(&catalogs, chk.path(), "silver.manifests", options, same, 12).await;
    let listed = iceberg(&["manifests", &db, "silver.manifests"]).expect("readers present");
    let newest = listed["snapshots"]
        .as_array()
        .and_then(|s| s.last())
        .expect("a snapshot");
    let current: Vec<String> = serde_json::from_value(newest["manifests"].clone()).expect("manifest paths");
    assert!(
        current.len() < 12 && current.iter().any(|m| m.contains("-merged-")),
        "{current:?}"
    );
    cases.push(iceberg_case(
        "iceberg with merged manifests",
        &db,
        "silver.manifests",
        None,
        0..1200,
    ));

    let Some(mut spark) = Spark::start() else { return };
    let mut failures = Vec::new();
    for case in &cases {
        if let Some(wrong) = wrong_rows(&spark.run(case.spark.clone()), case.ids.clone()) {
            failures.push(format!("{} by Spark: {wrong}", case.name));
        }
        for (reader, args) in &case.others {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let script: fn(&[&str]) -> Option<serde_json::Value> =
                if case.spark["format"] == "delta" { read } else { iceberg };
            let answer = script(&args).expect("readers present");
            if let Some(wrong) = wrong_rows(&answer, case.ids.clone()) {
                failures.push(format!("{} by {reader}: {wrong}", case.name));
            }
        }
    }
    snapshots_as_java_reads_them(&mut spark, &db, lake.path());
    assert!(
        failures.is_empty(),
        "{} reads went wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Iceberg's Java library, through Spark's metadata tables, on the three
/// appends weir made to `silver.plain`: each an `append` with the summary
/// totals Java keeps (records, data files, sizes) adding up, and data
/// sequence numbers 1, 2, 3 on the files each one added.
fn snapshots_as_java_reads_them(spark: &mut Spark, db: &str, lake: &std::path::Path) {
    let warehouse = lake.join("warehouse");
    let mut sql = |sql: &str| -> Vec<Vec<String>> {
        let answer = spark.ok(serde_json::json!({"op": "sql", "catalog": db,
            "warehouse": warehouse.to_str().unwrap(), "sql": sql}));
        serde_json::from_value(answer["rows"].clone()).expect("rows of strings")
    };
    let snapshots = sql(
        "SELECT operation, summary['added-records'], summary['total-records'], summary['added-data-files'], \
         summary['total-data-files'], summary['added-files-size'], summary['total-files-size'] \
         FROM lake.silver.plain.snapshots ORDER BY committed_at",
    );
    assert_eq!(snapshots.len(), 3, "{snapshots:?}");
    let (mut files, mut bytes) = (0, 0);
    for (n, s) in snapshots.iter().enumerate() {
        let number = |i: usize| -> i64 { s[i].parse().unwrap_or_else(|_| panic!("snapshot {n}: {s:?}")) };
        assert_eq!(s[0], "append", "{s:?}");
        assert_eq!((number(1), number(2)), (100, 100 * (n as i64 + 1)), "records: {s:?}");
        files += number(3);
        bytes += number(5);
        assert_eq!((number(4), number(6)), (files, bytes), "running totals: {s:?}");
    }
    let live = sql("SELECT count(*), sum(file_size_in_bytes) FROM lake.silver.plain.files");
    assert_eq!(
        live,
        [[files.to_string(), bytes.to_string()]],
        "the last summary's totals are the live files'"
    );
    let sequences = sql("SELECT DISTINCT sequence_number FROM lake.silver.plain.entries ORDER BY 1");
    assert_eq!(sequences, [["1"], ["2"], ["3"]], "data sequence numbers");
}
