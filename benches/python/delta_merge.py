"""Upserts with Python deltalake's merge, for weir's Update-mode benchmark.

Usage: delta_merge.py <table dir> <keys file>
The keys file holds one JSON list of key lists; each list is merged as one
batch of (event_id, count = 1) rows, matched on event_id.
Prints {"ms": [..], "removed_bytes": [..], "added_bytes": [..]} as JSON, one
entry per batch.
"""

import json
import os
import sys
import time

import pyarrow as pa
from deltalake import DeltaTable


def sizes(dt):
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    return dict(zip(actions["path"], actions["size_bytes"]))


def main():
    table, keys_file = sys.argv[1], sys.argv[2]
    with open(keys_file) as f:
        batches = json.load(f)
    out = {"ms": [], "removed_bytes": [], "added_bytes": []}
    for keys in batches:
        dt = DeltaTable(table)
        before = sizes(dt)
        schema = pa.schema([pa.field("event_id", pa.int64(), False), pa.field("count", pa.int64(), False)])
        source = pa.Table.from_pydict({"event_id": keys, "count": [1] * len(keys)}, schema=schema)
        started = time.perf_counter()
        (
            dt.merge(source, predicate="t.event_id = s.event_id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        out["ms"].append((time.perf_counter() - started) * 1000)
        after = sizes(DeltaTable(table))
        out["removed_bytes"].append(sum(s for p, s in before.items() if p not in after))
        out["added_bytes"].append(sum(s for p, s in after.items() if p not in before))
    print(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
