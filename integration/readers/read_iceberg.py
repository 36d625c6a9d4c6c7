"""Independent readers and writers of weir's Iceberg tables, for weir's tests.

The catalog is a SQL catalog (JDBC schema) in a SQLite file or a PostgreSQL
database: CATALOG is a path to the SQLite file or a postgres:// URL,
optionally followed by #NAME for a catalog name other than "lake"; or
rest+URI#WAREHOUSE for an Iceberg REST catalog (the test SeaweedFS).

Usage:
    read_iceberg.py ids pyiceberg|duckdb|duckdb-dir|clickhouse CATALOG NAMESPACE.TABLE [SNAPSHOT_ID]
        -> {"ids": [...], "rows": n, "amount_cents": sum}, as of that snapshot if given
    read_iceberg.py ids-or-none ...   as ids; a missing table reads as no rows
    read_iceberg.py ids-at CATALOG NAMESPACE.TABLE SNAPSHOT_ID
        -> as ids, by pyiceberg as of that snapshot
    read_iceberg.py counts pyiceberg|duckdb CATALOG NAMESPACE.TABLE
        -> {"counts": [[event_id, count], ...]}, sorted (an Update-mode count by key)
    read_iceberg.py window-totals pyiceberg|duckdb CATALOG NAMESPACE.TABLE
        -> {"groups": [[window start ms, merchant_id, sum_amount in cents, count], ...]}
    read_iceberg.py describe CATALOG NAMESPACE.TABLE
        -> {"metadata_location": ..., "properties": {...}, "schema": [[name, type, required]],
            "partition_spec": [[source, transform, name]],
            "snapshots": [{"id": .., "operation": .., "summary": {...}}] (by sequence number),
            "files": n, "manifests": n (of the current snapshot)}
    read_iceberg.py drop CATALOG NAMESPACE.TABLE     drops the table and deletes its files
    read_iceberg.py append CATALOG NAMESPACE.TABLE FIRST N
        appends N rows with event ids FIRST.. in the table's schema (pyiceberg as a writer)
    read_iceberg.py delete CATALOG NAMESPACE.TABLE PREDICATE
        deletes the rows matching PREDICATE (pyiceberg rewrites their files)
    read_iceberg.py create CATALOG WAREHOUSE NAMESPACE.TABLE
        creates a table of the rate source's schema, partitioned by day(ts)
    read_iceberg.py list CATALOG NAMESPACE
        -> {"tables": ["namespace.table", ...]} as pyiceberg lists them

Each command prints one JSON object on standard output.
"""

import json
import os
import shutil
import sys

import duckdb_offline


def catalog(where, warehouse="file:///nonexistent"):
    from pyiceberg.catalog.sql import SqlCatalog

    if where.startswith("rest+"):
        # An Iceberg REST catalog (the test SeaweedFS): rest+<uri>#<warehouse>.
        from pyiceberg.catalog.rest import RestCatalog

        uri, _, rest_warehouse = where[len("rest+") :].partition("#")
        return RestCatalog(
            "rest",
            uri=uri,
            warehouse=rest_warehouse,
            credential=f"{os.environ['AWS_ACCESS_KEY_ID']}:{os.environ['AWS_SECRET_ACCESS_KEY']}",
            **{
                "s3.endpoint": os.environ["WEIR_TEST_S3_ENDPOINT"],
                "s3.access-key-id": os.environ["AWS_ACCESS_KEY_ID"],
                "s3.secret-access-key": os.environ["AWS_SECRET_ACCESS_KEY"],
                "s3.region": os.environ.get("AWS_REGION", "us-east-1"),
                "s3.path-style-access": "true",
            },
        )
    where, _, name = where.partition("#")
    uri = where if "://" in where else f"sqlite:///{os.path.abspath(where)}"
    for scheme in ("postgres://", "postgresql://"):
        if uri.startswith(scheme):
            uri = "postgresql+psycopg2://" + uri[len(scheme) :]
    properties = {}
    if "WEIR_TEST_S3_ENDPOINT" in os.environ:
        # Tables on the test S3 (SeaweedFS).
        properties = {
            "s3.endpoint": os.environ["WEIR_TEST_S3_ENDPOINT"],
            "s3.access-key-id": os.environ["AWS_ACCESS_KEY_ID"],
            "s3.secret-access-key": os.environ["AWS_SECRET_ACCESS_KEY"],
            "s3.region": os.environ.get("AWS_REGION", "us-east-1"),
        }
    return SqlCatalog(name or "lake", uri=uri, warehouse=warehouse, **properties)


def duckdb_connection(location=""):
    """DuckDB with the iceberg extension (and S3 access for a table there)."""
    if location.startswith("s3://"):
        return duckdb_offline.with_test_s3(duckdb_offline.connect("httpfs", "avro", "iceberg"))
    return duckdb_offline.connect("avro", "iceberg")


def ids(reader, where, name, snapshot_id=None):
    """The event ids and amounts of the table, or of its snapshot
    `snapshot_id` (time travel), by `reader`."""
    table = catalog(where).load_table(name)
    if reader == "pyiceberg":
        t = table.scan(snapshot_id=snapshot_id).to_arrow()
        event_ids = t.column("event_id").to_pylist()
        cents = None
        if "amount" in t.column_names:
            cents = sum(int(v * 100) for v in t.column("amount").to_pylist() if v is not None)
        return {"ids": event_ids, "rows": t.num_rows, "amount_cents": cents}
    if reader in ("duckdb", "duckdb-dir"):
        # duckdb-dir opens the table directory, through metadata/version-hint.text.
        location = (table.metadata_location if reader == "duckdb" else table.metadata.location).removeprefix("file://")
        con = duckdb_connection(location)
        scan, params = "iceberg_scan(?)", [location]
        if snapshot_id is not None:
            scan, params = "iceberg_scan(?, snapshot_from_id => ?)", [location, snapshot_id]
        names = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM {scan}", params).fetchall()]
        amount = "amount" if "amount" in names else "NULL"
        rows = con.execute(f"SELECT event_id, {amount} FROM {scan}", params).fetchall()
        cents = None
        if "amount" in names:
            cents = sum(int(r[1] * 100) for r in rows if r[1] is not None)
        return {"ids": [r[0] for r in rows], "rows": len(rows), "amount_cents": cents}
    if reader == "clickhouse":
        import read_table

        location = read_table.local(table.metadata.location)
        settings = {} if snapshot_id is None else {"iceberg_snapshot_id": snapshot_id}
        return read_table.clickhouse_ids(f"icebergLocal('{location}')", settings)
    raise SystemExit(f"unknown reader {reader!r}")


def window_totals(reader, where, name):
    """[[window start ms, merchant, sum_amount in cents, count]] of a table
    of per-window totals."""
    table = catalog(where).load_table(name)
    if reader == "pyiceberg":
        rows = table.scan().to_arrow().to_pylist()
        groups = [
            [int(r["window_start"].timestamp() * 1000), r["merchant_id"], int(r["sum_amount"] * 100), r["count"]]
            for r in rows
        ]
    elif reader == "duckdb":
        con = duckdb_connection()
        location = table.metadata_location.removeprefix("file://")
        groups = [
            list(r)
            for r in con.execute(
                "SELECT epoch_ms(window_start), merchant_id, CAST(sum_amount * 100 AS BIGINT), \"count\" "
                "FROM iceberg_scan(?)",
                [location],
            ).fetchall()
        ]
    else:
        raise SystemExit(f"unknown reader {reader!r}")
    return {"groups": sorted(groups)}


def counts(reader, where, name):
    """[[event_id, count]] of a table of counts by key."""
    table = catalog(where).load_table(name)
    if reader == "pyiceberg":
        t = table.scan().to_arrow()
        rows = zip(t.column("event_id").to_pylist(), t.column("count").to_pylist())
        got = [list(r) for r in rows]
    elif reader == "duckdb":
        con = duckdb_connection()
        location = table.metadata_location.removeprefix("file://")
        got = [list(r) for r in con.execute('SELECT event_id, "count" FROM iceberg_scan(?)', [location]).fetchall()]
    else:
        raise SystemExit(f"unknown reader {reader!r}")
    return {"counts": sorted(got)}


def delete(where, name, predicate):
    table = catalog(where).load_table(name)
    table.delete(predicate)
    return {"metadata_location": catalog(where).load_table(name).metadata_location}


def describe(where, name):
    table = catalog(where).load_table(name)
    m = table.metadata
    schema = table.schema()
    spec = table.spec()
    snapshots = [
        {
            "id": s.snapshot_id,
            "parent": s.parent_snapshot_id,
            "sequence": s.sequence_number,
            "operation": s.summary.operation.value if s.summary else None,
            "summary": dict(s.summary.additional_properties) if s.summary else {},
        }
        for s in sorted(m.snapshots, key=lambda s: s.sequence_number)
    ]
    tasks = list(table.scan().plan_files())
    files = len(tasks)
    current = table.current_snapshot()
    manifests = len(current.manifests(table.io)) if current else 0
    return {
        "metadata_location": table.metadata_location,
        "location": m.location,
        "uuid": str(m.table_uuid),
        "properties": dict(m.properties),
        "schema": [[f.name, str(f.field_type), f.required] for f in schema.fields],
        "partition_spec": [
            [schema.find_column_name(f.source_id), str(f.transform), f.name] for f in spec.fields
        ],
        "current_snapshot": m.current_snapshot_id,
        "refs": {name: {"snapshot": r.snapshot_id, "type": r.snapshot_ref_type.value, "min_keep": r.min_snapshots_to_keep} for name, r in m.refs.items()},
        "snapshots": snapshots,
        "files": files,
        "default_spec": m.default_spec_id,
        "file_specs": sorted({t.file.spec_id for t in tasks}),
        "manifests": manifests,
    }


def manifests(where, name):
    """The manifests each snapshot lists, oldest snapshot first."""
    table = catalog(where).load_table(name)
    return {
        "snapshots": [
            {"id": s.snapshot_id, "manifests": [m.manifest_path for m in s.manifests(table.io)]}
            for s in sorted(table.metadata.snapshots, key=lambda s: s.sequence_number)
        ]
    }


def manage(where, name, what, *args):
    """Refs, partitioning and properties as another engine sets them:
    `branch REF SNAPSHOT MIN_KEEP MAX_AGE_MS` (`-` for unset), `tag REF
    SNAPSHOT`, `main-retention MIN_KEEP`, `partition SOURCE TRANSFORM
    FIELD` (adds a field: a new spec), `property KEY VALUE`."""
    table = catalog(where).load_table(name)
    unset = lambda v: None if v == "-" else int(v)
    if what == "branch":
        ref, snapshot, keep, age = args
        table.manage_snapshots().create_branch(
            int(snapshot), ref, min_snapshots_to_keep=unset(keep), max_snapshot_age_ms=unset(age)
        ).commit()
    elif what == "tag":
        ref, snapshot = args
        table.manage_snapshots().create_tag(int(snapshot), ref).commit()
    elif what == "main-retention":
        # pyiceberg has no public call for main's own retention.
        (keep,) = args
        with table.transaction() as t:
            current = table.metadata.current_snapshot_id
            t._apply(*t._set_ref_snapshot(current, "main", "branch", min_snapshots_to_keep=int(keep)))
    elif what == "partition":
        source, transform, field = args
        from pyiceberg.transforms import parse_transform

        with table.update_spec() as u:
            u.add_field(source, parse_transform(transform), field)
    elif what == "property":
        key, value = args
        with table.transaction() as t:
            t.set_properties({key: value})
    else:
        raise SystemExit(f"unknown change {what!r}")
    return {"metadata_location": catalog(where).load_table(name).metadata_location}


def drop(where, name):
    cat = catalog(where)
    location = cat.load_table(name).metadata.location
    if "://" in location and not location.startswith("file://"):
        cat.purge_table(name)
    else:
        cat.drop_table(name)
        shutil.rmtree(location.removeprefix("file://"), ignore_errors=True)
    return {"dropped": name}


def rate_rows(schema, first, n):
    """Rows like weir's rate source: event_id, ts, account_id, amount."""
    import datetime
    import decimal

    import pyarrow as pa

    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    cols = {
        "event_id": pa.array(range(first, first + n), pa.int64()),
        "ts": pa.array([start + datetime.timedelta(seconds=i) for i in range(first, first + n)], pa.timestamp("us", tz="UTC")),
        "account_id": pa.array([i % 100 for i in range(first, first + n)], pa.int64()),
        "amount": pa.array(
            [decimal.Decimal((i * 7919) % 100000).scaleb(-2) for i in range(first, first + n)], pa.decimal128(18, 2)
        ),
    }
    return pa.table(cols, schema=schema.as_arrow())


def append(where, name, first, n):
    table = catalog(where).load_table(name)
    table.append(rate_rows(table.schema(), int(first), int(n)))
    return {"appended": int(n)}


def create(where, warehouse, name):
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.schema import Schema
    from pyiceberg.transforms import DayTransform
    from pyiceberg.types import DecimalType, LongType, NestedField, TimestamptzType

    schema = Schema(
        NestedField(1, "event_id", LongType(), required=True),
        NestedField(2, "ts", TimestamptzType(), required=True),
        NestedField(3, "account_id", LongType(), required=True),
        NestedField(4, "amount", DecimalType(18, 2), required=True),
    )
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=DayTransform(), name="ts_day"))
    cat = catalog(where, warehouse)
    namespace = name.rsplit(".", 1)[0]
    cat.create_namespace_if_not_exists(namespace)
    t = cat.create_table(name, schema=schema, partition_spec=spec)
    return {"metadata_location": t.metadata_location}


def main():
    cmd = sys.argv[1]
    if cmd == "ids":
        snapshot_id = int(sys.argv[5]) if len(sys.argv) > 5 else None
        out = ids(sys.argv[2], sys.argv[3], sys.argv[4], snapshot_id)
    elif cmd == "ids-or-none":
        # As ids, but no table reads as no rows.
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            out = ids(sys.argv[2], sys.argv[3], sys.argv[4])
        except (NoSuchTableError, NoSuchNamespaceError):
            out = {"ids": [], "rows": 0, "amount_cents": 0}
    elif cmd == "ids-at":
        out = ids("pyiceberg", sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif cmd == "counts":
        out = counts(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "window-totals":
        out = window_totals(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "describe":
        out = describe(sys.argv[2], sys.argv[3])
    elif cmd == "manifests":
        out = manifests(sys.argv[2], sys.argv[3])
    elif cmd == "manage":
        out = manage(*sys.argv[2:])
    elif cmd == "drop":
        out = drop(sys.argv[2], sys.argv[3])
    elif cmd == "append":
        out = append(*sys.argv[2:6])
    elif cmd == "delete":
        out = delete(*sys.argv[2:5])
    elif cmd == "create":
        out = create(*sys.argv[2:5])
    elif cmd == "list":
        # The tables of a namespace, as namespace.table names.
        tables = catalog(sys.argv[2]).list_tables(sys.argv[3])
        out = {"tables": sorted(".".join(t) for t in tables)}
    else:
        raise SystemExit(f"unknown command {cmd!r}")
    print(json.dumps(out, default=str))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
