"""Changes a Delta table the way another engine would, with Python deltalake.

    alter_table.py add-column TABLE NAME          a nullable string column
    alter_table.py add-constraint TABLE NAME EXPR a CHECK constraint
    alter_table.py repartition TABLE COLUMN       rewrite partitioned by COLUMN
    alter_table.py append-copy TABLE              append its rows again, event_id + 1,000,000
    alter_table.py recreate TABLE                 delete the table, create a new one with its rows
    alter_table.py delete TABLE PREDICATE         delete the rows matching PREDICATE (rewrites their files)
    alter_table.py set-property TABLE KEY VALUE   set a table property

Prints the table's new version as JSON.
"""

import json
import os
import sys

from deltalake import DeltaTable, Field, write_deltalake
from deltalake.schema import PrimitiveType


def main():
    cmd, table = sys.argv[1], sys.argv[2]
    dt = DeltaTable(table)
    if cmd == "add-column":
        dt.alter.add_columns([Field(sys.argv[3], PrimitiveType("string"), nullable=True)])
    elif cmd == "add-constraint":
        dt.alter.add_constraint({sys.argv[3]: sys.argv[4]})
    elif cmd == "repartition":
        write_deltalake(
            table,
            dt.to_pyarrow_table(),
            mode="overwrite",
            schema_mode="overwrite",
            partition_by=[sys.argv[3]],
        )
    elif cmd == "append-copy":
        import pyarrow.compute as pc

        rows = dt.to_pyarrow_table()
        i = rows.schema.get_field_index("event_id")
        rows = rows.set_column(i, "event_id", pc.add(rows["event_id"], 1_000_000))
        write_deltalake(table, rows, mode="append")
    elif cmd == "recreate":
        import shutil

        rows = dt.to_pyarrow_table()
        shutil.rmtree(table)
        write_deltalake(table, rows)
    elif cmd == "delete":
        dt.delete(sys.argv[3])
    elif cmd == "set-property":
        dt.alter.set_table_properties({sys.argv[3]: sys.argv[4]})
    else:
        raise SystemExit(f"unknown command {cmd!r}")
    print(json.dumps({"version": DeltaTable(table).version()}))
    sys.stdout.flush()
    # deltalake's native teardown can abort the interpreter; the work is done.
    os._exit(0)


if __name__ == "__main__":
    main()
