"""Spark, the reference implementation of both formats (Delta Lake on Spark
and Iceberg's Spark runtime), reading and writing tables beside weir in
weir's tests.

One process starts one Spark (local[2]) and answers requests until its
standard input ends, so a test file pays for one JVM. A request is one JSON
object on a line; its answer is one JSON object on a line of standard
output:

    {"op": "read", "format": "delta", "table": DIR}               the table as it is
    {"op": "read", "format": "delta", "table": DIR, "version": V}  time travel
    {"op": "read", "format": "iceberg", "catalog": CATALOG, "table": "NAMESPACE.TABLE"}
    {"op": "read", "format": "iceberg", ..., "snapshot": ID}
        -> {"ids": [...], "rows": n, "amount_cents": sum or null}
    {"op": "sql", "sql": STATEMENT}                                Delta tables by path
    {"op": "sql", "catalog": CATALOG, "warehouse": DIR, "sql": STATEMENT}
        -> {"rows": [[...], ...]} (the statement's result, as strings)
    {"op": "create-delta", "table": DIR, "columns": [{"name", "type",
     "generated": EXPRESSION?, "identity": true?}], "properties": {K: V}}
        creates a Delta table by path with Delta's table builder
        -> {"rows": []}
    {"op": "rows", "table": DIR, "first": A, "end": B, "zone": true?,
     "columns": {NAME: VALUE}?, "app_id": APP?, "version": V?}
        appends rows A..B of the rate source's columns (with weir's test
        zones, and constant columns) to a Delta table by path, as one
        idempotent write when app_id and version are given (Delta's
        txnAppId / txnVersion); with "catalog" (and "warehouse"), to the
        Iceberg table "NAMESPACE.TABLE" of that catalog
        -> {"rows": [[n]]}

Every answer is {"error": "..."} instead when Spark refused (the process
goes on). CATALOG is a SQL catalog (the JDBC catalog's schema) as
read_iceberg.py takes it: a SQLite file or a postgres:// URL, optionally
followed by #NAME for a catalog name other than "lake"; Spark's JDBC
catalog opens it, named so, and STATEMENT names its tables NAME.NS.TABLE.

The jars come from WEIR_SPARK_JARS (default .cache/spark-jars), fetched by
scripts/spark-jars.sh from integration/readers/spark/pom.xml.
"""

import atexit
import glob
import json
import os
import shutil
import sys
import tempfile
from urllib.parse import urlparse

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

# The rate source's rows, as weir's RateSource makes them, and the zones
# weir's tests partition by (weir/tests/spark.rs).
RATE_COLUMNS = [
    "id AS event_id",
    "timestamp_micros(1767225600000000 + id * 1000) AS ts",
    "id % 1000 AS account_id",
    "CAST(((id * 7919) % 100000) / 100.0 AS DECIMAL(18,2)) AS amount",
]
ZONES = ["10:00 utc", "50%", "a/b", "k=v", "z\u00fcrich", "", None, "plain"]


def jars():
    folder = os.environ.get("WEIR_SPARK_JARS") or os.path.join(ROOT, ".cache", "spark-jars")
    found = sorted(glob.glob(os.path.join(folder, "*.jar")))
    if not found:
        raise SystemExit(f"no Spark jars in {folder}; scripts/spark-jars.sh fetches them")
    return found


def scratch_warehouse():
    """A warehouse directory of Spark's own for this process, removed at its
    end: every table here is opened by path or through a catalog, and
    without it Spark leaves an empty spark-warehouse/ where it was started."""
    folder = tempfile.mkdtemp(prefix="weir-spark-warehouse-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


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
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", scratch_warehouse())
        # Delta's VACUUM lists the table in this many tasks (10,000 by default).
        .config("spark.sql.sources.parallelPartitionDiscovery.parallelism", "4")
        # Tests vacuum with no retention.
        .config("spark.databricks.delta.retentionDurationCheck.enabled", "false")
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


def iceberg_session(spark, where, sessions, warehouse=None):
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
    # is where tables Spark creates go.
    s.conf.set(f"{prefix}.warehouse", warehouse or "file:///nonexistent")
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
    raise ValueError(f"unknown format {request['format']!r}")


def sql(spark, request, sessions):
    s = spark
    if "catalog" in request:
        s, _ = iceberg_session(spark, request["catalog"], sessions, request.get("warehouse"))
    rows = s.sql(request["sql"]).collect()
    return {"rows": [[None if v is None else str(v) for v in row] for row in rows]}


def append_rows(spark, request, sessions):
    from pyspark.sql import functions as F

    s, name = spark, None
    if "catalog" in request:
        s, name = iceberg_session(spark, request["catalog"], sessions, request.get("warehouse"))
    df = s.range(int(request["first"]), int(request["end"])).selectExpr(*RATE_COLUMNS)
    if request.get("zone"):
        zones = F.array(*[F.lit(z).cast("string") for z in ZONES])
        df = df.withColumn("zone", F.element_at(zones, (F.col("event_id") % len(ZONES) + 1).cast("int")))
    for column, value in request.get("columns", {}).items():
        df = df.withColumn(column, F.lit(value))
    if name is not None:
        df.writeTo(f"{quoted(name)}.{quoted(request['table'])}").append()
    else:
        writer = df.write.format("delta").mode("append")
        if request.get("zone"):
            writer = writer.partitionBy("zone")
        if "app_id" in request:
            writer = writer.option("txnAppId", request["app_id"]).option("txnVersion", int(request["version"]))
        writer.save(request["table"])
    return {"rows": [[str(int(request["end"]) - int(request["first"]))]]}


def create_delta(spark, request):
    """Creates a Delta table by path with Delta's own table builder, which
    makes generated and identity columns (Spark's SQL does not, for Delta)."""
    jvm = spark._jvm
    builder = jvm.io.delta.tables.DeltaTable.create(spark._jsparkSession).location(request["table"])
    for column in request["columns"]:
        col = jvm.io.delta.tables.DeltaTable.columnBuilder(spark._jsparkSession, column["name"])
        col = col.dataType(column["type"])
        if "generated" in column:
            col = col.generatedAlwaysAs(column["generated"])
        if column.get("identity"):
            col = col.generatedAlwaysAsIdentity(1, 1)
        builder = builder.addColumn(col.build())
    for key, value in request.get("properties", {}).items():
        builder = builder.property(key, value)
    builder.execute()
    return {"rows": []}


def answer(spark, request, sessions):
    op = request.get("op", "read")
    if op == "read":
        return read(spark, request, sessions)
    if op == "sql":
        return sql(spark, request, sessions)
    if op == "create-delta":
        return create_delta(spark, request)
    if op == "rows":
        return append_rows(spark, request, sessions)
    raise ValueError(f"unknown op {op!r}")


def cause(e):
    """The line of a Spark error that names the cause: the first Java
    exception's, not Py4J's "an error occurred while calling"."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    named = [line for line in lines if "Exception" in line or "Error:" in line]
    picked = named[0] if named else (lines[0] if lines else type(e).__name__)
    return picked[:400]


def main():
    # Answers go to the standard output as it is now; anything else that
    # writes there (Spark's JVM, which inherits it, included) goes to the
    # standard error.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    spark = session()
    spark.sparkContext.setLogLevel("ERROR")
    sessions = {}
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out = answer(spark, json.loads(line), sessions)
        except Exception as e:  # a refusal is an answer: the next request still runs
            out = {"error": cause(e)}
        answers.write(json.dumps(out) + "\n")
        answers.flush()
    spark.stop()


if __name__ == "__main__":
    main()
