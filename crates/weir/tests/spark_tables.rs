//! Tables Spark made or maintains: weir appends to and compacts Delta and
//! Iceberg tables that Spark (the formats' reference implementation)
//! created and wrote, Spark goes on writing after weir, Spark's own
//! maintenance runs between weir's batches, and every reader sees every row
//! once;
//! Delta tables whose features weir would break are refused, naming the
//! feature, with nothing written; deletion vectors are kept by appends and
//! compaction and refused for Update. One Spark serves the whole file.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{RecordBatch, StringArray};
use serde_json::json;
use weir::prelude::*;
use weir_test_support::operators::{counted_groups, query_error};
use weir_test_support::readers::{iceberg, python, read, wrong_rows, Spark};

/// Weir's test zones (as `spark.rs` and `read_spark.py` spell them).
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

fn with_zones(b: RecordBatch) -> std::result::Result<RecordBatch, BoxError> {
    use arrow_array::cast::AsArray;
    let ids = b.column(0).as_primitive::<arrow_array::types::Int64Type>();
    let zones: StringArray = ids.values().iter().map(|i| ZONES[*i as usize % ZONES.len()]).collect();
    let mut fields = b.schema().fields().to_vec();
    fields.push(Arc::new(arrow_schema::Field::new(
        "zone",
        arrow_schema::DataType::Utf8,
        true,
    )));
    let mut columns = b.columns().to_vec();
    columns.push(Arc::new(zones));
    Ok(RecordBatch::try_new(
        Arc::new(arrow_schema::Schema::new(fields)),
        columns,
    )?)
}

fn log_entries(table: &Path) -> usize {
    std::fs::read_dir(table.join("_delta_log"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".json"))
        .count()
}

/// Weir's query on a Delta table by path: the rate source, `batches` of
/// 100 rows, named `name`.
async fn weir_into_delta(table: &Path, chk: &Path, name: &str, zones: bool, batches: u64) -> weir::Result<()> {
    let mut stream = read_stream(RateSource::rows_per_batch(100));
    if zones {
        stream = stream.map_batches(with_zones);
    }
    let q = stream
        .write_stream()
        .query_name(name)
        .checkpoint_location(chk)
        .stop_after_batch(BatchId(batches - 1))
        .start(weir::delta::DeltaSink::try_new(table.to_str().unwrap())?)
        .await?;
    q.await_termination().await?;
    Ok(())
}

/// Every reader of a Delta table (Spark and `readers`) against the ids it
/// should hold.
fn check_delta(
    spark: &mut Spark,
    table: &Path,
    readers: &[&str],
    expected: &[i64],
    failures: &mut Vec<String>,
    what: &str,
) {
    let dir = table.to_str().unwrap();
    let mut answers = vec![(
        "Spark",
        spark.run(json!({"op": "read", "format": "delta", "table": dir})),
    )];
    for reader in readers {
        answers.push((*reader, read(&["ids", reader, dir]).expect("readers present")));
    }
    for (reader, answer) in answers {
        if let Some(wrong) = wrong_rows(&answer, expected.iter().copied()) {
            failures.push(format!("{what} by {reader}: {wrong}"));
        }
    }
}

/// Every reader of an Iceberg table (Spark, pyiceberg, DuckDB, ClickHouse)
/// against the ids it should hold.
fn check_iceberg(spark: &mut Spark, db: &str, table: &str, expected: &[i64], failures: &mut Vec<String>, what: &str) {
    let mut answers = vec![(
        "Spark",
        spark.run(json!({"op": "read", "format": "iceberg", "catalog": db, "table": table})),
    )];
    for reader in ["pyiceberg", "duckdb", "clickhouse"] {
        answers.push((reader, iceberg(&["ids", reader, db, table]).expect("readers present")));
    }
    for (reader, answer) in answers {
        if let Some(wrong) = wrong_rows(&answer, expected.iter().copied()) {
            failures.push(format!("{what} by {reader}: {wrong}"));
        }
    }
}

/// Spark writes a partitioned Delta table with an idempotent write (its
/// `txn`, as its streaming sink leaves), then adds a nullable column; weir,
/// whose stream lacks it, appends (its rows null there) and compacts; Spark
/// appends again: each reader sees every row once, and both markers hold.
async fn delta_spark_then_weir_then_spark(spark: &mut Spark, dir: &Path, failures: &mut Vec<String>) {
    let table = dir.join("spark_first");
    let t = table.to_str().unwrap();
    spark.ok(
        json!({"op": "rows", "table": t, "first": 10_000, "end": 10_100, "zone": true,
                    "app_id": "spark-query", "version": 0}),
    );
    spark.ok(json!({"op": "sql", "sql": format!("ALTER TABLE delta.`{t}` ADD COLUMNS (note STRING)")}));
    weir_into_delta(&table, &dir.join("chk-delta"), "weir-after-spark", true, 3)
        .await
        .expect("weir appends to Spark's table");
    let compacted = weir::delta::Compact::new(t).unwrap().await.unwrap();
    assert!(compacted.files_removed > compacted.files_added, "{compacted:?}");
    spark.ok(
        json!({"op": "rows", "table": t, "first": 10_100, "end": 10_200, "zone": true,
                    "columns": {"note": "late"}, "app_id": "spark-query", "version": 1}),
    );
    // weir's vacuum deletes the files its compaction replaced, Spark's
    // among them, and nothing live.
    let vacuumed = weir::delta::Vacuum::new(t)
        .unwrap()
        .with_retention(std::time::Duration::ZERO)
        .with_force(true)
        .await
        .unwrap();
    assert_eq!(vacuumed.files.len(), compacted.files_removed, "{vacuumed:?}");
    let expected: Vec<i64> = (0..300).chain(10_000..10_200).collect();
    check_delta(
        spark,
        &table,
        &["deltalake", "duckdb", "clickhouse"],
        &expected,
        failures,
        "Delta: Spark, Spark's new column, weir, compaction, Spark, weir's vacuum",
    );
    let notes = spark.ok(json!({"op": "sql", "sql": format!(
        "SELECT count(*), count(note), count(CASE WHEN event_id >= 10100 THEN note END) FROM delta.`{t}`")}));
    assert_eq!(
        notes["rows"],
        json!([["500", "100", "100"]]),
        "only Spark's last rows have a note: {notes}"
    );
    let txn = read(&["txn", t, "spark-query", "weir-after-spark"]).expect("readers present");
    assert_eq!(
        txn,
        json!({"spark-query": 1, "weir-after-spark": 2}),
        "each writer's marker"
    );
}

/// Spark creates a partitioned Iceberg table in weir's catalog and writes
/// it, then adds a column; weir appends and compacts; Spark appends again.
async fn iceberg_spark_then_weir_then_spark(spark: &mut Spark, lake: &Path, chk: &Path, failures: &mut Vec<String>) {
    let db = lake.join("catalog.db");
    let db = db.to_str().unwrap();
    let warehouse = lake.join("warehouse");
    let at = |sql: &str| json!({"op": "sql", "catalog": db, "warehouse": warehouse.to_str().unwrap(), "sql": sql});
    spark.ok(at("CREATE NAMESPACE IF NOT EXISTS lake.silver"));
    spark.ok(at(
        "CREATE TABLE lake.silver.spark_first (event_id BIGINT, ts TIMESTAMP, account_id BIGINT, \
                 amount DECIMAL(18,2)) USING iceberg PARTITIONED BY (days(ts), bucket(4, account_id))",
    ));
    spark.ok(json!({"op": "rows", "catalog": db, "table": "silver.spark_first", "first": 10_000, "end": 10_100}));
    spark.ok(at("ALTER TABLE lake.silver.spark_first ADD COLUMN note STRING"));

    let catalogs = Catalogs::new(weir::catalog::Config::embedded(lake));
    let q = read_stream(RateSource::rows_per_batch(100))
        .write_stream()
        .query_name("weir-after-spark")
        .checkpoint_location(chk)
        .stop_after_batch(BatchId(2))
        .to_table_in(&catalogs, "silver.spark_first", TableOptions::new())
        .await
        .expect("weir appends to Spark's table");
    q.await_termination().await.unwrap();
    catalogs.table("silver.spark_first").compact().await.unwrap();
    spark.ok(
        json!({"op": "rows", "catalog": db, "table": "silver.spark_first", "first": 10_100, "end": 10_200,
                    "columns": {"note": "late"}}),
    );
    // weir expires the snapshots of both writers but the last.
    let expired = catalogs
        .table("silver.spark_first")
        .expire_snapshots()
        .with_retain_last(1)
        .with_older_than(std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(expired.retained, 1, "{expired:?}");
    assert!(!expired.data_files.is_empty(), "the compacted files go: {expired:?}");
    let expected: Vec<i64> = (0..300).chain(10_000..10_200).collect();
    check_iceberg(
        spark,
        db,
        "silver.spark_first",
        &expected,
        failures,
        "Iceberg: Spark, new column, weir, compaction, Spark, weir's expiry",
    );
    let d = iceberg(&["describe", db, "silver.spark_first"]).expect("readers present");
    assert_eq!(d["properties"]["weir.query.weir-after-spark.batch-id"], "2");
}

/// Delta tables Spark made with a feature weir does not write: weir
/// refuses each at start, naming the feature, and writes nothing.
async fn delta_features_weir_would_break_are_refused(spark: &mut Spark, dir: &Path, failures: &mut Vec<String>) {
    let column = |name: &str, kind: &str| json!({"name": name, "type": kind});
    let columns = vec![
        column("event_id", "BIGINT"),
        column("ts", "TIMESTAMP"),
        column("account_id", "BIGINT"),
        column("amount", "DECIMAL(18,2)"),
    ];
    let property = |key: &str| json!({ key: "true" });
    // (the feature, what weir's refusal names, another column, table properties).
    let features: [(&str, &str, Option<serde_json::Value>, serde_json::Value); 6] = [
        (
            "column mapping",
            "column mapping",
            None,
            json!({"delta.columnMapping.mode": "name"}),
        ),
        ("row tracking", "rowTracking", None, property("delta.enableRowTracking")),
        (
            "in-commit timestamps",
            "inCommitTimestamp",
            None,
            property("delta.enableInCommitTimestamps"),
        ),
        (
            "a generated column",
            "generationExpression",
            Some(json!({"name": "day", "type": "DATE", "generated": "CAST(ts AS DATE)"})),
            json!({}),
        ),
        (
            "an identity column",
            "identity",
            Some(json!({"name": "row_id", "type": "BIGINT", "identity": true})),
            json!({}),
        ),
        ("a CHECK constraint", "CHECK constraint", None, json!({})),
    ];
    for (n, (feature, named, extra, properties)) in features.into_iter().enumerate() {
        let table = dir.join(format!("feature-{n}"));
        let t = table.to_str().unwrap();
        let mut columns = columns.clone();
        columns.extend(extra);
        spark.ok(json!({"op": "create-delta", "table": t, "columns": columns, "properties": properties}));
        if feature == "a CHECK constraint" {
            spark.ok(json!({"op": "sql", "sql": format!("ALTER TABLE delta.`{t}` ADD CONSTRAINT positive CHECK (amount >= 0)")}));
        }
        spark.ok(json!({"op": "rows", "table": t, "first": 10_000, "end": 10_010}));
        let entries = log_entries(&table);
        match weir_into_delta(&table, &dir.join(format!("chk-feature-{n}")), "weir", false, 1).await {
            Ok(()) => failures.push(format!("a table with {feature}: weir wrote to it")),
            Err(e) => {
                let text = e.to_string();
                if !text.contains(named) {
                    failures.push(format!(
                        "a table with {feature}: the refusal does not name {named:?}: {text}"
                    ));
                }
                assert!(!e.retryable(), "{text}");
            }
        }
        assert_eq!(
            log_entries(&table),
            entries,
            "nothing written to the table with {feature}"
        );
        let answer = spark.run(json!({"op": "read", "format": "delta", "table": t}));
        if let Some(wrong) = wrong_rows(&answer, 10_000..10_010) {
            failures.push(format!("a table with {feature}, by Spark: {wrong}"));
        }
    }
}

/// A Delta table with deletion vectors, one of them on a file Spark wrote:
/// weir appends (files without vectors) and compacts (leaving the file
/// with a vector alone), and every reader applies the vector; an Update
/// query, which would rewrite files that may carry vectors, is refused.
async fn delta_deletion_vectors(spark: &mut Spark, dir: &Path, failures: &mut Vec<String>) {
    let properties = json!({"delta.enableDeletionVectors": "true"});
    let column = |name: &str, kind: &str| json!({"name": name, "type": kind});
    let table = dir.join("vectors");
    let t = table.to_str().unwrap();
    let rate = [
        column("event_id", "BIGINT"),
        column("ts", "TIMESTAMP"),
        column("account_id", "BIGINT"),
        column("amount", "DECIMAL(18,2)"),
    ];
    spark.ok(json!({"op": "create-delta", "table": t, "columns": rate, "properties": properties}));
    spark.ok(json!({"op": "rows", "table": t, "first": 10_000, "end": 10_010}));
    spark.ok(json!({"op": "sql", "sql": format!("DELETE FROM delta.`{t}` WHERE event_id = 10003")}));
    weir_into_delta(&table, &dir.join("chk-vectors"), "weir", false, 2)
        .await
        .expect("weir appends to a table with deletion vectors");
    weir::delta::Compact::new(t).unwrap().await.unwrap();
    let expected: Vec<i64> = (0..200).chain((10_000..10_010).filter(|id| *id != 10_003)).collect();
    // Python deltalake refuses tables with deletion vectors (it reads none).
    check_delta(
        spark,
        &table,
        &["duckdb", "clickhouse"],
        &expected,
        failures,
        "Delta with a deletion vector, appended and compacted by weir",
    );

    let counts = dir.join("vector-counts");
    let c = counts.to_str().unwrap();
    let columns = [column("event_id", "BIGINT"), column("count", "BIGINT")];
    spark.ok(json!({"op": "create-delta", "table": c, "columns": columns, "properties": properties}));
    let entries = log_entries(&counts);
    let started = counted_groups(50, 7)
        .write_stream()
        .output_mode(OutputMode::Update)
        .checkpoint_location(dir.join("chk-vector-counts"))
        .stop_after_batch(BatchId(1))
        .start(weir::delta::DeltaSink::try_new(c).unwrap())
        .await;
    let e = query_error(started).await.to_string();
    if !e.contains("deletionVectors") || !e.contains("update output mode") {
        failures.push(format!(
            "Update into a table with deletion vectors: not refused by name: {e}"
        ));
    }
    assert_eq!(log_entries(&counts), entries, "nothing written by the refused Update");
}

/// Spark maintains weir's Delta table between two runs of weir's query:
/// OPTIMIZE, then VACUUM with no retention; weir's query goes on where it
/// stopped and every reader sees every row once.
async fn delta_weir_then_spark_maintenance_then_weir(spark: &mut Spark, dir: &Path, failures: &mut Vec<String>) {
    let table = dir.join("maintained");
    let t = table.to_str().unwrap();
    let chk = dir.join("chk-maintained");
    weir_into_delta(&table, &chk, "weir", true, 3).await.unwrap();
    spark.ok(json!({"op": "sql", "sql": format!("OPTIMIZE delta.`{t}`")}));
    spark.ok(json!({"op": "sql", "sql": format!("VACUUM delta.`{t}` RETAIN 0 HOURS")}));
    weir_into_delta(&table, &chk, "weir", true, 5).await.unwrap();
    let expected: Vec<i64> = (0..500).collect();
    check_delta(
        spark,
        &table,
        &["deltalake", "duckdb", "clickhouse"],
        &expected,
        failures,
        "Delta: weir, Spark's OPTIMIZE and VACUUM, weir",
    );
    let txn = read(&["txn", t, "weir"]).expect("readers present");
    assert_eq!(txn, json!({"weir": 4}), "weir's marker after Spark's maintenance");
}

/// Spark maintains weir's Iceberg table between two runs of weir's query:
/// rewrite_data_files, a new partition field (partition evolution), and,
/// after weir's second run, expire_snapshots; every reader sees every row
/// once and weir's marker holds.
async fn iceberg_weir_then_spark_maintenance_then_weir(spark: &mut Spark, lake: &Path, failures: &mut Vec<String>) {
    let db = lake.join("catalog.db");
    let db = db.to_str().unwrap();
    let warehouse = lake.join("warehouse");
    let at = |sql: &str| json!({"op": "sql", "catalog": db, "warehouse": warehouse.to_str().unwrap(), "sql": sql});
    let catalogs = Catalogs::new(weir::catalog::Config::embedded(lake));
    let chk = lake.join("chk-iceberg-maintained");
    let run = |last: u64| {
        let catalogs = &catalogs;
        let chk = &chk;
        async move {
            let q = read_stream(RateSource::rows_per_batch(100))
                .write_stream()
                .query_name("weir")
                .checkpoint_location(chk)
                .stop_after_batch(BatchId(last))
                .to_table_in(
                    catalogs,
                    "silver.maintained",
                    TableOptions::new()
                        .format(TableFormat::Iceberg)
                        .partition_by(["bucket(4, account_id)"]),
                )
                .await
                .map_err(|e| e.to_string())?;
            q.await_termination().await.map_err(|e| e.to_string())
        }
    };
    run(2).await.unwrap();
    spark.ok(at(
        "CALL lake.system.rewrite_data_files(table => 'silver.maintained', options => map('min-input-files', '2'))",
    ));
    spark.ok(at("ALTER TABLE lake.silver.maintained ADD PARTITION FIELD hours(ts)"));
    run(4).await.unwrap();
    spark.ok(at(
        "CALL lake.system.expire_snapshots(table => 'silver.maintained', retain_last => 1, \
                 older_than => TIMESTAMP '2999-01-01 00:00:00')",
    ));
    let expected: Vec<i64> = (0..500).collect();
    check_iceberg(
        spark,
        db,
        "silver.maintained",
        &expected,
        failures,
        "Iceberg: weir, Spark's rewrite_data_files and a new partition field, weir, Spark's expire_snapshots",
    );
    let d = iceberg(&["describe", db, "silver.maintained"]).expect("readers present");
    assert_eq!(d["properties"]["weir.query.weir.batch-id"], "4");
    let spec: Vec<String> = d["partition_spec"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f[1].as_str().unwrap().to_string())
        .collect();
    assert_eq!(spec, ["bucket[4]", "hour"], "the table's current spec is Spark's");

    // Spark renames a column (Iceberg keeps its field id): weir's query,
    // whose stream still calls it `amount`, is refused naming it, and
    // writes nothing; the rows are all there under the new name.
    spark.ok(at(
        "ALTER TABLE lake.silver.maintained RENAME COLUMN amount TO amount_usd",
    ));
    let before = iceberg(&["describe", db, "silver.maintained"]).expect("readers present");
    match run(6).await {
        Ok(()) => failures.push("Iceberg: weir wrote after Spark renamed a column its stream has".into()),
        Err(e) if !e.to_string().contains("amount") => failures.push(format!(
            "Iceberg: the refusal after a rename does not name the column: {e}"
        )),
        Err(_) => {}
    }
    let after = iceberg(&["describe", db, "silver.maintained"]).expect("readers present");
    assert_eq!(
        after["snapshots"], before["snapshots"],
        "nothing committed after the rename"
    );
    let renamed = spark.run(json!({"op": "sql", "catalog": db, "sql":
        "SELECT count(DISTINCT event_id), count(*), count(amount_usd) FROM lake.silver.maintained"}));
    assert_eq!(renamed["rows"], json!([["500", "500", "500"]]), "{renamed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weir_and_spark_write_one_table_in_turn_and_weir_refuses_features_it_would_break() {
    if python().is_none() {
        return;
    }
    let Some(mut spark) = Spark::start() else { return };
    let lake = tempfile::tempdir().unwrap();
    let chk = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    delta_spark_then_weir_then_spark(&mut spark, lake.path(), &mut failures).await;
    iceberg_spark_then_weir_then_spark(&mut spark, lake.path(), chk.path(), &mut failures).await;
    delta_features_weir_would_break_are_refused(&mut spark, lake.path(), &mut failures).await;
    delta_deletion_vectors(&mut spark, lake.path(), &mut failures).await;
    delta_weir_then_spark_maintenance_then_weir(&mut spark, lake.path(), &mut failures).await;
    iceberg_weir_then_spark_maintenance_then_weir(&mut spark, lake.path(), &mut failures).await;
    assert!(
        failures.is_empty(),
        "{} checks failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
