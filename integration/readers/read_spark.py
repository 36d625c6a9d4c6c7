"""Spark, the reference implementation of both formats (Delta Lake on Spark
and Iceberg's Spark runtime), reading weir's tables for weir's tests.

One call starts one Spark (local[2]) and runs every read it is given, so a
test file pays for one JVM. The reads come as a JSON list on standard input:

    {"format": "delta", "table": DIR}                  the table as it is
    {"format": "delta", "table": DIR, "version": V}    time travel
    {"format": "iceberg", "catalog": CATALOG, "table": "NAMESPACE.TABLE"}
    {"format": "iceberg", "catalog": CATALOG, "table": ..., "snapshot": ID}

CATALOG is a SQL catalog (the JDBC catalog's schema) as read_iceberg.py
takes it: a SQLite file or a postgres:// URL, optionally followed by #NAME
for a catalog name other than "lake". Spark's JDBC catalog opens it.

Prints {"results": [...]}, one per read, in order: {"ids": [...], "rows": n,
"amount_cents": sum or null} or {"error": "..."} when Spark refused the
table (the other reads still run).

The jars come from WEIR_SPARK_JARS (default .cache/spark-jars), fetched by
scripts/spark-jars.sh from integration/readers/spark/pom.xml.
"""

import glob
import json
import os
import sys
from urllib.parse import urlparse

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def jars():
    folder = os.environ.get("WEIR_SPARK_JARS") or os.path.join(ROOT, ".cache", "spark-jars")
    found = sorted(glob.glob(os.path.join(folder, "*.jar")))
    if not found:
        raise SystemExit(f"no Spark jars in {folder}; scripts/spark-jars.sh fetches them")
    return found


def session():
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2]")
        .appName("weir-readers")
        .config("spark.jars", ",".join(jars()))
        .config(
            "spark.sql.extensions",
            "io.delta.sql.DeltaSparkSessionExtension,"
            "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
        )
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )


def jdbc_uri(where):
    """The JDBC URL of a catalog as read_iceberg.py names it."""
    if "://" not in where:
        return f"jdbc:sqlite:{os.path.abspath(where)}", {}
    url = urlparse(where)
    if url.scheme not in ("postgres", "postgresql"):
        raise SystemExit(f"unknown catalog {where!r}")
    port = f":{url.port}" if url.port else ""
    uri = f"jdbc:postgresql://{url.hostname}{port}{url.path}"
    auth = {}
    if url.username:
        auth["jdbc.user"] = url.username
    if url.password:
        auth["jdbc.password"] = url.password
    return uri, auth


def iceberg_session(spark, where, sessions):
    """A Spark session whose catalog of the catalog's name is that catalog.
    The JDBC catalog keys tables by its name in Spark, and a session holds
    one catalog of a name, so each catalog gets a session of its own."""
    if where in sessions:
        return sessions[where]
    path, _, name = where.partition("#")
    name = name or "lake"
    uri, auth = jdbc_uri(path)
    s = spark.newSession()
    prefix = f"spark.sql.catalog.{name}"
    s.conf.set(prefix, "org.apache.iceberg.spark.SparkCatalog")
    s.conf.set(f"{prefix}.type", "jdbc")
    s.conf.set(f"{prefix}.uri", uri)
    s.conf.set(f"{prefix}.jdbc.schema-version", "V1")
    # The tables' own locations say where their files are; the warehouse
    # is only where new tables would go.
    s.conf.set(f"{prefix}.warehouse", "file:///nonexistent")
    for key, value in auth.items():
        s.conf.set(f"{prefix}.{key}", value)
    sessions[where] = (s, name)
    return sessions[where]


def quoted(name):
    return ".".join(f"`{part}`" for part in name.split("."))


def summary(df):
    names = df.columns
    picked = [c for c in ("event_id", "amount") if c in names]
    rows = df.select(*picked).collect() if picked else []
    count = len(rows) if picked else df.count()
    ids = [r["event_id"] for r in rows] if "event_id" in names else []
    cents = None
    if "amount" in names:
        cents = sum(int(r["amount"] * 100) for r in rows if r["amount"] is not None)
    return {"ids": ids, "rows": count, "amount_cents": cents}


def read(spark, request, sessions):
    if request["format"] == "delta":
        reader = spark.read.format("delta")
        if "version" in request:
            reader = reader.option("versionAsOf", int(request["version"]))
        return summary(reader.load(request["table"]))
    if request["format"] == "iceberg":
        s, name = iceberg_session(spark, request["catalog"], sessions)
        reader = s.read
        if "snapshot" in request:
            reader = reader.option("snapshot-id", int(request["snapshot"]))
        return summary(reader.table(f"{quoted(name)}.{quoted(request['table'])}"))
    raise SystemExit(f"unknown format {request['format']!r}")


def cause(e):
    """The line of a Spark error that names the cause: the first Java
    exception's, not Py4J's "an error occurred while calling"."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    named = [line for line in lines if "Exception" in line or "Error:" in line]
    picked = named[0] if named else (lines[0] if lines else type(e).__name__)
    return picked[:400]


def main():
    requests = json.load(sys.stdin)
    spark = session()
    spark.sparkContext.setLogLevel("ERROR")
    sessions = {}
    results = []
    for request in requests:
        try:
            results.append(read(spark, request, sessions))
        except Exception as e:  # a refusal is an answer: it goes in the results
            results.append({"error": cause(e)})
    spark.stop()
    json.dump({"results": results}, sys.stdout)


if __name__ == "__main__":
    main()
