"""Independent readers of weir's tables, for weir's tests.

Usage:
    read_table.py ids deltalake|duckdb|clickhouse <table dir> [<version>]
        -> {"ids": [...], "rows": n, "amount_cents": sum}, as of that version if given
    read_table.py ids-at <table dir> <version>
        -> as ids, by Python deltalake at that version
    read_table.py ids-files <parquet file>...
        -> {"ids": [...], "rows": n}, by DuckDB reading exactly these files
    read_table.py txn <table dir> <app id>...
        -> {"<app id>": version or null, ...}
    read_table.py counts deltalake|duckdb <table dir>
        -> {"counts": [[event_id, count], ...]}, sorted (an Update-mode count by key)
    read_table.py window-totals deltalake|duckdb <table dir>
        -> {"groups": [[window start ms, merchant_id, sum_amount in cents, count], ...]}
    read_table.py describe <table dir>
        -> {"version": v, "schema": [[name, type, nullable]], "partition_columns": [...],
            "files": [{"path": ..., "partition_values": {...}, "num_records": n}],
            "last_commit": {...commit info...}}

Each command prints one JSON object on standard output.
"""

import decimal
import json
import os
import sys

import duckdb_offline


def duckdb_connection(table=""):
    """DuckDB with the delta extension (and S3 access for a table there)."""
    if table.startswith("s3://"):
        return duckdb_offline.with_test_s3(duckdb_offline.connect("httpfs", "delta"))
    return duckdb_offline.connect("delta")


def storage_options(table):
    """Options for a table on the test S3 (SeaweedFS), from the environment."""
    if not table.startswith("s3://"):
        return None
    return {
        "AWS_ENDPOINT_URL": os.environ["WEIR_TEST_S3_ENDPOINT"],
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": os.environ.get("AWS_REGION", "us-east-1"),
        "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"],
    }


def ids(reader, table, version=None):
    """The event ids and amounts of the table, or of its version `version`
    (time travel), by `reader`."""
    if reader == "deltalake":
        from deltalake import DeltaTable

        t = DeltaTable(table, version=version, storage_options=storage_options(table)).to_pyarrow_table()
        names = t.column_names
        event_ids = t.column("event_id").to_pylist() if "event_id" in names else []
        cents = None
        if "amount" in names:
            cents = sum(int(a * 100) for a in t.column("amount").to_pylist() if a is not None)
        return {"ids": event_ids, "rows": t.num_rows, "amount_cents": cents}
    if reader == "duckdb":
        con = duckdb_connection(table)
        scan = f"delta_scan('{table}')" if version is None else f"delta_scan('{table}', version => {int(version)})"
        cols = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {scan}").fetchall()]
        rows = con.execute(f"SELECT count(*) FROM {scan}").fetchone()[0]
        event_ids = []
        if "event_id" in cols:
            event_ids = [r[0] for r in con.execute(f"SELECT event_id FROM {scan}").fetchall()]
        cents = None
        if "amount" in cols:
            cents = con.execute(f"SELECT CAST(coalesce(sum(amount), 0) * 100 AS BIGINT) FROM {scan}").fetchone()[0]
        return {"ids": event_ids, "rows": rows, "amount_cents": cents}
    if reader == "clickhouse":
        settings = {} if version is None else {"delta_lake_snapshot_version": int(version)}
        return clickhouse_ids(f"deltaLakeLocal('{local(table)}')", settings)
    raise SystemExit(f"unknown reader {reader}")


def local(table):
    """A local table's directory, for ClickHouse's *Local table functions."""
    if "://" in table and not table.startswith("file://"):
        raise SystemExit(f"the ClickHouse reader reads local tables only, not {table}")
    return os.path.abspath(table.removeprefix("file://")).replace("'", "\\'")


def clickhouse_ids(source, settings=None):
    """Event ids and amounts by ClickHouse (chdb, in process) from a table
    function such as deltaLakeLocal('dir'), with query `settings` (such as
    the version to read)."""
    import chdb

    # chdb reads files under its working directory only.
    os.chdir("/")
    tail = ""
    if settings:
        tail = " SETTINGS " + ", ".join(f"{k} = {v}" for k, v in settings.items())
    names = [r[0] for r in json.loads(chdb.query(f"DESCRIBE {source}{tail}", "JSONCompact").bytes())["data"]]
    amount = "toString(amount)" if "amount" in names else "NULL"
    out = chdb.query(f"SELECT event_id, {amount} FROM {source}{tail}", "JSONCompact")
    rows = json.loads(out.bytes())["data"]
    cents = None
    if "amount" in names:
        cents = sum(int(decimal.Decimal(r[1]) * 100) for r in rows if r[1] is not None)
    return {"ids": [int(r[0]) for r in rows], "rows": len(rows), "amount_cents": cents}


def counts(reader, table):
    if reader == "deltalake":
        from deltalake import DeltaTable

        t = DeltaTable(table, storage_options=storage_options(table)).to_pyarrow_table()
        rows = zip(t.column("event_id").to_pylist(), t.column("count").to_pylist())
        return {"counts": sorted([list(r) for r in rows])}
    if reader == "duckdb":
        con = duckdb_connection()
        rows = con.execute(f"SELECT event_id, \"count\" FROM delta_scan('{table}')").fetchall()
        return {"counts": sorted([list(r) for r in rows])}
    raise SystemExit(f"unknown reader {reader}")


def window_totals_of(rows):
    """[[window start ms, merchant, cents, count]] of Python rows."""
    return sorted(
        [int(r["window_start"].timestamp() * 1000), r["merchant_id"], int(r["sum_amount"] * 100), r["count"]]
        for r in rows
    )


def window_totals(reader, table):
    if reader == "deltalake":
        from deltalake import DeltaTable

        t = DeltaTable(table, storage_options=storage_options(table)).to_pyarrow_table()
        return {"groups": window_totals_of(t.to_pylist())}
    if reader == "duckdb":
        con = duckdb_connection()
        rows = con.execute(
            "SELECT epoch_ms(window_start), merchant_id, CAST(sum_amount * 100 AS BIGINT), \"count\" "
            f"FROM delta_scan('{table}')"
        ).fetchall()
        return {"groups": sorted([list(r) for r in rows])}
    raise SystemExit(f"unknown reader {reader}")


def ids_files(files):
    con = duckdb_connection()
    rows = con.execute("SELECT event_id FROM read_parquet(?)", [files]).fetchall()
    return {"ids": [r[0] for r in rows], "rows": len(rows)}


def txn(table, app_ids):
    from deltalake import DeltaTable

    t = DeltaTable(table, storage_options=storage_options(table))
    return {app: t.transaction_version(app) for app in app_ids}


def describe(table):
    from deltalake import DeltaTable

    t = DeltaTable(table, storage_options=storage_options(table))
    schema = [[f.name, str(f.type), f.nullable] for f in t.schema().fields]
    import pyarrow as pa

    actions = pa.table(t.get_add_actions(flatten=True)).to_pydict()
    files = []
    n = len(actions["path"])
    part_cols = t.metadata().partition_columns
    for i in range(n):
        files.append(
            {
                "path": actions["path"][i],
                "num_records": actions.get("num_records", [None] * n)[i],
                "partition_values": {c: actions.get(f"partition.{c}", [None] * n)[i] for c in part_cols},
            }
        )
    history = t.history(1)
    return {
        "version": t.version(),
        "schema": schema,
        "partition_columns": part_cols,
        "files": files,
        "last_commit": history[0] if history else None,
    }


def main():
    cmd = sys.argv[1]
    if cmd == "ids":
        version = int(sys.argv[4]) if len(sys.argv) > 4 else None
        out = ids(sys.argv[2], sys.argv[3], version)
    elif cmd == "ids-at":
        out = ids("deltalake", sys.argv[2], int(sys.argv[3]))
    elif cmd == "ids-files":
        out = ids_files(sys.argv[2:])
    elif cmd == "txn":
        out = txn(sys.argv[2], sys.argv[3:])
    elif cmd == "counts":
        out = counts(sys.argv[2], sys.argv[3])
    elif cmd == "window-totals":
        out = window_totals(sys.argv[2], sys.argv[3])
    elif cmd == "describe":
        out = describe(sys.argv[2])
    else:
        raise SystemExit(f"unknown command {cmd}")
    json.dump(out, sys.stdout, default=str)
    sys.stdout.flush()
    # Leave without interpreter teardown: native reader threads can abort
    # the process there ("terminate called without an active exception")
    # after the answer is out.
    os._exit(0)


if __name__ == "__main__":
    main()
