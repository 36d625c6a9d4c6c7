"""Spark's side of the compaction workload of the head-to-head benchmark
(benches/benches/spark.rs): Delta's OPTIMIZE or Iceberg's
rewrite_data_files on a table of many small files that weir made, in the
session spark_stream.py makes (local[2], two shuffle partitions).

    spark_compact.py FORMAT DIR EXISTING

EXISTING is the Delta table's path, or the SQLite file of weir's embedded
catalog `lake` whose Iceberg table `bench.payments` it is. It prints
{"batch": 0, "ms": the statement's milliseconds, "files": files it
rewrote} and {"done": rows in the table after}.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spark_stream import session  # noqa: E402


def table(spark, fmt, existing):
    if fmt == "delta":
        return spark.read.format("delta").load(existing)
    return spark.table("lake.bench.payments")


def main():
    fmt, where, existing = sys.argv[1], sys.argv[2], sys.argv[3]
    spark = session(fmt, where, existing)
    spark.sparkContext.setLogLevel("ERROR")
    # A session already up has read the table before: so has this one.
    before = table(spark, fmt, existing).count()
    started = time.monotonic()
    if fmt == "delta":
        rows = spark.sql(f"OPTIMIZE delta.`{existing}`").collect()
        files = rows[0]["metrics"]["numFilesRemoved"]
    else:
        rows = spark.sql("CALL lake.system.rewrite_data_files(table => 'bench.payments')").collect()
        files = rows[0]["rewritten_data_files_count"]
    ms = (time.monotonic() - started) * 1e3
    print(json.dumps({"batch": 0, "ms": ms, "files": files}), flush=True)
    after = table(spark, fmt, existing).count()
    if after != before:
        raise SystemExit(f"the compaction changed the rows: {before} before, {after} after")
    print(json.dumps({"done": after}), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
