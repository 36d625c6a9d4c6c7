"""Spark Structured Streaming's side of the head-to-head benchmark
(benches/benches/spark.rs): the rate-micro-batch source into a Delta or
Iceberg table, exactly once, triggers back to back, as a tuned user runs
it on this machine (local[2], two shuffle partitions).

    spark_stream.py FORMAT DIR BATCHES ROWS PARTITIONS [EXISTING]

FORMAT is delta (a table by path under DIR) or iceberg (a Hadoop catalog
`lake` whose warehouse is under DIR). With EXISTING the stream appends to
a table weir made: for delta the table's path, for iceberg the SQLite file
of weir's embedded catalog `lake` (Iceberg's JDBC catalog), whose table
`bench.payments` it is. It prints one JSON line per batch,
{"batch": N, "ms": triggerExecution, "rows": N}, as Spark's listener
reports it, stops after batch BATCHES-1 and prints {"done": rows in the
table}. The jars come from WEIR_SPARK_JARS (default .cache/spark-jars),
fetched by scripts/spark-jars.sh.
"""

import json
import os
import sys
import threading

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "integration", "readers"))
from read_spark import jars, scratch_warehouse  # noqa: E402  (the suite's Spark reader finds the jars)


def session(fmt, where, existing=None):
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("weir-bench")
        .config("spark.jars", ",".join(jars()))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", scratch_warehouse())
    )
    if fmt == "delta":
        builder = (
            builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
            .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
            # The snapshot's state in two partitions, not fifty, on two cores.
            .config("spark.databricks.delta.snapshotPartitions", "2")
        )
    else:
        builder = builder.config(
            "spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
        ).config("spark.sql.catalog.lake", "org.apache.iceberg.spark.SparkCatalog")
        if existing:
            builder = (
                builder.config("spark.sql.catalog.lake.type", "jdbc")
                .config("spark.sql.catalog.lake.uri", f"jdbc:sqlite:{os.path.abspath(existing)}")
                .config("spark.sql.catalog.lake.jdbc.schema-version", "V1")
                .config("spark.sql.catalog.lake.warehouse", os.path.join(where, "warehouse"))
                # weir's columns are required; Spark's projection of the
                # rate source is nullable though never null.
                .config("spark.sql.iceberg.check-nullability", "false")
            )
        else:
            builder = builder.config("spark.sql.catalog.lake.type", "hadoop").config(
                "spark.sql.catalog.lake.warehouse", os.path.join(where, "warehouse")
            )
    return builder.getOrCreate()


def main():
    fmt, where, batches, rows, partitions = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    existing = sys.argv[6] if len(sys.argv) > 6 else None
    last = batches - 1
    spark = session(fmt, where, existing)
    spark.sparkContext.setLogLevel("ERROR")
    from pyspark.sql.streaming import StreamingQueryListener

    done = threading.Event()
    reached = threading.Event()

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event):
            pass

        def onQueryProgress(self, event):
            p = event.progress
            if p.batchId <= last:
                line = {"batch": p.batchId, "ms": p.durationMs.get("triggerExecution"), "rows": p.numInputRows}
                print(json.dumps(line), flush=True)
            if p.batchId >= last:
                reached.set()
                done.set()

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            done.set()

    spark.streams.addListener(Listener())
    # The rate source's columns as weir's has them.
    stream = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", rows)
        .option("numPartitions", partitions)
        .load()
        .selectExpr(
            "value AS event_id",
            "timestamp AS ts",
            "value % 1000 AS account_id",
            "CAST((value % 100000) / 100.0 AS DECIMAL(18,2)) AS amount",
        )
    )
    writer = stream.writeStream.option("checkpointLocation", os.path.join(where, "chk"))
    if fmt == "delta":
        table = existing or os.path.join(where, "table")
        query = writer.format("delta").start(table)
    elif existing:
        query = writer.format("iceberg").toTable("lake.bench.payments")
    else:
        spark.sql(
            "CREATE TABLE lake.bench.payments (event_id BIGINT, ts TIMESTAMP, account_id BIGINT,"
            " amount DECIMAL(18,2)) USING iceberg"
        )
        query = writer.format("iceberg").toTable("lake.bench.payments")
    done.wait()
    query.stop()
    # Stopping interrupts the batch after the last one, which Spark reports
    # as the query's exception: a failure only before the last batch.
    if not reached.is_set() and query.exception() is not None:
        raise SystemExit(f"the query failed: {query.exception()}")
    read = spark.read.format("delta").load(table) if fmt == "delta" else spark.table("lake.bench.payments")
    print(json.dumps({"done": read.count()}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
