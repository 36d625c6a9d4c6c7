"""Exactly-once micro-batches through Python deltalake, the way a pipeline
without weir must do it: before each write, read the query's txn version and
skip the batch if it is already in the table; write it with the txn in the
same commit.

Usage: delta_microbatches.py <table dir> <batches> <rows per batch>
Prints {"per_batch_ms": [...]} as JSON.
"""

import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake


def batch(n, rows):
    ids = pa.array(range(n * rows, (n + 1) * rows), pa.int64())
    return pa.table({"event_id": ids, "account_id": pc.remainder(ids, 1000)})


def main():
    table, batches, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    app = "bench-query"
    per_batch = []
    for n in range(batches):
        data = batch(n, rows)
        started = time.perf_counter()
        try:
            done = DeltaTable(table).transaction_version(app)
        except Exception:
            done = None
        if done is None or done < n:
            write_deltalake(
                table,
                data,
                mode="append",
                commit_properties=CommitProperties(app_transactions=[Transaction(app_id=app, version=n)]),
            )
        per_batch.append((time.perf_counter() - started) * 1000)
    json.dump({"per_batch_ms": per_batch}, sys.stdout)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
