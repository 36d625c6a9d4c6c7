"""Exactly-once micro-batches through pyiceberg, the way a pipeline without
weir must do it: load the table, read the query's last batch id from the
current snapshot's summary, skip the batch if it is there, else append it
with the batch id in the snapshot properties.

Usage: iceberg_microbatches.py <work dir> <batches> <rows per batch>
Prints {"per_batch_ms": [...]} as JSON.
"""

import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog.sql import SqlCatalog


def batch(n, rows):
    ids = pa.array(range(n * rows, (n + 1) * rows), pa.int64())
    return pa.table({"event_id": ids, "account_id": pc.remainder(ids, 1000)})


def main():
    work, batches, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.makedirs(work, exist_ok=True)
    catalog = SqlCatalog(
        "lake", uri=f"sqlite:///{os.path.join(work, 'catalog.db')}", warehouse=f"file://{os.path.join(work, 'wh')}"
    )
    catalog.create_namespace_if_not_exists("bench")
    catalog.create_table_if_not_exists("bench.t", schema=batch(0, 1).schema)
    key = "bench-query.batch-id"
    per_batch = []
    for n in range(batches):
        data = batch(n, rows)
        started = time.perf_counter()
        table = catalog.load_table("bench.t")
        snapshot = table.current_snapshot()
        done = int(snapshot.summary.additional_properties.get(key, -1)) if snapshot else -1
        if done < n:
            table.append(data, snapshot_properties={key: str(n)})
        per_batch.append((time.perf_counter() - started) * 1000)
    json.dump({"per_batch_ms": per_batch}, sys.stdout)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
