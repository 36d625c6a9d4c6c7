"""Spark Structured Streaming's side of workload 4 of the head-to-head
benchmark (benches/benches/spark.rs): Spark's Kafka source reading a topic
of JSON payments from its start, each value parsed into typed columns,
into a fresh Delta or Iceberg table on a 1 s processing-time trigger,
exactly once, as a tuned user runs it on this machine (local[2], two
shuffle partitions).

    spark_kafka.py FORMAT DIR BOOTSTRAP TOPIC RECORDS PER_TRIGGER

FORMAT and DIR are as for spark_stream.py (a Delta table by path under
DIR, or a Hadoop catalog `lake` whose warehouse is under DIR). Each
trigger reads at most PER_TRIGGER records (maxOffsetsPerTrigger). It
prints one JSON line per batch, {"batch": N, "ms": triggerExecution,
"rows": N}, stops once RECORDS records have been written and prints
{"done": rows in the table}.
"""

import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spark_stream import session  # noqa: E402  (the same tuned session)

# The payments' columns, as weir's bench declares them (PAYMENT_SCHEMA).
SCHEMA = (
    "event_id BIGINT, ts TIMESTAMP, account_id BIGINT, merchant STRING, amount DECIMAL(18,2),"
    " currency STRING, country STRING, channel STRING, status STRING"
)


def main():
    fmt, where, bootstrap, topic = sys.argv[1:5]
    records, per_trigger = int(sys.argv[5]), sys.argv[6]
    spark = session(fmt, where)
    spark.sparkContext.setLogLevel("ERROR")
    from pyspark.sql.functions import col, from_json
    from pyspark.sql.streaming import StreamingQueryListener

    done = threading.Event()
    state = {"rows": 0, "failed": None}

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event):
            pass

        def onQueryProgress(self, event):
            p = event.progress
            if p.numInputRows == 0:
                return
            state["rows"] += p.numInputRows
            line = {"batch": p.batchId, "ms": p.durationMs.get("triggerExecution"), "rows": p.numInputRows}
            print(json.dumps(line), flush=True)
            if state["rows"] >= records:
                done.set()

        def onQueryIdle(self, event):
            pass

        def onQueryTerminated(self, event):
            state["failed"] = event.exception
            done.set()

    spark.streams.addListener(Listener())
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_trigger)
        .option("kafka.isolation.level", "read_committed")
        .load()
        .select(from_json(col("value").cast("string"), SCHEMA).alias("p"))
        .select("p.*")
    )
    writer = (
        stream.writeStream.option("checkpointLocation", os.path.join(where, "chk"))
        .trigger(processingTime="1 second")
    )
    if fmt == "delta":
        table = os.path.join(where, "table")
        query = writer.format("delta").start(table)
    else:
        spark.sql(f"CREATE TABLE lake.bench.payments ({SCHEMA}) USING iceberg")
        query = writer.format("iceberg").toTable("lake.bench.payments")
    done.wait()
    if state["failed"]:
        raise SystemExit(f"the query failed: {state['failed']}")
    query.stop()
    read = spark.read.format("delta").load(table) if fmt == "delta" else spark.table("lake.bench.payments")
    parsed = read.where("event_id IS NOT NULL AND ts IS NOT NULL AND amount IS NOT NULL").count()
    print(json.dumps({"done": parsed}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
