"""Compaction with Python deltalake, for weir's compaction benchmark.

Usage: delta_optimize.py <table dir> <target size in bytes>
Prints {"seconds": s, "files_removed": n, "files_added": n, "max_rss_mib": m} as JSON.
"""

import json
import os
import resource
import sys
import time

from deltalake import DeltaTable


def main():
    table, target = sys.argv[1], int(sys.argv[2])
    dt = DeltaTable(table)
    started = time.perf_counter()
    metrics = dt.optimize.compact(target_size=target)
    seconds = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "seconds": seconds,
                "files_removed": metrics.get("numFilesRemoved"),
                "files_added": metrics.get("numFilesAdded"),
                "max_rss_mib": rss,
            }
        )
    )
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
